"""The scheduler of one Ray namespace: a fair queue per TPU pool and bad-host quarantine, shared by every
job (every supervisor, of every client) of the cluster.

One named, detached actor per namespace (:data:`SCHEDULER_NAME`), created by the first supervisor that
needs it (``get_if_exists``). It holds the policy (``fray_core.scheduling``) and the one view of the cluster
every queued job is judged by: a supervisor asks it, before it claims slice heads, how many slices it may
claim now (:meth:`Scheduler.acquire_pool`), and the scheduler answers from its own copy of the cluster's
state (which slices are alive, free, held by which job), read for every job of the cluster at once
(``fray_ray.view.ClusterView``, in a thread, so calls are never held up by a slow GCS). A queued job reads
nothing from the GCS itself: at 16,000 hosts one read of the node table is ~150 ms of GCS CPU, and one a
second per queued job saturated the GCS at a handful of jobs (issue 29). The node table follows Ray's
node-change channel (``NodeFeed``); the available resources are read again at most once a second when
something says they changed (a job claimed, released or left, nodes came or went, a slice was in transit),
else every ``ClusterView.interval`` (1 s on a small cluster, up to 30 s where one read is costly). Placement groups stay
the real arbiter: the queue only orders. An admitted job keeps its place, reserving the count it was
admitted for, until it reports its claim done (:meth:`Scheduler.claimed`) or its entry expires, so two
supervisors admitted at once do not both count the same free slices.

An entry not renewed for ``ttl`` seconds (a supervisor killed hard) is dropped; ``leave`` (at job end)
drops it at once. If the actor dies its state (queue and quarantines) is lost: the next call creates a
fresh one and jobs go on (:class:`SchedulerClient`).

It is an async actor on one event loop: a call awaits only the cluster's state (a read in a thread, one at
a time, shared by every call that needs it), and from then on runs to completion, so the queue needs no
lock for its safety. Questions for slices are judged one at a time all the same, in the order they came
(an asyncio lock, for order): one awaiting a read is never passed by a later one judged on the older copy.
"""

from __future__ import annotations

import asyncio
import heapq
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
import ray
import ray.exceptions as rex

from fray_core.scheduling import FairQueue, Quarantine, pending_reason
from fray_ray.slices import SliceView, head_group_job, members, slice_view
from fray_ray.view import REFRESH_S, ClusterView, NodeFeed

__all__ = [
    "ARRIVAL_WAIT",
    "SCHEDULER_NAME",
    "ArrivalOrder",
    "Scheduler",
    "SchedulerBehind",
    "SchedulerClient",
    "job_label",
    "missing_slices",
    "pool_name",
]

# The version is in the name: a detached scheduler of an older Fray lives on in a long-lived cluster, and
# a newer client must not call methods it lacks (v2: it reads the cluster's state itself, acquire_pool; v3:
# acquire_pool holds a waiting job's call, known and hold; v4: draining holds a supervisor's call the same way;
# v5: claimed and released name the slices).
SCHEDULER_NAME = "fray-scheduler-v5"
CALL_TIMEOUT = 30.0  # seconds to wait for the scheduler's answer (its first start included)
# The scheduler's resource on the non-preemptible node: Ray's smallest amount (4 decimals), so the resource
# caps nothing in practice (0.001 capped the supervisors sharing it at 1,000 concurrent jobs: issue 29).
ACTOR_RESOURCE = 0.0001
FEED_START_TIMEOUT = 30.0  # seconds the node table's feed may take to start (subscribe and one full read)
FEED_RETRY = 30.0  # seconds before a feed that failed is tried again (full reads meanwhile)
# A waiting job's call is held (see acquire_pool's ``known``) for at most this long, its answer judged again
# every HOLD_STEP seconds and whenever a job claims, releases or leaves: a queued job asked 2-4 times a second
# before, each answer a call and a judgement (13 ms/s of head CPU per queued job: bench/NOTES.md, issue 29).
HOLD_STEP = 1.0
# At most this many calls held at once: an async actor serves a bounded number of calls at a time (Ray's
# default 1,000, raised below), and the pokes, the draining nodes and the quarantine must not wait behind them.
MAX_HELD = 256
# A slice a job said it claimed is held by that job in every answer until a read of what is free that began
# at least CLAIM_SETTLE_S after the claim (the GCS's copy of a node's resources lags the raylet's commit of
# a placement group: a read right after a claim still showed the slice free, the next job in line was
# admitted to it and its claim failed after RESERVE_GRACE, 10 s, without a reason; bench/NOTES.md), and
# at most CLAIM_KEEP_S (past any read interval: by then a read says the truth).
CLAIM_SETTLE_S = 1.0
CLAIM_KEEP_S = 60.0
# Seconds a job of a supervisor process waits, before its first question to the scheduler, for the jobs that
# reached the process before it to have theirs answered (ArrivalOrder); a job that made another wait this long
# loses its turn (it is waited for no more). Past a slow import of the job's module (jax, torch: 3-10 s).
ARRIVAL_WAIT = 20.0


