"""``RayCluster``: jobs on a Ray cluster, TPU slices gang-scheduled by the shared fray_core runner.

Example::

    from fray_core import JobRequest, Entrypoint, ResourceConfig, using_cluster
    from fray_ray import RayCluster

    cluster = RayCluster(address="auto")                 # or current_cluster() with FRAY_CLUSTER_SPEC=ray
    job_id = cluster.launch(JobRequest(name="train", entrypoint=Entrypoint(callable=train),
                                       resources=ResourceConfig.with_tpu("v4-16", slice_count=2)))
    cluster.wait(job_id, timeout=3600, raise_on_failure=True).result   # one entry per host

Each job is supervised by a detached actor on a non-preemptible node (the head node by default), so
``launch`` returns at once and the job outlives the launching process; any process connected to the same
cluster can ``poll``/``wait``/``terminate``/``logs`` it by id. Records and logs live in the job store:
by default in the cluster itself (its GCS's key-value store, as Ray's job submission keeps its jobs), or
``jobs_dir`` (a ``gs://`` URL for records that outlive the cluster).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import cloudpickle
import ray

from fray_core.cluster import check_spec_keys
from fray_core.errors import FrayError
from fray_core.records import JobStore, default_jobs_dir
from fray_core.runner import RetryPolicy
from fray_core.scheduling import Quarantine
from fray_core.supervisor import RecordCluster, check_picklable, launch_error
from fray_core.types import JobId, JobInfo, JobRequest, JobStatus, TpuConfig, summarize_request
from fray_ray._host import gce_preempted
from fray_ray.code import Shipped, scan_code, upload_code
from fray_ray.connect import RayConnectionError, check_ray_address, connected_gcs_address, resolve_address
from fray_ray.provider import QUEUE_TTL
from fray_ray.scheduler import ACTOR_RESOURCE
from fray_ray.supervisor import (
    JOBS_PER_SUPERVISOR,
    NOTICE_GROUP,
    WAIT_GROUP,
    WAIT_THREADS,
    JobSupervisor,
    launching_key,
    start_error_key,
    supervisor_name,
)

__all__ = ["RayCluster", "DEFAULT_RAY_POLICY"]

DEFAULT_RAY_POLICY = RetryPolicy(
    backoff_initial=1.0,
    backoff_max=60.0,
    schedule_timeout=600.0,
    poll_interval=0.5,
    cancel_grace=30.0,
    host_start_timeout=600.0,
)
DEFAULT_NAMESPACE = "fray"
TERMINATE_TIMEOUT = 60.0
# ``launch`` writes the PENDING record, then creates the supervisor (named actors are registered with the GCS
# before ``.remote()`` returns): a poller in between must not call the job's supervisor gone. ``launch`` says
# so in Ray's KV store (launching_key) for that window. A marker left by a launcher that died mid-launch is
# trusted for this long, timed by the poller's own clock: never the record's submitted_at (the client's wall
# clock) against the poller's, which are two machines' clocks.
SUPERVISOR_START_GRACE = 30.0
STORE_CHECK_TIMEOUT = 20.0  # seconds launch waits for the head to read the store, once per client and store
# seconds close() and terminate() wait for a hand-over's answer (a supervisor still starting)
HAND_OVER_TIMEOUT = 30.0
# seconds a supervisor Ray has not created yet may take before it is killed and its hand-overs go to a new one,
# and before a poll calls its job's supervisor never started. Past Ray's own runtime_env setup timeout (600 s,
# after which Ray fails the creation itself): a supervisor carries its job's runtime_env (code, pip packages),
# whose set-up on a busy head takes minutes. At 30 s, a supervisor still coming up on a loaded head could be
# killed, and a poll meanwhile called its jobs' supervisor gone (bench/NOTES.md, 2026-11-27).
SUPERVISOR_START_TIMEOUT = 660.0
COLD_START_REASON = "waiting for its supervisor actor"  # the pending reason a cold start writes (see _never_created)
PING_TIMEOUT = 10.0  # seconds a poll waits for a live supervisor to say which jobs it runs
SETTLE_INTERVAL = 1.0  # seconds between the hand-over thread's looks at the deadlines above
# seconds close() waits for its supervisors to hear they take no more jobs: a supervisor still starting would
# hold a `fray launch` at exit for its whole start; one not told goes 60 s after its last job (IDLE_AFTER_JOBS)
RETIRE_TIMEOUT = 1.0
WARM_AFTER_TIMEOUT = 60.0  # seconds a launch waits for its hosts to start before warming the next supervisor anyway
CLOCK_RESYNC = 600.0  # seconds between two readings of the cluster's clock by one client
CLOCK_RETRY = 30.0  # seconds before a client tries again when the cluster's clock could not be read
CLOCK_TIMEOUT = 10.0  # seconds one reading may take (the first may create the scheduler actor)
# seconds between looks at the job record meanwhile: each look is two KV calls on the default store, and a
# queued job's client made 10 a second at 0.2 s, the largest per-job GCS term of a queued job (issue 29)
WARM_AFTER_POLL = 1.0
UNMARK_IDLE = 5.0  # seconds the thread that removes launching markers waits for more before it exits

# Not settable in .options(): the concurrency groups. No task events: a supervisor's calls (a log batch from
# every host several times a second, each client's waits) would fill Ray's task-event buffers and its
# dashboard with Fray's own traffic.
# Threads of a supervisor actor's default group (its hosts' reports and log batches, stop, ping): each call
# returns at once, so a few serve thousands of hosts; 64 made each supervisor ~107 threads (issue 29).
SUPERVISOR_THREADS = 8
# The notice group: one call waits at a time (the next epoch's starts as the last returns: 2 threads).
_Supervisor = ray.remote(concurrency_groups={WAIT_GROUP: WAIT_THREADS, NOTICE_GROUP: 2}, enable_task_events=False)(
    JobSupervisor
)


@attrs.define
class _HandOver:
    """A job given to a supervisor whose answer has not come yet (see ``RayCluster._hand_over``)."""

    name: str  # the supervisor's actor name
    actor: Any
    info: JobInfo  # the job's PENDING record
    job: tuple[str, bytes, dict[str, Any]]  # what ``start`` was called with
    since: float  # when it was handed over (this process's monotonic clock)


class ClusterClock:
    """This client's reading of the cluster's clock, for the one thing compared across clients: a job's
    place in the cluster's line (``queued_at``). ``read()`` returns the cluster's wall clock (its scheduler
    actor's) or ``None``; it is called once, again every ``resync`` seconds, and carried forward meanwhile on
    this machine's monotonic clock, so a launch costs no round trip and one client's jobs keep the order it
    launched them in (the times it gives only go up), whichever of their supervisors starts first. ``now()``
    is ``None`` while the cluster's clock cannot be read (the job's supervisor then stamps it on arrival).

    Why not the supervisor's own clock on arrival: two jobs launched one after the other start two
    supervisor processes at once, and the second may be up first (seen in CI: a job queued behind the one
    launched after it).

    >>> ticks = iter([0.0, 0.2, 5.0])
    >>> clock = ClusterClock(lambda: 1000.0, mono=lambda: next(ticks))
    >>> clock.now(), clock.now()  # the reading took 0.2 s: the cluster read 1000.0 at 0.1
    (1000.1, 1004.9)
    """

    def __init__(
        self,
        read: Callable[[], float | None],
        *,
        resync: float = CLOCK_RESYNC,
        retry: float = CLOCK_RETRY,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read, self._resync, self._retry, self._mono = read, resync, retry, mono
        self._offset: float | None = None  # cluster time - our monotonic time
        self._synced = 0.0  # our monotonic time of the last reading
        self._next_try = float("-inf")
        self._last = float("-inf")  # the last time given: every later one is larger
        self._lock = threading.Lock()

    def now(self) -> float | None:
        with self._lock:
            now = self._mono()
            stale = self._offset is None or now - self._synced >= self._resync
            if stale and now >= self._next_try:
                before = now
                try:
                    cluster = self._read()
                except Exception:
                    cluster = None
                now = self._mono()
                if cluster is not None:
                    self._offset, self._synced = cluster - (before + now) / 2, now
                else:
                    self._next_try = now + self._retry
            if self._offset is None:
                return None
            t = max(self._offset + now, self._last + 1e-6)
            self._last = t
            return t


class RayCluster(RecordCluster):
    """The Ray backend.

    - ``address``: passed to ``ray.init`` when this process is not connected yet (``"auto"``: the local
      cluster started with ``ray start``).
    - ``namespace``: where the job supervisors live (default ``"fray"``); processes that share it see
      each other's jobs.
    - ``jobs_dir``: the job store. Default: ``$FRAY_JOBS_DIR`` when set, else the cluster's own store in
      Ray's GCS (``ray-kv://GCS/NAMESPACE``, see :mod:`fray_ray.kvfs`: records and logs every machine that
      reaches the cluster reads; files up to 64 MiB). A ``gs://`` URL keeps records past the cluster's life.
    - ``retry_policy``: backoff and deadlines of the shared runner.
    - ``non_preemptible_resource``: a resource only non-preemptible nodes have; supervisors and
      ``preemptible=False`` work request a sliver of it (default: Ray's head-node marker).
    - ``preemption_probe``: run on a host whose work failed; True means the VM was preempted (default:
      GCE metadata, 0.5 s timeout, False off GCE). Must be picklable.
    - ``non_preemptible_tpu_label``: ``"KEY=VALUE"``, the node label every host of a non-preemptible
      (on-demand or reserved) TPU slice carries, e.g. ``"fray.io/capacity=reserved"``. A TPU request with
      ``preemptible=False`` is placed only on slices whose worker-0 host has it; without it configured,
      such a request fails at ``launch`` (it is never silently run on preemptible slices).
    - ``autoscaling``: when True, a request for more slices than the cluster has waits (up to the
      runner's schedule timeout) instead of failing at once.
    - ``quarantine_after``, ``quarantine_window``, ``quarantine_for``: bad-host quarantine, as on the local
      fleet: after ``quarantine_after`` device failures (a busy TPU device at start) of one host within
      ``quarantine_window`` seconds, its slice is handed to no job for ``quarantine_for`` seconds. Kept by
      the namespace's scheduler actor, which takes the values of the first client that needs it.
    - ``queue_ttl``: jobs of the cluster wait for TPU slices in one first-come-first-served queue (the
      namespace's scheduler actor); a job keeps its place while its supervisor keeps asking, and for
      ``queue_ttl`` seconds after it stops (a supervisor killed hard). A job that ends leaves at once.
    - ``warm_supervisor``: a client's jobs share a supervisor process (up to ``JOBS_PER_SUPERVISOR``; see
      :mod:`fray_ray.supervisor`); once it took half of them, start the next one (or, when there is none,
      once the launched job's hosts all run), so the launch after its last does not pay an actor start
      (~0.4 s) before its slices are reserved. ``close()`` (also called at interpreter exit) retires the
      client's supervisors: they take no more jobs and go away when their last job ended; one that no client
      retires goes away 60 s after its last job (10 minutes for one that never had a job).
    """

    jobs_outlive_client = True  # the supervisor is a detached actor: `launch_detached` just launches
    listed_backend = "ray"  # list_jobs: the store may hold other backends' jobs too
    session_transport = "tcp"  # held sessions (Cluster.hold): the host tasks connect back over TCP

    def __init__(
        self,
        address: str | None = "auto",
        namespace: str | None = None,
        jobs_dir: str | None = None,
        retry_policy: RetryPolicy | None = None,
        non_preemptible_resource: str = "node:__internal_head__",
        preemption_probe: Callable[[], bool] | None = gce_preempted,
        autoscaling: bool = False,
        warm_supervisor: bool = True,
        non_preemptible_tpu_label: str | None = None,
        quarantine_after: int = 2,
        quarantine_window: float = 3600.0,
        quarantine_for: float = 1800.0,
        queue_ttl: float = QUEUE_TTL,
    ) -> None:
        Quarantine(quarantine_after, quarantine_window, quarantine_for, name="RayCluster")  # validates them
        self.quarantine = (quarantine_after, float(quarantine_window), float(quarantine_for))
        if isinstance(queue_ttl, bool) or not isinstance(queue_ttl, (int, float)) or not 0 < queue_ttl < float("inf"):
            raise ValueError(f"RayCluster: queue_ttl must be seconds > 0, got {queue_ttl!r}")
        self.queue_ttl = float(queue_ttl)
        if non_preemptible_tpu_label is not None:
            key, sep, value = non_preemptible_tpu_label.partition("=")
            if not (key.strip() and sep and value.strip()):
                raise ValueError(
                    f"RayCluster.non_preemptible_tpu_label: {non_preemptible_tpu_label!r} is not "
                    f"'KEY=VALUE' (a node label)"
                )
        self.non_preemptible_tpu_label = non_preemptible_tpu_label
        if not ray.is_initialized():
            _connect(address)
        self.address = address
        #: The cluster's GCS address as this process is connected to it: kept in every job record, so any
        #: client (a CLI with no flags after Ctrl-C) finds the cluster a job ran on.
        self.gcs_address = connected_gcs_address() or resolve_address(address) or ""
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.policy = retry_policy or DEFAULT_RAY_POLICY
        self.non_preemptible_resource = non_preemptible_resource
        self.preemption_probe = preemption_probe
        self.autoscaling = autoscaling
        self.store = JobStore(jobs_dir or self._default_store())
        self.spec = "ray" if address in (None, "auto") else f"ray?address={address}"
        #: The spec that reaches this cluster from anywhere (its real address), as job records keep it.
        self.record_spec = f"ray?address={self.gcs_address}" if self.gcs_address else self.spec
        if self.namespace != DEFAULT_NAMESPACE:
            self.record_spec += f"{'&' if '?' in self.record_spec else '?'}namespace={self.namespace}"
        self.warm_supervisor = warm_supervisor
        # The supervisor process this client gives its next job to (name, handle, jobs given), see launch
        self._standby: tuple[str, Any, int] | None = None
        self._standby_lock = threading.Lock()
        self._closed = threading.Event()  # set by close(): no new warm supervisor after it
        self._waitable: dict[str, Any] = {}  # job id -> its supervisor actor, for wait (see _block)
        self._store_ok = False  # the head has read this store (see _check_store)
        self._standby_shipped = Shipped()  # the code the standby supervisor was started with
        # The next supervisor, started once the current one took half its jobs, so that the launch after its
        # last does not wait for a process to start (name, handle, the code it was started with)
        self._spare: tuple[str, Any, Shipped] | None = None
        self._last_shipped = Shipped()  # the last launched job's code
        self._create_seen: dict[str, float] = {}  # job id -> when (monotonic, here) a poll first saw it waiting
        # for the supervisor its launch created (see _never_created)
        self._launch_seen: dict[str, float] = {}  # job id -> when (monotonic, here) a poll first saw it launching
        self._unmark_queue: list[str] = []  # launching markers to remove (see _unmark_later)
        self._unmarker: threading.Thread | None = None
        self._unmark_wake = threading.Event()
        self._handovers: dict[Any, _HandOver] = {}  # unanswered hand-overs, by the ref of their start call
        self._handover_ids: dict[str, Any] = {}  # job id -> that ref
        self._answered: set[str] = set()  # supervisors that took a job from this client (they are up)
        # jobs a supervisor refused, until their cold start wrote the new owner: their record still names
        # the refusing (maybe gone) supervisor, which a poll meanwhile must not read as the job's end
        self._taking_back: set[str] = set()
        self._taken_back = threading.Condition(self._standby_lock)  # notified as each take-back ends
        self._settler: threading.Thread | None = None
        #: This client's wall clock: it stamps ``submitted_at`` (what users read), which nothing on the
        #: cluster compares with its own clocks (tests skew it: ``cluster.wall = FakeClock().wall``).
        self.wall: Callable[[], float] = time.time
        self.clock = ClusterClock(self._read_cluster_clock)
        atexit.register(_close_at_exit, weakref.ref(self))

    def __repr__(self) -> str:
        return f"RayCluster(address={self.address!r}, namespace={self.namespace!r}, jobs_dir={self.store.root!r})"

    def _default_store(self) -> str:
        """The store of a client that named none: ``$FRAY_JOBS_DIR`` when set, else the cluster's own
        (``ray-kv://GCS/NAMESPACE``, :mod:`fray_ray.kvfs`), which every machine reaching the cluster reaches;
        a local dir only without a GCS address (Ray client mode)."""
        if os.environ.get("FRAY_JOBS_DIR") or not self.gcs_address:
            return default_jobs_dir()
        from fray_ray.kvfs import kv_root  # imports fsspec, which the store imports anyway

        return kv_root(self.gcs_address, self.namespace)

    # ---------------------------------------------------------------------------------------- launch

    def launch(self, request: JobRequest) -> JobId:
        if not isinstance(request, JobRequest):
            raise TypeError(f"launch: expected a JobRequest, got {request!r}")
        try:
            request_bytes = cloudpickle.dumps(request)  # once: pickling a script's function by value takes ms
        except Exception:
            check_picklable(request)  # names the entrypoint when it is what cannot be pickled
            raise
        if (
            isinstance(request.resources.device, TpuConfig)
            and not request.resources.preemptible
            and self.non_preemptible_tpu_label is None
        ):
            raise ValueError(
                f"ResourceConfig.preemptible: False for a {request.resources.device.type} request, but "
                f"this Ray cluster has no "
                "non-preemptible TPU capacity configured: pass "
                "RayCluster(non_preemptible_tpu_label='KEY=VALUE') naming the node "
                "label of on-demand/reserved slices, or use preemptible=True"
            )
        code_env, scanned = scan_code(request)  # the user's code, shipped (refused here when too big)
        shipped = Shipped(upload_code(code_env, stamp=scanned), scanned[3] if scanned is not None else None)
        try:
            job_id = self.store.new_job(request.name)  # the job's own dir, created exclusively
        except OSError as e:
            raise launch_error(e, self.store) from None
        info = JobInfo(
            job_id=job_id,
            name=request.name,
            status=JobStatus.PENDING,
            backend="ray",
            request_summary=summarize_request(request),
            submitted_at=self.wall(),
        )
        self._launch(request_bytes, shipped, job_id, info, _hosts(request))
        if self.warm_supervisor and self._standby is None:
            # Not now: a fresh actor is a fresh worker process (~1.3 s of CPU), which would start beside this
            # job's host workers and slow them down (measured in bench/NOTES.md, "where the start-up second
            # went"). It starts once this job's hosts all run, or the job ended (bounded wait).
            threading.Thread(target=self._warm_after, args=(job_id,), daemon=True, name="fray-warm-supervisor").start()
        return job_id

    def _read_cluster_clock(self) -> float | None:
        """The cluster's wall clock: its scheduler actor's (created here if it does not exist yet)."""
        from fray_ray.scheduler import SchedulerClient

        scheduler = SchedulerClient(self.namespace, self.non_preemptible_resource, self.quarantine)
        return scheduler.call("now", timeout=CLOCK_TIMEOUT)

    def _kv(self, op: str, key: bytes, value: bytes = b"") -> bytes | None:
        """Ray's KV store in this cluster's namespace (``op``: put, get, del); ``None`` when it cannot be
        used (Ray client mode)."""
        try:
            from ray.experimental import internal_kv

            if op == "put":
                internal_kv._internal_kv_put(key, value, overwrite=True, namespace=self.namespace)
            elif op == "del":
                internal_kv._internal_kv_del(key, namespace=self.namespace)
            else:
                return internal_kv._internal_kv_get(key, namespace=self.namespace)
        except Exception:
            pass
        return None

    def _launch(
        self,
        request_bytes: bytes,
        shipped: Shipped,
        job_id: JobId,
        info: JobInfo,
        hosts: int,
    ) -> None:
        """Record the job and give it to a supervisor (the client's current one, else a new one, which then
        takes the client's next jobs)."""
        settings = {
            "jobs_dir": self.store.root,
            # No client path: on another machine it does not exist. The code travels in the runtime_env.
            "sys_path": [],
            "cwd": "",
            "runtime_env": shipped.env,
            "policy": self.policy,
            "namespace": self.namespace,
            "address": self.gcs_address,
            "cluster": self.record_spec,
            "non_preemptible_resource": self.non_preemptible_resource,
            "preemption_probe": self.preemption_probe,
            "autoscaling": self.autoscaling,
            "non_preemptible_tpu_label": self.non_preemptible_tpu_label,
            "quarantine": self.quarantine,
            "queue_ttl": self.queue_ttl,
            "queued_at": self.clock.now(),  # its place in the cluster's line, by the cluster's clock
            "hosts": hosts,  # how much of a shared supervisor's capacity it takes (HOSTS_PER_SUPERVISOR)
            "code": shipped.code,  # its importable files' fingerprint (Shipped.same_code)
        }
        job = (job_id, request_bytes, settings)
        # The launching marker (see owner_gone) is put before any record names a supervisor that does not
        # have the job yet, and stays until a supervisor took it (the supervisor removes it): a poller then
        # neither calls the supervisor gone while it starts nor waits forever for a hand-over that was lost
        # (this process exited before the supervisor was up to take it).
        self._mark_launching(job_id)
        if not self._store_ok:
            try:
                self._check_store(info)  # a store the head cannot read: its FAILED record stays
            except BaseException:
                self._unmark_later(job_id)
                raise
        handed = False
        try:
            with self._standby_lock:  # launch may be called from several threads
                standby = self._standby
                if standby is not None and not self._standby_shipped.same_code(shipped):
                    standby = None  # it cannot load this job's code
                self._last_shipped = shipped
            if standby is not None:
                self._hand_over(standby, info, job)
                handed = True
                spare = False
                with self._standby_lock:
                    if self._standby is not None and self._standby[0] == standby[0]:
                        jobs = self._standby[2] + 1
                        # it takes no more after its last (it retires itself): the next goes to the spare
                        if jobs < JOBS_PER_SUPERVISOR:
                            self._standby = (standby[0], standby[1], jobs)
                        else:
                            self._standby = self._promote_spare(shipped)
                        spare = (
                            self.warm_supervisor
                            and self._spare is None
                            and JOBS_PER_SUPERVISOR // 2 <= jobs < JOBS_PER_SUPERVISOR
                        )
                if spare:
                    self._start_spare(shipped)
            else:
                self._cold_start(info, job, shipped.env)
        except BaseException as e:  # nothing started: leave no PENDING record behind
            if not handed:
                self.store.discard(job_id)
            err = launch_error(e, self.store)
            if err is e:
                raise
            raise err from None
        finally:
            if not handed:
                self._unmark_later(job_id)

    def _cold_start(
        self, info: JobInfo, job: tuple[str, bytes, dict[str, Any]], runtime_env: dict[str, Any], standby: bool = True
    ) -> None:
        """Start a supervisor with the job riding on its creation (which Ray delivers even when this process
        exits at once); with ``standby``, it takes the client's next jobs."""
        name = supervisor_name()
        # until it runs the job, the record says what the job waits for: a supervisor Ray has not created
        # (its runtime_env being set up, or no room on the head) leaves it PENDING for minutes
        info.pending_reason = f"{COLD_START_REASON} {name!r} to start"
        self._write_handed(info, job, name)
        max_jobs = JOBS_PER_SUPERVISOR if standby else 1
        actor = self._supervisor_options(name, runtime_env).remote(name, job=job, max_jobs=max_jobs)
        if not standby:
            return
        with self._standby_lock:  # the client's next jobs go to it
            old, self._standby = self._standby, ((name, actor, 1) if JOBS_PER_SUPERVISOR > 1 else None)
            self._standby_shipped = Shipped(runtime_env, job[2].get("code"))
        if old is not None:  # full, gone, or for other code: it takes no more, and exits when idle
            _retire_quietly(old[1])

    def _write_handed(self, info: JobInfo, job: tuple[str, bytes, dict[str, Any]], name: str) -> None:
        """Write the job's record naming its supervisor ``name``, and hand the record over with the job: the
        supervisor need not read it back (``_check_store`` made sure it can; issue 29: one GCS call a job)."""
        record = self.store.record_of(info, owner=self._owner(name))
        job[2]["record_size"] = self.store.write_record(info.job_id, record)
        job[2]["record"] = record

    def _mark_launching(self, job_id: str) -> None:
        """Say in Ray's KV store that ``job_id``'s supervisor is being started (see ``owner_gone``)."""
        self._kv("put", launching_key(job_id), b"1")

    def _unmark_later(self, job_id: str) -> None:
        """Remove ``job_id``'s launching marker from a background thread (one per client, started on first
        use): the launch does not wait for that round trip. A marker left (the process exited first) only
        delays, by ``SUPERVISOR_START_GRACE``, the verdict on a job whose supervisor died before it started."""
        with self._standby_lock:
            self._unmark_queue.append(job_id)
            if self._unmarker is None or not self._unmarker.is_alive():
                self._unmarker = threading.Thread(target=self._unmark_all, daemon=True, name="fray-unmark")
                self._unmarker.start()
        self._unmark_wake.set()

    def _unmark_all(self) -> None:
        while True:
            with self._standby_lock:
                todo, self._unmark_queue = self._unmark_queue, []
                if not todo:
                    self._unmark_wake.clear()
            if not todo:
                if not self._unmark_wake.wait(UNMARK_IDLE):
                    with self._standby_lock:
                        if not self._unmark_queue:
                            self._unmarker = None
                            return
                continue
            for job_id in todo:
                self._kv("del", launching_key(job_id))

    def _promote_spare(self, shipped: Shipped) -> tuple[str, Any, int] | None:
        """The spare as the supervisor of the client's next jobs, if it carries their code (under the lock)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        if not spare[2].same_code(shipped):
            _retire_quietly(spare[1])
            return None
        self._standby_shipped = spare[2]
        return (spare[0], spare[1], 0)

    def _warm(self) -> dict[str, Any]:
        """What a warm supervisor prepares for (see ``JobSupervisor._warm_up``)."""
        return {
            "jobs_dir": self.store.root,
            "namespace": self.namespace,
            "non_preemptible_resource": self.non_preemptible_resource,
            "quarantine": self.quarantine,
        }

    def _start_spare(self, shipped: Shipped) -> None:
        """Start the next supervisor while the current one still takes jobs (an actor start: ~0.4 s of a
        fresh process; waited for by the first launch that needs it otherwise)."""
        name = supervisor_name()
        try:
            actor = self._supervisor_options(name, shipped.env).remote(
                name, warm=self._warm(), max_jobs=JOBS_PER_SUPERVISOR
            )
        except Exception:
            return  # Ray is going away: the launch after the current one's last starts its supervisor cold
        with self._standby_lock:
            if self._spare is None and not self._closed.is_set():
                self._spare = (name, actor, shipped)
                return
        _retire_quietly(actor)

    def _warm_after(self, job_id: str) -> None:
        """Start the next job's warm supervisor once ``job_id``'s hosts have all started (or it ended, or
        ``WARM_AFTER_TIMEOUT`` passed); not when ``close()`` was called meanwhile or one is warm already."""
        end = time.monotonic() + WARM_AFTER_TIMEOUT
        while time.monotonic() < end and not self._closed.is_set():
            try:
                info, _ = self.store.read_info(job_id)
                if info.status.is_terminal() or any(a.hosts_started_at is not None for a in info.attempts):
                    break
            except Exception:
                pass  # a record mid-write or unreadable: look again
            if self._closed.wait(WARM_AFTER_POLL):
                return
        with self._standby_lock:
            if self._closed.is_set() or self._standby is not None or not ray.is_initialized():
                return
            self._standby = self._promote_spare(self._last_shipped)
            if self._standby is not None:
                return
            name = supervisor_name()
            try:
                # with the last job's code (the next job from this client most likely has the same)
                self._standby_shipped = self._last_shipped
                self._standby = (
                    name,
                    self._supervisor_options(name, self._standby_shipped.env).remote(
                        name, warm=self._warm(), max_jobs=JOBS_PER_SUPERVISOR
                    ),
                    0,
                )
            except Exception:
                pass  # Ray is going away: the next launch starts its supervisor cold

    def _owner(self, actor: str) -> dict[str, str]:
        """The record's ``owner``: the job's supervisor actor, its namespace, and the cluster's address and
        spec (``fray logs/stop/status ID`` reach the cluster from the record alone)."""
        return {
            "ray_actor": actor,
            "namespace": self.namespace,
            "address": self.gcs_address,
            "cluster": self.record_spec,
        }

    def _supervisor_options(self, name: str, runtime_env: dict[str, Any] | None = None) -> Any:
        """The supervisor actor's options; ``runtime_env``: the job's code and packages (its host tasks and
        the tasks they start inherit it), uploaded from this client by Ray."""
        return _Supervisor.options(
            runtime_env=runtime_env or None,
            name=name,
            namespace=self.namespace,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=SUPERVISOR_THREADS,
            max_restarts=0,
            # Ray's smallest amount: 0.001 made the 1,001st concurrent job wait PENDING with no reason (issue 29)
            resources={self.non_preemptible_resource: ACTOR_RESOURCE},
        )

    def _hand_over(self, standby: tuple[str, Any, int], info: JobInfo, job: tuple[str, bytes, dict[str, Any]]) -> None:
        """Give the job to the client's supervisor without waiting for its answer (a supervisor still
        starting took seconds under load, and every launch behind it waited: bench/NOTES.md, issue 29).
        The answer is settled in the background (:meth:`_settle`): a supervisor that does not take the job
        (full, retired, exiting, gone) is replaced by a cold start that carries it. Until a supervisor took
        it, the launching marker stays; ``close()`` waits for unsettled hand-overs, because a call to an
        actor that is not up yet is buffered in this process and is lost if it exits first."""
        name, actor, _ = standby
        info.pending_reason = f"handed to its supervisor actor {name!r}, which has not taken it yet"
        self._write_handed(info, job, name)
        ref = actor.start.remote(*job)
        with self._standby_lock:
            self._handovers[ref] = _HandOver(name, actor, info, job, time.monotonic())
            self._handover_ids[str(info.job_id)] = ref
            if self._settler is None or not self._settler.is_alive():
                self._settler = threading.Thread(target=self._settle_loop, daemon=True, name="fray-hand-over")
                self._settler.start()

    def _settle_loop(self) -> None:
        """The background half of :meth:`_hand_over`: settles answers as they come; exits when none is due."""
        while True:
            with self._standby_lock:
                if not self._handovers:
                    self._settler = None
                    return
                refs = list(self._handovers)
            ready, _ = ray.wait(refs, num_returns=1, timeout=SETTLE_INTERVAL)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            self._settle(ready)

    def _settle(self, ready: Sequence[Any]) -> None:
        """Settle the hand-overs whose answers came (``ready``), and those a supervisor that never answered
        anything has kept waiting for ``SUPERVISOR_START_TIMEOUT`` seconds (it is killed: stuck starting)."""
        now = time.monotonic()
        done: list[tuple[_HandOver, bool]] = []
        with self._standby_lock:
            for ref in ready:
                h = self._handovers.pop(ref, None)
                if h is None:
                    continue
                self._handover_ids.pop(str(h.info.job_id), None)
                try:
                    taken = bool(ray.get(ref, timeout=0))
                except Exception:
                    taken = False
                if taken:
                    self._answered.add(h.name)
                    if len(self._answered) > 1024:
                        self._answered.clear()
                else:
                    self._taking_back.add(str(h.info.job_id))
                done.append((h, taken))
            stuck = {
                h.name: h.actor
                for h in self._handovers.values()
                if now - h.since > SUPERVISOR_START_TIMEOUT and h.name not in self._answered
            }
        for actor in stuck.values():
            if _actor_state(actor) not in ("ALIVE", None):  # never came up: its unanswered calls fail (settled)
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass
        for h, taken in done:
            if not taken:
                self._take_back(h)

    def _take_back(self, h: _HandOver) -> None:
        """A supervisor did not take the job handed to it: start one that does (it becomes the client's
        standby if the refusing one was), or say in the record why none could."""
        job_id = str(h.info.job_id)
        self._waitable.pop(job_id, None)
        with self._standby_lock:
            current = self._standby is not None and self._standby[0] == h.name
            if current:
                self._standby = None
        if current:
            _retire_quietly(h.actor)
        try:
            self._cold_start(h.info, h.job, h.job[2]["runtime_env"], standby=current and not self._closed.is_set())
        except Exception as e:
            try:
                info = h.info
                info.status, info.finished_at, info.pending_reason = JobStatus.FAILED, time.time(), None
                info.error = f"launch: no supervisor could be started for the job: {type(e).__name__}: {e}"
                self.store.write(info, owner=self._owner(h.name))
            except Exception:
                pass  # the poll says its supervisor does not have it, once the marker's grace passed
        finally:
            with self._taken_back:
                self._taking_back.discard(job_id)
                self._taken_back.notify_all()
            self._unmark_later(job_id)

    def _unsettled(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the answers of this client's unsettled hand-overs, and settle them."""
        end = time.monotonic() + timeout
        while ray.is_initialized():
            with self._standby_lock:
                refs = list(self._handovers)
            left = end - time.monotonic()
            if not refs or left <= 0:
                return
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=min(left, SETTLE_INTERVAL))
            self._settle(ready)

    def close(self) -> None:
        """Retire this client's supervisor (its jobs keep running; it exits when the last one ended, at once
        when it has none) and start no new one. Also called at interpreter exit."""
        self._closed.set()
        if ray.is_initialized():
            self._unsettled(HAND_OVER_TIMEOUT)  # a hand-over not yet sent would be lost with this process
        with self._standby_lock:
            standby, self._standby = self._standby, None
            spare, self._spare = self._spare, None
        for actor in [x[1] for x in (standby, spare) if x is not None]:
            if not ray.is_initialized():
                break
            try:
                ray.get(actor.retire.remote(), timeout=RETIRE_TIMEOUT)
            except Exception:
                pass  # it expired, is still starting, or the cluster is gone: it exits when idle

    # ------------------------------------------------------------------------------------------ poll

    def _block(self, job_ids: Sequence[str], timeout: float) -> None:
        """``wait``'s pause between looks at the records: until one of the jobs' supervisors says its job
        ended, or ``timeout``. Without a live supervisor to ask (gone, or not started yet), a short sleep."""
        by_actor: dict[str, tuple[Any, list[str]]] = {}  # one call per supervisor, for all its jobs waited on
        refs = []
        handing_refs = [r for r in map(self._handover_ids.get, job_ids) if r is not None]
        if handing_refs:  # answers that came: settled now (a ready one left for the thread would spin this wait)
            ready, _ = ray.wait(handing_refs, num_returns=len(handing_refs), timeout=0)
            self._settle(ready)
        for job_id in job_ids:
            handing = self._handover_ids.get(job_id)
            if handing is not None:  # not taken yet: its supervisor's answer is the next thing to wait for
                refs.append(handing)
                continue
            if job_id in self._taking_back:  # its new supervisor is being started: look again shortly
                continue
            found = self._waitable.get(job_id)
            if found is None:
                try:
                    found = self._supervisor_named(job_id)
                except Exception:  # the record is unreadable: poll says so
                    found = None
                if found is None:
                    continue
                if len(self._waitable) >= 256:
                    self._waitable.clear()
                self._waitable[job_id] = found
            by_actor.setdefault(found[0], (found[1], []))[1].append(job_id)
        for actor, ids in by_actor.values():
            try:
                refs.append(actor.wait_ended.remote(ids, timeout))
            except Exception:
                for job_id in ids:
                    self._waitable.pop(job_id, None)
        if not refs:
            time.sleep(min(timeout, 0.1))
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout + 1.0, fetch_local=True)
        try:
            if ready:
                ray.get(ready[0], timeout=0)
        except Exception:  # its supervisor is gone: poll decides what that means; do not spin meanwhile
            self._waitable.clear()
            time.sleep(min(timeout, 0.1))

    def _supervisor(self, job_id: str, record: dict[str, Any] | None = None) -> Any | None:
        """The job's supervisor actor (named in its record), ``None`` when it is gone."""
        found = self._supervisor_named(job_id, record)
        return None if found is None else found[1]

    def _supervisor_named(self, job_id: str, record: dict[str, Any] | None = None) -> tuple[str, Any] | None:
        """The job's supervisor actor and its name (from the job's record), ``None`` when it is gone."""
        owner = (record if record is not None else self.store.read(job_id)).get("owner") or {}
        try:
            name = owner["ray_actor"]
            return name, ray.get_actor(name, namespace=owner.get("namespace", self.namespace))
        except (KeyError, ValueError):
            return None

    def owner_gone(self, info: JobInfo, record: dict[str, Any]) -> str | None:
        """A job whose supervisor could not start it (and said why in Ray's KV store), whose supervisor
        actor is gone, or that never reached its supervisor (see :meth:`_never_taken`) is FAILED, whatever
        its record says; not while its launch is under way (``launch`` writes the PENDING record before
        the supervisor has the job, and says so in Ray's KV store until it has)."""
        if record.get("backend") != "ray":
            return None
        job_id = str(info.job_id)
        if job_id in self._handover_ids or job_id in self._taking_back:
            return None  # this client is handing it over, or to a new supervisor: settled in the background
        launching = info.status is JobStatus.PENDING and not info.attempts
        if launching:
            start_error = self._start_error(job_id)
            if start_error is not None:
                return start_error
        found = self._supervisor_named(job_id, record)
        if found is not None:
            return self._never_taken(job_id, *found, record) if launching else None
        if launching and self._still_launching(job_id):
            return None
        return (
            f"the job's supervisor actor {(record.get('owner') or {}).get('ray_actor')!r} (namespace "
            f"{self.namespace!r}) is gone "
            "before the job ended: its node died or the Ray cluster restarted"
        )

    def _never_taken(self, job_id: str, name: str, actor: Any, record: dict[str, Any]) -> str | None:
        """Why a job whose supervisor lives never reached it: its launching marker outlived the grace (its
        launcher exited before the supervisor took it, or was killed) and the supervisor does not run it;
        or the supervisor its launch created (the job riding on its creation) was never created.
        ``None`` while that cannot be told (a marker within its grace, a supervisor not answering)."""
        launching = self._launching_for(job_id)
        if launching is None:
            return self._never_created(job_id, name, actor, record)
        if launching < SUPERVISOR_START_GRACE or not self._kv_works():
            return None  # within the grace; or no KV store (client mode): a supervisor cannot say it took it
        try:
            running = ray.get(actor.ping.remote(), timeout=PING_TIMEOUT)
        except Exception:
            state = _actor_state(actor)
            if state in ("ALIVE", None) or launching < SUPERVISOR_START_TIMEOUT:
                return None  # up but busy, still starting (a runtime_env takes minutes), or cannot be told
            return (
                f"the job's supervisor actor {name!r} (namespace {self.namespace!r}) has not started (Ray says "
                f"{state}) {SUPERVISOR_START_TIMEOUT:.0f} s after the job was handed to it, and its launcher "
                "did not take the job back: nothing runs it"
            )
        if job_id in running:
            return None
        return (
            f"the job never reached its supervisor actor {name!r} (namespace {self.namespace!r}): the process "
            "that launched it exited before the supervisor took it"
        )

    def _never_created(self, job_id: str, name: str, actor: Any, record: dict[str, Any]) -> str | None:
        """Why a job whose launch created its supervisor (``_cold_start``: the job rides on the actor's
        creation, so no launching marker is kept) is not run: Ray has not created that actor
        ``SUPERVISOR_START_TIMEOUT`` seconds after a poll here first saw the job waiting for it (no room for it
        on the non-preemptible node, say). Then the actor is killed, so that it cannot run the job after
        this poll called it FAILED. Without this the job would stay PENDING forever."""
        if not str(record.get("pending_reason") or "").startswith(COLD_START_REASON):
            self._create_seen.pop(job_id, None)
            return None  # its supervisor took it (and cleared the reason), or it was handed over
        if len(self._create_seen) >= 1024 and job_id not in self._create_seen:
            del self._create_seen[next(iter(self._create_seen))]  # the oldest look goes, not every timer
        waited = time.monotonic() - self._create_seen.setdefault(job_id, time.monotonic())
        if waited < SUPERVISOR_START_TIMEOUT:
            return None
        state = _actor_state(actor)
        if state in ("ALIVE", "RESTARTING", None):
            return None  # up (it has the job: its first record write is on its way), or cannot be told
        reason = (
            f"the job's supervisor actor {name!r} (namespace {self.namespace!r}) was not created "
            f"{SUPERVISOR_START_TIMEOUT:.0f} s after the job was seen waiting for it (Ray says {state}): no "
            f"room for it where it must run ({self.non_preemptible_resource!r}), or its runtime_env could not be "
            "set up; nothing runs the job"
        )
        # said where every later poll looks first (the actor is gone after this: else they would say only that)
        self._kv("put", start_error_key(job_id), reason.encode())
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass  # gone meanwhile
        return reason

    def _still_launching(self, job_id: str) -> bool:
        """The job's ``launch`` has not created its supervisor yet (its KV marker is there), for at most
        ``SUPERVISOR_START_GRACE`` seconds of this process's own clock since a poll here first saw it so.
        Without Ray's KV store (client mode): the same grace, from this process's first look."""
        launching = self._launching_for(job_id)
        return launching is not None and launching < SUPERVISOR_START_GRACE

    def _launching_for(self, job_id: str) -> float | None:
        """Seconds since a poll here first saw ``job_id``'s launching marker (this process's own clock: the
        launcher's may differ), ``None`` when it has none. Without Ray's KV store: since the first look."""
        if self._kv_works() and not self._kv("get", launching_key(job_id)):
            self._launch_seen.pop(job_id, None)
            return None
        if len(self._launch_seen) >= 1024 and job_id not in self._launch_seen:
            del self._launch_seen[next(iter(self._launch_seen))]  # the oldest look goes, not every timer
        return time.monotonic() - self._launch_seen.setdefault(job_id, time.monotonic())

    @staticmethod
    def _kv_works() -> bool:
        try:
            from ray.experimental import internal_kv

            return bool(internal_kv._internal_kv_initialized())
        except Exception:
            return False

    def _start_error(self, job_id: str) -> str | None:
        """Why the job's supervisor could not start it, as it left it in Ray's KV store (see supervisor.py)."""
        try:
            from ray.experimental import internal_kv

            found = internal_kv._internal_kv_get(start_error_key(job_id), namespace=self.namespace)
        except Exception:  # KV unavailable (Ray client mode)
            return None
        return found.decode() if found else None

    def _check_store(self, info: JobInfo) -> None:
        """Once per client and store: the cluster's head (where supervisors run) can read this job's record,
        else ``launch`` fails here naming the store, instead of a job that never starts. A head that read
        the store once is remembered in Ray's KV store, so later clients skip the check."""
        key = b"fray:store-ok:" + self.store.root.encode()
        from ray.experimental import internal_kv

        try:
            if self._store_ok or internal_kv._internal_kv_get(key, namespace=self.namespace):
                self._store_ok = True
                return
        except Exception:
            return  # KV unavailable (Ray client mode): the supervisor's own start-up check decides
        self.store.write(info, owner=self._owner(""))
        ref = _probe_store.options(resources={self.non_preemptible_resource: ACTOR_RESOURCE}).remote(
            self.store.root, str(info.job_id)
        )
        try:
            problem = ray.get(ref, timeout=STORE_CHECK_TIMEOUT)
        except Exception:  # the head is slow or busy: the supervisor's own start-up check decides
            ray.cancel(ref, force=True)
            return
        if problem is None:
            self._store_ok = True
            internal_kv._internal_kv_put(key, b"1", overwrite=True, namespace=self.namespace)
            return
        reason = (
            f"launch: the Ray cluster at {self.gcs_address or self.address} cannot reach the job store "
            f"{self.store.root!r}: {problem}. "
            "Its supervisors run on the head node: give a store every machine reaches "
            "(jobs_dir='gs://BUCKET/fray', or a shared path)"
        )
        info.status, info.error, info.finished_at = JobStatus.FAILED, reason, time.time()
        self.store.write(info, owner=self._owner(""))
        raise FrayError(reason)

    # ------------------------------------------------------------------------------------- terminate

    def terminate(self, job_id: JobId | str) -> None:
        job_id = str(job_id)
        handing = self._handover_ids.get(job_id)
        if handing is not None:  # a stop before its supervisor took it would find nothing to stop
            ready, _ = ray.wait([handing], timeout=HAND_OVER_TIMEOUT)
            self._settle(ready)
        with self._taken_back:  # refused, and being given to a new supervisor: that one is the one to stop
            self._taken_back.wait_for(lambda: job_id not in self._taking_back, timeout=HAND_OVER_TIMEOUT)
        if self.poll(job_id).status.is_terminal():
            return
        actor = self._supervisor(job_id)
        if actor is not None:
            try:
                ray.get(actor.stop.remote(job_id), timeout=TERMINATE_TIMEOUT)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass  # it ended meanwhile, or is stuck: the deadline below decides
        end = time.monotonic() + TERMINATE_TIMEOUT
        while time.monotonic() < end:
            if self.poll(job_id).status.is_terminal():
                return
            time.sleep(0.1)
        others: list[str] = []
        if actor is not None:
            try:
                others = [j for j in ray.get(actor.ping.remote(), timeout=10) if j != job_id]
            except Exception:
                others = []  # not answering: stuck, its other jobs with it
        if actor is not None and not others:
            ray.kill(actor, no_restart=True)  # its placement groups and tasks go with it (it owns them)
            raise FrayError(
                f"terminate: job {job_id} did not stop within {TERMINATE_TIMEOUT:.0f} s; its supervisor was killed"
            )
        raise FrayError(
            f"terminate: job {job_id} did not stop within {TERMINATE_TIMEOUT:.0f} s; its supervisor was not "
            f"killed: it also runs {len(others)} other job(s) ({', '.join(others[:3])}); try again, or "
            f"kill the actor {(self.store.read(job_id).get('owner') or {}).get('ray_actor')!r} to end them all"
        )

    def job_context(self) -> Any:
        from fray_ray.context import RayJobContext

        return RayJobContext(namespace=self.namespace, non_preemptible_resource=self.non_preemptible_resource)


@ray.remote(num_cpus=0, max_retries=0, enable_task_events=False)
def _probe_store(root: str, job_id: str) -> str | None:
    """Run where the supervisors run: ``None`` if the job's record can be read from the store there, else why not."""
    try:
        from fray_core.records import JobStore

        JobStore(root).read(job_id)
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def _connect(address: str | None) -> None:
    """``ray.init``, after :func:`~fray_ray.connect.check_ray_address` made sure, within seconds, that the
    address answers as a Ray cluster this client can use (``ray.init`` alone retries for minutes)."""
    target = resolve_address(address)
    if target is not None:
        check_ray_address(target)
    try:
        # log_to_driver off: every host line reaches a client once, rank-prefixed, through the job's log
        # (Ray's copy came on top of it, unprefixed, to whichever driver launched the job)
        ray.init(address=address, logging_level="WARNING", configure_logging=True, log_to_driver=False)
    except ConnectionError as e:  # "auto" with no local cluster, or a cluster gone since the check
        raise RayConnectionError(
            f"cannot connect to the Ray cluster at {target or address or 'auto'}: {_first_line(e)}"
        ) from None
    except RuntimeError as e:
        if "version" in str(e).lower():  # Ray's own check (a patch-level Python difference)
            raise RayConnectionError(
                f"version mismatch with the Ray cluster at {target or address}: {_first_line(e)}"
            ) from None
        raise


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _actor_state(actor: Any) -> str | None:
    """Ray's state of an actor (``ALIVE``, ``PENDING_CREATION``, ``DEAD``...), ``None`` when it cannot be read."""
    try:
        from ray._private.state import actors

        return actors(actor._actor_id.hex()).get("State")
    except Exception:
        return None


def _retire_quietly(actor: Any) -> None:
    """Tell a supervisor to take no more jobs (not waited for: it may be busy or gone)."""
    try:
        actor.retire.remote()
    except Exception:
        pass  # it is gone already


def _hosts(request: JobRequest) -> int:
    """The hosts a job runs at most: its share of a supervisor process (``HOSTS_PER_SUPERVISOR``)."""
    res = request.resources
    return max(res.replica_counts) * res.hosts_per_replica


def _close_at_exit(ref: weakref.ref[RayCluster]) -> None:
    cluster = ref()
    if cluster is not None:
        cluster.close()


def _from_spec(params: dict[str, str]) -> RayCluster:
    """``ray``, ``ray?address=10.0.0.1:6379&namespace=team&jobs_dir=gs://bucket/fray``."""
    check_spec_keys(params, ["address", "namespace", "jobs_dir"], "ray")
    return RayCluster(
        address=params.get("address") or "auto",
        namespace=params.get("namespace") or None,
        jobs_dir=params.get("jobs_dir") or None,
    )
