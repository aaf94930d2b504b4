"""The Ray ``SliceProvider``: whole TPU slices through placement groups, one Ray task per host.

A TPU slice is reserved in two phases, for every slice of the attempt at once:

1. a placement group holding the slice's ``TPU-<type>-head`` resource on worker 0 (label selector
   ``ray.io/tpu-worker-id=0`` and ``ray.io/tpu-pod-type``): this claims one slice and tells its name;
2. a placement group with one ``{"TPU": chips_per_host}`` bundle per host, bundle ``h`` bound by label
   selector to ``ray.io/tpu-slice-name=<name>`` and ``ray.io/tpu-worker-id=h``.

The head group is held until release, so a slice that is ours never looks free to another job. Host ``h``
runs on bundle ``h``: ``TPU_WORKER_ID`` we set is the node's own worker id. This is what
``ray.util.tpu.SlicePlacementGroup`` does, done for all slices in parallel, for single-host slices too, and
with bundles tied to worker ids (see docs/design.md for why we do not call it directly).

Host tasks are submitted by the supervisor actor (on a non-TPU node), so a lost node surfaces as
``NodeDiedError`` within about a second. Outcomes are classified by exception type only.

A slice can also be lost before its host tasks run (they then never fail: they wait for a node that is
gone). So every ``wait_any`` also checks, at most every ``HEALTH_INTERVAL``, the state Ray keeps of the
lease: a placement group of the lease no longer CREATED (RESCHEDULING once the GCS marks a node of it dead,
or REMOVED) or a node that held a bundle reported dead ends every unfinished host of that slice as
PREEMPTED. Each host reports in (``mark_started``, called by the supervisor) when its process runs, which
``started_runs`` tells the runner.

An elastic job grows when ``free_slices`` has shown room for ``grow_after`` seconds; the runner then stops
the attempt with ``cancel(runs, grace=...)``: SIGTERM to every host's processes, sent by a small task pinned
to the host's node (the host said where it runs when it reported in; see ``fray_ray._host``), up to
``grace`` seconds for the host tasks to end, then the hard cancel that terminate and preemption use.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import cloudpickle
import ray
import ray.exceptions as rex
from ray._private.state import total_resources_per_node
from ray._raylet import NodeID
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from fray_core._threads import shared as shared_threads
from fray_core.errors import HostPreempted, Unschedulable
from fray_core.provider import (
    Heartbeat,
    HostOutcome,
    HostOutcomeKind,
    HostRun,
    HostSpec,
    LeaseHealth,
    SliceLease,
    SliceProvider,
)
from fray_core.tpu import get_tpu_spec
from fray_core.types import Entrypoint, GpuConfig, ResourceConfig, TpuConfig, parse_size
from fray_ray._host import (
    DeviceFaultError,
    HostConfig,
    HostPreemptedError,
    HostProcess,
    TpuBusyError,
    dump_host_stacks,
    host_payload,
    notice_key,
    run_host,
    run_shared_host,
    signal_host,
)
from fray_ray._notices import BOARD, board_key
from fray_ray.scheduler import ARRIVAL_WAIT, ArrivalOrder, SchedulerBehind, SchedulerClient, answer_key
from fray_ray.slices import (
    POD_TYPE_LABEL,
    SLICE_NAME_LABEL,
    WORKER_ID_LABEL,
    SliceView,
    TpuSlice,
    discover_slices,
    slice_view,
)
from fray_ray.view import ClusterView

__all__ = ["RaySliceProvider", "PREEMPTION_ERRORS", "discover_slices", "health_checks"]

#: Errors that mean the host (or the process that owned its task) went away: infrastructure, retryable.
#: Not ``WorkerCrashedError``: the host's own process died (a segfault, the kernel's OOM killer, an
#: ``os._exit``) while its node may be well; it is a failure unless the lease turns out lost within the
#: attribution window (the runner asks ``lease_health`` until ``detection_delay``), as on a node that went.
PREEMPTION_ERRORS: tuple[type[BaseException], ...] = (
    rex.NodeDiedError,
    rex.OwnerDiedError,
    rex.ActorDiedError,
    rex.ActorUnavailableError,
    rex.ObjectLostError,
    rex.LocalRayletDiedError,
)

#: Errors of a host being stopped gracefully that still mean its node went away (others: it ended on our SIGTERM).
_NODE_LOST: tuple[type[BaseException], ...] = (HostPreemptedError, rex.NodeDiedError, rex.LocalRayletDiedError)
#: Errors that say the host's node itself is gone.
_NODE_GONE: tuple[type[BaseException], ...] = (rex.NodeDiedError, rex.LocalRayletDiedError)

_host_task = ray.remote(max_calls=1)(run_host)  # a fresh worker process per TPU/GPU host, every attempt
# CPU replicas a worker runs before it exits: its start (~0.7 CPU-s) amortized, and a bound on what the jobs'
# code (the same client's: Ray reuses a worker only for its own job and runtime_env) can leave behind in it.
# 16 until 2026-11-28: 200 small jobs then started 13+ workers where raw Ray tasks start 6 (bench/NOTES.md). Ray
# takes max_calls from the remote function only (not .options()): a function of its own, so that Ray's
# function table does not mix it up with the fresh-worker one.
SHARED_WORKER_CALLS = 256
_shared_host_task = ray.remote(max_calls=SHARED_WORKER_CALLS)(run_shared_host)
_signal_task = ray.remote(num_cpus=0, max_retries=0)(signal_host)  # pinned to a host's node: SIGTERM its processes
_stacks_task = ray.remote(num_cpus=0, max_retries=0)(dump_host_stacks)  # pinned to a host's node: its stacks
#: a drain without a deadline (Ray's 0) still means the node goes: the hosts get this long to checkpoint
NOTICE_DEFAULT_GRACE = 30.0
INLINE_ENTRY_LIMIT = 100 * 1024  # Ray inlines task arguments up to 100 KB in the task spec
RESERVE_GRACE = 10.0  # seconds a reservation may run past a short acquire round once capacity looked free
GROUP_CHECK_S = 10.0  # seconds between lookups of a running lease's placement group (see _check_health)
HEALTH_INTERVAL = 1.0  # seconds between checks of the leases' placement groups (and of the shared view: view.py)
RESULT_TIMEOUT = 60.0  # seconds to fetch a finished host's result before it is taken as lost
STACKS_WAIT = 10.0  # seconds dump_stacks waits for the hosts' stacks to reach the job log (a worker may start first)
STACKS_QUIET = 0.5  # ... and for no more of a host's lines to come (its log batches go every LOG_SEND_INTERVAL)
RELEASE_TIMEOUT = 5.0  # seconds a job's next acquire waits for the nodes to have its released resources back
TRANSIT_S = 1.0  # seconds a busy slice that no job holds is looked at again every TRANSIT_STEP (see _in_transit)
TRANSIT_STEP = 0.05
# A process's question for the draining nodes is held by the scheduler while its answer stays the same, up to
# DRAIN_HOLD seconds (see Scheduler.draining): asked once a second before, each call was a task the supervisor
# submitted, and Ray sends a profile event for every submitted task to the GCS (one AddTaskEventData a second
# per supervisor process, ~1.3 ms/s of GCS work at 16,000 hosts: bench/NOTES.md, issue 29). A health check
# takes the answer when it is there and never waits for a held one (the last answer stands meanwhile).
DRAIN_HOLD = 30.0
FIRST_DRAIN_WAIT = 0.05  # seconds a health check waits for a process's first list of draining nodes
CHECK_ALIVE_TIMEOUT = 1.0  # seconds the liveness check of a process's lease nodes waits for the GCS (else: next time)
# Seconds between liveness checks of a process's lease nodes while no host failed (see _NodeLiveness): every
# second it was the first running job's largest GCS call at 16,000 hosts (1.4-1.6/s at ~1 ms: bench/NOTES.md).
LIVENESS_CALM_S = 5.0
# A one-replica job's task Ray queues itself (see _queue_lease): said in its pending reason only after this long
# (a task Ray starts at once needs none: a changed pending reason is a record write), and failed as unschedulable
# once no node had room for it for this long (its nodes gone, no autoscaler: else it would wait forever).
QUEUE_QUIET = 1.0
QUEUE_NO_ROOM_S = 60.0
ADMIT_WAIT_MIN = 0.05  # seconds an acquire round waits for the scheduler's answer at least (past its deadline)
SLOW_READ_S = 2.0  # a read of the node table this slow is named in the pending reason
QUEUE_TTL = 30.0  # seconds a job keeps its place in the scheduler's queue without asking again
# seconds the scheduler holds a waiting job's call while its answer stays the same (Scheduler.acquire_pool), and
# how much longer an unanswered call is still taken as held rather than the scheduler being behind
QUEUE_HOLD = 10.0
QUEUE_HOLD_SLACK = 5.0


@attrs.define(eq=False)
class _Reservation:
    """The placement groups behind one lease; ``remove`` is idempotent. ``nodes``: where its bundles are;
    ``lost``: why the slice is gone (set once, by the health check); ``node_died``: a host task of it
    failed because its node went away."""

    groups: list[PlacementGroup]
    removed: bool = False
    nodes: frozenset[str] = frozenset()
    lost: str | None = None
    node_died: bool = False
    host_nodes: tuple[str, ...] = ()  # bundle h's node id: the host's hardware identity (quarantine)
    tpu_per_host: float = 0.0  # the ``TPU`` resource each host task asks for (0: not a TPU lease)
    # A CPU/GPU lease's bundle: what each replica's task asks for (in its group's bundle; or, for a lease that
    # reserves nothing (no groups), of Ray itself, which queues the task: RaySliceProvider._queue_lease).
    # ``since``: when such a task was submitted; ``no_room_since``: since when no node of the cluster had room
    # for it (None: some had)
    bundle: dict[str, float] | None = None
    since: float = 0.0
    no_room_since: float | None = None
    group_checked: float = float("-inf")  # when its group was last looked up (RaySliceProvider._check_health)

    def remove(self) -> None:
        if self.removed:
            return
        self.removed = True
        for pg in self.groups:
            try:
                remove_placement_group(pg)
            except Exception:
                pass  # already removed (e.g. its creator died); nothing left to free


@attrs.define(eq=False)
class _Drains:
    """The nodes Ray drains, as a namespace's scheduler last said, shared by every job of the process: one
    question a second for all of them (64 jobs of one supervisor each asking, one at a time through their
    clients' waits, kept each other's health checks waiting: bench/NOTES.md)."""

    nodes: dict[str, int] = attrs.Factory(dict)
    at: float = float("-inf")  # when the question was last looked at (its answer taken, or still held)
    known: bool = False  # the scheduler answered once: its answer can be held until it changes
    asking: bool = False
    lock: threading.Lock = attrs.Factory(threading.Lock)
    # its own client: a question not answered in time stays in flight there and the next asker of the process
    # waits for that one, instead of each job's client sending one more to a scheduler that is behind
    client: SchedulerClient | None = None

    _all: ClassVar[dict[str, _Drains]] = {}
    _all_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def of(cls, namespace: str) -> _Drains:
        with cls._all_lock:
            return cls._all.setdefault(namespace, cls())


NODE_ID_HEX = 56  # hex digits of a Ray node id


class _NodeLiveness:
    """Which nodes the GCS says are dead, for every lease of the process: one ``CheckAlive`` for the nodes of
    all its running jobs (O(1) per node for the GCS), every ``LIVENESS_CALM_S`` while their hosts run well and
    every second while any job of the process looks for the cause of a host's failure (``urgent``), where
    each job looked up each of its placement groups every second (one call a second per slice per job: issue
    29). A node that dies fails the host tasks on it at once (Ray tells their owner, this process): the calm
    check is for a node gone without that. A node seen dead stays dead (Ray never reuses a node id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: dict[str, float] = {}  # node -> when a job last asked about it (monotonic)
        self._dead: set[str] = set()
        self._at = float("-inf")
        self._asking = False

    def dead(self, nodes: frozenset[str], now: float, urgent: bool = False) -> set[str]:
        """The ones of ``nodes`` seen dead; asks the GCS (for every job's nodes) when the last ask is a
        ``HEALTH_INTERVAL`` old (``urgent``: a host of the asking job failed) or ``LIVENESS_CALM_S``, or a node
        is new (not asked about yet)."""
        with self._lock:
            new = False
            for node in nodes:
                if len(node) == NODE_ID_HEX:  # one odd id ("" for a bundle Ray did not place) would fail the call
                    new = new or node not in self._wanted
                    self._wanted[node] = now
            due = HEALTH_INTERVAL if urgent or new else LIVENESS_CALM_S
            ask = not self._asking and now - self._at >= due
            if ask:
                self._asking, self._at = True, now
                # nodes no job asked about for a while are not asked after any more
                self._wanted = {n: t for n, t in self._wanted.items() if now - t < 2 * LIVENESS_CALM_S}
                wanted = [n for n in self._wanted if n not in self._dead]
        if ask:
            try:
                if wanted:
                    gcs = ray._private.worker.global_worker.gcs_client
                    alive = gcs.check_alive([NodeID.from_hex(n) for n in wanted], timeout=CHECK_ALIVE_TIMEOUT)
                    with self._lock:
                        self._dead.update(n for n, up in zip(wanted, alive) if not up)
            except Exception:  # noqa: BLE001 - the GCS is busy: the next check asks again
                pass
            finally:
                with self._lock:
                    self._asking = False
        with self._lock:
            return self._dead.intersection(nodes)


_LIVENESS = _NodeLiveness()


@attrs.define(eq=False)
class _Task:
    ref: Any
    tag: str = ""
    cancelled: bool = False
    reported: bool = False
    stopping: bool = False  # sent SIGTERM by a graceful cancel: however it ends, it was cancelled


def _node_table(fresh: bool = False) -> dict[str, dict[str, Any]]:
    """The live node table: the process's shared copy (at most ``REFRESH_S`` old, see ``fray_ray.view``), or
    with ``fresh`` a read of its own (a node that joined since the copy was taken: rare)."""
    if fresh:
        return {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    return ClusterView.shared().nodes()


def _bundle_nodes(pg: PlacementGroup) -> dict[int, str]:
    return {int(k): v for k, v in placement_group_table(pg).get("bundles_to_node_id", {}).items()}


class RaySliceProvider(SliceProvider):
    """One job's slices and host tasks on Ray. Runs inside the job's supervisor actor.

    ``non_preemptible_resource``: a resource only non-preemptible nodes have (default: Ray's head-node
    marker), requested by CPU/GPU gangs with ``preemptible=False``. ``non_preemptible_tpu_label``
    (``"KEY=VALUE"``): the node label of non-preemptible TPU slices, required by TPU requests with
    ``preemptible=False`` (the cluster refuses such a request at launch when it is not configured).

    TPU slices are claimed in the order the namespace's scheduler actor (``fray_ray.scheduler``) gives:
    first come, first served across every job of the cluster, quarantined slices excluded. A busy TPU
    device on a host is reported to it (``quarantine``: ``(after, window, for)``, the values the
    scheduler is created with); ``queue_ttl``: how long the job keeps its place without asking again;
    ``submitted_at``: when the job was submitted, which orders it in line; ``arrivals``: the order of the
    jobs of its supervisor process (its first question waits for theirs, see ``ArrivalOrder``).
    """

    def __init__(
        self,
        job_id: str,
        host_config: HostConfig,
        runtime_env: dict[str, Any] | None = None,
        non_preemptible_resource: str = "node:__internal_head__",
        autoscaling: bool = False,
        non_preemptible_tpu_label: str | None = None,
        namespace: str = "fray",
        quarantine: tuple[int, float, float] = (2, 3600.0, 1800.0),
        queue_ttl: float = QUEUE_TTL,
        scheduler: SchedulerClient | None = None,
        submitted_at: float | None = None,
        log: Callable[[str, str], None] | None = None,
        arrivals: ArrivalOrder | None = None,
    ) -> None:
        self.job_id = job_id
        self._arrivals = arrivals  # None once this job asked (or needs no asking): see _take_turn
        self._turn_until: float | None = None  # until when its first question waits for the jobs before it
        self.log = log  # writes one line of the job log under a host's tag (the supervisor's LogSink.write)
        self._stacks: dict[str, float | None] | None = None  # during dump_stacks: tag -> when its stacks last came
        self._detection: float | None = None  # detection_delay, once the cluster's config was read
        self._host_failed_at = float("-inf")  # when a host of this job last ended other than well (_check_health)
        self._last_wait: tuple[Any, dict[str, Any]] | None = None  # (ask key, answer) while waiting (_admit)
        self.scheduler = (
            scheduler if scheduler is not None else SchedulerClient(namespace, non_preemptible_resource, quarantine)
        )
        self.queue_ttl = queue_ttl
        self.submitted_at = submitted_at  # the job's place in the scheduler's line (first come, first served)
        self.non_preemptible_tpu_label = non_preemptible_tpu_label
        self.host_config = host_config
        self._shared_config = attrs.evolve(host_config, shared_worker=True)  # a CPU replica's (see _start_host)
        self._board_configs: tuple[Any, HostConfig, HostConfig] | None = None  # see _config_for
        self.runtime_env = runtime_env or None
        self.non_preemptible_resource = non_preemptible_resource
        self.autoscaling = autoscaling
        self._entry: tuple[tuple[int, int], Any] | None = None
        self._entry_bytes: tuple[int, concurrent.futures.Future[bytes]] | None = None
        self._max_slices_seen: dict[str, int] = {}
        self._pending_gang: tuple[tuple[Any, ...], PlacementGroup, Any] | None = None  # (shape, group, ready ref)
        self._max_gang_room: dict[tuple[Any, ...], int] = {}  # gang bundle shape -> most the nodes ever had room for
        self._lock = threading.Lock()
        self._pg_seq = itertools.count()  # placement group names must be unique among live groups
        self._beats_seen: dict[bytes, tuple[bytes, float]] = {}  # heartbeat key -> (last value, monotonic first seen)
        # What close() must clear from Ray's KV: a notice put (announce_preemption); the hosts' heartbeat keys
        # unless every host task submitted returned or raised from its own code (its host removed its key
        # then: _host._run_host). Two GCS calls a job saved for the jobs that need neither (issue 29).
        self._noticed = False
        self._hosts_submitted = 0
        self._hosts_ended_clean = 0
        self._reported_in: dict[str, HostProcess | None] = {}  # the hosts whose process has started, by tag
        self._ending: set[str] = set()  # the hosts whose user code is done: their task returns by itself
        self._job_label: dict[str, str] = {}  # the node label the job's TPU slices must carry
        self._last_health = 0.0
        self._released: set[str] = set()  # ids of the groups this job released, until its next acquire saw them gone
        self._transit: dict[str, float] = {}  # slice -> when it was first seen busy with no job holding it
        self._topology: str | None = None  # the topology the job's TPU slices must have (its request's)
        self._fresh_view = False  # the job released slices: the scheduler's next answer must see that
        self._room_of: tuple[tuple[Any, ...], int] | None = None  # (node table read, bundle) -> room (see _room)
        self._in_line = False  # this job asked the scheduler for slices (it has a place in its line to leave)
        self._queued_hosts: dict[str, _Reservation] = {}  # tag -> the reserving-nothing lease of a host not in yet

    # ------------------------------------------------------------------------------------- acquire

    def acquire(self, resources: ResourceConfig, counts: Sequence[int], deadline: float) -> list[SliceLease]:
        self._await_released()
        if isinstance(resources.device, TpuConfig):
            self._job_label = self._tpu_label(resources)
            return self._acquire_tpu(resources.device, counts, deadline, self._job_label)
        self._passed()  # a gang is placed by Ray alone: no line to take a place in
        return [self._acquire_gang(resources, deadline)]

    def _passed(self) -> None:
        """This job asked the scheduler (or needs no asking): the jobs that came after it wait for it no more."""
        if self._arrivals is not None:
            self._arrivals.passed(self.job_id)
            self._arrivals = None

    def _take_turn(self, kind: str, counts: Sequence[int], deadline: float) -> Unschedulable | None:
        """Before its first question, wait (to ``deadline``, this round's end) until the jobs that came to
        its supervisor process before it had theirs answered (:class:`ArrivalOrder`), at most ``ARRIVAL_WAIT`` in
        all; ``Unschedulable`` (held, saying for whom it waits) when the round ended first."""
        if self._arrivals is None:
            return None
        now = time.monotonic()
        if self._turn_until is None:
            self._turn_until = now + ARRIVAL_WAIT
        ahead = self._arrivals.wait_turn(self.job_id, max(0.0, min(deadline, self._turn_until) - now))
        if not ahead:
            return None  # its turn
        if time.monotonic() >= self._turn_until:  # waited long enough: those ahead lose their turn
            self._arrivals.skip_ahead(self.job_id)
            return None
        others = f"{len(ahead)} jobs, the first {ahead[0]}," if len(ahead) > 1 else f"job {ahead[0]}"
        reason = (
            f"waiting for {others} launched before it to take a place in the cluster's line first "
            f"(first come, first served; {ARRIVAL_WAIT:.0f} s at most)"
        )
        return Unschedulable(f"asked: {'/'.join(map(str, counts))} x {kind}; {reason}", held=True, reason=reason)

    def _tpu_label(self, resources: ResourceConfig) -> dict[str, str]:
        """The extra node label a TPU request's slices must carry: the non-preemptible one, or none."""
        if resources.preemptible:
            return {}
        if self.non_preemptible_tpu_label is None:  # RayCluster.launch refuses this; a direct caller gets it here
            raise Unschedulable(
                "preemptible=False: no non-preemptible TPU capacity is configured (non_preemptible_tpu_label)",
                permanent=True,
            )
        key, _, value = self.non_preemptible_tpu_label.partition("=")
        return {key.strip(): value.strip()}

    def _view(self, tpu_type: str, label: dict[str, str], topology: str | None = None) -> SliceView:
        """The slices of this type (with ``label``, and ``topology``: default the type's) from this process's
        shared copy of the cluster's state (see :func:`fray_ray.slices.slice_view`), without who holds the
        busy ones. Read when the job claims: a queued job waits on the scheduler's view instead."""
        shared = ClusterView.shared()
        return slice_view(shared.numbered("nodes"), shared.numbered("available"), tpu_type, label, topology)

    def _admit(
        self, spec_name: str, kind: str, counts: Sequence[int], label: dict[str, str], deadline: float = 0.0
    ) -> dict[str, Any] | Unschedulable:
        """Ask the scheduler, which reads the cluster's state once for every queued job of the cluster (issue
        29: a queued job reads nothing itself): its answer (``count``/``exclude`` to claim now, else ``held``/
        ``reason``; both with the pool's ``total``/``free``/``busy`` slice counts and the ``transit`` slices),
        or why the job waits when the scheduler has not answered by ``deadline`` (:class:`SchedulerBehind`)."""
        waiting = self._take_turn(kind, counts, deadline)
        if waiting is not None:
            return waiting
        fresh, self._fresh_view = self._fresh_view, False
        self._in_line = True
        key = (spec_name, tuple(counts))
        # The answer this job has while it waits: the scheduler holds the next call until it changes (up to
        # QUEUE_HOLD; one call per change, not one per round). Not after a release (a quick fresh look).
        last = self._last_wait if self._last_wait is not None and self._last_wait[0] == key and not fresh else None
        hold = min(QUEUE_HOLD, self.queue_ttl / 2)
        answer = self.scheduler.ask(
            "acquire_pool",
            self.job_id,
            spec_name,
            label,
            self._topology,
            list(counts),
            self.queue_ttl,
            self.submitted_at,
            fresh,
            answer_key(last[1]) if last is not None else None,
            hold,
            timeout=max(ADMIT_WAIT_MIN, deadline - time.monotonic()),
            key=key,
            replace=fresh,  # a held call in flight answers what the job had: not what it asks after a release
        )
        # Judged (or the scheduler is behind): its place is taken, the job after it may ask. Not once the call
        # is sent: Ray runs an async actor's calls out of order, and a call sent after this one was judged
        # first (1 run in 3 of test_ray_policy's launch-order test).
        self._passed()
        held = isinstance(answer, SchedulerBehind) and not answer.error and answer.waited < hold + QUEUE_HOLD_SLACK
        if held and last is not None:  # held, as asked: the answer it has still holds
            return {**last[1], "transit": []}
        if isinstance(answer, dict):
            self._last_wait = (key, answer) if "count" not in answer else None
        if isinstance(answer, SchedulerBehind):
            # The queue is the only admission there is: a job never takes slices on capacity alone because
            # the scheduler is slow (first come, first served would be lost without a word). It waits, held
            # (no attempt, no budget spent), and says why.
            asked = "/".join(map(str, counts))
            return Unschedulable(f"asked: {asked} x {kind}; {answer.reason()}", held=True, reason=answer.reason())
        return answer

    @staticmethod
    def _slow(took: float) -> str:
        """What a pending reason adds when reading the cluster's state is slow (the GCS is behind)."""
        return f"; the cluster's state took {took:.1f} s to read (the GCS is slow)" if took >= SLOW_READ_S else ""

    def free_slices(self, tpu_type: str) -> int:
        """Free slices of ``tpu_type`` this job could take now (with the label its request needs, not
        quarantined, not reserved for an older queued job): how an elastic job knows it could grow (see
        ``SliceProvider``). Asked of the scheduler (its view of the cluster is shared by every job); none
        while it does not answer."""
        spec = get_tpu_spec(tpu_type)
        answer = self.scheduler.call("free_in_pool", self.job_id, spec.name, self._job_label, self._topology)
        return 0 if answer is None else int(answer)

    def _acquire_tpu(
        self, tpu: TpuConfig, counts: Sequence[int], deadline: float, label: dict[str, str]
    ) -> list[SliceLease]:
        spec = get_tpu_spec(tpu.type)
        asked = "/".join(map(str, counts))
        kind = f"{spec.name} labelled {self.non_preemptible_tpu_label} (non-preemptible)" if label else spec.name
        self._topology = tpu.resolved_topology
        if self._topology != spec.topology:
            kind += f" ({self._topology})"
        while True:
            answer = self._admit(spec.name, kind, counts, label, deadline)
            if isinstance(answer, Unschedulable):  # the scheduler is behind
                self._sleep_until(deadline)
                raise answer.with_traceback(None)
            # a slice with a host down still exists: it may come back whole
            seen = self._max_slices_seen[spec.name] = max(self._max_slices_seen.get(spec.name, 0), answer["total"])
            if min(counts) > seen and not self.autoscaling:
                raise Unschedulable(
                    f"asked: {asked} x {kind}; the Ray cluster has {seen} slice(s) of {kind} in all "
                    "(pass autoscaling=True to RayCluster to wait for an autoscaler instead)",
                    permanent=True,
                )
            if "count" in answer:
                break
            waiting = Unschedulable(
                f"asked: {asked} x {kind}; cluster has: {answer['free']} free, {answer['busy']} busy",
                held=answer["held"],
                reason=answer["reason"] + self._slow(answer.get("slow", 0.0)),
            )
            if not (self._in_transit(answer["transit"]) and time.monotonic() + TRANSIT_STEP < deadline):
                self._sleep_until(deadline)
                raise waiting
            time.sleep(TRANSIT_STEP)
        count, exclude = int(answer["count"]), list(answer["exclude"])
        # Admitted: this process reads the cluster's state now, once, for the slices' nodes and names.
        view = self._view(spec.name, label, self._topology)
        free = view.free
        if any(not view.slices[n].labelled for n in free):
            leases = self._claim_by_resources(
                spec.name, count, deadline, [n for n in free if n not in exclude], len(free), answer["total"], view
            )
        else:
            leases = self._claim(
                spec.name,
                count,
                deadline,
                label,
                exclude + view.mismatched,
                len(free),
                answer["total"],
                view.nodes,
                view.slices,
            )
        # the slices' names: the scheduler holds them for this job even where its read of what is free
        # predates this claim (the next job in line is not admitted to them)
        self.scheduler.notify("claimed", self.job_id, [lease.name for lease in leases])
        return leases

    def _in_transit(self, busy_unheld: Sequence[str]) -> bool:
        """A slice is busy but no job holds it, first seen so less than ``TRANSIT_S`` ago: most likely a
        job that just ended removed its groups and Ray's view has not caught up (it lags by up to ~0.1 s),
        so looking again in ``TRANSIT_STEP`` beats sleeping out the round. A slice busy for another reason
        (work outside fray) gets those quick looks for ``TRANSIT_S`` only."""
        now = time.monotonic()
        self._transit = {name: self._transit.get(name, now) for name in busy_unheld}
        return any(now - first < TRANSIT_S for first in self._transit.values())

    def _claim(
        self,
        tpu_type: str,
        count: int,
        deadline: float,
        label: dict[str, str],
        exclude: list[str],
        free: int,
        total: int,
        nodes: dict[str, dict[str, Any]],
        slices: dict[str, TpuSlice] | None = None,
    ) -> list[SliceLease]:
        """Reserve ``count`` slices (heads, then hosts; see module doc), none of those in ``exclude``.
        ``nodes``: the live node table the caller just read (read again only for a node not in it)."""

        def node(nid: str) -> dict[str, Any]:
            nonlocal nodes
            if nid not in nodes:  # joined since (a restored slice): look once more
                nodes = _node_table(fresh=True)
            return nodes.get(nid, {})

        spec = get_tpu_spec(tpu_type)
        head_selector = {WORKER_ID_LABEL: "0", POD_TYPE_LABEL: spec.name, **label}
        if exclude:  # Ray's label selector: "!in(a, b)" matches a node whose label is none of them
            head_selector[SLICE_NAME_LABEL] = f"!in({', '.join(exclude)})"
        wait_until = max(deadline, time.monotonic() + RESERVE_GRACE)
        heads = [
            placement_group(
                [{spec.head_resource: 1}],
                bundle_label_selector=[head_selector],
                name=f"fray-{self.job_id}-head-{next(self._pg_seq)}",
            )
            for _ in range(count)
        ]
        groups: list[PlacementGroup] = list(heads)
        try:
            if not self._ready(heads, wait_until):
                # the scheduler admitted us, so the slices exist: another claim got there first (the queue
                # only orders, placement groups decide); we keep our place in line, and the scheduler's next
                # answer reads what is free again (its copy said free what was not)
                self._fresh_view = True
                raise Unschedulable(
                    f"asked: {count} x {spec.name}; could not claim {count} slice head(s) in time; cluster "
                    f"has: {free} free, {total - free} busy",
                    held=True,
                    reason=f"claiming {count} x {spec.name}: free slices were taken by another job meanwhile; retrying",
                )
            names = []
            head_nodes = []
            for head in heads:
                head_node = _bundle_nodes(head).get(0, "")
                name = (node(head_node).get("Labels") or {}).get(SLICE_NAME_LABEL)
                if not name:
                    raise Unschedulable(f"a {spec.name} slice head has no {SLICE_NAME_LABEL} label (node {head_node})")
                names.append(name)
                head_nodes.append(head_node)
            tpu = [
                (slices[n].tpu_per_host if slices and n in slices else 0.0) or _tpu_per_host(spec.chips_per_host)
                for n in names
            ]
            workers = [
                placement_group(
                    [{"TPU": tpu[i]}] * spec.hosts,
                    strategy="SPREAD",
                    bundle_label_selector=[
                        {SLICE_NAME_LABEL: name, WORKER_ID_LABEL: str(h), **label} for h in range(spec.hosts)
                    ],
                    name=f"fray-{self.job_id}-{name}-{next(self._pg_seq)}",
                )
                for i, name in enumerate(names)
            ]
            groups.extend(workers)
            if not self._ready(workers, wait_until, held=heads):
                raise Unschedulable(
                    f"asked: {count} x {spec.name}; claimed {', '.join(names)} but their hosts did not "
                    f"become free in time"
                )
        except BaseException:
            _Reservation(groups).remove()
            raise
        leases = []
        for name, head, head_node, worker, amount in zip(names, heads, head_nodes, workers, tpu):
            bundle_nodes = _bundle_nodes(worker)
            hosts = tuple(bundle_nodes.get(h, "") for h in range(spec.hosts))
            addrs = tuple(node(nid).get("NodeManagerAddress", "") for nid in hosts)
            held = frozenset(bundle_nodes.values()) | {head_node}
            res = _Reservation([worker, head], nodes=held, host_nodes=hosts, tpu_per_host=amount)
            leases.append(
                SliceLease(
                    name=name, device_type=spec.name, hosts=spec.hosts, host_addresses=addrs, handle=(res, worker)
                )
            )
        return leases

    def _claim_by_resources(
        self, tpu_type: str, count: int, deadline: float, candidates: list[str], free: int, total: int, view: SliceView
    ) -> list[SliceLease]:
        """Reserve ``count`` of the free ``candidates`` on a cluster whose slices carry no ``ray.io/tpu-*``
        labels: one placement group per slice, bound to it by its slice-name resource, bundle 0 on worker 0
        (the ``TPU-<type>-head`` resource, so the group holds the slice's head as the labelled claim does)."""
        spec = get_tpu_spec(tpu_type)
        if len(candidates) < count:
            raise Unschedulable(
                f"asked: {count} x {spec.name}; cluster has: {free} free, {total - free} busy",
                held=True,
                reason=f"claiming {count} x {spec.name}: only {len(candidates)} free slice(s) may be taken now; "
                f"retrying",
            )
        wait_until = max(deadline, time.monotonic() + RESERVE_GRACE)
        names = candidates[:count]
        groups = []
        for name in names:
            tpu = view.slices[name].tpu_per_host or _tpu_per_host(spec.chips_per_host)
            bundles = [{"TPU": tpu, spec.head_resource: 1.0, name: 0.001}] + [{"TPU": tpu, name: 0.001}] * (
                spec.hosts - 1
            )
            groups.append(
                placement_group(bundles, strategy="STRICT_SPREAD", name=f"fray-{self.job_id}-head-{next(self._pg_seq)}")
            )
        try:
            if not self._ready(groups, wait_until):
                self._fresh_view = True  # as in _claim: the next answer reads what is free again
                raise Unschedulable(
                    f"asked: {count} x {spec.name}; could not claim {', '.join(names)} in time; cluster "
                    f"has: {free} free, {total - free} busy",
                    held=True,
                    reason=f"claiming {count} x {spec.name}: free slices were taken by another job meanwhile; retrying",
                )
        except BaseException:
            _Reservation(groups).remove()
            raise
        nodes = view.nodes
        leases = []
        for name, pg in zip(names, groups):
            bundle_nodes = _bundle_nodes(pg)
            hosts = tuple(bundle_nodes.get(h, "") for h in range(spec.hosts))
            if any(h not in nodes for h in hosts):
                nodes = _node_table(fresh=True)
            addrs = tuple(nodes.get(h, {}).get("NodeManagerAddress", "") for h in hosts)
            res = _Reservation([pg], nodes=frozenset(hosts), host_nodes=hosts, tpu_per_host=bundles[0]["TPU"])
            leases.append(
                SliceLease(name=name, device_type=spec.name, hosts=spec.hosts, host_addresses=addrs, handle=(res, pg))
            )
        return leases

    def _acquire_gang(self, resources: ResourceConfig, deadline: float) -> SliceLease:
        """CPU/GPU: one placement group with a bundle per replica, kept pending across acquire rounds; one
        replica: no group at all (:meth:`_queue_lease`)."""
        n = int(resources.replicas)  # type: ignore[arg-type]  # a list of counts is for TPU slices only
        bundle = self._gang_bundle(resources)
        if n == 1:
            return self._queue_lease(resources, bundle)
        key = (n, tuple(sorted(bundle.items())))
        with self._lock:
            if self._pending_gang is None or self._pending_gang[0] != key:
                if self._pending_gang is not None:
                    _Reservation([self._pending_gang[1]]).remove()
                pg = placement_group(
                    [dict(bundle)] * n, strategy="PACK", name=f"fray-{self.job_id}-gang-{next(self._pg_seq)}"
                )
                # one wait registered with the GCS per group, not one per acquire round (2 a second a job)
                self._pending_gang = (key, pg, pg.ready())
            _, pg, ready = self._pending_gang
        if not self._ready([pg], deadline, refs=[ready]):
            raise self._gang_waiting(n, bundle)
        with self._lock:
            self._pending_gang = None
        nodes = _node_table()
        bn = _bundle_nodes(pg)
        if any(nid not in nodes for nid in bn.values()):
            nodes = _node_table(fresh=True)
        addrs = tuple(nodes.get(bn.get(i, ""), {}).get("NodeManagerAddress", "") for i in range(n))
        kind = "gpu" if isinstance(resources.device, GpuConfig) else "cpu"
        return SliceLease(
            name="ray",
            device_type=kind,
            hosts=n,
            host_addresses=addrs,
            handle=(_Reservation([pg], nodes=frozenset(bn.values()), bundle=bundle), pg),
        )

    def _queue_lease(self, resources: ResourceConfig, bundle: dict[str, float]) -> SliceLease:
        """A one-replica CPU/GPU job: a lease that reserves nothing. Its host task asks Ray for the bundle's
        resources itself and waits in Ray's own queue, as a plain Ray task does (:meth:`queued` says so), and
        starts in the first worker free for it. A placement group per job, created, waited for and removed
        around one task, made 100 small jobs take 21x as long as the same tasks without (bench/NOTES.md), and
        a group of one bundle guarantees nothing a task's own resource request does not. Fails at once when
        no node of the cluster ever had room for it (as a gang does)."""
        if self._room(bundle) < 1:  # permanent, or missing (schedule_timeout) while an autoscaler may add nodes
            raise self._gang_waiting(1, bundle)
        kind = "gpu" if isinstance(resources.device, GpuConfig) else "cpu"
        return SliceLease(name="ray", device_type=kind, hosts=1, handle=(_Reservation([], bundle=bundle), None))

    def _room(self, bundle: dict[str, float]) -> int:
        """How many ``bundle``-shaped requests the live nodes' totals hold at once (not what is free now): an
        O(N) read shared by every job of the process, at most every ``GANG_ROOM_MAX_AGE`` seconds."""
        nodes, read = ClusterView.shared().numbered("nodes", max_age=GANG_ROOM_MAX_AGE)
        key = (read, tuple(sorted(bundle.items())))
        if self._room_of is None or self._room_of[0] != key:  # the sum is O(N) too: once per read and shape
            self._room_of = (key, sum(_bundles_fitting(node.get("Resources") or {}, bundle) for node in nodes.values()))
        return self._room_of[1]

    def _gang_waiting(self, n: int, bundle: dict[str, float]) -> Unschedulable:
        """Why a CPU/GPU gang is not placed yet. Held (the job waits as long as it takes, PENDING, no
        ``schedule_timeout``) when the cluster's nodes have room for it in all, so other work holds it: a
        queue of CPU jobs on a busy cluster is not a missing capacity. Permanent (fails at once) when they
        never had room for it and no autoscaler may add nodes; else missing."""
        shared = ClusterView.shared()  # shared by every job of the process
        # the nodes' totals change when nodes come or go: an O(N) read at most every GANG_ROOM_MAX_AGE seconds
        room = self._room(bundle)
        shape = tuple(sorted(bundle.items()))
        seen = self._max_gang_room[shape] = max(self._max_gang_room.get(shape, 0), room)
        asked = _asked(n, bundle)
        if seen < n and not self.autoscaling:
            return Unschedulable(
                f"asked: {asked}; the Ray cluster's nodes have room for {seen} in all "
                "(pass autoscaling=True to RayCluster to wait for an autoscaler instead)",
                permanent=True,
            )
        if room >= n:
            # the same text round after round: a changed pending_reason is a record write
            reason = f"waiting for {asked}: the cluster has room for {room} in all, held by other work"
            return Unschedulable(f"asked: {asked}; {reason}", held=True, reason=reason)
        per_node = shared.available().values()
        have = ", ".join(f"{k} {sum(r.get(k, 0.0) for r in per_node):g}" for k in bundle)
        return Unschedulable(f"asked: {asked}; cluster has free: {have}; nodes with room for {room} in all")

    def _gang_bundle(self, resources: ResourceConfig) -> dict[str, float]:
        bundle: dict[str, float] = {}
        if resources.cpu:
            bundle["CPU"] = float(resources.cpu)
        if resources.ram:
            bundle["memory"] = float(parse_size(resources.ram, "ResourceConfig.ram"))
        if isinstance(resources.device, GpuConfig):
            bundle["GPU"] = float(resources.device.count)
        if not resources.preemptible:
            bundle[self.non_preemptible_resource] = 0.001
        return bundle

    @staticmethod
    def _ready(
        groups: list[PlacementGroup], until: float, held: Sequence[PlacementGroup] = (), refs: list[Any] | None = None
    ) -> bool:
        """All ``groups`` placed by ``until``; ``False`` early when a group already ``held`` leaves CREATED
        (its slice was lost while the rest was being reserved). ``refs``: their ``ready()`` refs, if made."""
        refs = refs if refs is not None else [pg.ready() for pg in groups]
        while True:
            remaining = until - time.monotonic()
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(remaining, HEALTH_INTERVAL)))
            if len(ready) == len(refs):
                return True
            if remaining <= HEALTH_INTERVAL or any(placement_group_table(pg).get("state") != "CREATED" for pg in held):
                return False

    @staticmethod
    def _sleep_until(deadline: float) -> None:
        time.sleep(max(0.0, min(deadline - time.monotonic(), 1.0)))

    def release(self, leases: list[SliceLease]) -> None:
        """Remove the leases' placement groups: a GCS call of ~2 ms, and nothing waited for, so the job's
        end is recorded at once. Ray gives the resources back to the nodes asynchronously (27-104 ms
        measured); this job's next ``acquire`` waits for that (:meth:`_await_released`), another job's
        looks again shortly (:meth:`_in_transit`)."""
        gone = [
            lease
            for lease in leases
            if lease.handle is not None and not lease.handle[0].removed and lease.handle[0].groups
        ]
        removed = [lease.handle[0] for lease in gone]
        for res in removed:
            res.remove()
        # Not a lost slice's groups: its nodes keep showing their resources until Ray declares them dead
        # (seconds), and nobody gets that slice back anyway (waiting for them cost every recovery ~4 s).
        self._released.update(
            pg.id.hex() for res in removed if res.lost is None and not res.node_died for pg in res.groups
        )
        if removed:  # the scheduler reads what is free for every queued job: now, not at its next interval
            self.scheduler.notify("released", self.job_id, [lease.name for lease in gone])

    def _await_released(self) -> None:
        """Before this job claims again (a retry, an elastic resize): wait, at most ``RELEASE_TIMEOUT``,
        until the nodes have the resources of the groups it released back, so a job that grows sees the
        slices it held as free instead of taking fewer."""
        pending, self._released = self._released, set()
        if pending:  # the shared copies may predate the release: this job's next views must show it
            ClusterView.shared().invalidate("available")
            self._fresh_view = True
        end = time.monotonic() + RELEASE_TIMEOUT
        while pending:
            # a placement group's bundles are node resources named ``<resource>_group_[<bundle>_]<group id>``
            t0 = time.monotonic()
            present = {
                name.rsplit("_", 1)[-1]
                for node in total_resources_per_node().values()
                for name in node
                if "_group_" in name
            }
            took = time.monotonic() - t0
            pending &= present
            if not pending or time.monotonic() >= end:
                return
            # a read of every node's resources: 20 ms apart on a small cluster, its own cost x 10 on a large
            # one (~80 ms of GCS CPU a read at 16,000 hosts): the GCS spends at most a tenth of its time here
            time.sleep(max(0.02, 10 * took))

    def close(self) -> None:
        """The job ended: drop a gang reservation still pending, and leave the scheduler's queue at once
        (younger jobs no longer wait behind this one)."""
        with self._lock:
            if self._pending_gang is not None:
                _Reservation([self._pending_gang[1]]).remove()
                self._pending_gang = None
        if self._in_line:  # a round trip to the scheduler at every job's end, for the jobs that were in its line
            self.scheduler.call("leave", self.job_id)
        try:  # the hosts' heartbeats (see heartbeats) and preemption notices (announce_preemption)
            gcs = ray._private.worker.global_worker.gcs_client
            # also when a beat was seen: its host's own removal may have failed (a busy GCS)
            if self._hosts_ended_clean < self._hosts_submitted or self._beats_seen:
                gcs.internal_kv_del(f"fray-hb:{self.job_id}:".encode(), True, b"fray")
            if self._noticed:
                gcs.internal_kv_del(f"fray-notice:{self.job_id}:".encode(), True, b"fray")
        except Exception:
            pass

    # --------------------------------------------------------------------------------------- start

    def prepare_entry(self, entrypoint: Entrypoint) -> None:
        """Pickle ``entrypoint`` in the background (the slices are being reserved meanwhile); ``start``
        uses the bytes. A function defined in a script is pickled by value, which takes milliseconds.
        Idempotent: the runner calls it as it begins, and a supervisor may have called it earlier."""
        if self._entry_bytes is not None and self._entry_bytes[0] == id(entrypoint):
            return
        future: concurrent.futures.Future[bytes] = concurrent.futures.Future()

        def pickle() -> None:
            try:
                future.set_result(cloudpickle.dumps(host_payload(entrypoint)))
            except BaseException as e:  # start() raises it: a host start that failed
                future.set_exception(e)

        self._entry_bytes = (id(entrypoint), future)
        shared_threads().submit(pickle, name="fray-pickle-entrypoint")  # a thread kept for the next job (issue 29)

    def _entry_arg(self, entrypoint: Entrypoint, attempt: int) -> Any:
        """The pickled entrypoint as a host task argument, once per attempt.

        Small (the usual case): the bytes themselves, which Ray inlines in the task spec, so no host fetches
        anything before it starts. Large: a fresh ``ray.put`` for every attempt. A reference kept across
        attempts has copies on the previous attempt's nodes; after a preemption a host may try to fetch it
        from a removed node and stall until Ray declares that node dead (~15 s, measured in bench/NOTES.md).
        """
        key = (id(entrypoint), attempt)
        if self._entry is None or self._entry[0] != key:
            pre = self._entry_bytes
            data = (
                pre[1].result()
                if pre is not None and pre[0] == id(entrypoint)
                else cloudpickle.dumps(host_payload(entrypoint))
            )
            self._entry = (key, data if len(data) <= INLINE_ENTRY_LIMIT else ray.put(data))
        return self._entry[1]

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        pg = lease.handle[1]
        entry = self._entry_arg(entrypoint, hosts[0].attempt)
        is_tpu = lease.device_type not in ("cpu", "gpu")
        runs: list[HostRun] = []
        if pg is None:  # a lease that reserves nothing: the task waits in Ray's queue (see queued)
            lease.handle[0].since = time.monotonic()
        try:
            for spec in hosts:
                runs.append(self._start_host(lease, pg, spec, entry, is_tpu))
        except BaseException:
            # all or nothing (see SliceProvider.start): the host tasks already submitted must not run on
            self._cancel_unfinished(runs)
            raise
        return runs

    def _start_host(
        self, lease: SliceLease, pg: PlacementGroup | None, spec: HostSpec, entry: Any, is_tpu: bool
    ) -> HostRun:
        """Submit one host's task (not waited for)."""
        attempt, s, h = spec.attempt, spec.slice_index, spec.host_index
        if is_tpu:
            tag, where = f"a{attempt} s{s}/h{h}", f"{lease.name} host {h}"
            opts: dict[str, Any] = {"num_cpus": 0, "resources": {"TPU": _lease_tpu(lease)}}
        else:
            tag, where = f"a{attempt} r{h}", f"replica {h}"
            # in its group's bundle, whose marker resource the group holds; queued, it asks Ray for that too
            opts = _task_options(lease.handle[0].bundle or {}, markers=pg is None)
        env = dict(spec.env)
        env.setdefault(
            "FRAY_CLUSTER_SPEC", "ray"
        )  # tasks inside the job use Ray's job context, unless the user set one
        env["FRAY_NOTICE_FILE"] = self._notice_file(attempt)  # where preemption_notice() reads the deadline
        # A CPU replica runs in a worker Ray may reuse (a fresh one costs ~1 CPU-second: most of a small job's
        # cost, bench/NOTES.md); a TPU or GPU host in a fresh one, whose device it holds until it exits.
        shared = not is_tpu and not opts.get("num_gpus")
        if pg is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=h
            )
        else:  # before the task exists: it may report in (mark_started, another thread) at once
            self._queued_hosts[tag] = lease.handle[0]
        self._hosts_submitted += 1
        ref = (
            (_shared_host_task if shared else _host_task)
            .options(
                max_retries=0,
                retry_exceptions=False,
                # a CPU replica's task records no task events (Fray's record has its states): at hundreds of
                # small jobs their events were ~12% of the CPU the jobs cost (bench/NOTES.md, issue 29)
                enable_task_events=not shared,
                runtime_env=self.runtime_env,
                name=f"fray:{self.job_id}:{tag}",
                **opts,
            )
            .remote(entry, env, tag, where, self._config_for(shared))
        )
        return HostRun(lease=lease, slice_index=s, host_index=h, handle=_Task(ref, tag=tag))

    def _config_for(self, shared: bool) -> HostConfig:
        """The host config of a new host task, with the supervisor process's current notice epoch (see
        ``fray_ray._notices``; none outside a supervisor actor: the hosts read the KV key)."""
        board = BOARD.ref(self.job_id)
        cached = self._board_configs
        if cached is None or cached[0] is not board:
            cached = self._board_configs = (
                board,
                attrs.evolve(self.host_config, notice_board=board),
                attrs.evolve(self._shared_config, notice_board=board),
            )
        return cached[2] if shared else cached[1]

    def _notice_file(self, attempt: int) -> str:
        return os.path.join(tempfile.gettempdir(), f"fray-notice-{self.job_id}-a{attempt}")

    # ------------------------------------------------------------------------------- lease health

    def lease_health(self, leases: Sequence[SliceLease]) -> list[LeaseHealth]:
        """Ray's own state of each lease: LOST once a node of it is reported dead or a placement group of it
        left CREATED (after Ray's node-death detection, :attr:`detection_delay`), DRAINING when a node of it
        is being drained (Ray's DrainNode: the autoscaler's and GKE maintenance events' preemption notice,
        with its deadline), else INTACT."""
        now = time.monotonic()
        if now - self._last_health >= HEALTH_INTERVAL:
            self._last_health = now
            self._check_health([lease for lease in leases if lease.handle is not None])
        # a queued host's lease has no node until the host reported in: nothing that could drain yet
        draining = (
            self._draining() if any(lease.handle is not None and lease.handle[0].nodes for lease in leases) else {}
        )
        out = []
        for lease in leases:
            res = lease.handle[0] if lease.handle is not None else None
            if res is None:
                out.append(LeaseHealth.unknown())
            elif res.lost is not None:
                out.append(LeaseHealth.lost(res.lost))
            elif any(n in draining for n in res.nodes):
                ms = [draining[n] for n in res.nodes if n in draining and draining[n] > 0]
                deadline = min(ms) / 1000.0 if ms else time.time() + NOTICE_DEFAULT_GRACE
                out.append(
                    LeaseHealth.draining(
                        deadline, f"Ray drains {len([n for n in res.nodes if n in draining])} node(s) for preemption"
                    )
                )
            else:
                out.append(LeaseHealth.intact())
        return out

    def _draining(self) -> dict[str, int]:
        """The nodes Ray drains (node id -> deadline, ms since the epoch; 0: none given), as the scheduler
        last read them: one read a second for the whole cluster, not one per supervisor (Ray's handler
        walks every node: 0.65 ms of GCS work a call at 16,000 hosts on a quiet machine, issue 29). Looked
        at most once per ``HEALTH_INTERVAL``: one question in flight per process, held by the scheduler until
        its answer changes (``DRAIN_HOLD``); a question not answered yet leaves the last answer standing."""
        shared = _Drains.of(self.scheduler.namespace)
        with shared.lock:
            if time.monotonic() - shared.at < HEALTH_INTERVAL or shared.asking:
                return shared.nodes  # fresh, or another job of this process is asking right now
            shared.asking = True
            if shared.client is None:
                s = self.scheduler
                shared.client = SchedulerClient(s.namespace, s.resource, s.quarantine)
            client = shared.client
        answer = None
        try:
            if shared.known:  # held while it stays the same: taken when there, never waited for
                answer = client.ask("draining", shared.nodes, DRAIN_HOLD, timeout=0.0)
            else:  # the first answer: worth a moment's wait (the scheduler may be starting)
                answer = client.ask("draining", timeout=FIRST_DRAIN_WAIT)
        finally:
            with shared.lock:
                shared.asking, shared.at = False, time.monotonic()
                if isinstance(answer, dict):
                    shared.nodes, shared.known = answer, True
        return shared.nodes

    @property
    def detection_delay(self) -> float:
        """How long Ray may take to declare a lost node dead, from the cluster's own health checks (the GCS's
        system config, :func:`health_checks`): ``health_check_period_ms`` x ``health_check_failure_threshold``
        (15 s by default; each check fails at once once the node's raylet is gone), one period more for a check
        a loaded head runs late, plus this provider's own health-check interval and a second for the news to
        reach it: 19.5 s at Ray's defaults."""
        if self._detection is None:
            period, _, threshold = health_checks()
            self._detection = period * (threshold + 1) + HEALTH_INTERVAL + 1.0
        return self._detection

    def heartbeats(self, runs: Sequence[HostRun]) -> dict[HostRun, Heartbeat]:
        """The hosts' last ``fray_core.heartbeat()``, from Ray's GCS key-value store (see ``_host._beat_to_gcs``)."""
        if not runs:
            return {}
        keys = [f"fray-hb:{self.job_id}:{r.handle.tag}".encode() for r in runs]
        try:
            got = ray._private.worker.global_worker.gcs_client.internal_kv_multi_get(keys, b"fray")
        except Exception:
            return {}  # the GCS is busy: no news is not a stall signal by itself (ages are computed from the beats)
        # A beat's age by this process's own clock, from when it first saw that beat: the time the host wrote
        # in it is the host's wall clock, another machine's (comparing it with ours would turn clock skew
        # into a stall). Precise to one look (the runner's poll interval).
        now = time.monotonic()
        seen = self._beats_seen
        out = {}
        for r, k in zip(runs, keys):
            value = got.get(k)
            if not value and k in seen:  # removed by its host as it ended (_host._beat_to_gcs): its last beat
                value = seen[k][0]
            if value:
                _, _, step = value.decode().partition(" ")
                last = seen.get(k)
                if last is None or last[0] != value:
                    last = seen[k] = (value, now)
                try:
                    out[r] = Heartbeat(age=now - last[1], step=int(step) if step.strip() else None)
                except ValueError:
                    pass
        return out

    def dump_stacks(self, runs: Sequence[HostRun]) -> None:
        """Each host's worker writes the stacks of all its threads (its faulthandler, on a signal sent by a task
        pinned to its node) to its output, hence to the job log under the host's prefix. Waits (at most
        ``STACKS_WAIT``) until every dump reached the log (:meth:`saw_log`) and went quiet: the hosts are killed
        next, and lines still in a host's pump would be lost."""
        targets = [(r, self._reported_in.get(r.handle.tag)) for r in runs if not r.handle.reported]
        targets = [(r, p) for r, p in targets if p is not None]
        if not targets:
            return
        with self._lock:
            self._stacks = {r.handle.tag: None for r, _ in targets}
        for r, process in targets:
            if self.log is not None:
                self.log(r.handle.tag, "[fray] the Python stacks of every thread of this host, before it is stopped:")
            _stacks_task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(process.node_id, soft=False),
                name=f"fray:{self.job_id}:{r.handle.tag}:stacks",
            ).remote(process)
        deadline = time.monotonic() + STACKS_WAIT
        try:
            while time.monotonic() < deadline:
                with self._lock:
                    last = list(self._stacks.values())
                now = time.monotonic()
                if all(t is not None and now - t >= STACKS_QUIET for t in last):
                    break
                time.sleep(0.05)
        finally:
            with self._lock:
                self._stacks = None

    def saw_log(self, tag: str, lines: Sequence[str]) -> None:
        """Lines of a host reached the job log (the supervisor calls it): how :meth:`dump_stacks` knows a
        host's stacks arrived."""
        with self._lock:
            if self._stacks is None or tag not in self._stacks:
                return
            if self._stacks[tag] is not None or any("most recent call first" in line for line in lines):
                self._stacks[tag] = time.monotonic()

    def announce_preemption(self, runs: Sequence[HostRun], deadline: float) -> None:
        """Post the deadline on the process's notice board, which the hosts of these runs' attempts wait on
        (``fray_ray._notices``), and put it in Ray's KV (``_host.notice_key``), which a host whose board is
        gone reads once a second: a drained node takes no new task, so nothing sent there could deliver it;
        each host then writes it into its FRAY_NOTICE_FILE and SIGTERMs itself (``_host._DrainWatch``)."""
        attempts = {str(r.handle.tag).split(" ", 1)[0].lstrip("a") for r in runs if r.handle is not None}
        for attempt in attempts:
            BOARD.post(board_key(self.job_id, attempt), deadline)
        try:
            gcs = ray._private.worker.global_worker.gcs_client
            self._noticed = True
            for attempt in attempts:
                gcs.internal_kv_put(notice_key(self.job_id, attempt).encode(), repr(deadline).encode(), True, b"fray")
        except Exception:
            pass  # the GCS is unreachable: the hosts get the runner's SIGTERM (cancel with grace) only

    # ------------------------------------------------------------------------------------- started

    def mark_started(self, tag: str, process: HostProcess | None = None) -> None:
        """A host's process reports in (through the supervisor) before it runs the user's code, saying
        where it runs (what a graceful ``cancel`` signals): for a queued host also where Ray placed it, the
        node its lease's health is read from (a drain of it is the host's preemption notice)."""
        self._reported_in[tag] = process
        res = self._queued_hosts.pop(tag, None)
        if res is not None and process is not None:
            res.nodes = frozenset((process.node_id,))

    def started_runs(self, runs: list[HostRun]) -> list[HostRun] | None:
        """The runs whose host process has started (see ``SliceProvider``)."""
        return [r for r in runs if r.handle.tag in self._reported_in]

    def queued(self, runs: list[HostRun]) -> str | None:
        """The hosts of a lease that reserves nothing wait in Ray's queue until they report in (see
        ``SliceProvider.queued``): Ray does not tell a task waiting for resources from one whose worker is
        starting, without a state-API call per task. Said after ``QUEUE_QUIET``; unschedulable once no node
        had room for the task for ``QUEUE_NO_ROOM_S`` (its nodes gone, no autoscaler to add any)."""
        res = next(
            (
                r.lease.handle[0]
                for r in runs
                if r.lease.handle is not None and r.lease.handle[1] is None and r.handle.tag not in self._reported_in
            ),
            None,
        )
        if res is None:
            return None
        now = time.monotonic()
        if now - res.since < QUEUE_QUIET:
            return None
        bundle = res.bundle or {}
        room = self._room(bundle)
        if room >= 1:
            res.no_room_since = None
        elif res.no_room_since is None:
            res.no_room_since = now
        elif now - res.no_room_since >= QUEUE_NO_ROOM_S and not self.autoscaling:
            raise Unschedulable(
                f"asked: {_asked(1, bundle)}; no node of the Ray cluster has had room for it for "
                f"{QUEUE_NO_ROOM_S:g} s (pass autoscaling=True to RayCluster to wait for an autoscaler instead)",
                permanent=True,
            )
        # the same text while the room does not change: a changed pending reason is a record write
        return (
            f"waiting in Ray's queue for {_asked(1, bundle)}: the cluster has room for {room} in all, held by "
            "other work (or a worker is starting for it)"
        )

    # ---------------------------------------------------------------------------------------- wait

    def wait_any(self, runs: list[HostRun], timeout: float) -> list[HostOutcome]:
        live = [r for r in runs if not r.handle.reported]
        if not live:
            return []
        out = self._lost_runs(live)
        if out:
            return out
        by_ref = {r.handle.ref: r for r in live}
        refs = list(by_ref)
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, min(timeout, HEALTH_INTERVAL)), fetch_local=False)
        if not ready:
            return self._lost_runs(live)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in ready:
            run = by_ref[ref]
            run.handle.reported = True
            out.append(self._outcome(run))
        return out

    def _lost_runs(self, live: list[HostRun]) -> list[HostOutcome]:
        """PREEMPTED outcomes for the unfinished hosts of every lease Ray reports lost (see module doc)."""
        now = time.monotonic()
        if now - self._last_health >= HEALTH_INTERVAL:
            self._last_health = now
            self._check_health({id(r.lease): r.lease for r in live}.values())
        out = []
        for run in live:
            lost = run.lease.handle[0].lost if run.lease.handle is not None else None
            if lost is not None and not run.handle.reported:
                run.handle.reported = True
                self._cancel_unfinished([run])  # it may still wait for a node that is gone
                out.append(HostOutcome(run, HostOutcomeKind.PREEMPTED, error=f"SliceLost: {lost}"))
        return out

    def _check_health(self, leases: Any) -> None:
        """Mark leases lost (Ray's own state, no text): a node of the lease dead (the process's one
        ``CheckAlive``, :class:`_NodeLiveness`: every second while this job looks for the cause of a host's
        failure, else every ``LIVENESS_CALM_S``), or its placement group out of CREATED.

        The group of each lease (the first: a slice's head group sits on worker 0, a node of the host group
        too) is looked up by id at most every ``GROUP_CHECK_S`` while the job runs well, every check for
        ``detection_delay`` after one of its hosts failed (when attribution looks: a group removed under the
        job), and until its nodes are known. The GCS moves a group to RESCHEDULING when it marks a node of it
        dead, the moment the node is dead for ``CheckAlive`` too: what the group adds is a group removed by
        someone else. Neither read grows with the cluster (the node table's does: issue 29).

        A lease that reserves nothing (one replica queued by Ray) has no group: once its host reported in, its
        node is asked after the same way. Without that, a node lost under a one-replica job whose host's
        worker Ray reports crashed (not NodeDied) was the job's failure."""
        now = time.monotonic()
        every = self._host_failed_at > float("-inf") and now - self._host_failed_at < self.detection_delay
        for lease in leases:
            res: _Reservation | None = lease.handle[0] if lease.handle is not None else None
            if res is None or res.lost is not None or res.removed:
                continue
            dead = _LIVENESS.dead(res.nodes, now, urgent=every) if res.nodes else set()
            if dead:
                what = f"node(s) {', '.join(sorted(d[:12] for d in dead))}"
                res.lost = (
                    f"{_lease_name(lease)}: {what} of it dead (Ray's GCS)"
                    if res.groups
                    else f"ray: the node of the job's one replica ({min(dead)[:12]}) is dead (Ray's GCS)"
                )
                continue
            if not res.groups or (res.nodes and not every and now - res.group_checked < GROUP_CHECK_S):
                continue
            res.group_checked = now
            pg = res.groups[0]
            table = placement_group_table(pg)
            state = table.get("state")
            # Placed again elsewhere (a node died and the group was rescheduled onto a replacement between two
            # checks) is as lost as RESCHEDULING: the hosts' tasks were on the dead node.
            moved = sorted(set((table.get("bundles_to_node_id") or {}).values()) - res.nodes) if res.nodes else []
            if res.removed:
                continue  # released by this job meanwhile
            if state != "CREATED":
                res.lost = f"{_lease_name(lease)}: placement group {pg.id.hex()[:12]} is {state} (a node of it died)"
            elif moved:
                res.lost = (
                    f"{_lease_name(lease)}: placement group {pg.id.hex()[:12]} was placed again on node(s) "
                    f"{', '.join(m[:12] for m in moved)} (a node of it died)"
                )

    def _outcome(self, run: HostRun) -> HostOutcome:
        out = self._outcome_of(run)
        if out.kind is not HostOutcomeKind.SUCCEEDED:  # attribution looks at the leases now: every group too
            self._host_failed_at = time.monotonic()
        return out

    def _outcome_of(self, run: HostRun) -> HostOutcome:
        task: _Task = run.handle
        try:
            value = ray.get(task.ref, timeout=RESULT_TIMEOUT)
            self._hosts_ended_clean += 1
        except rex.TaskCancelledError:
            return HostOutcome(run, HostOutcomeKind.CANCELLED)
        except rex.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else e
            if not isinstance(cause, rex.RayError):  # raised in the host's own code: its cleanup ran
                self._hosts_ended_clean += 1
            if isinstance(cause, _NODE_GONE):
                run.lease.handle[0].node_died = True  # release need not wait for its resources (see there)
            if isinstance(cause, TpuBusyError):  # the host's device is unusable: counts towards its quarantine
                self.scheduler.call("device_failed", run.lease.name, run.host_index, "device busy", _host_node(run))
            if isinstance(cause, DeviceFaultError):  # a known device fault's signature: the same (as locally)
                self.scheduler.call("device_failed", run.lease.name, run.host_index, cause.fault, _host_node(run))
                return HostOutcome(run, HostOutcomeKind.PREEMPTED, error=f"DeviceFault: {cause}")
            if isinstance(cause, (HostPreemptedError, HostPreempted, *PREEMPTION_ERRORS)) and not (
                task.stopping and not isinstance(cause, _NODE_LOST)
            ):
                return HostOutcome(run, HostOutcomeKind.PREEMPTED, error=f"{type(cause).__name__}: {cause}")
            if task.cancelled:
                return HostOutcome(run, HostOutcomeKind.CANCELLED)
            return HostOutcome(
                run, HostOutcomeKind.FAILED, error=f"{type(cause).__name__}: {cause}\n{_traceback_of(e)}"
            )
        except PREEMPTION_ERRORS as e:
            if isinstance(e, _NODE_GONE):
                run.lease.handle[0].node_died = True
            if task.stopping and not isinstance(e, _NODE_LOST):  # its worker ended on our SIGTERM
                return HostOutcome(run, HostOutcomeKind.CANCELLED)
            return HostOutcome(run, HostOutcomeKind.PREEMPTED, error=f"{type(e).__name__}: {_first_lines(str(e))}")
        except rex.WorkerCrashedError as e:  # the host's process died; its node's fate the window decides
            if task.cancelled or task.stopping:
                return HostOutcome(run, HostOutcomeKind.CANCELLED)
            return HostOutcome(
                run,
                HostOutcomeKind.FAILED,
                error=(
                    "WorkerCrashedError: the host's process died while its node was up (a crash, a signal, or "
                    f"out of memory?): {_first_lines(str(e))}"
                ),
            )
        except rex.OutOfMemoryError as e:  # Ray's memory monitor killed the host's worker: the job's own memory
            if task.cancelled:
                return HostOutcome(run, HostOutcomeKind.CANCELLED)
            return HostOutcome(
                run,
                HostOutcomeKind.FAILED,
                error=f"OutOfMemoryError: host process killed by SIGKILL (out of memory?): {_first_lines(str(e))}",
            )
        except rex.GetTimeoutError as e:
            return HostOutcome(
                run, HostOutcomeKind.PREEMPTED, error=f"GetTimeoutError: the host's result could not be fetched: {e}"
            )
        except rex.RayError as e:  # runtime env setup, unschedulable task...: infrastructure of this attempt
            if task.cancelled:
                return HostOutcome(run, HostOutcomeKind.CANCELLED)
            return HostOutcome(run, HostOutcomeKind.FAILED, error=f"{type(e).__name__}: {e}")
        if task.stopping:  # it returned on our SIGTERM (after a checkpoint): not the job's result
            return HostOutcome(run, HostOutcomeKind.CANCELLED)
        return HostOutcome(run, HostOutcomeKind.SUCCEEDED, result=value)

    # -------------------------------------------------------------------------------------- cancel

    def cancel(self, runs: list[HostRun], grace: float | None = None) -> None:
        """Stop these hosts. Without ``grace`` (terminate, a failed or lost sibling): kill them now. With
        ``grace`` (an elastic job's resize): SIGTERM to the processes of every host that reported in, up to
        ``grace`` seconds for the host tasks to end (to checkpoint), then kill what is left. Their outcome
        is CANCELLED unless their slice was lost (PREEMPTED)."""
        live = [r for r in runs if not r.handle.reported]
        for r in live:
            r.handle.cancelled = True
        if grace is not None and grace > 0:
            stopping = self._sigterm(live)
            if stopping:
                ray.wait([r.handle.ref for r in stopping], num_returns=len(stopping), timeout=grace, fetch_local=False)
        self._cancel_unfinished(live)

    def mark_ending(self, tag: str) -> None:
        """A host's user code is done and its task is returning (its last log batch, which the host waits
        for before it returns, says so): :meth:`_cancel_unfinished` leaves its task alone."""
        self._ending.add(tag)

    def _cancel_unfinished(self, runs: Sequence[HostRun]) -> None:
        """``ray.cancel(force=True)`` the host tasks of ``runs`` that have not finished and are not ending.

        A cancel that races with the task's own reply crashes the owner, here the supervisor process with
        every job it runs (Ray 2.60's RAY_CHECK "Tried to complete task that was not pending" in
        task_manager.cc; ray-project/ray#54798 fixed the retry path of that race, not this one). Seen twice
        on the emulated cluster: an elastic resize, and CI 2026-12-07 (levanter's preemption test: host 1
        returned while host 0's TimeoutError ended the attempt, and the cancel of host 1 met its reply).
        Asking Ray first (``ray.wait``) left the instant while the reply is on its way; a host that is
        ending has told the supervisor so before its reply is sent (:meth:`mark_ending`) and is left to
        return; a host whose reaper or log pump cannot start says it is ending itself (``_host._say_ending``).
        What is left is a task that fails before its function runs (a runtime_env or worker-start failure),
        which does not race with a user's quick return."""
        refs = [r.handle.ref for r in runs if r.handle.tag not in self._ending]
        if not refs:
            return
        _, unfinished = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in unfinished:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass  # finished meanwhile

    def _sigterm(self, runs: list[HostRun]) -> list[HostRun]:
        """Send SIGTERM to the processes of the ``runs`` that reported in, each by a task pinned to its
        node (not waited for: the host's own end is what counts); returns those runs."""
        out = []
        for r in runs:
            process = self._reported_in.get(r.handle.tag)
            if process is None:
                continue  # not running the user's code yet: nothing to checkpoint
            r.handle.stopping = True
            _signal_task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(process.node_id, soft=False),
                name=f"fray:{self.job_id}:{r.handle.tag}:sigterm",
            ).remote(process, signal.SIGTERM)
            out.append(r)
        return out


