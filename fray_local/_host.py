"""The process of one host (or replica): ``python -m fray_local._host PAYLOAD RESULT``.

It is a *guardian* that runs no user code and forks the *worker* that does (see :mod:`fray_local._proc`).
The worker runs the job's entrypoint and writes ``("ok", value)`` / ``("error", kind, text)`` /
``("exit", code)`` to RESULT with cloudpickle; its stdout/stderr are the host's log. The guardian waits
for the worker, then kills every process the worker left behind and exits as the worker did. It also
tears the host down when it is told to (SIGTERM: gracefully; ``HARD_STOP``: at once) and when the
supervisor that started it dies, and tells that supervisor it is alive: a byte on the beat pipe at least
every ``BEAT_INTERVAL`` (a guardian that falls silent is killed with its host, see :mod:`fray_local._proc`).
Simulated-TPU hooks come through env vars: ``FRAY_SIM_LOCKFILE`` (the host's ``libtpu_lockfile``: present
at start means the device is busy), ``FRAY_SIM_FAIL`` (fail this host with that message),
``FRAY_SIM_CRASH`` (die hard, leaving the lockfile behind, as a crashed TPU process does) and
``FRAY_SIM_DEVICE_ERROR`` (a broken device).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import traceback
from typing import Any

from fray_core.errors import HostPreempted
from fray_core.hostrun import EntrypointExit, call_entrypoint
from fray_local import _proc

# A graceful stop (SIGTERM) waits this long for the worker before killing everything.
SOFT_STOP_GRACE = 10.0
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


class TpuDeviceError(RuntimeError):
    """The TPU device cannot be opened (a broken host, ``TpuFleet.break_host``): not the user's fault."""


class DeviceBusyError(TpuDeviceError):
    """The TPU device is held by a stale process (``/tmp/libtpu_lockfile``): retryable, not the user's fault."""


class SimulatedHostFailure(RuntimeError):
    """A failure injected by a fault plan (``FailHost``)."""


# ---------------------------------------------------------------------------------------- guardian


def _supervisor_alive(pid: int, start: str) -> bool:
    if not pid:
        return True  # started by hand, not by a supervisor: nothing to watch
    if _proc.LINUX:
        return os.getppid() == pid and start != "" and str(_proc.process_start_ticks(pid)) == start
    return os.getppid() == pid


