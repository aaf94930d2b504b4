"""What runs inside one host's (or one replica's) Ray task: a fresh worker process (``max_calls=1``).

It puts the driver's ``sys.path`` and cwd in place (so functions of a test module or a script unpickle),
sets the host's env, removes a stale ``/tmp/libtpu_lockfile``, streams its stdout/stderr to the job's
supervisor (which writes the job log), and runs the entrypoint: the callable in this process, a binary in a
child process. Errors keep their type so the supervisor classifies them by type, never by message.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import attrs
import cloudpickle

__all__ = ["CommandFailedError", "HostConfig", "HostPreemptedError", "gce_preempted", "run_host"]

LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
_TAIL_LINES = 20
_GCE_PREEMPTED_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"


class CommandFailedError(RuntimeError):
    """A binary entrypoint exited non-zero. ``exit_code`` and the tail of its output are kept."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[Any, ...]:
        return (CommandFailedError, (self.args[0], self.exit_code))


class HostPreemptedError(RuntimeError):
    """The host's work failed and the cloud says the VM was preempted: retryable, not the user's fault."""


def gce_preempted(timeout: float = 0.5) -> bool:
    """GCE's metadata server says this VM was preempted. ``False`` off GCE (no metadata server)."""
    req = urllib.request.Request(_GCE_PREEMPTED_URL, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode().strip().upper() == "TRUE"
    except Exception:
        return False


@attrs.frozen
class HostConfig:
    """Per-job settings a host needs, shipped with every host task."""

    sys_path: tuple[str, ...]
    cwd: str
    supervisor: Any  # the job's supervisor actor handle (receives log lines); None: print only
    preemption_probe: Callable[[], bool] | None = gce_preempted
    clean_lockfile: bool = True


class _LogPump:
    """Tees this process's fd 1 and 2 into a pipe; lines go to the original stdout and, in batches, to the
    supervisor. ``close`` flushes and waits (bounded) for the last batch to be delivered."""

    def __init__(self, tag: str, supervisor: Any) -> None:
        self.tag = tag
        self.supervisor = supervisor
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._last_send: Any = None
        sys.stdout.flush()
        sys.stderr.flush()
        self._orig_out = os.dup(1)
        r, w = os.pipe()
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        self._r = r
        self._reader = threading.Thread(target=self._read, daemon=True, name="fray-log-reader")
        self._reader.start()
        self._stop = threading.Event()
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name="fray-log-sender")
        self._sender.start()

    def feed(self, line: str) -> None:
        with self._lock:
            self._pending.append(line)
        self.tail.append(line)

    def _read(self) -> None:
        with os.fdopen(self._r, "rb") as f:
            for raw in f:
                os.write(self._orig_out, raw)
                self.feed(raw.decode("utf-8", "replace").rstrip("\n"))

    def _flush(self) -> None:
        with self._lock:
            lines, self._pending = self._pending, []
        if lines and self.supervisor is not None:
            self._last_send = self.supervisor.append_log.remote(self.tag, lines)

    def _send_loop(self) -> None:
        while not self._stop.wait(0.2):
            self._flush()

    def close(self) -> None:
        import ray

        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._orig_out, 1)  # closes the pipe's write ends: the reader drains and stops
        os.dup2(self._orig_out, 2)
        self._reader.join(5.0)
        self._stop.set()
        self._sender.join(5.0)
        self._flush()
        if self._last_send is not None:
            try:
                ray.get(self._last_send, timeout=10.0)
            except Exception:
                pass  # the supervisor is gone or slow: the log is best effort, the result is not


def _die_with_parent() -> None:
    # A binary's process must not outlive its host task when Ray kills the worker (cancel, preemption).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    os.setsid()


def _run_binary(cmd: list[str], where: str, pump: _LogPump) -> None:
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
    )
    assert proc.stdout is not None
    for raw in proc.stdout:
        os.write(1, raw)  # through the pump: logged and kept in its tail
    rc = proc.wait()
    if rc != 0:
        time.sleep(0.05)  # let the reader take the last lines into the tail
        tail = "\n".join(pump.tail)
        raise CommandFailedError(f"exit code {rc} on {where}; last output:\n{tail}", exit_code=rc)


def run_host(entry_bytes: bytes, env: dict[str, str], tag: str, where: str, config: HostConfig) -> Any:
    """The body of a host task: returns the callable's value (``None`` for a binary that exits 0)."""
    for p in reversed(config.sys_path):
        if p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)
    if os.path.isdir(config.cwd):
        os.chdir(config.cwd)
    os.environ.update(env)
    os.environ["PYTHONUNBUFFERED"] = "1"
    pump = _LogPump(tag, config.supervisor)
    try:
        if config.clean_lockfile and "TPU_WORKER_ID" in env and os.path.exists(LIBTPU_LOCKFILE):
            try:
                os.remove(LIBTPU_LOCKFILE)
                print(f"[fray] removed stale {LIBTPU_LOCKFILE} before start", flush=True)
            except OSError:
                pass
        entrypoint = cloudpickle.loads(entry_bytes)
        try:
            if entrypoint.binary is not None:
                _run_binary(entrypoint.command, where, pump)
                return None
            args, kwargs = entrypoint.positional, dict(entrypoint.function_args or {})
            return entrypoint.callable(*args, **kwargs)
        except BaseException as e:
            if config.preemption_probe is not None and config.preemption_probe():
                raise HostPreemptedError(f"{where} was preempted (cloud metadata) while running: {type(e).__name__}: {e}") from e
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        pump.close()