@attrs.frozen
class SchedulerBehind:
    """The scheduler has not answered this job's request yet (:meth:`SchedulerClient.ask`): it is behind
    (or starting). ``waited``: seconds since the request was sent; ``error``: why it could not be reached
    (``""``: it was reached and has not answered)."""

    waited: float
    error: str = ""

    def reason(self) -> str:
        """The job's ``pending_reason`` while it waits for the answer."""
        if self.error:
            return f"waiting for the cluster's scheduler ({SCHEDULER_NAME}): it could not be reached ({self.error})"
        return (
            f"waiting for the cluster's scheduler ({SCHEDULER_NAME}): no answer to this job's request for "
            f"{self.waited:.0f} s (it is behind); the job keeps its place"
        )


class ArrivalOrder:
    """The jobs of one supervisor process ask the scheduler for the first time in the order they came
    (``queued_at``, their place in the cluster's line), so first come, first served holds for the jobs
    one client launched back to back: without it, a job launched after another whose start in the process
    was quicker (the other's module took seconds to import, its thread ran later) asked first, found the
    slice free and took it (``test_ray_policy``'s launch-order test). The scheduler's line cannot order
    them itself: it learns of a job only when that job asks.

    A job comes (:meth:`arrived`) when the process takes it, and is done waiting for (:meth:`passed`) once
    its first question was answered (Ray runs an async actor's calls out of order: one sent first may be
    judged second), once it needs no scheduler (a CPU job) and when it ends. :meth:`wait_turn`
    waits, bounded, until no job that came before it is left; a caller that waited long enough makes
    those left lose their turn (:meth:`skip_ahead`). Cost: O(log n) a job, one wake-up a pass (only the
    new first job's), whatever the number waiting.

    >>> order = ArrivalOrder()
    >>> order.arrived("a", 1.0); order.arrived("b", 2.0)
    >>> order.wait_turn("b", timeout=0.0)     # "a" came first and has not asked
    ['a']
    >>> order.passed("a")                     # "a" asked: "b"'s turn
    >>> order.wait_turn("b", timeout=0.0)
    []
    >>> order.arrived("c", 3.0); order.arrived("d", 4.0)
    >>> order.skip_ahead("d")                 # "b" and "c" were waited for long enough: they lose their turn
    ['b', 'c']
    >>> order.ahead("d")
    []
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[float, int, threading.Event]] = {}  # job -> (came, seq, its turn)
        self._heap: list[tuple[float, int, str]] = []  # (came, seq, job), oldest first; passed jobs lazily
        self._seq = 0

    def arrived(self, job_id: str, at: float) -> None:
        """``job_id`` came at ``at`` (any clock shared by the process's jobs; ties: the order of the calls)."""
        with self._lock:
            if job_id in self._waiting:
                return
            self._seq += 1
            self._waiting[job_id] = (at, self._seq, threading.Event())
            heapq.heappush(self._heap, (at, self._seq, job_id))
            self._wake_first()

    def passed(self, job_id: str) -> None:
        """``job_id`` asked (or needs no asking, or ended): the jobs behind it wait for it no more."""
        with self._lock:
            if self._waiting.pop(job_id, None) is not None:
                self._wake_first()

    def ahead(self, job_id: str) -> list[str]:
        """The jobs that came before ``job_id`` and have not asked yet, oldest first (O(jobs waiting))."""
        with self._lock:
            mine = self._waiting.get(job_id)
            if mine is None:
                return []
            return [j for j, w in sorted(self._waiting.items(), key=lambda kv: kv[1][:2]) if w[:2] < mine[:2]]

    def wait_turn(self, job_id: str, timeout: float) -> list[str]:
        """Wait up to ``timeout`` seconds until no job that came before ``job_id`` is left to ask; returns
        those still left then, oldest first (``[]``: its turn)."""
        end = time.monotonic() + max(0.0, timeout)
        while True:
            with self._lock:
                mine = self._waiting.get(job_id)
                if mine is None or self._first() == job_id:
                    return []
                turn = mine[2]
                turn.clear()
            left = end - time.monotonic()
            if left <= 0 or not turn.wait(left):
                return self.ahead(job_id)

    def skip_ahead(self, job_id: str) -> list[str]:
        """The jobs that came before ``job_id`` and have not asked yet lose their turn: waited for no more,
        by anyone (one job stuck before its first question holds up the others once, not each in turn).
        Returns them."""
        with self._lock:
            mine = self._waiting.get(job_id)
            if mine is None:
                return []
            skipped = [j for j, w in self._waiting.items() if w[:2] < mine[:2]]
            for job in skipped:
                del self._waiting[job]
            self._wake_first()
        return skipped

    def _first(self) -> str | None:
        # an entry of a job that passed since (or came again: another seq) is dropped here, lazily
        while self._heap and self._waiting.get(self._heap[0][2], (0.0, -1))[1] != self._heap[0][1]:
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    def _wake_first(self) -> None:
        first = self._first()
        if first is not None:
            self._waiting[first][2].set()


_JOB_ID_TAIL = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{6}$")


def job_label(job_id: str) -> str:
    """A job's name as its id shows it (``train-a-20261123-094501-3fa2c1`` -> ``train-a``)."""
    return _JOB_ID_TAIL.sub("", job_id) or job_id


def pool_name(tpu_type: str, label: dict[str, str]) -> str:
    """The scheduler's queue for slices of this type with this node label.

    >>> pool_name("v4-16", {"pool": "reserved"})
    'v4-16;pool=reserved'
    """
    return tpu_type + "".join(f";{k}={v}" for k, v in sorted(label.items()))


def answer_key(answer: dict[str, Any]) -> tuple[Any, ...]:
    """What a waiting job's answer says (see ``Scheduler.acquire_pool``'s ``known``): a held call returns
    when this changes.

    >>> answer_key({"held": True, "reason": "r", "total": 2, "free": 0, "busy": 2, "transit": [], "slow": 0.0})
    (None, True, 'r', 2, 0, 2)
    """
    return (answer.get("count"), answer.get("held"), answer.get("reason"), answer.get("total"),
            answer.get("free"), answer.get("busy"))  # fmt: skip


def missing_slices(alive: int, seen: int, incomplete: Sequence[str] = ()) -> list[str]:
    """What a pending reason says is missing: slices with a host down (named), and the rest of the most
    ever seen, lost.

    >>> missing_slices(1, 3, ["fake-v4-16-2"])
    ['1 with a host down: fake-v4-16-2', '1 lost, restoring']
    """
    out = [f"{len(incomplete)} with a host down: {', '.join(incomplete)}"] if incomplete else []
    lost = seen - alive - len(incomplete)
    return out + [f"{lost} lost, restoring"] if lost > 0 else out


class Scheduler:
    """Actor body (see module doc). ``quarantine_*``: see ``RayCluster``; the first client's values apply."""

    def __init__(
        self,
        quarantine_after: int = 2,
        quarantine_window: float = 3600.0,
        quarantine_for: float = 1800.0,
        follow_nodes: bool = True,
    ) -> None:
        self._queues: dict[str, FairQueue] = {}
        self._quarantine = Quarantine(quarantine_after, quarantine_window, quarantine_for, name="fray-scheduler")
        self._seen: dict[str, int] = {}  # per pool: the most slices ever seen alive
        # Quarantine is keyed by the failed host's node id (its hardware: a restarted KubeRay pod keeps its
        # TPU_NAME but is a new node), by the slice name only when a caller did not say the node.
        self._hosts: dict[str, tuple[str, int]] = {}  # quarantine key -> (slice name, host index)
        self._cluster: ClusterView | None = None  # made on first use (the actor's body is also used without Ray)
        self._reading: dict[str, asyncio.Future[Any]] = {}  # kind of state -> its read in flight
        self._group_jobs: dict[str, str] = {}  # placement group id -> the job whose slice head it holds ("": none)
        # The node table from Ray's node-change channel (NodeFeed) rather than a full read a second: off in
        # tests of the actor's body that give it a table of their own, and after the feed failed to start.
        self._follow_nodes = follow_nodes
        self._feed: NodeFeed | None = None
        self._feed_starting: asyncio.Future[Any] | None = None
        self._feed_retry_at = 0.0
        # Kinds of state something said changed since their last read (a job claimed, released or left, a
        # slice was in transit, the node table moved): read again after REFRESH_S, not the kind's interval.
        self._changed: set[str] = set()
        self._poked: asyncio.Event | None = None  # set (and replaced) when a job claims, releases or leaves
        self._gone: set[str] = set()  # jobs that left while a call of theirs may be held (see acquire_pool)
        self._held = 0  # acquire_pool calls being held
        self._nodes_read = -1  # the number of the node table's copy the last view was made from
        self._node_ids: frozenset[str] = frozenset()  # and the nodes in it
        self._claims: dict[str, tuple[str, float]] = {}  # slice name -> (the job that said it claimed it, when)
        # Questions for slices are judged one at a time, in the order they came (an asyncio lock is first come,
        # first served): one that awaits a read of the cluster's state keeps its place, so a question that
        # came after it is never judged first, on what was free before (see _state_of).
        self._judging: asyncio.Lock | None = None

    async def _state_of(self, kind: str) -> tuple[Any, int]:
        """The cluster's ``kind`` state (numbered, see ``ClusterView.numbered``): the copy when it is fresh
        enough, else one read in a thread that every call needing it awaits (the event loop stays free)."""
        if self._cluster is None:
            self._cluster = ClusterView()
        if kind == "nodes":
            feed = await self._node_feed()
            if feed is not None:
                return feed.numbered()
        # A read under way is joined, never passed with the older copy: a call that came while an earlier
        # one awaited a read was judged at once on what was free before, and admitted to the slice the earlier
        # call's job was first in line for (CI, 2026-12-07/08: a job launched second ran first). The awaiting
        # calls resume in the order they came, on the newer copy.
        reading = self._reading.get(kind)
        if reading is None:
            age = self._cluster.age(kind)
            if age < REFRESH_S or (kind not in self._changed and age < self._cluster.interval(kind)):
                return self._cluster.numbered(kind, max_age=float("inf"))  # the copy, however old: judged above
            self._changed.discard(kind)  # a change said during this read is read next time
            reading = asyncio.get_running_loop().run_in_executor(None, self._cluster.numbered, kind)
            self._reading[kind] = reading
            reading.add_done_callback(lambda _f, k=kind: self._reading.pop(k, None))
        return await asyncio.shield(reading)

    async def _node_feed(self) -> NodeFeed | None:
        """The node table's feed once it runs (started by the first call that needs it, every other call
        awaiting that start); ``None`` while it cannot be had: the node table is then read in full, at most
        once a second, and a feed is tried again after ``FEED_RETRY`` seconds."""
        if not self._follow_nodes:
            return None
        if self._feed is not None and not self._feed.healthy:
            self._feed.close()
            self._feed, self._feed_retry_at = None, time.monotonic() + FEED_RETRY
        if self._feed is None and self._feed_starting is None and time.monotonic() >= self._feed_retry_at:
            self._feed_starting = asyncio.ensure_future(self._start_feed())
        if self._feed_starting is not None:
            await asyncio.shield(self._feed_starting)
        return self._feed

    async def _start_feed(self) -> None:
        try:
            feed = NodeFeed(ray.get_runtime_context().gcs_address)
            await asyncio.wait_for(feed.start(), FEED_START_TIMEOUT)
            self._feed = feed
        except Exception:  # noqa: BLE001 - full reads instead, and another try later
            self._feed_retry_at = time.monotonic() + FEED_RETRY
        finally:
            self._feed_starting = None

    async def _view(
        self, tpu_type: str, label: dict[str, str], topology: str | None, holders: bool, fresh: bool = False
    ) -> SliceView:
        if fresh and self._cluster is not None and "available" not in self._reading:
            self._cluster.invalidate("available")  # a job released slices: its next answer must see them free
        nodes = await self._state_of("nodes")
        if nodes[1] != self._nodes_read:  # a new copy of the node table (a full read gives one every second)
            self._nodes_read = nodes[1]
            ids = frozenset(nodes[0])
            if ids != self._node_ids:  # nodes came or went: what is free may have changed with them
                self._node_ids = ids
                self._changed.add("available")
        available = await self._state_of("available")
        view = slice_view(nodes, available, tpu_type, label, topology, self._group_job if holders else None)
        return self._with_claims(view)

    def _with_claims(self, view: SliceView) -> SliceView:
        """``view`` with the slices jobs said they claimed (:meth:`claimed`) held by those jobs, where the
        read of what is free may predate the claim (see ``CLAIM_SETTLE_S``); a claim the reads have caught
        up with is forgotten (from then on the view says who holds the slice, or that it is free again).

        >>> from fray_ray.slices import SliceView
        >>> s = Scheduler(follow_nodes=False)
        >>> s._cluster = ClusterView()
        >>> asyncio.run(s.claimed("train-a-20261123-094501-3fa2c1", ["s1"]))
        >>> v = s._with_claims(SliceView(alive=["s1", "s2"], free=["s1", "s2"], holders={}, incomplete=[], nodes={}))
        >>> v.free, v.holders
        (['s2'], {'s1': 'train-a'})
        """
        if not self._claims:
            return view
        now = time.monotonic()
        # when the read of what is free this view was made from began (a newer read finished meanwhile, in
        # its thread: not known, so nothing is forgotten on its account)
        began = self._cluster.began("available", view.token[1]) if self._cluster is not None else float("-inf")
        for name, (_, at) in list(self._claims.items()):
            if began >= at + CLAIM_SETTLE_S or now - at > CLAIM_KEEP_S:
                del self._claims[name]
        taken = {name: job_label(self._claims[name][0]) for name in view.free if name in self._claims}
        if not taken:
            return view
        return attrs.evolve(view, free=[n for n in view.free if n not in taken], holders={**view.holders, **taken})

    def _forget_claims(self, job_id: str, names: Sequence[str] | None = None) -> None:
        """Forget what ``job_id`` said it claimed (``names``; ``None``: all of it): it released or left."""
        for name, (job, _) in list(self._claims.items()):
            if job == job_id and (names is None or name in names):
                del self._claims[name]

    def _group_job(self, group_id: str) -> str:
        """The job (label) whose slice-head group has this id, or ``""`` when it is no such group; asked of
        Ray once per group (names never change)."""
        job = self._group_jobs.get(group_id)
        if job is None:
            from ray.util.placement_group import PlacementGroup, placement_group_table

            try:
                pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id)))
                holder = head_group_job(placement_group_table(pg).get("name") or "")
            except Exception:
                return ""  # not a group id (a resource named like one), or Ray could not say: ask next time
            job = self._group_jobs[group_id] = job_label(holder) if holder else ""
        return job

    async def acquire_pool(
        self,
        job_id: str,
        tpu_type: str,
        label: dict[str, str],
        topology: str | None,
        counts: Sequence[int],
        ttl: float,
        since: float | None = None,
        fresh: bool = False,
        known: tuple[Any, ...] | None = None,
        hold: float = 0.0,
    ) -> dict[str, Any]:
        """May ``job_id`` claim ``counts`` (largest first) slices of ``tpu_type`` with node ``label`` and
        ``topology`` now? Judged on this actor's view of the cluster (see the module doc); ``fresh``: the job
        released slices since it last asked (read the free slices again). The answer of :meth:`acquire`, plus
        the pool's slices: ``total`` (alive or with a host down), ``free``, ``busy``, ``transit`` (busy and
        held by no job: most likely just released) and ``slow`` (seconds the last read of the node table
        took). ``known``: the :func:`answer_key` of the answer the job has; while the answer is still that one
        the call is held, up to ``hold`` seconds (judged again every ``HOLD_STEP`` and whenever a job claims,
        releases or leaves), so a waiting job makes one call where it made one per round.

        >>> import asyncio
        >>> s = Scheduler(follow_nodes=False)
        >>> s._cluster = ClusterView()
        >>> for kind in ("nodes", "available"):  # a cluster with no TPU slice (no Ray needed for this)
        ...     s._cluster._state[kind].read = dict
        >>> asyncio.run(s.acquire_pool("job-a", "v4-16", {}, None, [1], 30.0))["total"]
        0
        """
        self._gone.discard(job_id)  # asking again: back in line (a retry after a claim)
        end = time.monotonic() + max(0.0, hold)
        held = False
        try:
            while True:
                poked = self._poke_event()  # taken before judging: a poke meanwhile ends the wait below at once
                if self._judging is None:
                    self._judging = asyncio.Lock()
                async with self._judging:  # in the order the questions came (see __init__)
                    answer = await self._acquire_pool_once(job_id, tpu_type, label, topology, counts, ttl, since, fresh)
                fresh = False
                if job_id in self._gone:  # it left while this call was judged: out of line again, for good
                    for q in self._queues.values():
                        q.leave(job_id)
                    return answer
                left = end - time.monotonic()
                if known is None or answer_key(answer) != known or answer["transit"] or left <= 0:
                    return answer
                if not held:
                    if self._held >= MAX_HELD:  # the actor's calls are for everyone: answer now, as before
                        return answer
                    held, self._held = True, self._held + 1
                try:
                    await asyncio.wait_for(poked.wait(), min(left, HOLD_STEP))
                except asyncio.TimeoutError:
                    pass
        finally:
            if held:
                self._held -= 1

    def _poke_event(self) -> asyncio.Event:
        if self._poked is None:
            self._poked = asyncio.Event()
        return self._poked

    def _poke(self) -> None:
        """Something a held call's answer may depend on changed: judge them again now."""
        if self._poked is not None:
            self._poked.set()
            self._poked = None

    async def _acquire_pool_once(
        self,
        job_id: str,
        tpu_type: str,
        label: dict[str, str],
        topology: str | None,
        counts: Sequence[int],
        ttl: float,
        since: float | None,
        fresh: bool,
    ) -> dict[str, Any]:
        try:
            view = await self._view(tpu_type, label, topology, holders=True, fresh=fresh)
        except Exception as e:  # the GCS did not answer: wait, held, and say so (never admit blind)
            why = f"could not read the cluster's state ({type(e).__name__}: {e}); retrying"
            total = self._seen.get(pool_name(tpu_type, label), 0)
            return {"held": True, "reason": why, "total": total, "free": 0, "busy": 0, "transit": [], "slow": 0.0}
        answer = await self.acquire(
            job_id,
            pool_name(tpu_type, label),
            tpu_type,
            counts,
            view.alive,
            view.free,
            view.holders,
            ttl,
            view.incomplete,
            since,
            members(view),
        )
        assert self._cluster is not None
        transit = sorted(set(view.alive) - set(view.free) - set(view.holders))
        if transit:  # most likely just released: Ray gives their resources back within ~0.1 s
            self._changed.add("available")
        answer.update(
            total=len(view.alive) + len(view.incomplete),
            free=len(view.free),
            busy=len(view.alive) - len(view.free),
            transit=transit,
            slow=0.0 if self._feed is not None else self._cluster.read_seconds("nodes"),
        )
        return answer

    async def draining(self, known: dict[str, int] | None = None, hold: float = 0.0) -> dict[str, int]:
        """The nodes Ray drains, node id -> deadline (ms since the epoch, 0: none given), read at most once a
        second for every running job of the cluster (``{}`` when the GCS cannot say: a lost node still shows
        in the job's own placement groups). ``known``: the answer the caller has; while the answer is still
        that one the call is held, up to ``hold`` seconds, looked at again every ``HOLD_STEP`` (the read
        itself is this actor's one view, re-read as ``_state_of`` says): a supervisor process asks a few
        times a minute while nothing drains, not once a second, and hears of a drain within a second of
        this actor's read of it."""
        end = time.monotonic() + max(0.0, hold)
        while True:
            try:
                value, _ = await self._state_of("draining")
                value = dict(value)
            except Exception:
                value = {}
            left = end - time.monotonic()
            if known is None or value != known or left <= 0:
                return value
            await asyncio.sleep(min(left, HOLD_STEP))

    async def free_in_pool(self, job_id: str, tpu_type: str, label: dict[str, str], topology: str | None) -> int:
        """Of the free slices of ``tpu_type`` with ``label`` and ``topology``, how many ``job_id`` could take
        now (:meth:`free_for`, on this actor's view of the cluster); 0 when the cluster's state cannot be
        read."""
        try:
            view = await self._view(tpu_type, label, topology, holders=False)
        except Exception:
            return 0
        return await self.free_for(job_id, pool_name(tpu_type, label), view.free, members(view))

    def _quarantined(
        self, alive: Sequence[str], members: dict[str, Sequence[str]] | None, now: float
    ) -> dict[str, str]:
        """The ``alive`` slices in quarantine now -> their quarantine key: a slice whose hardware (one of
        its ``members`` node ids) failed, or one quarantined by name."""
        active = self._quarantine.active(now)
        if not active:
            return {}
        keys = set(active)
        out = {}
        for name in alive:
            hit = [k for k in (members or {}).get(name, ()) if k in keys] or (
                [name] if name in keys and name not in self._hosts else []
            )
            if hit:
                out[name] = hit[0]
        return out

    async def acquire(
        self,
        job_id: str,
        pool: str,
        tpu_type: str,
        counts: Sequence[int],
        alive: Sequence[str],
        free: Sequence[str],
        holders: dict[str, str],
        ttl: float,
        incomplete: Sequence[str] = (),
        since: float | None = None,
        members: dict[str, Sequence[str]] | None = None,
    ) -> dict[str, Any]:
        """May ``job_id`` claim slices of ``pool`` now? ``counts`` largest first; ``alive``: the pool's
        slices in the cluster with every host up; ``free``: those whose head is free; ``holders``: slice
        name -> the job (name) holding it; ``incomplete``: slices with a host down (no capacity); ``since``:
        when the job was submitted (its place in line among jobs that reach the queue out of order);
        ``members``: each slice's node ids (quarantine follows the hardware, not the name). Returns
        ``{"count": c, "exclude": [names]}`` (claim ``c`` slices, none of the quarantined ``exclude``) or
        ``{"held": bool, "reason": str}``."""
        now = time.monotonic()
        seen = self._seen[pool] = max(self._seen.get(pool, 0), len(alive) + len(incomplete))
        in_quarantine = self._quarantined(alive, members, now)
        quarantined = list(in_quarantine)
        usable = [n for n in free if n not in quarantined]
        queue = self._queues.get(pool)
        if queue is None:
            queue = self._queues[pool] = FairQueue(ttl)
        queue.ttl = ttl
        count = queue.admit(job_id, counts, len(usable), now, keep=True, since=since)
        if count is not None:
            return {"count": count, "exclude": quarantined}
        qfree = len(free) - len(usable)
        held, reason = pending_reason(
            tpu_type,
            min(counts),
            up=len(alive) - qfree,
            free=len(usable),
            busy=len(alive) - len(free),
            holders=[holders[n] for n in alive if n in holders],
            place=queue.place(job_id, now),
            quarantined=[self._quarantine.reason(k, name=n) for n, k in in_quarantine.items()],
            missing=missing_slices(len(alive), seen, incomplete),
            where="cluster",
        )
        return {"held": held, "reason": reason}

    async def free_for(
        self, job_id: str, pool: str, free: Sequence[str], members: dict[str, Sequence[str]] | None = None
    ) -> int:
        """Of the pool's ``free`` slices, how many ``job_id`` could take now: not quarantined and not
        reserved for a job waiting in line (every waiter is ahead of a job not in line). What an elastic
        job grows into."""
        now = time.monotonic()
        quarantined = self._quarantined(free, members, now)
        usable = sum(1 for n in free if n not in quarantined)
        queue = self._queues.get(pool)
        return max(0, usable - queue.reserved_ahead(job_id, now)) if queue else usable

    async def claimed(self, job_id: str, names: Sequence[str] = ()) -> None:
        """The job holds the slices it was admitted for (``names``): it leaves the line, and those slices
        are held by it in every answer from now on, even by a read of what is free that predates the claim
        (see ``CLAIM_SETTLE_S``)."""
        now = time.monotonic()
        for name in names:
            self._claims[name] = (job_id, now)
        if len(self._claims) > 100_000:  # never more than the cluster's slices unless callers lie: bounded
            self._claims.clear()
        self._changed.add("available")
        for q in self._queues.values():
            q.leave(job_id)
        self._poke()

    async def released(self, job_id: str, names: Sequence[str] | None = None) -> None:
        """The job gave slices back (``names``; ``None``: all it held), a retry, a resize: the next answer of
        any job reads what is free."""
        self._forget_claims(job_id, names)
        self._changed.add("available")
        self._poke()

    async def leave(self, job_id: str) -> None:
        """The job stopped waiting (it ended, e.g. terminated): younger jobs no longer wait behind it, and
        the slices it held are read as free."""
        self._forget_claims(job_id)
        self._changed.add("available")
        for q in self._queues.values():
            q.leave(job_id)
        self._gone.add(job_id)
        if len(self._gone) > 10_000:  # ids of jobs long gone: a held call lasts seconds
            self._gone.clear()
        self._poke()

    async def device_failed(self, slice_name: str, host: int, what: str = "device busy", node_id: str = "") -> bool:
        """Host ``host`` of the slice, on node ``node_id`` (its hardware), could not use its device; True
        if this put the slice in quarantine (until that node leaves the cluster: a slice of the same name on
        other nodes is not quarantined)."""
        key = node_id or slice_name
        if node_id:
            self._hosts[key] = (slice_name, host)
        return self._quarantine.failed(key, host, time.monotonic(), what) is not None

    async def repair(self, slice_name: str) -> bool:
        """Take the slice out of quarantine and forget its device failures (an operator fixed it)."""
        was = False
        for key in [slice_name] + [k for k, (name, _) in self._hosts.items() if name == slice_name]:
            failures = self._quarantine.failures(key) or {}
            was = self._quarantine.lift(key) or was
            for host in list(failures):
                self._quarantine.repaired(key, host)
        return was

    async def now(self) -> float:
        """This actor's wall clock: the one clock jobs' places in line are stamped by (each client reads it
        once and carries it forward on its own monotonic clock, see ``fray_ray.cluster.ClusterClock``)."""
        return time.time()

    async def state(self) -> dict[str, Any]:
        """``{"queues": {pool: [job ids]}, "quarantined": {slice name: reason}, "quarantined_hosts": {node
        id: "<slice> host <h>"}, "device_failures": {slice name: [hosts with a device failure on record]}}``."""
        now = time.monotonic()
        active = self._quarantine.active(now)
        failures: dict[str, list[int]] = {}
        for key, (name, _) in self._hosts.items():
            failures.setdefault(name, []).extend(self._quarantine.failures(key) or {})
        return {
            "device_failures": {name: sorted(set(hosts)) for name, hosts in failures.items() if hosts},
            "queues": {pool: q.members(now) for pool, q in self._queues.items()},
            "quarantined": {
                self._hosts.get(k, (k, 0))[0]: self._quarantine.reason(k, name=self._hosts.get(k, (k, 0))[0])
                for k in active
            },
            "quarantined_hosts": {
                k: f"{self._hosts[k][0]} host {self._hosts[k][1]}" for k in active if k in self._hosts
            },
        }


