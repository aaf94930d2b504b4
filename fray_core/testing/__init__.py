"""Backend-neutral test helpers: a fake clock and an in-memory :class:`~fray_core.runner.SliceProvider`.

With them the gang runner runs thousands of attempts per second with no processes, no threads and no
real waiting: every wait of the provider moves the fake clock forward instead of sleeping. Nothing here
imports ray or pytest. Import it as ``fray_core.testing`` (it is not re-exported by ``fray_core``). The
backend conformance kit is the submodule ``fray_core.testing.conformance`` (pytest mixins; imports pytest).

Example: a 2-slice job whose first attempt loses slice 1 to a preemption, then succeeds::

    >>> from fray_core.runner import GangRunner, RetryPolicy
    >>> from fray_core.types import Entrypoint, JobRequest, ResourceConfig
    >>> clock = FakeClock()
    >>> def script(attempt, slice_index, host_index):
    ...     if attempt == 0 and slice_index == 1:
    ...         return HostScript("PREEMPTED", after=2.0)
    ...     return "SUCCEEDED"                      # after ``host_delay`` (1 s) of fake time
    >>> provider = InMemorySliceProvider({"v4-16": 2}, clock, script=script)
    >>> request = JobRequest(name="train", entrypoint=Entrypoint(binary="true"),
    ...                      resources=ResourceConfig.with_tpu("v4-16", slice_count=2))
    >>> runner = GangRunner("job-1", request, provider, policy=RetryPolicy(backoff_initial=5.0),
    ...                     clock=clock, wall=clock.wall, sleep=clock.sleep)
    >>> outcome = runner.run()
    >>> outcome.status.value, [a.outcome.value for a in runner.info.attempts]
    ('SUCCEEDED', ['PREEMPTED', 'SUCCEEDED'])
    >>> outcome.results[:2]                          # one per host, (slice, host) order
    [(1, 0, 0), (1, 0, 1)]
    >>> provider.problems()                          # invariants the runner must keep
    []
    >>> clock.now()                                  # 2 s of attempt 0 + 5 s backoff + 1 s
    8.0
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from fray_core.clock import FakeClock, HorizonExceeded, Timer
from fray_core.errors import Unschedulable
from fray_core.fleet import FaultPlan, Fleet, FleetLease, HostFate, Slice
from fray_core.provider import (
    Heartbeat,
    HostOutcomeKind,
    HostRun,
    HostSpec,
    LeaseHealth,
    SliceLease,
    SliceProvider,
)
from fray_core.request import Entrypoint, ResourceConfig, TpuConfig
from fray_core.tpu import get_tpu_spec

__all__ = [
    "HANG",
    "FakeClock",
    "HorizonExceeded",
    "HostScript",
    "InMemorySliceProvider",
    "LeaseRecord",
    "RunRecord",
    "Script",
    "Timer",
]


# ----------------------------------------------------------------------------------- host scripts


class _Default:
    """Marks a HostScript field left to the provider's default."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


@attrs.frozen
class HostScript:
    """How one host of one attempt ends, ``after`` seconds (fake time) from its start.

    - ``kind``: ``"SUCCEEDED"``, ``"FAILED"``, ``"PREEMPTED"`` (a :class:`HostOutcomeKind` or its name),
      or ``None`` for a host that hangs until it is cancelled, preempted or ended by
      :meth:`InMemorySliceProvider.finish`.
    - ``result``: what a SUCCEEDED host returns; by default ``(attempt, slice_index, host_index)``.
    - ``error``: the error text of a FAILED host (a default names the attempt, slice and host).
    - ``restore_after``: for PREEMPTED, when the preempted slice comes back as a fresh incarnation
      (``None``: gone for good); by default the provider's ``restore_after``.
    - ``heartbeat_every``: the host calls ``fray_core.heartbeat(step)`` every that many seconds from its
      start (step 1, 2, ...); ``heartbeat_until``: and stops after that many seconds (a stall). ``None``:
      no heartbeats / beats until it ends.

    A preemption takes the whole slice, as on a real TPU pod: every host of it still running ends
    PREEMPTED at that moment.

    >>> HostScript("FAILED", after=2.5).kind
    <HostOutcomeKind.FAILED: 'FAILED'>
    """

    kind: HostOutcomeKind | None = attrs.field(
        converter=lambda k: None if k is None or k == "HANG" else HostOutcomeKind(k)
    )
    after: float = attrs.field(default=1.0)
    result: Any = DEFAULT
    error: str | None = None
    restore_after: Any = DEFAULT
    heartbeat_every: float | None = None
    heartbeat_until: float | None = None

    @kind.validator
    def _check_kind(self, _a: attrs.Attribute, value: HostOutcomeKind | None) -> None:
        if value is HostOutcomeKind.CANCELLED:
            raise ValueError(
                "HostScript.kind: CANCELLED is what cancel() produces, not a scripted outcome; "
                "use SUCCEEDED, FAILED, PREEMPTED or None (hang)"
            )

    @after.validator
    def _check_after(self, _a: attrs.Attribute, value: float) -> None:
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"HostScript.after: expected seconds >= 0, got {value!r}")