#: Ray's defaults for the GCS's node health checks (ray_config_def.h): period, timeout (ms), failure threshold.
_HEALTH_CHECK_DEFAULTS = {
    "health_check_period_ms": 3000,
    "health_check_timeout_ms": 10000,
    "health_check_failure_threshold": 5,
}


def health_checks() -> tuple[float, float, int]:
    """``(period s, timeout s, failure threshold)`` of the connected cluster's node health checks: what its
    head was started with (the ``_system_config`` the GCS keeps), Ray's defaults for what it does not set. The
    cluster's config is asked for, not this process's ``ray._config`` (a connected process's own view).

    >>> health_checks() if ray.is_initialized() else (3.0, 10.0, 5)  # doctest: +SKIP
    (3.0, 10.0, 5)
    """
    values = dict(_HEALTH_CHECK_DEFAULTS)
    try:
        config = ray._private.state.state.get_system_config()
        for key in values:
            if key in config:
                values[key] = int(config[key])
    except Exception:
        pass  # cannot ask the GCS: Ray's defaults
    return (
        values["health_check_period_ms"] / 1000.0,
        values["health_check_timeout_ms"] / 1000.0,
        max(1, values["health_check_failure_threshold"]),
    )


GANG_ROOM_MAX_AGE = 30.0  # seconds a waiting gang's reading of the nodes' totals is used (see _gang_waiting)