_SchedulerActor = ray.remote(enable_task_events=False, max_concurrency=4096)(
    Scheduler
)  # Fray's own traffic: not in Ray's task events


def _answered(ref: Any) -> threading.Event:
    """An event set once ``ref`` is ready (value or error), by Ray's own completion callback
    (``ObjectRef.future()``)."""
    done = threading.Event()
    ref.future().add_done_callback(lambda _f: done.set())
    return done


class SchedulerClient:
    """A supervisor's handle on its namespace's scheduler: creates it when missing and again after it
    died; a call that cannot be answered returns ``None`` (the caller goes on without the queue)."""

    def __init__(
        self,
        namespace: str,
        resource: str = "node:__internal_head__",
        quarantine: tuple[int, float, float] = (2, 3600.0, 1800.0),
    ) -> None:
        self.namespace = namespace
        self.resource = resource
        self.quarantine = quarantine
        self._actor: Any = None
        # method -> (its call in flight, sent at, key, set once it is answered)
        self._asked: dict[str, tuple[Any, float, Any, threading.Event]] = {}
        self._ask_lock = threading.Lock()

    def _connect(self) -> Any:
        return _SchedulerActor.options(
            name=SCHEDULER_NAME,
            namespace=self.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            resources={self.resource: ACTOR_RESOURCE},  # with the supervisors, on a non-preemptible node
            # No profile events for the calls it serves: Ray records them ("timeline") for every task a process
            # runs or submits, whatever the task's enable_task_events, and sends them to the GCS once a second
            # while there are any (an AddTaskEventData a second from a busy actor, ~1.3 ms/s of GCS work at
            # 16,000 hosts: bench/NOTES.md, issue 29). Merged into the creating supervisor's env_vars.
            runtime_env={"env_vars": {"RAY_enable_timeline": "0"}},
        ).remote(*self.quarantine)

    def call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
        for _ in range(2):  # once more with a fresh actor if it died
            try:
                if self._actor is None:
                    self._actor = self._connect()
                return ray.get(getattr(self._actor, method).remote(*args), timeout=timeout)
            except (rex.RayActorError, rex.ActorUnavailableError, ValueError):
                self._actor = None  # dead (or a name race with another supervisor): reconnect
            except rex.GetTimeoutError:
                return None
        return None

    def ask(self, method: str, *args: Any, timeout: float, key: Any = None, replace: bool = False) -> Any:
        """Like :meth:`call`, with back-pressure: at most one call of ``method`` in flight. Waits up to
        ``timeout`` seconds; an answer not there by then is :class:`SchedulerBehind` (never a silent
        default) and the call stays in flight: the next ``ask`` waits for the same call instead of queueing
        another behind it. ``key``: what the answer depends on besides the cluster's state; an answer to a
        call made with another key is dropped (and a fresh call made), and so is one in flight for another
        key, or any with ``replace``, without waiting for it (a held call can take seconds to answer).

        >>> SchedulerBehind(12.0).reason().startswith("waiting for the cluster's scheduler")
        True
        """
        with self._ask_lock:
            end = time.monotonic() + max(0.0, timeout)
            flight = self._asked.get(method)
            if flight is not None and (replace or flight[2] != key):
                del self._asked[method]
            for _ in range(3):  # a stale answer dropped, then once more with a fresh actor if it died
                flight = self._asked.get(method)
                if flight is None:
                    try:
                        if self._actor is None:
                            self._actor = self._connect()
                        call = getattr(self._actor, method).remote(*args)
                        flight = (call, time.monotonic(), key, _answered(call))
                    except Exception as e:  # e.g. a name race with another supervisor creating it
                        self._actor = None
                        return SchedulerBehind(0.0, error=f"{type(e).__name__}: {e}")
                    self._asked[method] = flight
                ref, sent, made_for, done = flight
                # a Python wait on the answer's future, not ray.wait: a waiting job looks 2-4 times a second
                # while its call is held by the scheduler (see Scheduler.acquire_pool), and each ray.wait cost
                # the supervisor's core worker ~1 ms (bench/NOTES.md, issue 29)
                if not done.wait(max(0.0, end - time.monotonic())):
                    return SchedulerBehind(time.monotonic() - sent)
                del self._asked[method]
                try:
                    answer = ray.get(ref, timeout=CALL_TIMEOUT)
                except (rex.RayActorError, rex.ActorUnavailableError, ValueError):
                    self._actor = None  # dead: reconnect (a fresh actor is created if none exists)
                    continue
                except rex.GetTimeoutError:
                    return SchedulerBehind(time.monotonic() - sent)
                if made_for == key:
                    return answer
            return SchedulerBehind(0.0, error="it died twice while answering")

    def notify(self, method: str, *args: Any) -> None:
        """Send a call and go on without its answer (``claimed``: nothing waits for it, and the job's next
        ``acquire`` is seconds later at the earliest). Lost if the actor is dead; the entry then expires."""
        try:
            if self._actor is None:
                self._actor = self._connect()
            getattr(self._actor, method).remote(*args)
        except Exception:
            self._actor = None