def _reap(worker: int) -> tuple[int | None, bool]:
    """Reap every child that ended: the worker's wait status if it was one of them, and whether
    any child is left."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status, False
        if pid == 0:
            return status, True
        if pid == worker:
            status = st


def _signal_all(worker: int, sig: int) -> None:
    targets = _proc.descendants(os.getpid()) if _proc.LINUX else [worker]
    for pid in targets:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class _Beat:
    """The guardian's liveness for its supervisor (see :mod:`fray_local._proc`): a byte on the beat pipe, at
    most every half ``BEAT_INTERVAL``; called from every turn of the guardian's loops, which wake at least every
    ``BEAT_INTERVAL``."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self._last = float("-inf")
        if fd is not None:
            os.set_blocking(fd, False)  # a supervisor behind on reading must never block the guardian

    def __call__(self) -> None:
        if self.fd is None:
            return
        now = time.monotonic()
        if now - self._last < _proc.BEAT_INTERVAL / 2:
            return
        self._last = now
        try:
            os.write(self.fd, b".")
        except BlockingIOError:
            pass  # the pipe is full of beats the supervisor has not read yet: it knows we are alive
        except OSError:
            self.fd = None  # the supervisor is gone (EPIPE): its death is noticed by the parent checks

    def close_in_worker(self) -> None:
        """In the forked worker: drop the write end, so the guardian's end is EOF for the supervisor."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _beat_fd() -> int | None:
    """The beat pipe's fd the supervisor passed (``BEAT_ENV``), taken out of the environment (the worker and
    what it starts must not see it), or ``None``."""
    value = os.environ.pop(_proc.BEAT_ENV, "")
    try:
        fd = int(value)
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except (ValueError, OSError):
        return None
    return fd if is_pipe else None  # a variable set by hand must not make us write into some other file


def _kill_tree(worker: int, beat: _Beat) -> int | None:
    """SIGKILL every descendant until none is left (as a subreaper, orphans come back to us)."""
    status = None
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        beat()  # a tree in uninterruptible sleep may take a while: we are still answering
        _signal_all(worker, signal.SIGKILL)
        st, left = _reap(worker)
        status = st if st is not None else status
        if not left:
            return status
        signal.sigtimedwait({signal.SIGCHLD}, 0.05)
    return status


def _soft_stop_grace() -> float:
    """How long a graceful stop waits: an elastic job's hosts get its ``grace`` to checkpoint, a noticed
    preemption's the time to its deadline (the supervisor kills them when it is over; this is the backstop
    should it not)."""
    try:
        elastic = float(os.environ.get("FRAY_ELASTIC_GRACE", "") or 0.0)
    except ValueError:
        elastic = 0.0
    from fray_core.hostapi import preemption_notice

    deadline = preemption_notice()
    notice = deadline - time.time() if deadline is not None else 0.0
    return max(SOFT_STOP_GRACE, elastic + 1.0, notice + 1.0)


def _guard(worker: int, sup_pid: int, sup_start: str, beat: _Beat) -> int:
    watched = {signal.SIGCHLD, _proc.HARD_STOP, _proc.STACKS, *_STOP_SIGNALS}
    status = None
    soft_deadline = None
    every = _proc.BEAT_INTERVAL  # how often at least we check on the supervisor and tell it we are alive
    while status is None:
        beat()
        timeout = every if soft_deadline is None else max(0.0, min(every, soft_deadline - time.monotonic()))
        info = signal.sigtimedwait(watched, timeout)
        if info is None:
            if soft_deadline is not None and time.monotonic() >= soft_deadline:
                break
            if not _supervisor_alive(sup_pid, sup_start):
                print("[fray] the job's supervisor died: stopping this host", file=sys.stderr, flush=True)
                break
            continue
        if info.si_signo == signal.SIGCHLD:
            status = _reap(worker)[0]
        elif info.si_signo == _proc.HARD_STOP:
            break
        elif info.si_signo == _proc.STACKS:  # the worker's faulthandler writes its stacks to the host's log
            try:
                os.kill(worker, _proc.STACKS)
            except ProcessLookupError:
                pass
        elif soft_deadline is None:  # stop gracefully: SIGTERM to the worker and everything it started
            _signal_all(worker, signal.SIGTERM)
            soft_deadline = time.monotonic() + _soft_stop_grace()
    st = _kill_tree(worker, beat)
    status = status if status is not None else st
    if status is None:
        return 128 + signal.SIGKILL  # killed before it could be reaped: as good as SIGKILL
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if sig not in _UNCATCHABLE:  # SIGKILL/SIGSTOP cannot be reset (EINVAL) and need no reset: always fatal
            signal.signal(sig, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), sig)  # end as the worker did, so the supervisor sees the same signal
        return 128 + sig
    return os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    sup_pid = int(os.environ.pop("FRAY_SUPERVISOR_PID", "0") or 0)
    sup_start = os.environ.pop("FRAY_SUPERVISOR_START", "")
    beat = _Beat(_beat_fd())
    beat()  # the guardian is up
    if not hasattr(signal, "sigtimedwait"):
        import threading

        beat.close_in_worker()  # no guardian here: nothing would beat

        if sup_pid:
            threading.Thread(target=_watch_supervisor, args=(sup_pid, sup_start), daemon=True).start()
        return _work(argv)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, _proc.HARD_STOP, _proc.STACKS, *_STOP_SIGNALS})
    if sup_pid:
        # First the parent-death signal, then the check: a supervisor that died before the prctl is caught
        # by the check (our parent is no longer that process), one that dies after it by the signal.
        _proc.prctl(_proc.PR_SET_PDEATHSIG, _proc.HARD_STOP)
        if not _supervisor_alive(sup_pid, sup_start):
            print("[fray] the job's supervisor died before this host started", file=sys.stderr, flush=True)
            return 128 + signal.SIGKILL
    _proc.prctl(_proc.PR_SET_CHILD_SUBREAPER, 1)
    guardian = os.getpid()
    worker = os.fork()
    if worker == 0:
        _proc.prctl(_proc.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != guardian:
            os._exit(128 + signal.SIGKILL)
        beat.close_in_worker()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return _work(argv)
    return _guard(worker, sup_pid, sup_start, beat)


def _watch_supervisor(sup_pid: int, sup_start: str) -> None:
    """Without ``sigtimedwait`` (not Linux): no guardian; the worker polls its supervisor instead."""
    while _supervisor_alive(sup_pid, sup_start):
        time.sleep(0.5)
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(128 + signal.SIGKILL)


# ------------------------------------------------------------------------------------------ worker


class ResultUnwritable(Exception):
    """The host's result file cannot be written (a full disk): the host fails, saying why and where."""


