"""Job records, results and logs, stored through fsspec so ``gs://bucket/fray`` works like a local path.

Layout under the jobs dir (``FRAY_JOBS_DIR``, default ``~/.cache/fray/jobs``)::

    <job_id>/record.json     status, attempts, counters, timestamps, owner (written atomically)
    <job_id>/result.pkl      cloudpickled per-host results of the successful attempt
    <job_id>/job.log         every host's output, each line prefixed with its slice/host tag
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle

from fray_core.errors import JobNotFoundError
from fray_core.types import JobId, JobInfo

__all__ = ["JobStore", "default_jobs_dir", "new_job_id", "owner_info", "pid_alive"]


def default_jobs_dir() -> str:
    """``$FRAY_JOBS_DIR``, else ``$XDG_CACHE_HOME/fray/jobs`` (``~/.cache/fray/jobs``)."""
    env = os.environ.get("FRAY_JOBS_DIR")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fray", "jobs")


def new_job_id(name: str) -> JobId:
    """A unique, sortable, readable id: ``<name>-<utc time>-<random>``."""
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", name).strip("-").lower()[:40] or "job"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return JobId(f"{slug}-{stamp}-{secrets.token_hex(3)}")


def owner_info() -> dict[str, Any]:
    """Who supervises a job: checked by other processes to tell a live job from an orphaned one.

    ``start_ticks`` (Linux: the process's start time in clock ticks since boot) tells the owner from a
    later process that got the same pid.
    """
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "start_ticks": _start_ticks(os.getpid()),
    }


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode("ascii", "replace").split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def _start_wall_time(ticks: int) -> float | None:
    """When a process that started ``ticks`` clock ticks after boot started, as a ``time.time()`` value."""
    try:
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None


def pid_alive(pid: int, started: float | None = None, start_ticks: int | None = None) -> bool:
    """Whether process ``pid`` runs (a zombie does not) and is the one that was there before.

    With ``start_ticks`` (from :func:`owner_info`) the process must have exactly that start time; with
    only ``started`` (a ``time.time()`` the owner took after it started) it must not have started later:
    either way a pid reused by another process counts as dead.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat(pid)
    if fields is None:
        return not os.path.isdir("/proc/self")  # no /proc here: trust kill(0)
    if fields[0] in ("Z", "X"):
        return False  # a zombie is dead for our purposes
    ticks = int(fields[19])
    if start_ticks is not None:
        return ticks == start_ticks
    if started is not None:
        began = _start_wall_time(ticks)
        # btime has a resolution of 1 s and moves with clock adjustments: allow for both
        return began is None or began <= started + 2.0
    return True


class JobStore:
    """Reads and writes job records under one root (any fsspec URL)."""

    def __init__(self, root: str | None = None) -> None:
        import fsspec  # imported here: it costs ~40 ms, and `import fray_local` stays cheap

        self.root = (root or default_jobs_dir()).rstrip("/")
        self.fs, self._root_path = fsspec.core.url_to_fs(self.root)
        self.is_local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.fs.makedirs(self._root_path, exist_ok=True)

    def _p(self, job_id: str, name: str = "") -> str:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise JobNotFoundError(f"unknown job id {job_id!r}")
        base = f"{self._root_path}/{job_id}"
        return f"{base}/{name}" if name else base

    def exists(self, job_id: str) -> bool:
        return self.fs.exists(self._p(job_id, "record.json"))

    # ---------------------------------------------------------------------------------------- records

    def write(self, info: JobInfo, **extra: Any) -> None:
        """Write the record atomically: readers see the old or the new one, never half of one."""
        record = info.to_json()
        record.update(extra)
        data = json.dumps(record, indent=1, sort_keys=True, default=str)
        path = self._p(info.job_id, "record.json")
        self.fs.makedirs(self._p(info.job_id), exist_ok=True)
        if self.is_local:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".record.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(data)
            os.replace(tmp, path)
        else:  # object stores replace whole objects atomically
            with self.fs.open(path, "w") as f:
                f.write(data)

    def read(self, job_id: str) -> dict[str, Any]:
        path = self._p(job_id, "record.json")
        try:
            with self.fs.open(path, "r") as f:
                return json.load(f)
        except FileNotFoundError:
            raise JobNotFoundError(f"unknown job id {job_id!r} (no record under {self.root})") from None

    def list_ids(self) -> list[str]:
        try:
            entries = self.fs.ls(self._root_path, detail=False)
        except FileNotFoundError:
            return []
        ids = [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return sorted(i for i in ids if not i.startswith(".") and self.exists(i))

    # ---------------------------------------------------------------------------------------- results

    def write_result(self, job_id: str, results: list[Any]) -> None:
        path = self._p(job_id, "result.pkl")
        try:
            data = cloudpickle.dumps(results)
        except Exception:  # results that cannot be pickled stay in the launching process only
            return
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def read_result(self, job_id: str) -> list[Any] | None:
        path = self._p(job_id, "result.pkl")
        try:
            with self.fs.open(path, "rb") as f:
                return cloudpickle.loads(f.read())
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------------------------------- logs

    def log_path(self, job_id: str) -> str:
        return self._p(job_id, "job.log")

    def read_log(self, job_id: str, offset: int = 0) -> tuple[list[str], int]:
        """Complete lines from byte ``offset`` on, and the offset after the last complete line."""
        path = self.log_path(job_id)
        try:
            with self.fs.open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n")
        if end < 0:
            return [], offset
        chunk = data[: end + 1]
        return chunk.decode("utf-8", "replace").splitlines(), offset + len(chunk)

    def iter_log(self, job_id: str, follow: bool, is_done: Any, poll: float = 0.1) -> Iterator[str]:
        """Yield log lines; with ``follow``, keep going until ``is_done()`` and the log is drained."""
        offset = 0
        while True:
            done = bool(is_done()) if follow else True
            lines, offset = self.read_log(job_id, offset)
            yield from lines
            if done:
                return
            if not lines:
                time.sleep(poll)