#: a host that never ends by itself
HANG = HostScript(None)

#: what a script returns: a HostScript, a kind (or its name, or "HANG"), or None (hang)
ScriptResult = HostScript | HostOutcomeKind | str | None
#: ``script(attempt_index, slice_index, host_index) -> ScriptResult``, asked once per started host
Script = Callable[[int, int, int], ScriptResult]


# ------------------------------------------------------------------------------------ bookkeeping


class LeaseRecord:
    """What the provider knows of one acquired slice (the ``handle`` of its :class:`SliceLease`).

    ``released`` counts ``release`` calls (the runner must make exactly one); ``runs`` are the host runs
    started on it; ``group`` numbers the successful ``acquire`` call it came from; ``counts`` and
    ``free_before`` are what that call asked and how many slices of the type were free when it was served.
    """

    __slots__ = (
        "lease", "fleet_lease", "slice", "incarnation", "runs", "released", "acquired_at", "released_at",
        "attempt", "job_id", "started_at", "group", "counts", "free_before", "lost",
    )  # fmt: skip

    def __init__(
        self, fl: FleetLease | None, group: int, counts: tuple[int, ...], free_before: int, now: float
    ) -> None:
        self.lease: SliceLease = None  # type: ignore[assignment]  # set right after
        self.fleet_lease = fl  # the fleet model's lease (None for a CPU/GPU gang)
        self.slice: Slice | None = fl.slice if fl is not None else None
        self.incarnation = fl.incarnation if fl is not None else 0
        self.runs: list[RunRecord] = []
        self.released = 0
        self.acquired_at = now
        self.released_at: float | None = None
        self.attempt: int | None = None  # these three are set by start()
        self.job_id = ""
        self.started_at: float | None = None
        self.group = group
        self.counts = counts
        self.free_before = free_before
        self.lost = False  # its slice was preempted while this lease held it

    @property
    def name(self) -> str:
        return self.lease.name

    @property
    def preempted(self) -> bool:
        """True when the slice was preempted while this lease held it (before its release)."""
        return self.lost

    def __repr__(self) -> str:
        return f"<LeaseRecord {self.lease.name} attempt={self.attempt} released={self.released}>"


class RunRecord(HostRun):
    """One started host: the :class:`HostRun` the provider hands out, with its attempt, env and fate.

    ``lease`` is the slice's :class:`SliceLease` (``lease_record`` its :class:`LeaseRecord`); ``state``
    is ``"running"`` or ``"ended"``; ``kind`` how it ended (CANCELLED when cancelled while running);
    ``reported`` whether ``wait_any`` handed its outcome to the caller (``report_seq``: in which order);
    ``cancelled`` whether ``cancel`` was called on it. Once ended it is its own
    :class:`~fray_core.runner.Outcome` (``run`` is itself): ``wait_any`` reports the record, not a copy.
    """

    # One object per host, in as few words as the simulation allows: at 16,000 hosts per attempt the
    # records outgrow the CPU's L2 cache and are walked by the cyclic collector, so every slot shows in
    # the runner's time (bench/runner_scale.py, bench/NOTES.md). What is the same for every host of a
    # slice (attempt, job, start time) lives on the slice's LeaseRecord; state and reported are derived.
    __slots__ = ("env", "script", "kind", "result", "error", "cancelled", "ended_at", "report_seq")

    def __init__(self, lease: SliceLease, s: int, h: int, env: dict[str, str] | None, script: HostScript) -> None:
        self.lease = lease
        self.slice_index = s
        self.host_index = h
        self.handle = None
        self.env = env
        self.script = script
        self.kind: HostOutcomeKind | None = None  # None while running
        self.result: Any = None
        self.error: str | None = None
        self.cancelled = False
        self.ended_at: float | None = None
        self.report_seq: int | None = None  # order in which wait_any reported it; None until it did

    @property
    def run(self) -> RunRecord:
        """The run itself: an ended :class:`RunRecord` is its own :class:`~fray_core.runner.Outcome`."""
        return self

    @property
    def lease_record(self) -> LeaseRecord:
        return self.lease.handle  # type: ignore[no-any-return]

    @property
    def attempt(self) -> int:
        """The attempt index the runner gave the host (its ``FRAY_ATTEMPT``; -1 if none)."""
        return self.lease.handle.attempt  # type: ignore[no-any-return]

    @property
    def job_id(self) -> str:
        return self.lease.handle.job_id  # type: ignore[no-any-return]

    @property
    def started_at(self) -> float:
        return self.lease.handle.started_at  # type: ignore[no-any-return]

    @property
    def state(self) -> str:
        """``"running"`` or ``"ended"``."""
        return "running" if self.kind is None else "ended"

    @property
    def reported(self) -> bool:
        return self.report_seq is not None

    def __repr__(self) -> str:
        kind = self.kind.value if self.kind else "-"
        return f"<RunRecord a{self.attempt} s{self.slice_index}/h{self.host_index} {self.state} {kind}>"