def _task_options(bundle: dict[str, float], markers: bool) -> dict[str, Any]:
    """A CPU/GPU replica's task options for ``bundle`` (``_gang_bundle``'s); with ``markers``, its other
    resources too (the non-preemptible marker), which a task in a placement group's bundle leaves to the group.

    >>> _task_options({"CPU": 2.0, "memory": 64.0, "node:__internal_head__": 0.0001}, markers=True)
    {'num_cpus': 2.0, 'memory': 64.0, 'resources': {'node:__internal_head__': 0.0001}}
    """
    rest = dict(bundle)
    cpu, memory, gpu = rest.pop("CPU", 0), rest.pop("memory", 0), rest.pop("GPU", 0)
    opts: dict[str, Any] = {"num_cpus": cpu}
    if memory:
        opts["memory"] = memory
    if gpu:
        opts["num_gpus"] = gpu
    if markers and rest:
        opts["resources"] = rest
    return opts


def _asked(n: int, bundle: dict[str, float]) -> str:
    """A request as a pending reason names it.

    >>> _asked(2, {"CPU": 1.0, "memory": 67108864.0})
    '2 x {CPU: 1, memory: 6.71089e+07}'
    """
    return f"{n} x {{{', '.join(f'{k}: {v:g}' for k, v in bundle.items())}}}"


