"""The supervisor process of a client's jobs on Ray: a detached, non-preemptible actor that runs fray_core's
:class:`~fray_core.supervisor.Supervisor` (the runner, the record, the log: the same code as the local backend's)
for each job it was given, each in a thread of its own.

A ``RayCluster`` gives its jobs to one supervisor process (``start`` returns at once), as long as the process
takes them: at most ``JOBS_PER_SUPERVISOR`` jobs in its life, and at most ``HOSTS_PER_SUPERVISOR`` hosts of
running jobs (each host sends it log batches) unless it has none. Then the client starts the next one. One
process per job cost the head ~100 MB and ~1.5 CPU-seconds per job (issue 29, bench/NOTES.md); shared,
a job's share is a few MB and a launch after the first starts no process. Jobs share a process only when they
carry the same code (``runtime_env``): a job's request is unpickled there, which imports the user's modules.
The lifetime cap bounds what those imports and any leak of a job's code can accumulate.

No task of the launching process is in flight after ``launch``, so the job outlives its launcher. The process
writes each job's record and log through the job store and takes ``stop`` and log lines from anyone. It removes
itself when its client retired it (``retire``: the client closed, or moved on) and its last job ended, and
otherwise after ``idle_timeout`` seconds without a job (``IDLE_AFTER_JOBS``, 60 s, once it had one). Killed
(``kill -9``, its node lost), every job it ran is reported FAILED by the next poll of any client
(``RayCluster.owner_gone``): the record names the process, and Ray removes the jobs' host tasks and placement
groups with it (it owns them).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import ray

from fray_ray._notices import BOARD

# Only ray and the standard library at import: every process that unpickles a handle of this actor (each
# host task gets one, to report in and send its log) imports this module to load the class, and the
# runner, the job store and the provider below cost a host ~70 ms of CPU at start-up (bench/NOTES.md).
# The supervisor imports them when it starts its job, or while it waits as a warm standby.
if TYPE_CHECKING:
    from fray_core.records import JobStore
    from fray_core.runner import GangRunner
    from fray_core.supervisor import Supervisor
    from fray_ray._host import HostProcess
    from fray_ray.scheduler import SchedulerClient


def _import_job_modules() -> None:
    """Import what starting a job needs (see the note at this module's imports)."""
    import fray_core.records  # noqa: F401
    import fray_core.runner  # noqa: F401
    import fray_core.supervisor  # noqa: F401
    import fray_core.types  # noqa: F401
    import fray_ray.provider  # noqa: F401


def _job_threads() -> Any:
    """The pool of the jobs' threads: a thread whose job ended takes the next job (a thread start under a
    busy GIL took milliseconds, issue 29; ``fray_core._threads``): the process's one shared pool."""
    from fray_core._threads import shared

    return shared()


def scheduler_key(settings: dict[str, Any]) -> tuple[Any, ...]:
    """What a scheduler client depends on, from a job's (or a warm-up's) settings."""
    return (settings["namespace"], settings["non_preemptible_resource"], tuple(settings["quarantine"]))


__all__ = [
    "JobSupervisor",
    "JOBS_PER_SUPERVISOR",
    "HOSTS_PER_SUPERVISOR",
    "NOTICE_GROUP",
    "WAIT_GROUP",
    "WAIT_THREADS",
    "supervisor_name",
]

STANDBY_IDLE_TIMEOUT = 600.0  # seconds a supervisor that never had a job waits for one before it removes itself
# ... and one whose jobs all ended: its client may have exited without retiring it (a `fray launch` does not
# wait for a supervisor still starting to hear it), and an idle process costs the head ~100 MB
IDLE_AFTER_JOBS = 60.0
# Jobs one supervisor process takes in its life: its memory (~100 MB, bench/NOTES.md) shared by many, and a
# bound on what the jobs' code (imported here when a request is unpickled; it never runs here) can leave behind.
# 16 until 2026-11-28: 200 small jobs then started 13 supervisors (~1.5 CPU-s each on the head) while their jobs
# waited: 26 s against 17.8 s with one (bench/NOTES.md); 256 until later that day: the next supervisor (the
# spare, started at half) then started in the middle of a burst of 200 after 60 others, ~1.7 CPU-s of the
# head's (10.5 s against 8.4 s). How many run here at once HOSTS_PER_SUPERVISOR bounds.
JOBS_PER_SUPERVISOR = 1024
# Hosts of running jobs one supervisor process takes more jobs beside (each host sends it up to 5 log batches
# a second): a job larger than that gets a process of its own.
HOSTS_PER_SUPERVISOR = 512
WAIT_GROUP = "wait"  # the actor's concurrency group of ``wait_ended`` calls
NOTICE_GROUP = "notice"  # the actor's concurrency group of ``notice_board`` calls: one waits at a time
WAIT_THREADS = 4  # its threads: more clients waiting at once queue, each call returning within MAX_WAIT_CALL
# (a client waits on all its jobs of one supervisor with one call)
MAX_WAIT_CALL = 5.0  # seconds one ``wait_ended`` call blocks at most
PIN_RENEW = 0.4  # a job's own package is pinned again after this share of a pin's life (JobSupervisor.pin)
WARM_UP_JOIN = 10.0  # seconds a job that came during a standby's warm-up waits for it before going on
SUPERVISOR_PREFIX = "fray-supervisor-"


def start_error_key(job_id: str) -> bytes:
    """The Ray KV key (namespace: the job's) under which a supervisor that could not start its job says why."""
    return f"fray:start-error:{job_id}".encode()


def launching_key(job_id: str) -> bytes:
    """The Ray KV key (namespace: the job's) that says the job's ``launch`` has not created its supervisor
    yet: a poll then does not call the supervisor gone (no clock of another machine involved)."""
    return f"fray:launching:{job_id}".encode()


def _owner(actor: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The record's ``owner`` field: the supervising actor, and the cluster the job runs on (for clients that
    know only the record: ``fray logs/stop/status ID`` with no flags)."""
    owner = {"ray_actor": actor, "namespace": settings["namespace"]}
    if settings.get("address"):
        owner.update(address=settings["address"], cluster=settings.get("cluster", ""))
    return {"owner": owner}


def supervisor_name() -> str:
    """A fresh actor name; the job record's ``owner.ray_actor`` maps a job to its supervisor."""
    return f"{SUPERVISOR_PREFIX}{uuid.uuid4().hex[:16]}"


class _Ended(threading.Event):
    """A job's "final record written" event that also wakes the process's waiters (``wait_ended``)."""

    def __init__(self, wake: Any) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake()


class _Job:
    """One job of a supervisor process: its runner (fray_core's :class:`Supervisor`), record and log."""

    def __init__(self, process: JobSupervisor, job_id: str, settings: dict[str, Any]) -> None:
        self.process = process
        self.job_id = job_id
        self.hosts = _job_hosts(settings)
        self.runner: GangRunner | None = None
        self.supervisor: Supervisor | None = None
        self.provider: Any = None
        self.log: Any = None
        self.store: JobStore | None = None
        self.stop_requested = threading.Event()
        self.ended = _Ended(process._wake)  # set once the job's final record is written
        self.code_uri: str | None = None  # its own package, when it is not this process's (see _prepare)
        # The job's place in the cluster's queue, by the cluster's clock (the scheduler's, as its client read
        # it: ClusterClock), the same for every job; else when it reached this supervisor, by this (the head's)
        # clock. Never the record's submitted_at: its client's wall clock, another machine's.
        queued_at = settings.get("queued_at")
        self.received_at = float(queued_at) if isinstance(queued_at, (int, float)) else time.time()

    def begin(self, request_bytes: bytes, settings: dict[str, Any]) -> None:
        """Start the job and run it (its own thread). A job that cannot start (the store unreachable from
        here, its record not found, any error before the runner runs) ends FAILED with the reason: never a
        PENDING job in a live supervisor that does not run it."""
        try:
            self._unmark(settings)
            try:
                started = self._prepare(request_bytes, settings)
            except BaseException as e:
                self._start_failed(settings, e)
                return
            if started:
                self.supervisor.run()  # never raises; its on_ended is self.finished
        finally:
            self.finished()  # idempotent: the process forgets the job (and exits when that was its last)

    def _unmark(self, settings: dict[str, Any]) -> None:
        """Remove the job's launching marker: it reached its supervisor (see ``RayCluster.owner_gone``)."""
        try:
            from ray.experimental import internal_kv

            internal_kv._internal_kv_del(launching_key(self.job_id), namespace=settings.get("namespace", "fray"))
        except Exception:
            pass  # a poll past the marker's grace asks this process (ping) instead

    def _start_failed(self, settings: dict[str, Any], error: BaseException) -> None:
        """The job could not start: say why where every client looks (the record if the store works from
        here, and Ray's KV store, which ``RayCluster.poll`` reads for a job whose supervisor is gone)."""
        job_id = self.job_id
        reason = (
            f"the job could not start on the Ray cluster: {type(error).__name__}: {error} (job store "
            f"{settings.get('jobs_dir')!r}, as the cluster's head sees it)"
        )
        try:
            from ray.experimental import internal_kv

            internal_kv._internal_kv_put(
                start_error_key(job_id), reason.encode(), overwrite=True, namespace=settings.get("namespace", "fray")
            )
        except Exception:
            pass  # the client calls the supervisor gone after its grace instead
        try:
            from fray_core.types import JobInfo, JobStatus

            info = JobInfo.from_json(self.store.read(job_id))
            if not info.status.is_terminal():
                info.status, info.error, info.finished_at = JobStatus.FAILED, reason, time.time()
                if self.log is not None:
                    self.log.close()
                self.store.write_final(info, **_owner(self.process.name, settings))
        except Exception:
            pass  # no store or no record here: the KV entry says it
        self.ended.set()

    def _prepare(self, request_bytes: bytes, settings: dict[str, Any]) -> bool:
        """Load the request (this imports the user's modules) and make the runner; ``False`` when the job
        already ended (its request cannot be loaded here)."""
        import cloudpickle

        from fray_core.joblog import LogSink
        from fray_core.runner import RetryPolicy
        from fray_core.supervisor import Supervisor
        from fray_core.types import JobInfo, JobRequest, JobStatus
        from fray_ray._host import HostConfig
        from fray_ray.kvfs import INLINE as KV_INLINE
        from fray_ray.provider import QUEUE_TTL, RaySliceProvider

        job_id = self.job_id
        for p in reversed(settings["sys_path"]):
            if p not in sys.path and os.path.isdir(p):
                sys.path.insert(0, p)
        self.store = self.process.store_for(settings["jobs_dir"])
        # The record the client wrote. In the cluster's own store (Ray's KV: ``ray-kv://`` names this GCS) it
        # came with the job, and is not read back (issue 29: a GCS call a job); its first rewrite is one call
        # too. Elsewhere (a path, a bucket) it is read: not found means this is not the client's store.
        record = settings.get("record")
        assume = getattr(self.store.fs, "assume_inline", None)
        if assume is not None and isinstance(record, dict) and record.get("job_id") == job_id:
            size = settings.get("record_size")
            if isinstance(size, int) and size <= KV_INLINE:  # as the client wrote it: inline, no chunks
                assume(self.store.record_path(job_id))
        else:
            record = self.store.read(job_id)
        self.store.prepare(job_id)  # the job's dir and log, with the store's permissions
        log_path = (
            self.store.log_path(job_id)
            if self.store.is_local
            else os.path.join(tempfile.mkdtemp(prefix="fray-ray-log-"), "job.log")
        )
        self.log = LogSink(log_path)
        owner = _owner(self.process.name, settings)
        try:
            request: JobRequest = cloudpickle.loads(request_bytes)
        except Exception as e:  # the user's module is not importable on the cluster
            info = JobInfo.from_json(self.store.read(job_id))
            info.status = JobStatus.FAILED
            info.error = f"the job's request cannot be loaded on the Ray cluster: {type(e).__name__}: {e}"
            info.finished_at = time.time()
            self.log.close()
            self.store.write_final(info, **owner)
            self.ended.set()
            return False
        env = request.environment
        runtime_env: dict[str, Any] = {}  # new clients: none, the host tasks inherit this actor's (the job's code)
        job_dir = (settings.get("runtime_env") or {}).get("working_dir")
        if job_dir and job_dir != self.process.own_working_dir:
            # A package that differs from this process's only in files no import reads (a log or data beside
            # the script; fray_ray.code.Shipped.same_code): the hosts get the job's own, and it stays in the
            # GCS while the job lives (Ray keeps a package only while a job or actor's runtime_env names it,
            # or for a while after its upload: see pin)
            runtime_env["working_dir"] = self.code_uri = job_dir
            self.process.pin(job_dir)
        if "runtime_env" not in settings and env is not None and env.pip_packages:
            runtime_env["pip"] = list(env.pip_packages)
        if "runtime_env" not in settings and env is not None and env.workspace:
            runtime_env["working_dir"] = env.workspace
        info = JobInfo.from_json(record)  # read once: nobody but this process writes it once it took the job
        info.pending_reason = None  # the client's "waiting for its supervisor": this one has it now
        host_config = HostConfig(
            sys_path=tuple(settings["sys_path"]),
            cwd=settings["cwd"],
            supervisor=ray.get_runtime_context().current_actor,
            preemption_probe=settings.get("preemption_probe"),
            job_id=job_id,
        )
        self.provider = RaySliceProvider(
            job_id,
            host_config,
            runtime_env=runtime_env,
            non_preemptible_resource=settings["non_preemptible_resource"],
            autoscaling=settings.get("autoscaling", False),
            non_preemptible_tpu_label=settings.get("non_preemptible_tpu_label"),
            namespace=settings["namespace"],
            quarantine=settings.get("quarantine", (2, 3600.0, 1800.0)),
            queue_ttl=settings.get("queue_ttl", QUEUE_TTL),
            scheduler=self.process.scheduler_for(settings),
            submitted_at=self.received_at,
            log=self.log.write,
            arrivals=self.process.arrivals,
        )
        self.provider.prepare_entry(request.entrypoint)  # pickled while the slices are being reserved
        self.supervisor = Supervisor(
            self.store, request, self.provider, self.log, info=info, policy=settings["policy"] or RetryPolicy(),
            owner=owner, label="Ray", on_ended=self.finished, received_at=min(self.received_at, time.time()),
        )  # fmt: skip
        self.supervisor.ended = self.ended  # the event wait_ended() serves: set once the final record is written
        self.runner = self.supervisor.runner
        if self.stop_requested.is_set():  # a stop that came before the runner existed
            self.runner.stop()
        if not self.store.is_local:
            self.process.upload_logs()
        return True

    def finished(self) -> None:
        """The job ended and everything of it is released: drop the job's local copy of its log when its
        store is elsewhere (the store has it all by now), and let the process forget it."""
        if self.store is not None and not self.store.is_local and self.log is not None:
            shutil.rmtree(os.path.dirname(self.log.path), ignore_errors=True)
        self.process.job_done(self.job_id)

    def stop(self) -> None:
        self.stop_requested.set()
        if self.runner is not None:
            self.runner.stop()


def _job_hosts(settings: dict[str, Any]) -> int:
    """The hosts a job runs (its client counts them: ``settings["hosts"]``), at least 1."""
    try:
        return max(1, int(settings.get("hosts", 1)))
    except (TypeError, ValueError):
        return 1


def _pin_package(uri: str, seconds: int) -> None:
    """Pin a runtime_env package in the GCS for ``seconds`` (best effort: a failed pin is tried again at
    the next round, well before the last one lapses)."""
    try:
        from ray.experimental import internal_kv

        internal_kv._pin_runtime_env_uri(uri, expiration_s=seconds)
    except Exception:
        pass


class JobSupervisor:
    """Actor body (wrapped with ``ray.remote`` by the cluster): the supervisor process of up to
    ``max_jobs`` jobs in its life. Methods other than the constructor are served concurrently with the
    running jobs (a threaded actor); the ones for a job take its id first."""

    def __init__(
        self,
        name: str,
        idle_timeout: float = STANDBY_IDLE_TIMEOUT,
        job: tuple[str, bytes, dict[str, Any]] | None = None,
        warm: dict[str, Any] | None = None,
        max_jobs: int = JOBS_PER_SUPERVISOR,
    ) -> None:
        self.name = name
        self.max_jobs = max_jobs  # jobs it takes in its life
        self.jobs: dict[str, _Job] = {}  # the jobs running here, by id
        self.taken = 0  # jobs taken in this process's life
        self.hosts = 0  # hosts of the jobs running here
        self.idle_timeout = idle_timeout
        self._lock = threading.Condition()  # guards the above; notified when a job starts or ends
        from fray_ray.scheduler import ArrivalOrder

        # its jobs ask the cluster's scheduler for the first time in the order they came (launch order)
        self.arrivals = ArrivalOrder()
        # notified when a job's final record is written (wait_ended): its own, because every job's end wakes
        # every waiter, and a lock held by hundreds of job threads became a convoy under a busy GIL (issue 29)
        self._ended_cv = threading.Condition()
        self._retired = False  # takes no more jobs: exits when its last job ended
        self._closing = False  # exiting
        self._idle_since = time.monotonic()
        self._stores: dict[str, JobStore] = {}
        self._warm_scheduler: tuple[tuple[Any, ...], SchedulerClient] | None = None
        self._warming: threading.Thread | None = None
        self._uploader: threading.Thread | None = None  # see upload_logs
        # the package this process was started with (its runtime_env's working_dir), and the other packages
        # of its jobs it keeps in the GCS (uri -> jobs; see pin)
        self.own_working_dir: str | None = (ray.get_runtime_context().runtime_env or {}).get("working_dir")
        self._pins: dict[str, int] = {}
        self._pinner: threading.Thread | None = None
        from fray_ray.code import ray_pin_s

        self._pin_s = ray_pin_s()  # as long as Ray's own pin of an upload, by Ray's setting in this process
        if job is not None:  # a cold start: the first job rides on the actor's creation, which Ray delivers
            self.start(*job)  # even when the launching process exits at once
        elif warm is not None:
            self._warming = threading.Thread(target=self._warm_up, args=(warm,), daemon=True, name="fray-warm-up")
            self._warming.start()
        threading.Thread(target=self._expire, daemon=True, name="fray-supervisor-expiry").start()
        BOARD.attach(lambda epoch: ray.get_runtime_context().current_actor.notice_board.remote(epoch))

    def _warm_up(self, warm: dict[str, Any]) -> None:
        """While idle, do what every job's start needs first, off its critical path (measured: ~20 ms per
        job): the job store (its first use imports fsspec) and the connection to the namespace's scheduler
        actor (created here if it does not exist yet). ``warm``: the launching cluster's ``jobs_dir``,
        ``namespace``, ``non_preemptible_resource`` and ``quarantine``; a job with other settings makes its own."""
        try:
            from fray_ray.scheduler import SchedulerClient

            _import_job_modules()
            # Ray's actor exit (the supervisor's last step) imports this: ~12-60 ms of CPU that would
            # otherwise compete with the launcher reading the job's result
            import ray.dag.compiled_dag_node  # noqa: F401

            self.store_for(warm["jobs_dir"])
            scheduler = SchedulerClient(warm["namespace"], warm["non_preemptible_resource"], warm["quarantine"])
            scheduler.call("state")
            self._warm_scheduler = (scheduler_key(warm), scheduler)
        except Exception:
            pass  # the job does it itself

    def _expire(self) -> None:
        """Remove this process once it had no job for ``idle_timeout`` seconds (``IDLE_AFTER_JOBS`` at most
        once it had one)."""
        with self._lock:
            while not self._closing:
                idle = time.monotonic() - self._idle_since
                limit = self.idle_timeout if not self.taken else min(self.idle_timeout, IDLE_AFTER_JOBS)
                if not self.jobs and idle >= limit:
                    self._closing = True  # a late start() is refused: the client then starts a fresh supervisor
                    break
                self._lock.wait(limit - idle if not self.jobs else limit)
            else:
                return  # another path is removing it (retired and its last job ended)
        self._terminate()

    @staticmethod
    def _terminate() -> None:
        BOARD.close()  # its waiting call would hold up the actor's exit
        ray.get_runtime_context().current_actor.__ray_terminate__.remote()

    def upload_logs(self) -> None:
        """Make sure the process's log uploader runs: one thread for every job here whose store is remote,
        not one each (a thread start under a busy GIL took milliseconds; 200 small jobs started 800)."""
        if self._uploader is not None:  # the common case, without the process's lock
            return
        with self._lock:
            if self._uploader is not None:
                return
            self._uploader = threading.Thread(target=self._upload_loop, daemon=True, name="fray-log-upload")
        self._uploader.start()

    def _upload_loop(self) -> None:
        """Every ``LOG_UPLOAD_INTERVAL`` seconds, each running job's new log bytes to its store, until exit."""
        from fray_core.supervisor import LOG_UPLOAD_INTERVAL

        while True:
            due = time.monotonic() + LOG_UPLOAD_INTERVAL
            with self._lock:  # notified at every job's start and end: wait out the interval
                while not self._closing and (left := due - time.monotonic()) > 0:
                    self._lock.wait(left)
                if self._closing:
                    return
                jobs = [j.supervisor for j in self.jobs.values() if j.supervisor is not None]
            for sup in jobs:
                if not sup.store.is_local and not sup.done.is_set():
                    try:
                        sup.upload_log()
                    except Exception:  # noqa: BLE001 - one job's store must not stop every job's uploads
                        pass

    def _wake(self) -> None:
        with self._ended_cv:
            self._ended_cv.notify_all()

    def store_for(self, root: str) -> JobStore:
        """The job store at ``root``, one per store for every job of this process."""
        from fray_core.records import JobStore

        store = self._stores.get(root)  # no lock to read: a dict's get is atomic, and the lock is busy
        if store is None:
            store = JobStore(root)
            with self._lock:
                store = self._stores.setdefault(root, store)
        return store

    def scheduler_for(self, settings: dict[str, Any]) -> SchedulerClient | None:
        """The scheduler client the warm-up connected, if it was made for these settings: given to one job
        (a client keeps one call of each kind in flight: each job has its own)."""
        if self._warming is not None:  # a job that came during the warm-up: finish it rather than do it twice
            self._warming.join(WARM_UP_JOIN)
        if self._warm_scheduler is None:  # given away (the common case): no need for the process's lock
            return None
        with self._lock:
            warm = self._warm_scheduler
            if warm is None or warm[0] != scheduler_key({"quarantine": (2, 3600.0, 1800.0), **settings}):
                return None
            self._warm_scheduler = None
            return warm[1]

    def start(self, job_id: str, request_bytes: bytes, settings: dict[str, Any]) -> bool:
        """Take the job and return at once (the launcher waits for this answer); ``False`` when this
        process takes no more jobs (full, retired or exiting): the client then starts the next one."""
        hosts = _job_hosts(settings)
        with self._lock:
            if job_id in self.jobs:
                return True  # the same hand-over again
            full = self.taken >= self.max_jobs or (self.jobs and self.hosts + hosts > HOSTS_PER_SUPERVISOR)
            if full:
                self._retired = True
            if self._closing or self._retired:
                if not self.jobs and not self._closing:
                    self._closing = True
                    self._terminate()
                return False
            self.taken += 1
            self.hosts += hosts
            job = self.jobs[job_id] = _Job(self, job_id, settings)
            self.arrivals.arrived(job_id, job.received_at)
            self._lock.notify_all()
        _job_threads().submit(functools.partial(job.begin, request_bytes, settings), name=f"fray-job-{job_id}")
        return True

    def pin(self, uri: str) -> None:
        """Keep the package ``uri`` in the GCS while a job here uses it (:meth:`unpin`). Ray keeps a package
        while a job or actor's runtime_env names it, and a fresh upload for ``ray_pin_s()`` (10 minutes by
        default) before that; a job whose hosts name it only in their own tasks' runtime_env would lose it
        while it queues or between attempts. So it is pinned for as long as Ray pins an upload, now and again
        after each ``PIN_RENEW`` of that, by one thread of the process."""
        with self._lock:
            self._pins[uri] = self._pins.get(uri, 0) + 1
            start = self._pinner is None
            if start:
                self._pinner = threading.Thread(target=self._pin_loop, daemon=True, name="fray-code-pins")
        _pin_package(uri, self._pin_s)
        if start:
            self._pinner.start()

    def unpin(self, uri: str) -> None:
        """A job that used ``uri`` (:meth:`pin`) ended; its last pin lapses within ``ray_pin_s()``."""
        with self._lock:
            left = self._pins.get(uri, 0) - 1
            if left > 0:
                self._pins[uri] = left
            else:
                self._pins.pop(uri, None)

    def _pin_loop(self) -> None:
        while not self._closing:
            time.sleep(self._pin_s * PIN_RENEW)
            with self._lock:
                uris = list(self._pins)
            for uri in uris:
                _pin_package(uri, self._pin_s)

    def job_done(self, job_id: str) -> None:
        """A job ended (its final record written, everything of it released): forget it; the process
        exits when that was its last job and it takes no more."""
        with self._lock:
            job = self.jobs.pop(job_id, None)
            if job is None:
                return
            self.arrivals.passed(job_id)  # it never asked (it could not start, or ended first)
            if job.code_uri is not None:
                self.unpin(job.code_uri)  # the lock is re-entrant (a Condition's RLock)
            job.ended.set()
            self.hosts -= job.hosts
            self._idle_since = time.monotonic()
            if self.taken >= self.max_jobs:
                self._retired = True
            exit_now = not self.jobs and self._retired and not self._closing
            if exit_now:
                self._closing = True
            self._lock.notify_all()
        if exit_now:
            self._terminate()

    # ---------------------------------------------------------------------------- called by others

    def retire(self) -> bool:
        """Take no more jobs (the client closed or moved on); exit now if no job runs here, else when the
        last one ended."""
        with self._lock:
            self._retired = True
            exit_now = not self.jobs and not self._closing
            if exit_now:
                self._closing = True
            self._lock.notify_all()
        if exit_now:
            self._terminate()
        return True

    def stop(self, job_id: str) -> bool:
        """Terminate the job: the runner cancels every host and releases every slice. ``False``: the job is
        not running here (it ended)."""
        with self._lock:
            job = self.jobs.get(job_id)
        if job is None:
            return False
        job.stop()
        return True

    def host_started(self, job_id: str, tag: str, process: HostProcess | None = None) -> None:
        """A host's process reports in before it runs the user's code (the job is RUNNING once all did),
        saying where it runs (a graceful stop signals it there)."""
        job = self.jobs.get(job_id)
        if job is not None and job.provider is not None:
            job.provider.mark_started(tag, process)

    def append_log(self, job_id: str, tag: str, lines: list[str], ending: bool = False) -> None:
        """A batch of a host's output lines; ``ending``: its last, sent once the user's code is done and
        waited for by the host before its task returns (see ``RaySliceProvider.mark_ending``)."""
        job = self.jobs.get(job_id)
        if job is None or job.log is None:
            return  # the job ended: its log is closed
        for line in lines:
            job.log.write(tag, line)
        if job.provider is not None:
            job.provider.saw_log(tag, lines)  # a stalled host's stacks arriving (see RaySliceProvider.dump_stacks)
            if ending:
                job.provider.mark_ending(tag)

    @ray.method(concurrency_group=NOTICE_GROUP)
    def notice_board(self, epoch: int) -> tuple[dict[str, float], list[Any]]:
        """One epoch of this process's preemption notices (``fray_ray._notices``): returns when a notice is
        posted after ``epoch`` began (or ``ROLL_S`` passed) with every notice still current and, in a list (a
        ref nested, so Ray does not resolve it), the ref of the next epoch's call, which it starts."""
        notices, epoch = BOARD.wait(epoch)
        return notices, [BOARD.next_epoch(epoch)]

    @ray.method(concurrency_group=WAIT_GROUP)
    def wait_ended(self, job_ids: list[str], timeout: float) -> bool:
        """Block until the final record of one of ``job_ids`` is written (True; also for a job not running
        here) or ``timeout`` seconds (at most ``MAX_WAIT_CALL``) pass (False): how a client's ``wait``
        learns of an end without polling. Served by threads of their own, so waiting clients never hold up
        ``stop`` or the hosts' reports."""

        def one_ended() -> bool:
            return any((j := self.jobs.get(job_id)) is None or j.ended.is_set() for job_id in job_ids)

        with self._ended_cv:
            return self._ended_cv.wait_for(one_ended, max(0.0, min(timeout, MAX_WAIT_CALL)))

    def ping(self) -> list[str]:
        """The ids of the jobs running here (empty: an idle supervisor)."""
        with self._lock:
            return list(self.jobs)
