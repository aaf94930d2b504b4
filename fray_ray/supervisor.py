"""The supervisor of one job on Ray: a detached, non-preemptible actor that runs fray_core's
:class:`~fray_core.supervisor.Supervisor` (the runner, the record, the log: the same code as the local backend's).

A ``RayCluster`` keeps one supervisor warm (started, idle) and hands it the next job with ``start``, which
runs the runner in a thread and returns at once: starting an actor costs ~0.4 s (a fresh worker process),
which a launch then does not wait for. No task of the launching process is in flight afterwards, so the job
outlives its launcher. The supervisor writes the job record and the log through the job store, takes
``stop`` and log lines from anyone, and removes itself when the job ended. One that is never given a job
removes itself after ``idle_timeout`` seconds (its client also kills it on exit).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import ray

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


def scheduler_key(settings: dict[str, Any]) -> tuple[Any, ...]:
    """What a scheduler client depends on, from a job's (or a warm-up's) settings."""
    return (settings["namespace"], settings["non_preemptible_resource"], tuple(settings["quarantine"]))


__all__ = ["JobSupervisor", "WAIT_GROUP", "WAIT_THREADS", "supervisor_name"]

STANDBY_IDLE_TIMEOUT = 600.0  # seconds a warm supervisor waits for a job before it removes itself
WAIT_GROUP = "wait"  # the actor's concurrency group of ``wait_ended`` calls
WAIT_THREADS = 4  # its threads: more clients waiting at once queue, each call returning within MAX_WAIT_CALL
MAX_WAIT_CALL = 5.0  # seconds one ``wait_ended`` call blocks at most
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


class JobSupervisor:
    """Actor body (wrapped with ``ray.remote`` by the cluster). Methods other than the constructor are
    served concurrently with the running job (a threaded actor)."""

    def __init__(
        self,
        name: str,
        idle_timeout: float = STANDBY_IDLE_TIMEOUT,
        job: tuple[str, bytes, dict[str, Any]] | None = None,
        warm: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.job_id: str | None = None
        self.runner: GangRunner | None = None
        self.supervisor: Supervisor | None = None  # fray_core's, which runs the job
        self._claim = threading.Lock()
        self._claimed = False
        self._stop_requested = threading.Event()
        self._ended = threading.Event()  # set once the job's final record is written
        self._warming: threading.Thread | None = None
        if job is not None:  # a cold start: the job rides on the actor's creation, which Ray delivers
            self.start(*job)  # even when the launching process exits at once
        else:
            threading.Thread(target=self._expire, args=(idle_timeout,), daemon=True, name="fray-standby-expiry").start()
            if warm is not None:
                self._warming = threading.Thread(
                    target=self._warm_up, args=(warm,), daemon=True, name="fray-standby-warm-up"
                )
                self._warming.start()

    def _warm_up(self, warm: dict[str, Any]) -> None:
        """While idle, do what every job's start needs first, off its critical path (measured: ~20 ms per
        job): the job store (its first use imports fsspec) and the connection to the namespace's scheduler
        actor (created here if it does not exist yet). ``warm``: the launching cluster's ``jobs_dir``,
        ``namespace``, ``non_preemptible_resource`` and ``quarantine``; a job with other settings makes its own."""
        try:
            from fray_core.records import JobStore
            from fray_ray.scheduler import SchedulerClient

            _import_job_modules()
            # Ray's actor exit (the supervisor's last step) imports this: ~12-60 ms of CPU that would
            # otherwise compete with the launcher reading the job's result
            import ray.dag.compiled_dag_node  # noqa: F401

            self._warm_store = JobStore(warm["jobs_dir"])
            scheduler = SchedulerClient(warm["namespace"], warm["non_preemptible_resource"], warm["quarantine"])
            scheduler.call("state")
            self._warm_scheduler = (scheduler_key(warm), scheduler)
        except Exception:
            pass  # the job does it itself

    def _expire(self, idle_timeout: float) -> None:
        time.sleep(idle_timeout)
        with self._claim:
            if self._claimed:
                return
            self._claimed = True  # a late start() is refused: the client then starts a fresh supervisor
        ray.get_runtime_context().current_actor.__ray_terminate__.remote()

    def start(self, job_id: str, request_bytes: bytes, settings: dict[str, Any]) -> bool:
        """Take the job and return at once (the launcher waits for this answer); ``False`` when this
        supervisor already had a job or expired."""
        with self._claim:
            if self._claimed:
                return False
            self._claimed = True
            self.job_id = job_id
        # The job's place in the cluster's queue, by the cluster's clock (the scheduler's, as its client read
        # it: ClusterClock), the same for every job; else when it reached this supervisor, by this (the head's)
        # clock. Never the record's submitted_at: its client's wall clock, another machine's.
        queued_at = settings.get("queued_at")
        self.received_at = float(queued_at) if isinstance(queued_at, (int, float)) else time.time()
        threading.Thread(target=self._begin, args=(job_id, request_bytes, settings), daemon=True).start()
        return True

    def _begin(self, job_id: str, request_bytes: bytes, settings: dict[str, Any]) -> None:
        """Start the job and run it. A job that cannot start (the store unreachable from here, its record
        not found, any error before the runner runs) ends FAILED with the reason and this actor exits: never
        a live actor beside a PENDING job."""
        try:
            started = self._prepare(job_id, request_bytes, settings)
        except BaseException as e:
            self._start_failed(job_id, settings, e)
            return
        if started:
            self.supervisor.run()

    def _start_failed(self, job_id: str, settings: dict[str, Any], error: BaseException) -> None:
        """The job could not start: say why where every client looks (the record if the store works from
        here, and Ray's KV store, which ``RayCluster.poll`` reads for a job whose supervisor is gone), exit."""
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
                log = getattr(self, "log", None)
                if log is not None:
                    log.close()
                self.store.write_final(info, **_owner(self.name, settings))
        except Exception:
            pass  # no store or no record here: the KV entry says it
        self._ended.set()
        ray.get_runtime_context().current_actor.__ray_terminate__.remote()

    def _prepare(self, job_id: str, request_bytes: bytes, settings: dict[str, Any]) -> bool:
        """Load the request (this imports the user's modules) and make the runner; ``False`` when the job
        already ended (its request cannot be loaded here)."""
        if self._warming is not None:  # a job that came during the warm-up: finish it rather than do it twice
            self._warming.join(WARM_UP_JOIN)
        import cloudpickle

        from fray_core.joblog import LogSink
        from fray_core.records import JobStore
        from fray_core.runner import RetryPolicy
        from fray_core.supervisor import Supervisor
        from fray_core.types import JobInfo, JobRequest, JobStatus
        from fray_ray._host import HostConfig
        from fray_ray.provider import QUEUE_TTL, RaySliceProvider

        for p in reversed(settings["sys_path"]):
            if p not in sys.path and os.path.isdir(p):
                sys.path.insert(0, p)
        self.settings = settings
        warm_store: JobStore | None = getattr(self, "_warm_store", None)
        self.store = (
            warm_store
            if warm_store is not None and warm_store.root == settings["jobs_dir"]
            else JobStore(settings["jobs_dir"])
        )
        self.store.read(
            job_id
        )  # the client wrote it: not found means this is not the client's store (nothing made here)
        self.store.prepare(job_id)  # the job's dir and log, with the store's permissions
        log_path = (
            self.store.log_path(job_id)
            if self.store.is_local
            else os.path.join(tempfile.mkdtemp(prefix="fray-ray-log-"), "job.log")
        )
        self.log = LogSink(log_path)
        owner = _owner(self.name, settings)
        try:
            request: JobRequest = cloudpickle.loads(request_bytes)
        except Exception as e:  # the user's module is not importable on the cluster
            info = JobInfo.from_json(self.store.read(job_id))
            info.status = JobStatus.FAILED
            info.error = f"the job's request cannot be loaded on the Ray cluster: {type(e).__name__}: {e}"
            info.finished_at = time.time()
            self.log.close()
            self.store.write_final(info, **owner)
            self._ended.set()
            ray.get_runtime_context().current_actor.__ray_terminate__.remote()
            return False
        env = request.environment
        runtime_env: dict[str, Any] = {}  # new clients: none, the host tasks inherit this actor's (the job's code)
        if "runtime_env" not in settings and env is not None and env.pip_packages:
            runtime_env["pip"] = list(env.pip_packages)
        if "runtime_env" not in settings and env is not None and env.workspace:
            runtime_env["working_dir"] = env.workspace
        info = JobInfo.from_json(self.store.read(job_id))
        me = ray.get_runtime_context().current_actor
        host_config = HostConfig(
            sys_path=tuple(settings["sys_path"]),
            cwd=settings["cwd"],
            supervisor=me,
            preemption_probe=settings.get("preemption_probe"),
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
            scheduler=self._scheduler_for(settings),
            submitted_at=self.received_at,
            log=self.log.write,
        )
        self.provider.prepare_entry(request.entrypoint)  # pickled while the slices are being reserved
        self.supervisor = Supervisor(
            self.store, request, self.provider, self.log, info=info, policy=settings["policy"] or RetryPolicy(),
            owner=owner, label="Ray", on_ended=self._exit, received_at=min(self.received_at, time.time()),
        )  # fmt: skip
        self.supervisor.ended = self._ended  # the event wait_ended() serves: set once the final record is written
        self.runner = self.supervisor.runner
        if self._stop_requested.is_set():  # a terminate that came before the runner existed
            self.runner.stop()
        if not self.store.is_local:
            threading.Thread(target=self.supervisor.upload_loop, daemon=True).start()
        return True

    def _scheduler_for(self, settings: dict[str, Any]) -> SchedulerClient | None:
        """The scheduler client the warm-up connected, if it was made for these settings."""
        warm = getattr(self, "_warm_scheduler", None)
        key = scheduler_key({"quarantine": (2, 3600.0, 1800.0), **settings})
        return warm[1] if warm is not None and warm[0] == key else None

    def _exit(self) -> None:
        """The job ended and everything of it is released: this actor goes away (with the job's local copy
        of its log when its store is elsewhere: the store has it all by now)."""
        if not self.store.is_local:
            shutil.rmtree(os.path.dirname(self.log.path), ignore_errors=True)
        ray.get_runtime_context().current_actor.__ray_terminate__.remote()

    # ---------------------------------------------------------------------------- called by others

    def stop(self) -> bool:
        """Terminate the job: the runner cancels every host and releases every slice."""
        self._stop_requested.set()
        if self.runner is not None:
            self.runner.stop()
        return True

    def host_started(self, tag: str, process: HostProcess | None = None) -> None:
        """A host's process reports in before it runs the user's code (the job is RUNNING once all did),
        saying where it runs (a graceful stop signals it there)."""
        provider = getattr(self, "provider", None)
        if provider is not None:
            provider.mark_started(tag, process)

    def append_log(self, tag: str, lines: list[str]) -> None:
        for line in lines:
            self.log.write(tag, line)
        provider = getattr(self, "provider", None)
        if provider is not None:
            provider.saw_log(tag, lines)  # a stalled host's stacks arriving (see RaySliceProvider.dump_stacks)

    @ray.method(concurrency_group=WAIT_GROUP)
    def wait_ended(self, timeout: float) -> bool:
        """Block until the job's final record is written (True) or ``timeout`` seconds (at most
        ``MAX_WAIT_CALL``) pass (False): how a client's ``wait`` learns of the end without polling. Served
        by threads of their own, so waiting clients never hold up ``stop`` or the hosts' reports."""
        return self._ended.wait(max(0.0, min(timeout, MAX_WAIT_CALL)))

    def ping(self) -> str:
        return self.job_id