def _bundles_fitting(total: dict[str, float], bundle: dict[str, float]) -> int:
    """How many ``bundle``-shaped bundles a node with ``total`` resources holds at once.

    >>> _bundles_fitting({"CPU": 4.0, "memory": 8.0}, {"CPU": 1.0, "memory": 3.0})
    2
    """
    wanted = [(k, v) for k, v in bundle.items() if v > 0]
    if not wanted:
        return 1 << 30
    return min(int(total.get(k, 0.0) / v + 1e-9) for k, v in wanted)


def _tpu_per_host(chips: int) -> float:
    """A host's ``TPU`` resource when the cluster does not show it: chips x ``RAY_TPU_RESOURCE_PER_CHIP``
    (Ray's opt-in, e.g. 2 on v7x: one resource per logical device)."""
    value = os.environ.get("RAY_TPU_RESOURCE_PER_CHIP", "1")
    return float(chips * (int(value) if value.isdecimal() and int(value) >= 1 else 1))


def _lease_tpu(lease: SliceLease) -> float:
    """The ``TPU`` resource a host task of ``lease`` asks for: the whole host's, as its slice showed it."""
    res = lease.handle[0] if lease.handle is not None else None
    return (res.tpu_per_host if res is not None else 0.0) or _tpu_per_host(
        get_tpu_spec(lease.device_type).chips_per_host
    )


def _host_node(run: HostRun) -> str:
    """The node id (the hardware) the run's host was reserved on; ``""`` when not known."""
    nodes = run.lease.handle[0].host_nodes if run.lease.handle is not None else ()
    return nodes[run.host_index] if run.host_index < len(nodes) else ""


def _lease_name(lease: SliceLease) -> str:
    return "the gang" if lease.device_type in ("cpu", "gpu") else f"slice {lease.name}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _traceback_of(e: rex.RayTaskError) -> str:
    """The remote traceback, as Python printed it on the host (colour codes removed)."""
    tb = _ANSI.sub("", getattr(e, "traceback_str", None) or str(e)).strip()
    return tb if tb.startswith("Traceback") else f"Traceback (most recent call last, on the host):\n{tb}"


def _first_lines(text: str, n: int = 3) -> str:
    return "\n".join(text.strip().splitlines()[:n])
