"""Job records, results and logs, stored through fsspec so ``gs://bucket/fray`` works like a local path.

Layout under the jobs dir (``FRAY_JOBS_DIR``, default ``~/.cache/fray/jobs``)::

    <job_id>/record.json     status, attempts, counters, timestamps, owner (written atomically)
    <job_id>/result.pkl      cloudpickled per-host results of the successful attempt (written atomically,
                             before the record says SUCCEEDED)
    <job_id>/job.log         every host's output, each line prefixed with its slice/host tag

Safety rules (docs/backends.md, "The job store"): listing and polling read only JSON; results are unpickled
only when asked for (``JobInfo.result``, ``Cluster.result``), and on a local disk only from a jobs dir and job
dir that belong to the reader and that nobody else can write. Nothing inside the jobs dir is reached through a
symbolic link. A private store (the default) makes its dirs 0700 and its files 0600; ``shared=True`` (or
``FRAY_JOBS_SHARED=1``) makes them readable by others (0755/0644) and accepts a jobs dir others can write.
"""

from __future__ import annotations

import datetime
import errno
import functools
import json
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import cloudpickle

from fray_core._procfs import start_ticks as process_start_ticks
from fray_core._procfs import stat_fields
from fray_core.errors import FrayError, JobNotFoundError, RecordError, ResultUnavailableError, UnsafeJobsDirError
from fray_core.status import JobId, JobInfo, JobStatus, StoredResult

__all__ = ["SHARED_ENV", "JobStore", "default_jobs_dir", "new_job_id", "owner_info", "pid_alive"]

#: set to 1 to make a jobs dir shared on purpose (see :class:`JobStore`)
SHARED_ENV = "FRAY_JOBS_SHARED"
RECORD = "record.json"
RESULT = "result.pkl"
LOG = "job.log"
CALLS = "calls.json"  # a held session's call count, written by the session's client (not the job's supervisor)
MAX_RECORD_BYTES = 16 * 1024 * 1024  # a record is a few KiB; more is not one of ours
INCOMPLETE_GRACE = 30.0  # seconds a job dir may lack its record (it is being created) before it is reported
MAX_JSON_DEPTH = 64  # a record nests ~5 levels; deeper is not one of ours (and would exhaust the parser's stack)
MAX_INT_DIGITS = 19  # numbers in records are counts, sizes and seconds: |n| < 10**19
MAX_FLOAT = 1e15  # ... and floats are finite and below this (a time stamp is ~1.8e9)
MAX_FIELD_CHARS = 64 * 1024  # a longer string is cut when a record is written, so the record stays readable
#: space set aside in each job dir at launch, so the final record can be written on a full disk (see write_final)
RESERVE = ".reserve"
RESERVE_BYTES = 256 * 1024
#: ``ended.<STATUS>``: the job ended but its final record could not be written (see write_final)
ENDED_MARKER = "ended."
NEW_JOB_TRIES = 8  # ids tried before giving up when each one's dir already exists
FINAL_WRITE_DEADLINE = 10.0  # seconds write_final keeps trying (file descriptors free up as the job's hosts end)


_READ_ONLY_PROTOCOLS = {"http", "https", "github", "zip", "tar", "libarchive"}
#: Job stores a backend provides, named to fsspec by import path (fsspec imports one only when a store URL
#: uses it): ``ray-kv://HOST:PORT/NAMESPACE``, a Ray cluster's own store (its default, ``fray_ray.kvfs``).
BACKEND_STORES = {
    "ray-kv": (
        "fray_ray.kvfs.RayKVFileSystem",
        "a Ray cluster's store needs fray's Ray backend: pip install 'fray[ray]'",
    )
}


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
        "start_ticks": process_start_ticks(os.getpid()),
    }


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
    fields = stat_fields(pid)
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a record holds")


