"""Job supervision, written once for every backend: :class:`Supervisor` runs one job, :class:`RecordCluster`
answers ``poll``/``list_jobs``/``logs`` from the job store.

A backend supplies what only it knows: a provider (where hosts run), a log path, the ``owner`` fields of
the record (a pid, a Ray actor's name) and, in :meth:`RecordCluster.owner_gone`, how to tell that a job's
supervisor is gone. The rest -- the PENDING record, the runner, a crash of the runner turned into FAILED
with its reason, the final record written even on a full disk, the provider and the log closed, the log
uploaded to a remote store -- is here::

    job_id = store.new_job(request.name)            # the job's own dir, created exclusively
    sup = Supervisor(store, request, provider, LogSink(store.log_path(job_id)),
                     info=JobInfo(job_id=job_id, name=request.name, status=JobStatus.PENDING),
                     policy=RetryPolicy(), owner={"owner": owner_info()}, label="local")
    sup.start()                                     # PENDING record, then the runner in a thread
    sup.done.wait(60)
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from fray_core._logupload import append_upload
from fray_core._threads import shared as shared_threads
from fray_core.cluster import Cluster
from fray_core.errors import FrayError, RecordError
from fray_core.joblog import LogSink
from fray_core.records import JobStore
from fray_core.request import JobRequest
from fray_core.runner import GangRunner, RetryPolicy, SliceProvider
from fray_core.status import AttemptOutcome, JobId, JobInfo, JobStatus

__all__ = ["LOG_UPLOAD_INTERVAL", "RecordCluster", "Supervisor", "check_picklable", "launch_error"]

LOG_UPLOAD_INTERVAL = 5.0  # seconds between log uploads when the store is remote (gs://...)
START_TIMEOUT = 10.0  # seconds between a waiting supervisor thread's looks at its launch (see _thread_main)
# seconds a final record waits for a write-behind of an earlier state still in flight (see Supervisor.persist);
# a remote store's own calls time out sooner (Ray's KV: 30 s), so this only bounds a store that does not
WRITE_BEHIND_WAIT = 120.0


def check_picklable(request: JobRequest) -> None:
    """Fail in the caller's process, before anything starts, if the entrypoint cannot be shipped.

    >>> from fray_core.types import Entrypoint, JobRequest
    >>> check_picklable(JobRequest(name="ok", entrypoint=Entrypoint(callable=print)))
    """
    import cloudpickle

    ep = request.entrypoint
    try:
        cloudpickle.dumps(ep)
    except Exception as e:
        what = ep.describe()
        raise TypeError(
            f"Entrypoint.callable: {what} (or its function_args) cannot be pickled with cloudpickle, so it "
            f"cannot be shipped to the job's processes: {type(e).__name__}: {e}. Pass a module-level "
            "function and picklable arguments."
        ) from e


class Supervisor:
    """Runs one job: the shared runner over ``provider``, every state change written to ``store``.

    - ``info``: the job's PENDING :class:`JobInfo`; ``owner``: extra record fields saying who supervises it
      (read back by :meth:`RecordCluster.owner_gone`); ``label``: the backend's name in error texts.
    - ``cleanup``: called once the runner returned (or crashed), before the provider is closed (the local
      backend kills what is left of the job's hosts there); ``on_ended``: called last (Ray: the actor exits).
    - ``received_at``: when the job reached this process, by its wall clock (see :class:`GangRunner`); the
      record's ``submitted_at`` is its client's clock, which on a cluster is another machine's.
    - ``ended`` is set once the final record is written (or could not be), ``done`` once everything is released.

    A crash of the runner or the provider ends the job FAILED with the reason (its traceback goes to the
    job's log), never RUNNING forever. A record that cannot be written (full disk, no file descriptors)
    does not stop the job; the final one is written with :meth:`JobStore.write_final`, after the job's
    hosts are released.
    """

    def __init__(
        self,
        store: JobStore,
        request: JobRequest,
        provider: SliceProvider,
        log: LogSink,
        *,
        info: JobInfo,
        policy: RetryPolicy,
        owner: dict[str, Any],
        label: str,
        cleanup: Callable[[], None] | None = None,
        on_ended: Callable[[], None] | None = None,
        received_at: float | None = None,
    ) -> None:
        self.store = store
        self.provider = provider
        self.log = log
        self.owner = owner
        self.label = label
        self.cleanup = cleanup
        self.on_ended = on_ended
        self.ended = threading.Event()
        self.done = threading.Event()
        self.write_error: str | None = None  # why the last record write failed (None: it did not)
        self.runner = GangRunner(
            info.job_id, request, provider, policy=policy, on_change=self.persist, info=info, received_at=received_at
        )
        self.thread: threading.Thread | None = None
        self._go = threading.Event()
        self._abandoned = False
        self._final_written = False
        self._upload_lock = threading.Lock()  # the periodic upload and the final one must not append the same bytes
        self._uploaded = 0  # bytes of the log the remote store's copy has
        self._writes = threading.Condition()  # the write-behind of states that are not final (see persist)
        self._next_record: dict[str, Any] | None = None
        self._writing = False
        self._final_begun = False
        self._late_final: dict[str, Any] | None = None  # see _final_again

    @property
    def job_id(self) -> JobId:
        return self.runner.job_id

    @property
    def info(self) -> JobInfo:
        return self.runner.info

    def persist(self, info: JobInfo) -> None:
        """Write the record (the runner's ``on_change``). A failed write is remembered, not raised: the job
        goes on, and the next change writes it again; a final record that failed is written by :meth:`run`
        once the job's hosts are released (:meth:`JobStore.write_final`).

        To a remote store (Ray's KV, ``gs://``) a state that is not final is written behind, by a thread of
        the job's, and a state that changes while a write is in flight replaces the one waiting (only the
        newest is written): the runner never waits for the store's round trips, and a job whose states
        follow each other within milliseconds (waiting, starting, running) writes one or two records, not
        five. Two readers' views stay in order: the final record waits for the write in flight, and
        nothing is written after it."""
        if not info.status.is_terminal() and not self.store.is_local:
            self._write_behind(self.store.record_of(info, **self.owner))
            return
        if info.status.is_terminal():
            self._settle_writes()
        if info.status.is_terminal() and not self.store.is_local:
            self.upload_log()  # first: whoever sees the job ended sees all of its log (a remote store's copy)
        try:
            self.store.write(info, **self.owner)
        except Exception as e:  # noqa: BLE001 - any failure to record must not stop the job
            self.write_error = f"{type(e).__name__}: {e}"
            return
        self.write_error = None
        if info.status.is_terminal():
            self._final_written = True
            self._final_again(info)
            self.ended.set()

    def _final_again(self, info: JobInfo) -> None:
        """The final record is written; a write behind still in flight (past ``WRITE_BEHIND_WAIT``: a store
        that hangs) would land after it: its writer then writes the final record once more when it is done."""
        with self._writes:
            if self._writing:
                self._late_final = self.store.record_of(info, **self.owner)

    def _write_behind(self, record: dict[str, Any]) -> None:
        """Queue ``record`` (replacing one still waiting) for the job's writer thread; start it if none runs."""
        with self._writes:
            if self._final_begun:
                return  # the final record is being written: an earlier state must not follow it
            self._next_record = record
            if self._writing:
                return
            self._writing = True
        try:
            shared_threads().submit(self._writer, name=f"fray-record-{self.job_id}")
        except RuntimeError:  # no thread to be had: write it here
            self._writer()

    def _writer(self) -> None:
        while True:
            with self._writes:
                record, self._next_record = self._next_record, None
                if record is None:  # nothing newer (never after the final): the final again, if it came first
                    record, self._late_final = self._late_final, None
                if record is None:
                    self._writing = False
                    self._writes.notify_all()
                    return
            try:
                self.store.write_record(self.job_id, record)
            except Exception as e:  # noqa: BLE001 - as persist: remembered, and the next change writes again
                self.write_error = f"{type(e).__name__}: {e}"
            else:
                self.write_error = None

    def _settle_writes(self) -> None:
        """Before the final record: drop a state still waiting, and wait (at most ``WRITE_BEHIND_WAIT``) for
        the write in flight, so that no earlier state lands after the final one."""
        with self._writes:
            self._final_begun = True
            self._next_record = None
            self._writes.wait_for(lambda: not self._writing, timeout=WRITE_BEHIND_WAIT)

    def start(self, record: bool = True) -> None:
        """Run the job in a thread of its own; with ``record``, write the PENDING record first.

        Either both happen or neither: the thread is started first (and waits), so a process that cannot
        start a thread leaves no PENDING record behind; a record that cannot be written stops the thread.
        Raises what failed; the caller then discards the job's dir (:meth:`JobStore.discard`).
        """
        self.thread = threading.Thread(target=self._thread_main, daemon=True, name=f"fray-job-{self.job_id}")
        self.thread.start()
        try:
            if record:
                self.store.write(self.info, **self.owner)
        except BaseException:
            self._abandoned = True
            self._go.set()
            raise
        self._go.set()

    def _thread_main(self) -> None:
        # start() sets _go on every path (recorded, or abandoned when the record failed), after the record
        # write returned: a slow store (gs://) only delays the job, it never runs without its record.
        while not self._go.wait(START_TIMEOUT):
            pass
        if self._abandoned:
            self.log.close()
            self.done.set()
            return
        self.run()

    def run(self) -> None:
        """Run the job to its end in this thread, then release everything (never raises)."""
        info = self.runner.info
        try:
            self.runner.run()
        except BaseException as e:  # a bug in the runner or provider must not leave the job RUNNING
            info.status = JobStatus.FAILED
            info.error = f"internal error in the {self.label} supervisor: {type(e).__name__}: {e}"
            info.finished_at = self.runner.wall()  # the runner's steady wall clock: no negative durations
            self._log_lines("fray", traceback.format_exc())
        finally:
            self._release()

    def _release(self) -> None:
        info = self.runner.info
        for step in (self.cleanup, self.provider.close):
            if step is None:
                continue
            try:
                step()
            except Exception:  # noqa: BLE001 - the final record comes first
                self._log_lines("fray", traceback.format_exc())
        if not info.status.is_terminal():  # cannot happen unless the runner returned early: say so
            info.status = JobStatus.FAILED
            info.error = info.error or (
                f"internal error in the {self.label} supervisor: the runner ended without an outcome"
            )
            info.finished_at = self.runner.wall()  # the runner's steady wall clock: no negative durations
        self.log.close()
        self._settle_writes()
        if not self.store.is_local:  # before the final record: whoever sees the job ended sees all its log
            self.upload_log()
        problem = None
        if self._final_written:
            self.store.drop_reserve(self.job_id)
        else:
            problem = self.store.write_final(info, **self.owner)
            if problem is None:
                self._final_again(info)
        if problem is not None:
            self.write_error = problem
            try:
                print(f"fray: {problem}", file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass
        self.ended.set()
        self.done.set()
        if self.on_ended is not None:
            self.on_ended()

    def _log_lines(self, tag: str, text: str) -> None:
        for line in text.rstrip("\n").splitlines():
            self.log.write(tag, line)

    def upload_log(self) -> None:
        """Send the job's log to a remote store (``gs://``): it is written locally, where the hosts' lines
        arrive, and the store's copy gets only the bytes written since the last upload (never the whole log
        again: that was quadratic in the log's length, see ``fray_core._logupload``)."""
        try:
            with self._upload_lock:
                self._uploaded = append_upload(
                    self.store.fs, self.log.path, self.store.log_path(self.job_id), self._uploaded
                )
        except OSError:
            pass  # the store is unreachable now: the next upload (or the final one) sends these bytes too


def _end_orphan(info: JobInfo, reason: str, now: float | None = None) -> None:
    """End ``info``, whose supervisor is gone, FAILED with ``reason``: an attempt it left open ends then too,
    CANCELLED (its hosts went with their supervisor) with ``reason`` as its cause. Neither retry budget is
    charged, and no attempt says FAILED: the user's code did not fail, and no slice was lost.

    >>> from fray_core.status import Attempt
    >>> info = JobInfo(job_id="j", name="j", status=JobStatus.RUNNING, attempts=[Attempt(index=0, started_at=1.0)])
    >>> _end_orphan(info, "its supervisor is gone", now=5.0)
    >>> info.status.value, info.finished_at, info.attempts[0].outcome.value, info.attempts[0].ended_at
    ('FAILED', 5.0, 'CANCELLED', 5.0)
    """
    now = time.time() if now is None else now
    info.status, info.error = JobStatus.FAILED, reason
    info.pending_reason = None  # what it waited for is moot: it ended
    info.finished_at = info.finished_at or now
    for attempt in info.attempts:
        if attempt.outcome is None:
            attempt.outcome, attempt.ended_at = AttemptOutcome.CANCELLED, attempt.ended_at or info.finished_at
            attempt.cause = attempt.cause or reason


class RecordCluster(Cluster):
    """A :class:`Cluster` whose jobs are known by their records in :attr:`store`: ``poll``, ``list_jobs``
    and ``logs`` are written here; a backend says how to tell that a job's supervisor is gone
    (:meth:`owner_gone`) and may answer for jobs it supervises in this process (:meth:`live_info`).

    >>> class MyCluster(RecordCluster):  # doctest: +SKIP
    ...     def owner_gone(self, info, record):
    ...         return None if my_supervisor_alive(record["owner"]) else "its supervisor died"
    """

    store: JobStore
    #: ``list_jobs`` lists only records of this backend (``None``: every record in the store)
    listed_backend: str | None = None

    def live_info(self, job_id: str) -> JobInfo | None:
        """The state of a job this process supervises (fresher than its record); ``None`` otherwise."""
        return None

    def owner_gone(self, info: JobInfo, record: dict[str, Any]) -> str | None:
        """Why the supervisor of an unfinished job is gone (the job is then FAILED with this text), or
        ``None`` while it lives or cannot be told. Raises :class:`RecordError` for an owner field that
        makes no sense."""
        return None

    def poll(self, job_id: JobId | str) -> JobInfo:
        live = self.live_info(str(job_id))
        if live is not None:
            return live
        info, record = self.store.read_info(str(job_id))  # JSON only: results load when asked for
        return self._checked(info, record)

    def _checked(self, info: JobInfo, record: dict[str, Any]) -> JobInfo:
        """A job whose supervisor is gone is FAILED, whatever its record says."""
        if info.status.is_terminal():
            return info
        reason = self.owner_gone(info, record)
        if reason is None:
            return info
        # the supervisor writes the final record just before it goes
        info, record = self.store.read_info(str(info.job_id))
        if not info.status.is_terminal():
            _end_orphan(info, reason)
            self._record_orphan(info, record)
        return info

    def _record_orphan(self, info: JobInfo, record: dict[str, Any]) -> None:
        """Write the verdict on a job whose supervisor is gone into its record, so that it is terminal on disk
        (one ``finished_at`` for every later reader, the open attempt closed) and nobody has to judge it again.
        Best effort: a reader that may not write the store (another user's job) still answers, from memory."""
        try:
            self.store.write_record(str(info.job_id), {**record, **info.to_json()})
        except (OSError, RecordError, ValueError, TypeError):
            pass

    def list_jobs(self) -> list[JobInfo]:
        """Every job in the store (of :attr:`listed_backend`), oldest first; never unpickles. A job whose
        record cannot be read is listed as UNKNOWN with the reason in ``error`` (and a warning)."""
        out = []
        for info, record in self.store.list_infos():
            if record is None:
                out.append(info)
                continue
            if self.listed_backend is not None and info.backend != self.listed_backend:
                continue
            try:
                live = self.live_info(info.job_id)
                out.append(live if live is not None else self._checked(info, record))
            except (RecordError, KeyError, TypeError, AttributeError, ValueError) as e:
                why = str(e) if isinstance(e, RecordError) else f"record cannot be read: {e}"
                out.append(self.store.unknown(info.job_id, why))
        out.sort(key=lambda i: i.submitted_at)
        return out

    def logs(self, job_id: JobId | str, follow: bool = False) -> Iterator[str]:
        self.store.read(str(job_id))  # unknown ids fail here, before iteration
        return self.store.iter_log(str(job_id), follow, lambda: self.poll(job_id).status.is_terminal())


def launch_error(error: BaseException, store: JobStore | None = None) -> BaseException:
    """What ``launch`` raises when it failed half-way (the caller has discarded the job): no thread could be
    started, or the job could not be recorded, said plainly as a :class:`FrayError`; other errors as they are.

    >>> print(launch_error(RuntimeError("can't start new thread")))
    launch: cannot start a thread (can't start new thread): too many threads or processes; the job was not launched
    """
    if isinstance(error, RuntimeError) and "thread" in str(error):
        return FrayError(
            f"launch: cannot start a thread ({error}): too many threads or processes; the job was not launched"
        )
    if isinstance(error, OSError):
        where = f" in {store.root}" if store is not None else ""
        what = f"{type(error).__name__}: {error}"
        return FrayError(f"launch: cannot record the job{where} ({what}); the job was not launched")
    return error