def _write(path: str, payload: Any) -> None:
    import cloudpickle

    tmp = path + ".tmp"
    try:
        data = cloudpickle.dumps(payload)
    except Exception as e:  # an unpicklable return value is the user's failure, said plainly
        data = cloudpickle.dumps(
            ("error", "user", f"TypeError: the return value of the entrypoint cannot be pickled: {e}\n")
        )
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:  # a write or close that fails names no file: this says which
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise ResultUnwritable(f"cannot write this host's result to {path}: {e.strerror or e}") from e


def _work(argv: list[str]) -> int:
    """The worker: run the entrypoint, write its result; a result that cannot be written fails the host with
    one line naming the cause and the file (its last output, which the job's error quotes), not a traceback."""
    try:
        return _run_entry(argv)
    except ResultUnwritable as e:
        print(f"[fray] HostResultUnwritable: {e}", file=sys.stderr, flush=True)
        return 1


def _run_entry(argv: list[str]) -> int:
    import faulthandler

    # a stalled host's stacks, every thread, even one stuck in C code (a hung collective): see dump_stacks
    faulthandler.register(_proc.STACKS, file=sys.stderr, all_threads=True)
    payload_path, result_path = argv[1], argv[2]
    extra_path = os.environ.pop("FRAY_SYS_PATH", None)
    if extra_path:
        for p in reversed(json.loads(extra_path)):
            if p not in sys.path:
                sys.path.insert(0, p)

    lockfile = os.environ.pop("FRAY_SIM_LOCKFILE", None)
    fail_msg = os.environ.pop("FRAY_SIM_FAIL", None)
    crash = os.environ.pop("FRAY_SIM_CRASH", None)
    device_error = os.environ.pop("FRAY_SIM_DEVICE_ERROR", None)
    try:
        # the fleet model decided this host's fate (fray_core.fleet.Fleet.host_fate); the host only meets it
        if device_error:
            kind, _, text = device_error.partition(": ")
            raise (DeviceBusyError if kind == "DeviceBusyError" else TpuDeviceError)(text or device_error)
        if crash:
            print(crash, file=sys.stderr, flush=True)
            os._exit(139)  # the model left the host's lockfile behind, as a crashed libtpu process does
        if fail_msg:
            raise SimulatedHostFailure(fail_msg.partition(": ")[2] or fail_msg)
        if lockfile:
            with open(lockfile, "w") as f:
                f.write(str(os.getpid()))

        import cloudpickle

        with open(payload_path, "rb") as f:
            entry = cloudpickle.load(f)
        if entry.callable is not None:
            try:
                value = call_entrypoint(entry.callable, entry.positional, entry.function_args)
            except EntrypointExit as e:  # sys.exit(code) in the user's function: its exit code decides
                text = f"SystemExit: {e}\n{e.traceback}"
                sys.stderr.write(text)
                _write(result_path, ("error", "user", text))
                return e.exit_code
            _write(result_path, ("ok", value))
            rc = 0
        else:
            try:
                rc = subprocess.call(entry.command)
            except OSError as e:  # a missing or non-executable binary fails the same way every time
                text = f"CommandNotFound: cannot run {entry.command[0]!r}: {type(e).__name__}: {e}\n"
                sys.stderr.write(text)
                _write(result_path, ("error", "user", text))
                return 127
            _write(result_path, ("exit", rc))
    except ResultUnwritable:
        raise  # not the user's failure: see _work
    except (TpuDeviceError, HostPreempted) as e:
        _write(result_path, ("error", "infra", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return 3
    except SimulatedHostFailure as e:
        # an injected fault, not the user's code failing: one line, without a traceback of this module
        # (which would read as a crash of Fray's own, in `fray sim` and every simulated fleet's job log)
        text = f"SimulatedHostFailure: {e}\n"
        sys.stderr.write(text)
        _write(result_path, ("error", "user", text))
        rc = 1
    except BaseException as e:  # the user's failure, with its traceback
        text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        sys.stderr.write(text)
        _write(result_path, ("error", "user", text))
        rc = 1
    if lockfile:
        try:
            os.remove(lockfile)
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