def _bounded_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (a record's numbers have at most {MAX_INT_DIGITS})")
    return int(text)


def _bounded_float(text: str) -> float:
    value = float(text)
    if not abs(value) < MAX_FLOAT:  # also NaN, and 1e999 (which float() reads as inf)
        raise ValueError(
            f"the number {text[:40]} is out of range (a record's numbers are finite and below {MAX_FLOAT:g})"
        )
    return value


def _json_depth(data: bytes) -> int:
    """How deep ``[``/``{`` nest in a JSON text (brackets inside strings count too: an upper bound)."""
    depth = deepest = 0
    for b in data.translate(None, delete=_NOT_BRACKETS):
        if b in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def loads_record(data: bytes, what: str) -> Any:
    """Parse a JSON file of the store with limits: nesting depth (``MAX_JSON_DEPTH``), integers of at most
    ``MAX_INT_DIGITS`` digits, finite floats below ``MAX_FLOAT``, no ``NaN``/``Infinity``. A file outside them
    raises :class:`RecordError` naming ``what`` and the limit, so one planted file never breaks a listing.

    >>> loads_record(b'{"calls": 3}', "calls.json")
    {'calls': 3}
    """
    if _json_depth(data) > MAX_JSON_DEPTH:
        raise RecordError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels; not a Fray record")
    try:
        return json.loads(
            data.decode("utf-8"), parse_int=_bounded_int, parse_float=_bounded_float, parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RecordError(f"{what} is not a valid record: {e}") from None


def _safe(value: Any, cut: bool) -> Any:
    """``value`` within what :func:`loads_record` reads: numbers out of range as text (a reader would refuse
    the whole record for one of them), with ``cut``, strings over ``MAX_FIELD_CHARS`` cut."""
    if isinstance(value, str):
        if cut and len(value) > MAX_FIELD_CHARS:
            return f"{value[:MAX_FIELD_CHARS]}... [cut: {len(value)} characters in all]"
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 10**MAX_INT_DIGITS else f"an integer of {value.bit_length()} bits (out of range)"
    if isinstance(value, float):
        return value if abs(value) < MAX_FLOAT else repr(value)
    if isinstance(value, dict):
        return {k: _safe(v, cut) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_safe(v, cut) for v in value]
    return value


def _encode(record: dict[str, Any]) -> bytes:
    """A record as JSON that every reader can read (:func:`loads_record`): numbers out of range are written
    as text, and strings longer than ``MAX_FIELD_CHARS`` are cut when the record would be large (a record
    over ``MAX_RECORD_BYTES`` is refused by readers)."""
    data = json.dumps(_safe(record, cut=False), indent=1, sort_keys=True, default=str).encode()
    if len(data) > MAX_RECORD_BYTES // 4:
        data = json.dumps(_safe(record, cut=True), indent=1, sort_keys=True, default=str).encode()
    return data


def _shared_from_env() -> bool:
    value = os.environ.get(SHARED_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{SHARED_ENV}={value!r}: expected 1 (a jobs dir shared on purpose) or 0 (private, the default)")


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


class JobStore:
    """Reads and writes job records, results and logs under one root (any fsspec URL).

    - ``root``: the jobs dir; default ``$FRAY_JOBS_DIR``, else ``~/.cache/fray/jobs``.
    - ``shared``: ``False`` (default, unless ``FRAY_JOBS_SHARED=1``): a private store, dirs 0700 and files
      0600, and results are loaded only when the jobs dir is yours and nobody else can write it. ``True``:
      dirs 0755 and files 0644 (others can list your jobs and read their logs), and the jobs dir itself may be
      writable by others (a team dir, e.g. mode 1777); results are still loaded only from job dirs you own
      that nobody else can write.

    >>> store = JobStore("/tmp/fray-doctest-jobs")  # doctest: +SKIP
    >>> store.read_info(job_id)[0].status           # doctest: +SKIP
    """

    def __init__(self, root: str | None = None, *, shared: bool | None = None) -> None:
        import fsspec  # imported here: it costs ~40 ms, and `import fray_local` stays cheap

        self.root = (root or default_jobs_dir()).rstrip("/")
        self.shared = _shared_from_env() if shared is None else bool(shared)
        for protocol, (path, errtxt) in BACKEND_STORES.items():
            if self.root.startswith(protocol + "://"):
                fsspec.register_implementation(protocol, path, clobber=False, errtxt=errtxt)
        try:
            self.fs, self._root_path = fsspec.core.url_to_fs(self.root)
        except (ImportError, ValueError, TypeError) as e:  # unknown protocol, or its fsspec package is missing
            where = "FRAY_JOBS_DIR" if not root and os.environ.get("FRAY_JOBS_DIR") else "jobs_dir"
            why = (str(e).splitlines() or [""])[0]
            raise ValueError(
                f"{where}={self.root!r}: not a usable job store ({type(e).__name__}: {why}); "
                "supported: a local path, file://, memory://, or an fsspec URL whose package is installed (gs:// with "
                "gcsfs, s3:// with s3fs)"
            ) from None
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if set(protocols) & _READ_ONLY_PROTOCOLS:
            where = "FRAY_JOBS_DIR" if not root and os.environ.get("FRAY_JOBS_DIR") else "jobs_dir"
            raise ValueError(
                f"{where}={self.root!r}: {protocols[0]}:// cannot hold a job store (records are written, and it is "
                "read-only); supported: a local path, file://, memory://, or a writable fsspec URL (gs://, s3://)"
            )
        self.is_local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.dir_mode = 0o755 if self.shared else 0o700  # of every dir the store creates
        self.file_mode = 0o644 if self.shared else 0o600  # of records, logs and results (and any file beside them)
        if self.is_local:
            if not os.path.isdir(self._root_path):
                os.makedirs(self._root_path, mode=self.dir_mode, exist_ok=True)
        else:
            self.fs.makedirs(self._root_path, exist_ok=True)

    def _p(self, job_id: str, name: str = "") -> str:
        if not isinstance(job_id, str) or not job_id or "/" in job_id or "\0" in job_id or job_id.startswith("."):
            raise JobNotFoundError(f"unknown job id {job_id!r}")
        base = f"{self._root_path}/{job_id}"
        return f"{base}/{name}" if name else base

    def exists(self, job_id: str) -> bool:
        if self.is_local:
            return os.path.lexists(self._p(job_id, RECORD))
        return self.fs.exists(self._p(job_id, RECORD))

    # ------------------------------------------------------------------------------------ local files

    def _open_nofollow(self, job_id: str, name: str) -> tuple[os.stat_result, int]:
        """The job dir's stat and an fd for ``name`` in it; no symbolic link is followed on the way
        (a link raises ``OSError`` with ``errno.ELOOP``)."""
        try:
            dfd = os.open(self._p(job_id), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except NotADirectoryError:
            if os.path.islink(self._p(job_id)):  # Linux reports a link opened with O_DIRECTORY as ENOTDIR
                raise OSError(errno.ELOOP, "a symbolic link", self._p(job_id)) from None
            raise
        try:
            return os.fstat(dfd), os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        finally:
            os.close(dfd)

    def _read_bytes(self, job_id: str, name: str, limit: int | None = None, offset: int = 0) -> bytes:
        if not self.is_local:
            with self.fs.open(self._p(job_id, name), "rb") as f:
                f.seek(offset)
                return f.read() if limit is None else f.read(limit + 1)
        _, fd = self._open_nofollow(job_id, name)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(errno.EISDIR, "not a regular file", self._p(job_id, name))
            f.seek(offset)
            return f.read() if limit is None else f.read(limit + 1)

    def new_job(self, name: str) -> JobId:
        """A fresh job id whose dir this call created (exclusively: two launches never share a job dir),
        with an empty log and the space reserved for its final record (see :meth:`prepare`). An id whose
        dir exists already is not reused: another is drawn, up to ``NEW_JOB_TRIES`` times.

        >>> job_id = JobStore("/tmp/fray-doctest-jobs").new_job("train")  # doctest: +SKIP
        """
        for _ in range(NEW_JOB_TRIES):
            job_id = new_job_id(name)
            if self._make_job_dir(job_id, exclusive=True):
                try:
                    self.prepare(job_id)
                except BaseException:
                    self.discard(job_id)
                    raise
                return job_id
        raise FrayError(
            f"cannot create a job dir under {self.root}: {NEW_JOB_TRIES} fresh ids for {name!r} all existed already "
            "(another process creates jobs with the same ids?)"
        )

    def discard(self, job_id: str) -> None:
        """Remove a job dir made by :meth:`new_job` for a launch that failed (nothing of it is left)."""
        try:
            if self.is_local:
                shutil.rmtree(self._p(job_id), ignore_errors=True)
            else:
                self.fs.rm(self._p(job_id), recursive=True)
        except (OSError, FileNotFoundError):
            pass

    def prepare(self, job_id: str) -> None:
        """Make the job's dir and an empty log with the store's modes (before a log writer opens it), and
        set aside ``RESERVE_BYTES`` for the job's final record (:meth:`write_final`)."""
        if not self.is_local:
            return
        self._make_job_dir(job_id)
        fd = os.open(self._p(job_id, LOG), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_APPEND, self.file_mode)
        os.close(fd)
        fd = os.open(self._p(job_id, RESERVE), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)  # real blocks, not a sparse file
            except (AttributeError, OSError) as e:
                if getattr(e, "errno", None) == errno.ENOSPC:
                    raise
                os.write(fd, b"\0" * RESERVE_BYTES)  # a file system without fallocate
        finally:
            os.close(fd)

    def _make_job_dir(self, job_id: str, exclusive: bool = False) -> bool:
        """Create the job dir; ``False`` when it existed (with ``exclusive``: someone else's)."""
        path = self._p(job_id)
        if not self.is_local:
            # Object stores have no exclusive create; ids are random. A remote job dir holds files only once
            # its record is written (nothing is made ahead of it, see prepare): its record says it is taken,
            # in one O(1) look (a dir's is a listing: in Ray's KV a scan of every key, issue 29).
            if exclusive and self.fs.isfile(self._p(job_id, RECORD)):
                return False
            self.fs.makedirs(path, exist_ok=True)
            return True
        try:
            os.mkdir(path, self.dir_mode)
        except FileExistsError:
            return False
        os.chmod(path, self.dir_mode)  # mkdir's mode is reduced by the umask; be exact
        return True

    def _write_atomic(self, job_id: str, name: str, data: bytes) -> None:
        """Readers see the old file or the new one, never part of one (write to a temp file, then rename)."""
        path = self._p(job_id, name)
        if not self.is_local:  # object stores replace whole objects atomically
            with self.fs.open(path, "wb") as f:
                f.write(data)
            return
        fd, tmp = tempfile.mkstemp(dir=self._p(job_id), prefix=f".{name}.", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if self.shared:
                os.chmod(tmp, self.file_mode)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    # ---------------------------------------------------------------------------------------- records

    def write(self, info: JobInfo, **extra: Any) -> None:
        """Write the record atomically: readers see the old or the new one, never half of one.

        The one way results are stored: when ``info`` says SUCCEEDED and holds its results in memory, they
        are written first (atomically), so a SUCCEEDED record always has its results, or says in
        ``result_error`` why not (they cannot be pickled, or the disk is full). ``info`` then refers to the
        stored copy instead of holding the results, so a long-lived process does not keep every job's results.
        """
        if info.status is JobStatus.SUCCEEDED and info.result_error is None and info.result_in_memory is not None:
            self._make_job_dir(info.job_id)
            self._store_results(info, info.result_in_memory)
        self.write_record(info.job_id, self.record_of(info, **extra))

    def record_of(self, info: JobInfo, **extra: Any) -> dict[str, Any]:
        """The record :meth:`write` writes for ``info`` (its results, if any, already stored): a snapshot
        that a writer in another thread can write later (:meth:`write_record`) while ``info`` changes.

        >>> from fray_core.status import JobInfo, JobStatus
        >>> JobStore.record_of(None, JobInfo(job_id="j-1", name="n", status=JobStatus.PENDING), owner={})["status"]
        'PENDING'
        """
        record = info.to_json()
        stored = info.stored_result
        if stored is not None and stored.size is not None:
            record["result_size"] = stored.size
        record.update(extra)
        return record

    def write_record(self, job_id: str, record: dict[str, Any]) -> int:
        """Write a record made by :meth:`record_of`, atomically (see :meth:`write`); returns its size in bytes."""
        self._make_job_dir(job_id)
        data = _encode(record)
        self._write_atomic(job_id, RECORD, data)
        return len(data)

    def write_final(self, info: JobInfo, **extra: Any) -> str | None:
        """Write a job's final (terminal) record, whatever it takes; ``None`` once written, else why it
        could not be (the caller says so where it can: its own log, its stderr).

        A plain :meth:`write` first. On a full disk or out of file descriptors, keeps trying for up to
        ``FINAL_WRITE_DEADLINE`` seconds (the caller releases the job's hosts first, which frees descriptors)
        with the record written into the space :meth:`prepare` reserved (no new blocks needed). When even
        that fails, the reserve is renamed ``ended.<STATUS>`` (a rename needs neither space nor a descriptor),
        which every reader takes as the job's end (:meth:`read_info` says the record could not be written).
        """
        deadline = time.monotonic() + FINAL_WRITE_DEADLINE
        delay = 0.05
        error = ""
        while True:
            try:
                self.write(info, **extra)
                break
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
            if self.is_local:
                try:
                    self._write_into_reserve(info, extra)
                    break
                except OSError as e:
                    error = f"{error}; then into the reserved space: {type(e).__name__}: {e}"
            if time.monotonic() + delay > deadline:
                return self._mark_ended(info, error)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        self.drop_reserve(info.job_id)
        return None

    def _write_into_reserve(self, info: JobInfo, extra: dict[str, Any]) -> None:
        record = info.to_json()
        record.update(extra)
        data = _encode(record)
        if len(data) > RESERVE_BYTES:  # keep what a reader needs: status, error, counters, the last attempts
            record["attempts"] = record.get("attempts", [])[-8:]
            record["request"] = {}
            data = _encode(record)
        fd = os.open(self._p(info.job_id, RESERVE), os.O_WRONLY | os.O_NOFOLLOW)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:RESERVE_BYTES]) :]
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        if self.shared:
            os.chmod(self._p(info.job_id, RESERVE), self.file_mode)
        os.replace(self._p(info.job_id, RESERVE), self._p(info.job_id, RECORD))

    def _mark_ended(self, info: JobInfo, error: str) -> str:
        why = f"job {info.job_id}: the final record ({info.status.value}) could not be written: {error}"
        if self.is_local:
            try:
                os.rename(self._p(info.job_id, RESERVE), self._p(info.job_id, ENDED_MARKER + info.status.value))
                return f"{why}; readers see {info.status.value} through {ENDED_MARKER}{info.status.value}"
            except OSError as e:
                return f"{why}; nor could it be marked ended: {e}"
        return why

    def drop_reserve(self, job_id: str) -> None:
        """Free the space :meth:`prepare` set aside, once the job's final record is written."""
        if self.is_local:
            try:
                os.unlink(self._p(job_id, RESERVE))
            except OSError:
                pass

    def _store_results(self, info: JobInfo, results: list[Any]) -> None:
        try:
            data = cloudpickle.dumps(results)
        except Exception as e:  # the launching process keeps them; the record says they are missing
            info.result_error = (
                f"results were not stored: they cannot be pickled ({type(e).__name__}: {e}); only the process "
                "that supervised the job had them"
            )
            return
        try:
            self._write_atomic(info.job_id, RESULT, data)
        except OSError as e:
            info.result_error = f"results were not stored: cannot write {RESULT}: {e}"
            return
        info.result = self._stored(info.job_id, len(data))

    def _stored(self, job_id: str, size: int | None) -> StoredResult:
        return StoredResult(functools.partial(self.read_result, job_id, size), size=size)

    def read(self, job_id: str) -> dict[str, Any]:
        """The raw record; :class:`JobNotFoundError` when there is none, :class:`RecordError` when it is bad."""
        path = self._p(job_id, RECORD)
        try:
            data = self._read_bytes(job_id, RECORD, limit=MAX_RECORD_BYTES)
        except FileNotFoundError:
            raise JobNotFoundError(f"unknown job id {job_id!r} (no record under {self.root})") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RecordError(
                    f"job {job_id}: {path} (or its dir) is a symbolic link; links in the jobs dir are not followed"
                ) from None
            if e.errno in (errno.EISDIR, errno.ENOTDIR):
                what = "its record is not a regular file" if e.errno == errno.EISDIR else "it is not a directory"
                raise RecordError(f"job {job_id}: {what} ({path})") from None
            raise RecordError(f"job {job_id}: cannot read {path}: {e}") from None
        if len(data) > MAX_RECORD_BYTES:
            raise RecordError(
                f"job {job_id}: {path} is larger than {MAX_RECORD_BYTES} bytes (the limit of a record; Fray writes "
                "smaller ones, cutting long fields); not a Fray record"
            )
        record = loads_record(data, f"job {job_id}: {path}")
        if not isinstance(record, dict):
            raise RecordError(f"job {job_id}: {path} holds {type(record).__name__} {str(record)[:40]!r}, not a record")
        return record

    def read_info(self, job_id: str) -> tuple[JobInfo, dict[str, Any]]:
        """The job's :class:`JobInfo` (results attached lazily, never loaded here) and its raw record."""
        record = self.read(job_id)
        try:
            info = JobInfo.from_json(record)
        except (ValueError, TypeError, OverflowError, RecursionError) as e:
            raise RecordError(f"job {job_id}: record cannot be read: {e}") from None
        if not info.status.is_terminal():
            self._apply_end_marker(job_id, info)
        if info.job_id != job_id:
            raise RecordError(f"job {job_id}: record cannot be read: it is the record of job {info.job_id!r}")
        if info.kind == "session":
            info.calls = self.read_calls(job_id)
        if info.status is JobStatus.SUCCEEDED and info.result_error is None:
            size = record.get("result_size")
            info.result = self._stored(job_id, size if isinstance(size, int) and not isinstance(size, bool) else None)
        return info, record

    def _apply_end_marker(self, job_id: str, info: JobInfo) -> None:
        """A job whose final record could not be written left ``ended.<STATUS>`` (see :meth:`write_final`)."""
        if not self.is_local:
            return
        for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            if os.path.lexists(self._p(job_id, ENDED_MARKER + status.value)):
                was = info.status.value
                info.status = status
                info.error = (
                    f"the job ended {status.value}, but its supervisor could not write the final record (disk full or "
                    f"out of file descriptors); the last record it wrote said {was}"
                    + ("" if status is not JobStatus.SUCCEEDED else "; the results were not stored")
                )
                info.finished_at = info.finished_at or os.lstat(self._p(job_id, ENDED_MARKER + status.value)).st_mtime
                return

    def write_calls(self, job_id: str, calls: int) -> None:
        """A held session's call count (``JobInfo.calls``), kept beside the record: the session's client counts
        the calls, the job's supervisor writes the record, and neither overwrites the other's file."""
        self._write_atomic(job_id, CALLS, json.dumps({"calls": int(calls)}).encode())

    def read_calls(self, job_id: str) -> int:
        """A held session's call count (0 before its first call); :class:`RecordError` when the file is bad."""
        try:
            data = self._read_bytes(job_id, CALLS, limit=4096)
        except FileNotFoundError:
            return 0  # no call made yet
        except OSError as e:
            raise RecordError(f"job {job_id}: cannot read {self._p(job_id, CALLS)}: {e}") from None
        try:
            calls = loads_record(data, "calls.json")["calls"]
        except (RecordError, TypeError, KeyError):
            calls = None
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise RecordError(f"job {job_id}: {self._p(job_id, CALLS)} is not a call count: {data[:60]!r}")
        return calls

    def list_ids(self) -> list[str]:
        """Ids of the readable-looking job entries (each may still fail to read; see :meth:`scan`)."""
        return [job_id for job_id, problem in self.scan() if problem is None]

    def scan(self) -> list[tuple[str, str | None]]:
        """Every entry of the jobs dir that is or looks like a job, with why it cannot be read (or ``None``).

        Hidden entries (``.name``) are skipped; a job dir still being created (no record yet, for up to
        ``INCOMPLETE_GRACE`` seconds) too. Anything else that is not a readable job is reported, not dropped.
        """
        out: list[tuple[str, str | None]] = []
        if not self.is_local:
            try:
                entries = self.fs.ls(self._root_path, detail=False)
            except FileNotFoundError:
                return []
            for e in entries:
                job_id = e.rstrip("/").rsplit("/", 1)[-1]
                if not job_id.startswith(".") and self.fs.exists(self._p(job_id, RECORD)):
                    out.append((job_id, None))
            return sorted(out)
        try:
            entries = list(os.scandir(self._root_path))
        except FileNotFoundError:
            return []
        now = time.time()
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                if e.is_symlink():
                    out.append((e.name, f"{e.path} is a symbolic link; links in the jobs dir are not followed"))
                elif not e.is_dir(follow_symlinks=False):
                    out.append((e.name, f"{e.path} is not a job directory (a stray file in the jobs dir)"))
                elif not os.path.lexists(os.path.join(e.path, RECORD)):
                    if now - e.stat(follow_symlinks=False).st_mtime > INCOMPLETE_GRACE:
                        out.append((e.name, f"{e.path} has no {RECORD}: the job's record was removed or never written"))
                else:
                    out.append((e.name, None))
            except OSError as err:
                out.append((e.name, f"cannot read {e.path}: {err}"))
        return sorted(out)

    def list_infos(self) -> list[tuple[JobInfo, dict[str, Any] | None]]:
        """Every job as ``(info, record)``: a job whose record cannot be read is an UNKNOWN ``info`` whose
        ``error`` says why, with ``record`` ``None``. One bad job never hides the others."""
        out: list[tuple[JobInfo, dict[str, Any] | None]] = []
        for job_id, problem in self.scan():
            if problem is None:
                try:
                    out.append(self.read_info(job_id))
                    continue
                except JobNotFoundError:
                    continue  # removed meanwhile
                except RecordError as e:
                    problem = str(e)
            out.append((self.unknown(job_id, problem), None))
        return out

    def unknown(self, job_id: str, problem: str) -> JobInfo:
        """The listing entry of a job that cannot be read: UNKNOWN, ``error`` says why; also warned about."""
        try:
            when = os.lstat(self._p(job_id)).st_mtime if self.is_local else 0.0
        except (OSError, JobNotFoundError):
            when = 0.0
        text = problem if problem.startswith(f"job {job_id}:") else f"job {job_id}: {problem}"
        warnings.warn(f"fray: {text}", stacklevel=3)
        return JobInfo(
            job_id=JobId(job_id), name="?", status=JobStatus.UNKNOWN, error=text, submitted_at=when, backend="?"
        )

    # ---------------------------------------------------------------------------------------- results

    def read_result(self, job_id: str, expected_size: int | None = None) -> list[Any]:
        """Load a job's results: the one place the store unpickles. Raises :class:`ResultUnavailableError`
        (:class:`UnsafeJobsDirError` for a jobs dir or job dir that is not safe to unpickle from)."""
        path = self._p(job_id, RESULT)
        try:
            data = self._read_result_bytes(job_id) if self.is_local else self._read_bytes(job_id, RESULT)
        except FileNotFoundError:
            raise ResultUnavailableError(
                f"job {job_id}: result cannot be loaded: {path} does not exist (removed, or written by a Fray "
                "version that could lose it)"
            ) from None
        except UnsafeJobsDirError:
            raise
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ResultUnavailableError(
                    f"job {job_id}: result cannot be loaded: {path} (or its dir) is a symbolic link; links in the "
                    "jobs dir are not followed"
                ) from None
            raise ResultUnavailableError(f"job {job_id}: result cannot be loaded: {e}") from None
        if expected_size is not None and len(data) != expected_size:
            raise ResultUnavailableError(
                f"job {job_id}: result cannot be loaded: {path} has {len(data)} bytes but {expected_size} were "
                "written; the file is damaged"
            )
        try:
            results = cloudpickle.loads(data)
        except Exception as e:
            hint = ""
            if isinstance(e, ImportError):
                hint = " (the results are instances of a class whose module cannot be imported in this process)"
            elif isinstance(e, EOFError) or "truncated" in str(e):
                hint = " (the file is truncated)"
            raise ResultUnavailableError(f"job {job_id}: result cannot be loaded: {e}{hint}") from e
        if not isinstance(results, list):
            raise ResultUnavailableError(
                f"job {job_id}: result cannot be loaded: {path} holds a {type(results).__name__}, not a list of results"
            )
        return results

    def _read_result_bytes(self, job_id: str) -> bytes:
        """The result file's bytes, after checking that nobody but us could have written it."""
        self._check_root()
        dir_stat, fd = self._open_nofollow(job_id, RESULT)
        with os.fdopen(fd, "rb") as f:
            self._check_private(self._p(job_id), dir_stat, "job dir")
            file_stat = os.fstat(fd)
            if not stat.S_ISREG(file_stat.st_mode):
                raise OSError(errno.EISDIR, f"{self._p(job_id, RESULT)} is not a regular file")
            self._check_private(self._p(job_id, RESULT), file_stat, "result file")
            return f.read()

    def _check_root(self) -> None:
        if self.shared:
            return  # a team dir may be writable by others; every job dir and result is checked instead
        try:
            st = os.stat(self._root_path)
        except OSError as e:
            raise ResultUnavailableError(
                f"result cannot be loaded: cannot stat the jobs dir {self.root}: {e}"
            ) from None
        self._check_private(self._root_path, st, "jobs dir")

    def _check_private(self, path: str, st: os.stat_result, what: str) -> None:
        me = os.geteuid()
        shared_hint = (
            ""
            if self.shared or what != "jobs dir"
            else f", or, if the dir is shared on purpose, set {SHARED_ENV}=1 (results then load only from job "
            f"dirs you own)"
        )
        if st.st_uid != me:
            raise UnsafeJobsDirError(
                f"refusing to load results from {path}: this {what} belongs to {_user(st.st_uid)}, not to you "
                f"({_user(me)}), and unpickling a file runs code as whoever loads it. Fix: load results from a jobs "
                f"dir of your own (FRAY_JOBS_DIR; the default is ~/.cache/fray/jobs){shared_hint}"
            )
        if st.st_mode & 0o022:
            who = (
                "group and others" if st.st_mode & 0o022 == 0o022 else ("others" if st.st_mode & 0o002 else "its group")
            )
            raise UnsafeJobsDirError(
                f"refusing to load results from {path}: this {what} is writable by {who} (mode "
                f"{stat.S_IMODE(st.st_mode):04o}), so another user could have planted {RESULT} there, and "
                f"unpickling it would run their code as you. Fix: chmod go-w {path}{shared_hint}"
            )

    # ------------------------------------------------------------------------------------------- logs

    def log_path(self, job_id: str) -> str:
        return self._p(job_id, LOG)

    def record_path(self, job_id: str) -> str:
        return self._p(job_id, RECORD)

    def read_log(self, job_id: str, offset: int = 0) -> tuple[list[str], int]:
        """Complete lines from byte ``offset`` on, and the offset after the last complete line."""
        try:
            data = self._read_bytes(job_id, LOG, offset=offset)
        except FileNotFoundError:
            return [], offset
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RecordError(
                    f"job {job_id}: {self.log_path(job_id)} (or its dir) is a symbolic link; links in the jobs dir "
                    "are not followed"
                ) from None
            raise
        end = data.rfind(b"\n")
        if end < 0:
            return [], offset
        chunk = data[: end + 1]
        return chunk.decode("utf-8", "replace").splitlines(), offset + len(chunk)

    def iter_log(self, job_id: str, follow: bool, is_done: Any, poll: float = 0.1) -> Iterator[str]:
        """Yield log lines; with ``follow``, keep going until ``is_done()`` and the log is drained. Read in
        pieces (:func:`stream_log`): a log of any size, or a 'line' of any length, costs the same memory."""
        yield from stream_log(self, job_id, follow=follow, is_done=is_done, poll=poll)


# ------------------------------------------------------------------------------ logs, read in pieces

LOG_CHUNK = 1 << 20  # bytes read at a time: what a log reader holds, whatever the log's size
MAX_LOG_LINE = 1 << 20  # a longer "line" (progress bars with no newline) is cut into pieces of this size
_TAG_BYTES = 64  # a line's tag ("[a12 s3/h7] ") is in its first bytes: what a filter looks at


def open_log(store: JobStore, job_id: str) -> Any:
    """The job's log as a binary file (no symbolic link followed), or ``None`` when it has none yet.

    >>> f = open_log(store, job_id)  # doctest: +SKIP
    """
    try:
        if not store.is_local:
            return store.fs.open(store._p(job_id, LOG), "rb")
        _, fd = store._open_nofollow(job_id, LOG)
        return os.fdopen(fd, "rb")
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RecordError(
                f"job {job_id}: {store.log_path(job_id)} (or its dir) is a symbolic link; links in the jobs dir are "
                "not followed"
            ) from None
        raise


def log_tail_offset(f: Any, lines: int, keep: Any = None, block: int = 1 << 16) -> int:
    """The offset where the last ``lines`` complete lines of ``f`` start (those that ``keep(first_bytes)``
    accepts, when given), found by reading backwards a block at a time: a 1 GB log costs a few blocks.

    >>> import io
    >>> log_tail_offset(io.BytesIO(b"a\\nb\\nc\\npartial"), 2)
    2
    """
    f.seek(0, os.SEEK_END)
    pos = f.tell()
    if lines <= 0:
        return pos
    later = b""  # the first bytes after the block being read (the head of the line that starts in it)
    end_seen = False  # the last newline was found: lines after it are not complete yet
    found = 0
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        buf = f.read(pos - start)
        joined = buf + later
        i = len(buf)
        while (q := buf.rfind(b"\n", 0, i)) >= 0:
            i = q
            if not end_seen:
                end_seen = True
                continue
            if keep is None or keep(joined[q + 1 : q + 1 + _TAG_BYTES]):
                found += 1
                if found == lines:
                    return start + q + 1
        later = joined[:_TAG_BYTES]
        pos = start
    return 0


def iter_log_lines(f: Any, offset: int, keep: Any = None) -> Iterator[tuple[str, int]]:
    """``(line, offset after it)`` for every complete line of ``f`` from ``offset`` on, read ``LOG_CHUNK`` at a
    time (lines longer than ``MAX_LOG_LINE`` come in pieces of that size); ``keep(first_bytes)`` filters."""
    f.seek(offset)
    pending = b""
    while True:
        data = f.read(LOG_CHUNK)
        if not data:
            return
        pending += data
        start = 0
        while (nl := pending.find(b"\n", start)) >= 0:
            raw = pending[start:nl]
            offset += nl + 1 - start
            start = nl + 1
            if keep is None or keep(raw[:_TAG_BYTES]):
                for i in range(0, max(len(raw), 1), MAX_LOG_LINE):  # the end of a runaway line: in pieces too
                    yield raw[i : i + MAX_LOG_LINE].decode("utf-8", "replace"), offset
        pending = pending[start:]
        while len(pending) >= MAX_LOG_LINE:  # a runaway line: hand it out in pieces instead of holding it
            piece, pending = pending[:MAX_LOG_LINE], pending[MAX_LOG_LINE:]
            offset += len(piece)
            if keep is None or keep(piece[:_TAG_BYTES]):
                yield piece.decode("utf-8", "replace"), offset


def stream_log(
    store: JobStore,
    job_id: str,
    *,
    follow: bool = False,
    is_done: Any = None,
    tail: int | None = None,
    keep: Any = None,
    poll: float = 0.1,
) -> Iterator[str]:
    """The job's log lines in constant memory: from the start, or the last ``tail`` lines (of those ``keep``
    accepts); with ``follow``, new lines as they come until ``is_done()`` and the log is drained.

    >>> for line in stream_log(store, job_id, tail=10):  # doctest: +SKIP
    ...     print(line)
    """
    f = None
    offset = 0
    try:
        while True:
            done = bool(is_done()) if follow and is_done is not None else not follow
            if f is None:
                f = open_log(store, job_id)
                if f is not None and tail is not None:
                    offset = log_tail_offset(f, tail, keep)
            got = False
            if f is not None:
                for line, next_offset in iter_log_lines(f, offset, keep):
                    offset = next_offset
                    got = True
                    yield line
            if done:
                return
            if not got:
                time.sleep(poll)
    finally:
        if f is not None:
            f.close()


def delete_job(store: JobStore, job_id: str) -> None:
    """Remove a job's dir (record, log, result) from the store. Whether the job may be removed (it ended) is
    the caller's to decide; a job dir that is a symbolic link is unlinked, its target left alone.

    >>> delete_job(store, job_id)  # doctest: +SKIP
    """
    import shutil

    path = store._p(job_id)
    if not store.is_local:
        store.fs.rm(path, recursive=True)
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    shutil.rmtree(path)  # never follows links inside the dir