# ---------------------------------------------------------------------------------- the provider

_SELF = "(this job)"  # the fleet holder of the leases the provider acquires
_OTHER = "(another job)"  # ... and of slices taken by occupy()


class InMemorySliceProvider(SliceProvider):
    """A :class:`~fray_core.provider.SliceProvider` with no processes: the fleet model
    (:class:`fray_core.fleet.Fleet`, also behind ``fray_local.TpuFleet``) on a :class:`FakeClock`, host
    outcomes decided by a script or by the test.

    - ``fleet``: slices per TPU type, ``{"v4-16": 2}`` gives ``v4-16-0`` and ``v4-16-1`` with the
      catalog's hosts per slice (2 for v4-16). CPU/GPU requests get one pseudo-slice of ``replicas`` hosts.
      The model is ``provider.fleet``.
    - ``fault_plan``: a :class:`~fray_core.fleet.FaultPlan`, the same faults as on the local fleet
      (armed when an attempt's first slice starts, cancelled with its leases); :meth:`break_host` makes
      every host started on that host end PREEMPTED with a device error until :meth:`repair_host`. A
      dirty host (``DirtyHost``, or a ``FailHost(crash=True)`` before) is cleaned at start when
      ``clean_hosts`` (default), else its host ends PREEMPTED with device busy. Each such device failure
      is reported to the fleet, which quarantines a slice after ``quarantine_after`` of them on one host
      within ``quarantine_window`` seconds, for ``quarantine_for`` seconds.
    - ``acquire`` is all-or-nothing and takes the largest count in ``counts`` that is free; it raises
      ``Unschedulable(permanent=True)`` at once when no count can ever fit (fewer slices exist than the
      smallest count), and otherwise waits on the fake clock (running its callbacks, which may bring
      capacity back) until ``deadline``, then raises ``Unschedulable`` with a diagnosis such as
      ``asked: 2 x v4-16; fleet has: 1 free, 1 busy, 0 preempted``.
    - ``script(attempt, slice_index, host_index)`` decides each host's fate when it starts (see
      :class:`HostScript`); by default every host succeeds after ``host_delay`` seconds.
    - ``on_idle(provider)``, if given, is called whenever the caller would otherwise wait for time to
      pass (in ``wait_any`` with nothing ended, in ``acquire`` with nothing free): it may end hosts
      (:meth:`finish`), change capacity (:meth:`preempt`, :meth:`remove`, :meth:`restore`, :meth:`occupy`,
      :meth:`vacate`, :meth:`add_slices`) or stop the runner; then the provider looks again, and lets
      time pass only if still nothing happened. This is how a test drives random interleavings.
    - ``wait_any`` reports every wanted run that has ended (each run once), moving the clock to the next
      due event or the timeout; ``cancel`` ends running hosts as CANCELLED at once.

    It checks the runner as it goes and lists what went wrong in :meth:`problems` (``check()`` raises):
    a lease released more than once or never, a host neither reported nor cancelled when its slice was
    released, a host still running at the end, an ``acquire`` while slices of the last attempt are
    still held. With ``record=True`` (default) it keeps every :class:`LeaseRecord`/:class:`RunRecord`
    (``leases``, ``runs``, :meth:`runs_of`); ``record=False`` keeps only counters, for benchmarks.

    One provider serves one job at a time; it may serve the next job once the previous ``run()`` returned.

    >>> clock = FakeClock()
    >>> p = InMemorySliceProvider({"v4-16": 2}, clock)
    >>> p.occupy("v4-16-1")                        # another job holds it
    >>> try:
    ...     p.acquire(ResourceConfig.with_tpu("v4-16", slice_count=2), [2], deadline=30.0)
    ... except Unschedulable as e:
    ...     print(e, "| now:", clock.now())
    asked: 2 x v4-16; fleet has: 1 free, 1 busy, 0 preempted | now: 30.0
    >>> [lease.name for lease in p.acquire(ResourceConfig.with_tpu("v4-16", slice_count=[1, 2]), [2, 1], 60.0)]
    ['v4-16-0']
    """

    def __init__(
        self,
        fleet: Mapping[str, int] | None = None,
        clock: FakeClock | None = None,
        *,
        script: Script | None = None,
        on_idle: Callable[[InMemorySliceProvider], None] | None = None,
        host_delay: float = 1.0,
        restore_after: float | None = 0.0,
        record: bool = True,
        fault_plan: FaultPlan | None = None,
        clean_hosts: bool = True,
        quarantine_after: int = 2,
        quarantine_window: float = 3600.0,
        quarantine_for: float = 1800.0,
        detection_delay: float = 0.0,
    ) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self.script = script
        self.on_idle = on_idle
        self.host_delay = float(host_delay)
        self.restore_after = restore_after
        self.record = record
        self.clean_hosts = clean_hosts
        self.fleet = Fleet(
            fleet,
            self.clock,
            fault_plan=fault_plan,
            min_count=0,
            name="InMemorySliceProvider",
            quarantine_after=quarantine_after,
            quarantine_window=quarantine_window,
            quarantine_for=quarantine_for,
            detection_delay=detection_delay,
            clean_hosts=clean_hosts,
        )
        self._addresses: dict[Slice, tuple[int, tuple[str, ...]]] = {}  # per slice: (incarnation, host IPs)
        self._held: dict[LeaseRecord, None] = {}
        self._ready: dict[RunRecord, None] = {}  # ended, not yet reported
        self._due_at: dict[float, list[RunRecord]] = {}  # end time -> hosts due then, in start order
        self._fire_due = self._due_all  # one bound method for every clock event
        self._groups = itertools.count()
        self._vm_serial = itertools.count(1)
        self._report_seq = itertools.count()
        self._on_lost_cb = self._on_lost  # one bound method for every lease (not one per slice per attempt)
        self._host_ids: tuple[str, ...] = ()
        self._default_script = HostScript(HostOutcomeKind.SUCCEEDED, after=self.host_delay)
        self._kind_scripts = {
            k: HostScript(k, after=self.host_delay)
            for k in (HostOutcomeKind.SUCCEEDED, HostOutcomeKind.FAILED, HostOutcomeKind.PREEMPTED)
        }
        for k in list(self._kind_scripts):
            self._kind_scripts[k.value] = self._kind_scripts[k]
        self.violations: list[str] = []
        self.leases: list[LeaseRecord] = []
        self.runs: list[RunRecord] = []
        # counters
        self.acquire_calls = 0
        self.start_calls = 0
        self.hosts_started = 0
        self.unschedulable: list[tuple[float, str, bool]] = []  # (time, message, permanent)
        self.graceful_cancels: list[tuple[float, float, int]] = []  # (time, grace, hosts) of cancel(grace=...)
        self.stack_dumps: list[tuple[float, list[tuple[int, int]]]] = []  # (time, (slice, host)s) of dump_stacks
        self.notices: list[tuple[float, float, int]] = []  # (time, deadline, hosts) of announce_preemption
        self._beating = False  # some host's script sends heartbeats (else heartbeats() answers at once)

    # -------------------------------------------------------------------------------- inventory

    def add_slices(self, tpu_type: str, n: int = 1) -> list[str]:
        """Add ``n`` free slices of ``tpu_type`` (capacity coming back, or a bigger fleet); their names."""
        return [sl.name for sl in self.fleet.add_slices(tpu_type, n)]

    @property
    def slice_preemptions(self) -> int:
        """Slice preemptions so far (scripted, by the test, or by the fault plan)."""
        return sum(sl.preemptions for sl in self.fleet.slices())

    def slice_states(self, tpu_type: str | None = None) -> dict[str, str]:
        """``{slice name: state}``; states are free, held (by the job), occupied (by others), down, gone."""
        return {
            sl.name: ("occupied" if sl.holder == _OTHER else "held") if sl.state == "busy" else sl.state
            for sl in self.fleet.slices(tpu_type)
        }

    def describe(self, tpu_type: str) -> str:
        """``"1 free, 1 busy, 0 preempted"`` (busy: held by this job or occupied by another)."""
        return self.fleet.describe(tpu_type)

    def capacity(self, tpu_type: str) -> int:
        """Slices of the type that exist (free, busy, or preempted and coming back)."""
        return self.fleet.count(tpu_type)

    # ------------------------------------------------------------------------------- acquisition

    def acquire(self, resources: ResourceConfig, counts: Sequence[int], deadline: float) -> list[SliceLease]:
        self.acquire_calls += 1
        if self._held:
            held = ", ".join(r.lease.name for r in self._held)
            self.violations.append(f"acquire() called while the job still holds {held} (not released)")
        dev = resources.device
        clock = self.clock
        if not isinstance(dev, TpuConfig):  # validation allows a list of counts for TPU slices only
            n = int(resources.replicas)  # type: ignore[arg-type]
            rec = LeaseRecord(None, next(self._groups), tuple(counts), n, clock.now())
            return [self._lease(rec, f"{dev.kind}-gang", dev.kind, n, ("127.0.0.1",) * n)]
        spec = get_tpu_spec(dev.type)
        wanted = tuple(sorted(set(counts), reverse=True))
        if not wanted:
            raise ValueError("InMemorySliceProvider.acquire: counts is empty; give at least one slice count")
        fleet = self.fleet
        free_before = fleet.count(spec.name, "free")
        idled = False

        def idle(until: float) -> None:  # on_idle once, then let fake time pass to the next event
            nonlocal idled, free_before
            if self.on_idle is not None and not idled:
                idled = True
                self.on_idle(self)
            else:
                due = clock.next_due()
                clock.advance_to(until if due is None or due > until else due)
                idled = False
            free_before = fleet.count(spec.name, "free")

        try:
            got = fleet.acquire(_SELF, spec.name, wanted, deadline, idle)
        except Unschedulable as e:
            self.unschedulable.append((clock.now(), str(e), e.permanent))
            raise
        return self._take(got, wanted, free_before)

    def free_slices(self, tpu_type: str) -> int:
        """Free slices of the type this job could take now (not reserved for a job waiting in the
        fleet's queue): the optional provider method an elastic job grows by."""
        return self.fleet.free_slices(tpu_type, _SELF)

    def _take(self, got: list[FleetLease], counts: tuple[int, ...], free_before: int) -> list[SliceLease]:
        group = next(self._groups)
        now = self.clock.now()
        leases = []
        for fl in got:
            sl = fl.slice
            addr = self._addresses.get(sl)
            if addr is None or addr[0] != sl.incarnation:  # a fresh VM has fresh addresses
                serial = next(self._vm_serial)
                prefix = f"10.{(serial >> 8) & 255}.{serial & 255}."
                addr = self._addresses[sl] = (sl.incarnation, tuple(prefix + h for h in self._host_strs(sl.hosts)))
            rec = LeaseRecord(fl, group, counts, free_before, now)
            fl.driver = rec
            fl.on_lost = self._on_lost_cb
            leases.append(self._lease(rec, sl.name, sl.tpu_type, sl.hosts, addr[1]))
        return leases

    def _host_strs(self, n: int) -> tuple[str, ...]:
        if len(self._host_ids) < n:
            self._host_ids = tuple(str(h) for h in range(max(n, 2 * len(self._host_ids))))
        return self._host_ids[:n]

    def _lease(
        self, rec: LeaseRecord, name: str, device_type: str, hosts: int, addresses: tuple[str, ...]
    ) -> SliceLease:
        lease = SliceLease(name=name, device_type=device_type, hosts=hosts, host_addresses=addresses, handle=rec)
        rec.lease = lease
        self._held[rec] = None
        if self.record:
            self.leases.append(rec)
        return lease

    def release(self, leases: list[SliceLease]) -> None:
        now = self.clock.now()
        for lease in leases:
            rec = self._record_of(lease)
            rec.released += 1
            if rec.released > 1:
                self.violations.append(f"lease {lease.name} (attempt {rec.attempt}) released {rec.released} times")
                continue
            rec.released_at = now
            self._held.pop(rec, None)
            ready = self._ready
            for host in rec.runs:
                if host.report_seq is None and not host.cancelled:
                    if host.kind is None:
                        what = "was still running"
                    else:
                        what = f"had ended ({host.kind.value}) but was never reported"
                    self.violations.append(
                        f"attempt {host.attempt}: slice {host.slice_index} ({lease.name}) host {host.host_index} "
                        f"{what} when its slice was released, and was not cancelled"
                    )
                if host.kind is None:  # still running; keep the books straight: the host is gone with the slice
                    self._end(host, HostOutcomeKind.CANCELLED)
                if ready:
                    ready.pop(host, None)
            if rec.fleet_lease is not None:
                self.fleet.release(rec.fleet_lease)
            if not self.record:
                # Break the cycles through the record (runs -> SliceLease -> record, record <-> its fleet
                # lease) so the attempt's hosts and leases are freed by reference counting once the
                # runner drops them: left to the cyclic collector, 16,000 hosts per attempt pile up in its
                # oldest generation and every full collection walks them (bench/NOTES.md, runner_scale).
                rec.runs = []
                rec.lease = None  # type: ignore[assignment]
                if rec.fleet_lease is not None:
                    rec.fleet_lease.driver = rec.fleet_lease.on_lost = None

    def was_preempted(self, lease: SliceLease) -> bool:
        """Whether the slice was preempted while this lease held it (the cloud metadata probe), once the loss
        is detected (``detection_delay`` after it)."""
        rec = self._record_of(lease)
        fl = rec.fleet_lease
        return rec.preempted and (fl is None or self.fleet.detected(fl))

    def lease_health(self, leases: Sequence[SliceLease]) -> list[LeaseHealth]:
        """The fleet model's view of each lease (a loss is seen ``detection_delay`` after it; a notice at once,
        with its deadline on the fake wall clock)."""
        out = []
        clock = self.clock
        for lease in leases:
            fl = self._record_of(lease).fleet_lease
            state = self.fleet.lease_state(fl) if fl is not None else "intact"
            if state == "lost":
                out.append(LeaseHealth.lost("preempted"))
            elif state == "draining":
                out.append(LeaseHealth.draining(clock.wall() + (fl.notice - clock.now()), "preemption notice"))  # type: ignore[union-attr,operator]
            else:
                out.append(LeaseHealth.intact())
        return out

    @property
    def detection_delay(self) -> float:
        return self.fleet.detection_delay

    def heartbeats(self, runs: Sequence[HostRun]) -> dict[HostRun, Heartbeat]:
        """The scripted heartbeats (``HostScript.heartbeat_every``/``heartbeat_until``) of running hosts."""
        if not self._beating:
            return {}
        now = self.clock.now()
        out: dict[HostRun, Heartbeat] = {}
        for run in runs:
            host: RunRecord = run  # type: ignore[assignment]
            every = host.script.heartbeat_every
            if every is None or host.kind is not None:
                continue
            until = host.script.heartbeat_until
            start = host.started_at
            upto = now if until is None else min(now, start + until)
            n = int((upto - start) // every)
            if n >= 1:
                out[run] = Heartbeat(age=now - (start + n * every), step=n)
        return out

    def dump_stacks(self, runs: Sequence[HostRun]) -> None:
        """Recorded in ``stack_dumps`` (the hosts are records: they have no stacks)."""
        self.stack_dumps.append((self.clock.now(), [(r.slice_index, r.host_index) for r in runs]))

    def announce_preemption(self, runs: Sequence[HostRun], deadline: float) -> None:
        """Recorded in ``notices``."""
        self.notices.append((self.clock.now(), deadline, len(runs)))

    def _record_of(self, lease: SliceLease) -> LeaseRecord:
        rec = lease.handle
        if not isinstance(rec, LeaseRecord):
            raise ValueError(f"lease {lease!r} was not acquired from this InMemorySliceProvider")
        return rec

    # -------------------------------------------------------------------------------------- hosts

    def _script_for(self, attempt: int, s: int, h: int) -> HostScript:
        if self.script is None:
            return self._default_script
        got = self.script(attempt, s, h)
        if isinstance(got, HostScript):
            return got
        if got is None or got == "HANG":
            return HANG
        try:
            return self._kind_scripts[got]
        except KeyError:
            raise ValueError(
                f"script({attempt}, {s}, {h}) returned {got!r}; expected a HostScript, "
                f"'SUCCEEDED'/'FAILED'/'PREEMPTED' (or a HostOutcomeKind), or None/'HANG'"
            ) from None

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        self.start_calls += 1
        rec = self._record_of(lease)
        if rec.released:
            self.violations.append(f"start() on {lease.name} after it was released")
        if len(hosts) != lease.hosts:
            self.violations.append(f"start() on {lease.name} got {len(hosts)} hosts for its {lease.hosts}")
        if rec.started_at is not None:
            self.violations.append(f"start() on {lease.name} called again (a lease's hosts start once)")
        first = hosts[0] if hosts else None
        attempt = first.attempt if first is not None else -1
        s = first.slice_index if first is not None else 0
        rec.attempt = attempt
        rec.job_id = first.job_id if first is not None else ""
        fl = rec.fleet_lease
        if fl is not None:
            self.fleet.start_slice(fl, attempt)  # the model arms the attempt's faults, once
        host_fate = self.fleet.host_fate
        faulty = fl is not None and fl.faulty  # most slices: no host fault, every host healthy
        clock = self.clock
        now = rec.started_at = clock.now()
        new: list[RunRecord] = []
        lost = rec.preempted  # the slice went away between acquire and start
        # One clock event per distinct end time (not one per host, nor per slice): hosts due at the same
        # instant join one group and end in start order, as separate events pushed in that order would.
        due = self._due_at
        push = clock._push
        for spec in hosts:
            h = spec.host_index
            plan = self._script_for(attempt, s, h)
            host = RunRecord(lease, s, h, spec.env if self.record else None, plan)  # type: ignore[arg-type]
            new.append(host)
            if plan.heartbeat_every is not None:
                self._beating = True
            if lost:
                self._end(host, HostOutcomeKind.PREEMPTED, error=f"Preempted: slice {lease.name} was preempted")
            elif faulty and self._ended_by(host, host_fate(fl, h)):  # type: ignore[arg-type]
                pass
            elif plan.kind is not None:
                when = now + plan.after
                group = due.get(when)
                if group is None:
                    due[when] = group = []
                    push(when, self._fire_due, when)
                group.append(host)
        rec.runs.extend(new)
        self.hosts_started += len(new)
        if self.record:
            self.runs.extend(new)
        return new  # type: ignore[return-value]

    def _ended_by(self, host: RunRecord, fate: HostFate) -> bool:
        """Turn the fate the fleet decided for a starting host into an ended run; True if it ended it."""
        if fate.kind is None:
            return False
        self._end(host, HostOutcomeKind(fate.kind), error=fate.error)
        return True

    def _due_all(self, when: float) -> None:
        for host in self._due_at.pop(when):
            self._due(host)

    def _due(self, host: RunRecord) -> None:
        if host.kind is not None:  # ended already
            return
        plan = host.script
        kind = plan.kind
        if kind is HostOutcomeKind.SUCCEEDED:
            result = plan.result if plan.result is not DEFAULT else (host.attempt, host.slice_index, host.host_index)
            self._end(host, kind, result=result)
        elif kind is HostOutcomeKind.FAILED:
            self._end(host, kind, error=plan.error or self._failure_text(host))
        else:
            restore = plan.restore_after if plan.restore_after is not DEFAULT else self.restore_after
            self._preempt_lease(host.lease.handle, restore)

    @staticmethod
    def _failure_text(host: RunRecord) -> str:
        where = f"attempt {host.attempt} slice {host.slice_index} host {host.host_index}"
        return (
            f"RuntimeError: scripted failure on {where}\n"
            f'Traceback (most recent call last):\n  File "<simulated host>", line 1, in <module>\n'
            f"RuntimeError: scripted failure on {where}\n"
        )

    def _end(self, host: RunRecord, kind: HostOutcomeKind, result: Any = None, error: str | None = None) -> None:
        host.kind = kind
        host.result = result
        host.error = error
        host.ended_at = self.clock.now()
        if host.report_seq is None:
            self._ready[host] = None

    def wait_any(self, runs: list[HostRun], timeout: float) -> list[RunRecord]:
        """The runs among ``runs`` that ended, as their own outcomes (a :class:`RunRecord` carries
        ``kind``/``result``/``error``); advances the fake clock up to ``timeout`` for at least one."""
        clock = self.clock
        deadline = clock.now() + max(0.0, timeout)
        idled = False
        wanted: set[HostRun] | None = None
        while True:
            if self._ready:
                if wanted is None:
                    wanted = set(runs)
                got = [h for h in self._ready if h in wanted]
                if got:
                    ready = self._ready
                    for h in got:
                        del ready[h]
                        h.report_seq = next(self._report_seq)
                    return got
            if self.on_idle is not None and not idled:
                idled = True
                self.on_idle(self)
                continue
            if clock.now() >= deadline:
                return []
            due = clock.next_due()
            clock.advance_to(deadline if due is None or due > deadline else due)
            idled = False

    def cancel(self, runs: list[HostRun], grace: float | None = None) -> None:
        """End running hosts as CANCELLED at once (a host told to stop gracefully, ``grace``, is taken to
        have checkpointed and exited within it; ``graceful_cancels`` records each such call)."""
        if grace is not None:
            self.graceful_cancels.append((self.clock.now(), grace, len(runs)))
        for run in runs:
            host: RunRecord = run  # type: ignore[assignment]
            host.cancelled = True
            if host.kind is None:
                self._end(host, HostOutcomeKind.CANCELLED)

    # ------------------------------------------------------------------------------ driving it

    def running_runs(self) -> list[HostRun]:
        """The host runs still running, in start order."""
        return [h for rec in self._held for h in rec.runs if h.kind is None]

    def held_leases(self) -> list[SliceLease]:
        """The leases acquired and not yet released."""
        return [r.lease for r in self._held]

    def finish(
        self,
        run: HostRun,
        kind: HostOutcomeKind | str,
        *,
        result: Any = DEFAULT,
        error: str | None = None,
        restore_after: Any = DEFAULT,
    ) -> None:
        """End a running host now. PREEMPTED preempts its whole slice (see :meth:`preempt`)."""
        host: RunRecord = run  # type: ignore[assignment]
        if host.state != "running":
            raise ValueError(f"{host!r} is not running")
        plan = HostScript(kind, after=0.0, result=result, error=error, restore_after=restore_after)
        if plan.kind is None:
            raise ValueError("finish(): kind must be SUCCEEDED, FAILED or PREEMPTED, not a hang")
        host.script = plan
        self._due(host)

    def preempt(self, slice_name: str, restore_after: float | None = 0.0) -> None:
        """Preempt a slice now: every host of it still running ends PREEMPTED, the lease holding it goes
        stale, and a fresh incarnation is free again after ``restore_after`` seconds (``None``: gone)."""
        self.fleet.preempt(slice_name, restore_after)

    def _on_lost(self, fl: FleetLease) -> None:
        self._lose(fl.driver)

    def _lose(self, rec: LeaseRecord) -> None:
        rec.lost = True
        err = f"Preempted: slice {rec.lease.name} was preempted"
        fl = rec.fleet_lease
        detected = self.fleet.detected_at(fl) if fl is not None else None
        late = detected is not None and detected > self.clock.now()
        dead = []
        for host in rec.runs:
            if host.kind is None:
                if late:  # dead now; the runner hears of it when the control plane detects the loss
                    host.kind, host.error, host.ended_at = HostOutcomeKind.PREEMPTED, err, self.clock.now()
                    dead.append(host)
                else:
                    self._end(host, HostOutcomeKind.PREEMPTED, error=err)
        if dead:
            self.clock.call_at(detected, self._detected, dead)  # type: ignore[arg-type]

    def _detected(self, hosts: list[RunRecord]) -> None:
        for host in hosts:
            if host.report_seq is None:
                self._ready[host] = None

    def _preempt_lease(self, rec: LeaseRecord, restore_after: float | None) -> None:
        fl = rec.fleet_lease
        if fl is not None and fl.live:
            self.fleet.preempt(fl.slice.name, restore_after)
        else:
            self._lose(rec)

    def remove(self, slice_name: str) -> None:
        """Capacity loss: the slice is gone (preempted with no return) until :meth:`restore`."""
        self.fleet.remove(slice_name)

    def restore(self, slice_name: str) -> None:
        """Bring a down or gone slice back now, as a fresh incarnation."""
        self.fleet.restore(slice_name)

    def occupy(self, slice_name: str) -> None:
        """Another job takes a free slice (it counts as busy) until :meth:`vacate`."""
        sl = self.fleet.slice(slice_name)
        if sl.state != "free":
            state = self.slice_states()[slice_name]
            raise ValueError(f"occupy({slice_name!r}): the slice is {state}, only a free slice can be occupied")
        self.fleet.occupy(slice_name, _OTHER)

    def vacate(self, slice_name: str) -> None:
        """The other job gives the slice back."""
        self.fleet.vacate(slice_name)

    def notify_preemption(self, slice_name: str, grace: float, restore_after: float | None = 0.0) -> float:
        """A preemption notice for a slice (see :meth:`fray_core.fleet.Fleet.notify_preemption`): taken away
        ``grace`` seconds from now; the runner sees it draining. Returns the deadline (fake clock)."""
        return self.fleet.notify_preemption(slice_name, grace, restore_after)

    def break_host(self, slice_name: str, host: int) -> None:
        """Every host started on this one ends PREEMPTED with a device error until :meth:`repair_host`."""
        self.fleet.break_host(slice_name, host)

    def repair_host(self, slice_name: str, host: int) -> None:
        """Undo :meth:`break_host`."""
        self.fleet.repair_host(slice_name, host)

    # ---------------------------------------------------------------------------------- checking

    def runs_of(self, attempt: int, job_id: str | None = None) -> list[RunRecord]:
        """The recorded host runs of one attempt, in (slice, host) order of start."""
        return [r for r in self.runs if r.attempt == attempt and (job_id is None or r.job_id == job_id)]

    def lease_groups(self) -> list[list[LeaseRecord]]:
        """The recorded leases, one list per successful ``acquire`` call, in order."""
        groups: dict[int, list[LeaseRecord]] = {}
        for rec in self.leases:
            groups.setdefault(rec.group, []).append(rec)
        return list(groups.values())

    def problems(self) -> list[str]:
        """Every broken invariant so far; ``[]`` when the runner kept them all.

        Meant to be read after ``run()`` returned: leases still held and hosts still running are then
        leaks.
        """
        out = list(self.violations)
        for rec in self._held:
            out.append(f"lease {rec.lease.name} (attempt {rec.attempt}) was acquired and never released")
        for host in self.running_runs():
            out.append(
                f"attempt {host.attempt}: slice {host.slice_index} ({host.lease.name}) host "
                f"{host.host_index} is still running"
            )
        return out

    def check(self) -> None:
        """Raise ``AssertionError`` listing :meth:`problems`, if any."""
        probs = self.problems()
        if probs:
            raise AssertionError("InMemorySliceProvider found broken invariants:\n  " + "\n  ".join(probs))
