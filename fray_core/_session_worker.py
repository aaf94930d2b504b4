"""The persistent worker of a held session (see :mod:`fray_core.session`): the entrypoint of every host.

It connects back to the session's client (an authenticated ``multiprocessing.connection``: a Unix socket in
a private 0700 dir), says who it is, then executes the calls it is sent until told to exit (or the client goes
away). A call that raises is reported to the client and then re-raised, so the host ends FAILED and the
runner applies the failure budget; a preempted host simply dies, and the runner sees it.

``python -m fray_core._session_worker FD`` is the one-call child of ``fresh_process=True``: it reads the
pickled call from stdin and writes its reply to the pipe ``FD``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from typing import Any

from fray_core._exits import describe_exit

#: a reply: ("ok", pickled result) or ("err", {"module", "qualname", "text"})
Reply = tuple[str, Any]


def _error(exc: BaseException) -> dict[str, str]:
    t = type(exc)
    tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    return {"module": t.__module__, "qualname": t.__qualname__, "text": f"{t.__name__}: {exc}\n{tb}"}


def run_call(payload: bytes) -> tuple[Reply, BaseException | None]:
    """Run one pickled ``(fn, args, kwargs)`` here: the reply, and the exception when it failed."""
    import cloudpickle

    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        value = fn(*args, **kwargs)
    except BaseException as e:  # the user's failure (SystemExit included), with its traceback
        return ("err", _error(e)), e
    try:
        return ("ok", cloudpickle.dumps(value)), None
    except Exception as e:
        err = TypeError(f"the return value of {getattr(fn, '__qualname__', fn)!r} cannot be pickled: {e}")
        return ("err", _error(err)), err


class CallFailed(RuntimeError):
    """A call run in a fresh process failed; the message is its traceback."""


def run_call_in_child(payload: bytes) -> tuple[Reply, BaseException | None]:
    """``fresh_process=True``: run the call in a new process (its output goes to this host's log)."""
    import cloudpickle

    r, w = os.pipe()
    env = dict(os.environ, FRAY_SESSION_SYS_PATH=json.dumps([p for p in sys.path if p]))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fray_core._session_worker", str(w)], stdin=subprocess.PIPE, pass_fds=(w,), env=env
        )
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as reader:
        assert proc.stdin is not None
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        data = reader.read()
    rc = proc.wait()
    if data:
        reply: Reply = cloudpickle.loads(data)  # written by our own child through a private pipe
        if reply[0] == "ok":
            return reply, None
        return reply, CallFailed(reply[1]["text"])
    err = CallFailed(f"the call's process {describe_exit(rc)} without a result")
    return ("err", _error(err)), err


def serve(address: Any, family: str, authkey: bytes, fresh_process: bool) -> None:
    """The worker loop: returns when the session closes (the host then ends SUCCEEDED)."""
    from multiprocessing.connection import Client

    conn = Client(address, family=family, authkey=authkey)
    env = os.environ
    hello = {
        "attempt": int(env.get("FRAY_ATTEMPT", "0")),
        "slice": int(env.get("FRAY_SLICE_ID", "0")),
        "host": int(env.get("FRAY_HOST_ID", env.get("FRAY_REPLICA_ID", "0"))),
        "replicas": int(env.get("FRAY_NUM_REPLICAS", "1")),
        "pid": os.getpid(),
    }
    conn.send(("hello", hello))
    announce = env.get("FRAY_REPLICA_ID", "0") == "0"
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return None  # the client went away: the session is over
        if msg[0] == "exit":
            conn.close()
            return None
        _, index, what, payload = msg
        if announce:
            print(f"[fray] session call {index}: {what}", flush=True)
        reply, exc = run_call_in_child(payload) if fresh_process else run_call(payload)
        try:
            conn.send((reply[0], index, reply[1]))
        except (EOFError, OSError):
            return None
        if exc is not None:
            conn.close()
            raise exc  # the host ends FAILED: the runner spends the failure budget and restarts the hosts


def _child(argv: list[str]) -> int:
    import cloudpickle

    extra = os.environ.pop("FRAY_SESSION_SYS_PATH", None)
    if extra:
        for p in reversed(json.loads(extra)):
            if p not in sys.path:
                sys.path.insert(0, p)
    fd = int(argv[1])
    payload = sys.stdin.buffer.read()
    reply, exc = run_call(payload)
    if exc is not None:
        sys.stderr.write(reply[1]["text"])
    with os.fdopen(fd, "wb") as out:
        out.write(cloudpickle.dumps(reply))
    sys.stdout.flush()
    return 0 if exc is None else 1


if __name__ == "__main__":
    sys.exit(_child(sys.argv))
