"""One model of a TPU fleet, for every simulation of one: slices, incarnations, capacity, leases, host
health and faults.

:class:`Fleet` is a pure state machine driven by a clock: it knows nothing of processes or threads. Two
drivers run it, and neither re-implements any of it:

- ``fray_core.testing.InMemorySliceProvider``: a fake clock, hosts that are records (thousands of
  attempts per second, for property tests of the runner);
- ``fray_local.TpuFleet`` with ``fray_local``'s ``LocalSliceProvider``: real time, a process per host.

Faults have one vocabulary, :class:`FaultPlan` (``PreemptSlice``, ``FailHost``, ``DropCapacity``,
``DirtyHost``; ``FaultPlan.chaos(seed, rate)`` for seeded random preemptions), keyed by attempt index and
applied to every job on the fleet. What a plan arms for an attempt belongs to that attempt's leases: when
they are released, its pending faults are cancelled, so a fault never lands on another job or attempt and
a seed replays the same faults.

Hosts have a health: ``HEALTHY``; ``DIRTY`` (a crashed TPU process left its lockfile: the next process on
it cannot open the device unless the driver cleans the host first); ``BROKEN`` (the device fails every
process started on it until :meth:`Fleet.repair_host`). Either kind of device error is the
infrastructure's fault (the host ends PREEMPTED), not the user's.

>>> from fray_core.testing import FakeClock
>>> clock = FakeClock()
>>> fleet = Fleet({"v4-16": 2}, clock)
>>> leases = fleet.try_acquire("job-1", "v4-16", [2])
>>> [lease.slice.name for lease in leases]
['v4-16-0', 'v4-16-1']
>>> fleet.preempt("v4-16-1", restore_after=5.0)
>>> leases[1].lost, fleet.describe("v4-16")
(True, '0 free, 1 busy, 1 preempted')
>>> clock.advance(5.0)                             # a fresh incarnation comes back
>>> fleet.describe("v4-16"), fleet.slice("v4-16-1").incarnation
('1 free, 1 busy, 0 preempted', 1)
>>> fleet.break_host("v4-16-0", 1)
>>> fleet.host_fate(leases[0], 1)
HostFate(kind='PREEMPTED', error='TpuDeviceError: the TPU device of v4-16-0 host 1 is broken (device init failed)', crash=False, cleaned=False)
"""  # noqa: E501 - a doctest output line (HostFate repr) cannot be wrapped

from __future__ import annotations

import enum
import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from fray_core.errors import Unschedulable
from fray_core.limits import (
    MAX_FAULTS,
    MAX_FLEET_SLICES,
    MAX_HOSTS_PER_JOB,
    MAX_REPLICAS,
    MAX_RETRIES,
    check_flag,
    check_name,
    check_number,
    check_seconds,
    sequence_converter,
    show_number,
)
from fray_core.scheduling import FairQueue, Quarantine, pending_reason
from fray_core.tpu import get_tpu_spec, normalize_tpu_type

__all__ = [
    "DirtyHost",
    "DropCapacity",
    "FailHost",
    "Fault",
    "FaultPlan",
    "Fleet",
    "FleetClock",
    "FleetLease",
    "HostFate",
    "HostHealth",
    "PreemptSlice",
    "Slice",
    "simulated_fleet",
]

# ------------------------------------------------------------------------------------------ fault plan


# the largest index each field can name: attempts of a job (1 + both retry budgets), slices of a job, hosts of
# a job, slices of a type in a fleet
_FAULT_INDEX_MAX = {
    "attempt": 2 * MAX_RETRIES,
    "slice_index": MAX_REPLICAS - 1,
    "host_index": MAX_HOSTS_PER_JOB - 1,
    "to": MAX_FLEET_SLICES,
}


def _check_fault(fault: Any) -> None:
    """Every field of a fault, checked when it is made (not when an attempt meets it, far from the caller):
    indexes and counts are ints >= 0 up to what a job can have, times are seconds >= 0 (``restore_after`` may
    be None), ``crash`` a bool, ``message`` a name-like str, ``tpu_type`` a type of the catalog (kept by its
    catalog name)."""
    for a in attrs.fields(type(fault)):
        value = getattr(fault, a.name)
        field = f"{type(fault).__name__}.{a.name}"
        if a.name in _FAULT_INDEX_MAX:
            # bounded by what a job can have: an index past it (a typo, 10**30) names nothing and never fired
            check_number(field, value, integer=True, maximum=_FAULT_INDEX_MAX[a.name])
        elif a.name in ("after", "restore_after", "duration"):
            check_seconds(field, value, allow_none=a.name == "restore_after")
        elif a.name == "crash":
            check_flag(field, value)  # "no" is truthy: the host would die hard
        elif a.name == "message":
            # the host's error text, passed to it through its environment (which holds no NUL): a name's limits
            check_name(field, value)
        elif a.name == "tpu_type":
            # an unknown type matched no slice: the drop did nothing, silently
            object.__setattr__(fault, a.name, get_tpu_spec(value, field=field).name)


@attrs.frozen
class PreemptSlice:
    """Preempt slice ``slice_index`` of attempt ``attempt`` ``after`` seconds into it; it comes back after
    ``restore_after`` seconds (``None``: gone for good)."""

    attempt: int
    slice_index: int = 0
    after: float = 0.5
    restore_after: float | None = 0.0

    def __attrs_post_init__(self) -> None:
        _check_fault(self)


@attrs.frozen
class FailHost:
    """Fail host ``host_index`` of slice ``slice_index`` in attempt ``attempt`` as it starts (the user's
    fault: ``SimulatedHostFailure(message)``); ``crash=True``: the host dies hard and leaves its device
    lock behind, so the host is dirty until cleaned."""

    attempt: int
    slice_index: int = 0
    host_index: int = 0
    message: str = "injected host failure"
    crash: bool = False

    def __attrs_post_init__(self) -> None:
        _check_fault(self)


@attrs.frozen
class DropCapacity:
    """When attempt ``attempt`` starts (plus ``after`` s), only ``to`` slices of ``tpu_type`` stay up for
    ``duration`` seconds (the others, free ones first, are preempted and come back after it)."""

    attempt: int
    tpu_type: str
    to: int
    duration: float = 1.0
    after: float = 0.0

    def __attrs_post_init__(self) -> None:
        _check_fault(self)


@attrs.frozen
class DirtyHost:
    """Before attempt ``attempt`` starts, leave a stale device lock on host ``host_index`` of slice
    ``slice_index`` (as a crashed process would)."""

    attempt: int
    slice_index: int = 0
    host_index: int = 0

    def __attrs_post_init__(self) -> None:
        _check_fault(self)


Fault = PreemptSlice | FailHost | DropCapacity | DirtyHost


@attrs.frozen
class FaultPlan:
    """Faults keyed by attempt index; a fleet applies them to every job that runs on it.

    >>> FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=2.0)]).for_attempt(0)
    [PreemptSlice(attempt=0, slice_index=1, after=2.0, restore_after=0.0)]
    """

    faults: tuple[Fault, ...] = attrs.field(
        default=(),
        converter=sequence_converter(
            "FaultPlan.faults", "faults", "[PreemptSlice(attempt=0, slice_index=1)]", limit=MAX_FAULTS
        ),
    )
    seed: int | None = None
    _by_attempt: dict[int, list[Fault]] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for i, f in enumerate(self.faults):
            if not isinstance(f, _FAULT_TYPES):  # else an AttributeError ('attempt') from the loop below
                raise TypeError(
                    f"FaultPlan.faults: expected PreemptSlice, FailHost, DropCapacity or DirtyHost entries, got "
                    f"{f!r} (entry {i})"
                )
        _check_seed("FaultPlan.seed", self.seed)
        by: dict[int, list[Fault]] = {}
        for f in self.faults:
            by.setdefault(f.attempt, []).append(f)
        object.__setattr__(self, "_by_attempt", by)

    def for_attempt(self, attempt: int) -> list[Fault]:
        return list(self._by_attempt.get(attempt, ()))

    @staticmethod
    def chaos(seed: int, rate: float, *, attempts: int = 50, max_slices: int = 8, horizon: float = 2.0) -> FaultPlan:
        """Random preemptions: in each of the first ``attempts`` attempts, each slice is preempted with
        probability ``rate`` at a random time within ``horizon`` seconds. The same seed gives the same plan.

        >>> FaultPlan.chaos(seed=1, rate=0.5) == FaultPlan.chaos(seed=1, rate=0.5)
        True
        """
        _check_seed("FaultPlan.chaos: seed", seed)
        check_number("FaultPlan.chaos: rate", rate, maximum=1.0)
        check_number("FaultPlan.chaos: attempts", attempts, integer=True, maximum=MAX_FAULTS)
        check_number("FaultPlan.chaos: max_slices", max_slices, integer=True, maximum=MAX_FLEET_SLICES)
        check_seconds("FaultPlan.chaos: horizon", horizon, allow_none=False)
        if attempts * max_slices > MAX_FAULTS:  # a draw per slice per attempt, each a possible fault of the plan
            raise ValueError(
                f"FaultPlan.chaos: attempts x max_slices is {attempts:,} x {max_slices:,} = "
                f"{attempts * max_slices:,} draws; at most {MAX_FAULTS:,} allowed (the faults of one plan)"
            )
        rng = random.Random(seed)
        faults: list[Fault] = []
        for a in range(attempts):
            for s in range(max_slices):
                if rng.random() < rate:
                    faults.append(PreemptSlice(attempt=a, slice_index=s, after=round(rng.uniform(0, horizon), 3)))
        return FaultPlan(faults, seed=seed)


_FAULT_TYPES = (PreemptSlice, FailHost, DropCapacity, DirtyHost)


def _check_seed(field: str, seed: Any) -> None:
    """A plan's seed: an int or None (``random.Random`` also takes a str and refuses a float: one kind, as
    the signature says)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"{field}: expected an int or None, got {seed!r}")


# ------------------------------------------------------------------------------------------ the model


class FleetClock(Protocol):
    """What the model needs of time: ``now()`` and ``call_later(delay, fn, *args)`` returning something
    with ``cancel()``. ``fray_core.clock.FakeClock`` is one; ``fray_local`` has one on threads."""

    def now(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Any: ...


class HostHealth(enum.Enum):
    """The health of one host of a slice (``Fleet.host_health``)."""

    HEALTHY = "healthy"
    DIRTY = "dirty"  # a stale device lock: the next process fails unless the host is cleaned first
    BROKEN = "broken"  # the device fails every process until repaired


@attrs.frozen
class HostFate:
    """What the fleet decided for a host process starting now (:meth:`Fleet.host_fate`); drivers only turn it
    into an ended run (in memory) or into the host's environment (a real process).

    ``kind``: ``None`` (the process runs), ``"PREEMPTED"`` (its device cannot be opened: broken, or busy with
    a stale lock; the infrastructure's fault) or ``"FAILED"`` (an injected failure of the user's code);
    ``error`` the text it ends with. ``crash``: it dies hard, leaving its device lock behind (the host is
    dirty from now on). ``cleaned``: a stale device lock was removed before the start (a note for the log).
    """

    kind: str | None = None
    error: str | None = None
    crash: bool = False
    cleaned: bool = False


_HEALTHY_FATE = HostFate()


class Slice:
    """One slice of the fleet. ``state``: ``free``, ``busy`` (held by ``lease``), ``down`` (preempted,
    coming back as a fresh incarnation) or ``gone`` (preempted for good, until restored)."""

    __slots__ = (
        "name", "tpu_type", "hosts", "index", "state", "incarnation", "preemptions", "lease", "sick", "_quarantine",
        "draining",
    )  # fmt: skip

    def __init__(self, name: str, tpu_type: str, hosts: int, index: int, quarantine: Quarantine | None = None) -> None:
        self.name = name
        self.tpu_type = tpu_type
        self.hosts = hosts
        self.index = index  # creation order within its type: free slices are handed out lowest first
        self.state = "free"
        self.incarnation = 0
        self.preemptions = 0
        self.lease: FleetLease | None = None
        self.sick: dict[int, HostHealth] | None = None  # hosts that are not healthy
        self.draining: tuple[float, float | None] | None = None  # a preemption notice: (deadline, restore_after)
        self._quarantine = quarantine if quarantine is not None else Quarantine()  # the fleet's, keyed by slice

    @property
    def device_failures(self) -> dict[int, list[float]] | None:
        """Per host: when its device failed (within the quarantine window); ``None`` when none is on record."""
        return self._quarantine.failures(self)

    @property
    def quarantined_until(self) -> float | None:
        """Not handed to any job before then (``None``: not in quarantine)."""
        return self._quarantine.until(self)

    @property
    def quarantine_note(self) -> str:
        """Why it was quarantined, e.g. ``"device error twice in 10 min"``."""
        return self._quarantine.note(self)

    @property
    def holder(self) -> str | None:
        """Who holds the slice (the ``holder`` given to ``try_acquire``), or ``None``."""
        return self.lease.holder if self.lease is not None else None

    def health(self, host: int) -> HostHealth:
        return self.sick.get(host, HostHealth.HEALTHY) if self.sick else HostHealth.HEALTHY

    def __repr__(self) -> str:
        return f"<Slice {self.name} {self.state} incarnation={self.incarnation}>"


class FleetLease:
    """One incarnation of a slice, held by ``holder`` until released.

    ``lost`` becomes True when the slice is preempted while held (``lost_at``: when, on the fleet's clock);
    ``on_lost(lease)`` (set by the driver) is called at that moment, e.g. to kill the host processes: they
    are dead at once, though the runner learns of it only ``Fleet.detection_delay`` later
    (:meth:`Fleet.detected`). ``notice`` is the deadline (fleet clock) of a pending preemption notice
    (:meth:`Fleet.notify_preemption`), announced through ``on_notice(lease)``. ``driver`` is the driver's own
    data; ``group`` the leases acquired together with it (one attempt's slices, whose faults are armed once).
    """

    __slots__ = (
        "slice", "incarnation", "holder", "lost", "released", "on_lost", "driver", "_timers", "_host_faults",
        "lost_at", "notice", "on_notice", "group",
    )  # fmt: skip

    def __init__(self, sl: Slice, holder: str) -> None:
        self.slice = sl
        self.incarnation = sl.incarnation
        self.holder = holder
        self.lost = False
        self.released = False
        self.on_lost: Callable[[FleetLease], None] | None = None
        self.driver: Any = None
        self._timers: list[Any] | None = None  # faults armed for the attempt holding it
        self._host_faults: dict[int, FailHost] | None = None
        self.lost_at: float | None = None
        self.notice: float | None = None
        self.on_notice: Callable[[FleetLease], None] | None = None
        self.group: _Group | None = None

    @property
    def faulty(self) -> bool:
        """Whether a host of it has a fault to meet at start (see :meth:`Fleet.host_fate`)."""
        return self._host_faults is not None or bool(self.slice.sick)

    @property
    def live(self) -> bool:
        """Held now: neither released nor preempted."""
        return not self.released and not self.lost

    def __repr__(self) -> str:
        return f"<FleetLease {self.slice.name}#{self.incarnation} {self.holder} {'live' if self.live else 'ended'}>"


class _Group:
    """The leases of one acquisition (one attempt), and whether the plan's faults were armed on them."""

    __slots__ = ("leases", "armed")

    def __init__(self, leases: list[FleetLease]) -> None:
        self.leases = leases
        self.armed = False


_STATES = ("free", "busy", "down", "gone")


class Fleet:
    """Slices of TPU types with hosts (names ``<type>-<i>``, hosts per slice from the catalog), that
    holders acquire whole (all-or-nothing) and release; preemptions, capacity drops, host health and a
    fault plan, on a :class:`FleetClock`. Not thread-safe: a driver that uses threads holds a lock.

    - ``clock``: what time the model's timers (restores, armed faults) run on; a fresh ``FakeClock`` when
      not given.
    - ``on_demand``: slices are created when asked, so any request fits.
    - ``on_dirt(slice_name, host, dirty)``: called when a host becomes dirty or clean, for a driver that
      keeps a real device lock (the local fleet's lockfile); ``dirt_probe(slice_name, host)``: whether that
      lock is left on a host the model thinks healthy (a process that died hard left it), so that
      :meth:`host_health` and :meth:`clean` tell of it.
    - ``min_count``, ``name``: the smallest count ``capacity`` may give per type, and who to name in the
      error when it is smaller.
    - ``waiter_ttl``: how long a holder keeps its place in the queue without asking again.
    - ``quarantine_after``, ``quarantine_window``, ``quarantine_for``: after that many device failures of
      one host (:meth:`device_failed`) within the window, its slice is handed to no one for
      ``quarantine_for`` seconds (or until :meth:`repair_host`); slices with a device failure on record
      (until repaired) are handed out last.
    - ``detection_delay``: seconds between a slice's loss and the runner learning of it (the control
      plane's failure detection, e.g. Ray's node-death timeout): the lost slice's hosts are dead at once, but
      their outcomes and :meth:`lease_state` tell of it only that much later. 0: at once.
    - ``clean_hosts``: a host with a stale device lock is cleaned before the next process starts on it (as
      fray does on a real TPU VM); when False, that process fails with device busy.

    Faults have one vocabulary, here: :meth:`preempt`, :meth:`remove`, :meth:`restore`, :meth:`drop_capacity`,
    :meth:`occupy`/:meth:`vacate` (another job holds a slice), :meth:`break_host`/:meth:`repair_host`,
    :meth:`make_dirty`/:meth:`clean`, :meth:`notify_preemption`, and a :class:`FaultPlan` armed once per
    attempt (:meth:`start_slice`). The model decides each host's fate (:meth:`host_fate`).
    """

    def __init__(
        self,
        capacity: Mapping[str, int] | None = None,
        clock: FleetClock | None = None,
        *,
        on_demand: bool = False,
        fault_plan: FaultPlan | None = None,
        on_dirt: Callable[[str, int, bool], None] | None = None,
        dirt_probe: Callable[[str, int], bool] | None = None,
        min_count: int = 1,
        name: str = "Fleet",
        waiter_ttl: float = 5.0,
        quarantine_after: int = 2,
        quarantine_window: float = 3600.0,
        quarantine_for: float = 1800.0,
        detection_delay: float = 0.0,
        clean_hosts: bool = True,
    ) -> None:
        # Every argument checked here, naming it: a wrong one used to surface only when first used (a fault
        # plan when an attempt started, a capacity of the wrong kind as an AttributeError).
        if not isinstance(name, str):
            raise TypeError(f"Fleet.name: expected a str, got {name!r}")
        detection_delay = check_seconds(f"{name}: detection_delay", detection_delay, allow_none=False)
        check_number(f"{name}: min_count", min_count, integer=True)
        waiter_ttl = check_seconds(f"{name}: waiter_ttl", waiter_ttl, positive=True, allow_none=False)
        check_flag(f"{name}: clean_hosts", clean_hosts)
        for field, fn in (("on_dirt", on_dirt), ("dirt_probe", dirt_probe)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}: {field}: expected a callable or None, got {fn!r}")
        if capacity is not None and not isinstance(capacity, Mapping):
            raise TypeError(
                f"{name}: capacity: expected a mapping of TPU type to slice count like {{'v4-16': 2}}, got {capacity!r}"
            )
        if clock is None:
            from fray_core.clock import FakeClock

            clock = FakeClock()
        elif not (callable(getattr(clock, "now", None)) and callable(getattr(clock, "call_later", None))):
            raise TypeError(f"{name}: clock: expected a FleetClock (now() and call_later()) or None, got {clock!r}")
        self.clock = clock
        self._fleet_name = name
        self.on_demand = on_demand  # checked by the property's setter, as when set later
        self.fault_plan = fault_plan  # type: ignore[assignment]  # None: no faults (the property's setter)
        self.on_dirt = on_dirt
        self.dirt_probe = dirt_probe
        self.detection_delay = float(detection_delay)
        self.clean_hosts = clean_hosts
        self._occupied: dict[str, FleetLease] = {}  # slices another job holds (occupy)
        self._slices: dict[str, Slice] = {}
        self._free: dict[str, dict[Slice, None]] = {}  # per type: the free slices
        # per type: the slices by index, and heaps of the indexes of free slices: healthy ones, and those
        # with a device failure on record (handed out last); quarantined ones are in neither. Lazy: an
        # entry whose slice is no longer free (or moved) is dropped when met. Handing out c slices costs
        # O(c log n).
        self._by_type: dict[str, list[Slice]] = {}
        self._free_heap: dict[str, list[int]] = {}
        self._suspect_heap: dict[str, list[int]] = {}
        self._qfree: dict[str, int] = {}  # per type: free slices in quarantine
        self._counts: dict[str, dict[str, int]] = {}  # per type: state -> number of slices
        # per type: the holders waiting for slices, oldest first (the fair queue, see try_acquire)
        self._queues: dict[str, FairQueue] = {}
        self._waiter_ttl = float(waiter_ttl)
        # keyed by Slice; the fleet lifts each quarantine at its instant (a timer), to keep its heaps right
        self._quarantine = Quarantine(quarantine_after, quarantine_window, quarantine_for, name=name)
        for tpu_type, n in (capacity or {}).items():
            get_tpu_spec(tpu_type, field=f"{name}: capacity")
            if isinstance(n, bool) or not isinstance(n, int) or n < min_count:
                raise ValueError(f"{name}: count of {tpu_type!r} must be an int >= {min_count}, got {show_number(n)}")
            self.add_slices(tpu_type, n)

    def __repr__(self) -> str:
        return f"Fleet({self.capacity()}, on_demand={self.on_demand})"

    @property
    def on_demand(self) -> bool:
        """Slices are created when asked (up to :data:`~fray_core.limits.MAX_FLEET_SLICES` of a type)."""
        return self._on_demand

    @on_demand.setter
    def on_demand(self, value: bool) -> None:
        self._on_demand = check_flag(f"{self._fleet_name}: on_demand", value)  # "no" is truthy

    @property
    def fault_plan(self) -> FaultPlan:
        """The faults applied to every job on the fleet, keyed by attempt (an empty plan: none)."""
        return self._fault_plan

    @fault_plan.setter
    def fault_plan(self, value: FaultPlan | None) -> None:
        # checked when set, not when the next attempt starts (far from the caller, inside a job's runner)
        if value is not None and not isinstance(value, FaultPlan):
            raise TypeError(f"{self._fleet_name}: fault_plan: expected a FaultPlan([...]) or None, got {value!r}")
        self._fault_plan = value if value is not None else FaultPlan()

    @property
    def waiter_ttl(self) -> float:
        """How long a holder keeps its place in a queue without asking again."""
        return self._waiter_ttl

    @waiter_ttl.setter
    def waiter_ttl(self, value: float) -> None:
        self._waiter_ttl = float(
            check_seconds(f"{self._fleet_name}: waiter_ttl", value, positive=True, allow_none=False)
        )
        for q in self._queues.values():
            q.ttl = self._waiter_ttl

    @property
    def quarantine_after(self) -> int:
        return self._quarantine.after

    @property
    def quarantine_window(self) -> float:
        return self._quarantine.window

    @property
    def quarantine_for(self) -> float:
        return self._quarantine.duration

    # ------------------------------------------------------------------------------------- inventory

    def add_slices(self, tpu_type: str, n: int = 1) -> list[Slice]:
        """Add ``n`` free slices of ``tpu_type`` (named after the ones the type has); at most
        :data:`~fray_core.limits.MAX_FLEET_SLICES` of a type in all."""
        spec = get_tpu_spec(tpu_type)
        have = sum(self._counts[spec.name].values()) if spec.name in self._counts else 0
        if isinstance(n, int) and not isinstance(n, bool) and have + n > MAX_FLEET_SLICES:
            # before check_number, which calls an int past a float's range not finite: this says what is allowed
            asked = f"{have + n:,}" if n < 10**30 else show_number(n)  # f"{10**5000:,}" raises
            raise ValueError(
                f"{self._fleet_name}: at most {MAX_FLEET_SLICES:,} slices of {spec.name} allowed in a fleet, "
                f"asked for {asked}"
            )
        check_number(f"{self._fleet_name}: add_slices: n", n, integer=True)  # a str, a bool, a negative count
        counts = self._counts.setdefault(spec.name, dict.fromkeys(_STATES, 0))
        free = self._free.setdefault(spec.name, {})
        by_index = self._by_type.setdefault(spec.name, [])
        heap = self._free_heap.setdefault(spec.name, [])
        self._suspect_heap.setdefault(spec.name, [])
        self._qfree.setdefault(spec.name, 0)
        first = sum(counts.values())
        out = []
        for i in range(first, first + n):
            sl = Slice(f"{spec.name}-{i}", spec.name, spec.hosts, i, self._quarantine)
            self._slices[sl.name] = sl
            free[sl] = None
            by_index.append(sl)
            heapq.heappush(heap, i)
            out.append(sl)
        counts["free"] += n
        return out

    def slices(self, tpu_type: str | None = None) -> list[Slice]:
        t = normalize_tpu_type(tpu_type) if tpu_type else None
        return [s for s in self._slices.values() if t is None or s.tpu_type == t]

    def slice(self, name: str) -> Slice:
        try:
            return self._slices[name]
        except KeyError:
            raise KeyError(f"no slice named {name!r}; slices: {', '.join(self._slices) or 'none'}") from None

    def capacity(self) -> dict[str, int]:
        """Slices per type that exist (free, busy, or preempted and coming back)."""
        return {t: n for t, c in self._counts.items() if (n := sum(c.values()) - c["gone"])}

    def count(self, tpu_type: str, state: str | None = None) -> int:
        """Slices of a type in ``state``, or that exist (not gone) when ``state`` is None."""
        c = self._counts.get(get_tpu_spec(tpu_type).name)
        if c is None:
            return 0
        return sum(c.values()) - c["gone"] if state is None else c[state]

    def describe(self, tpu_type: str) -> str:
        """``"1 free, 1 busy, 0 preempted"`` for a type (``", 2 gone"`` when some are gone for good,
        ``", 1 quarantined (v4-16-3)"`` when some are in quarantine)."""
        t = get_tpu_spec(tpu_type).name
        c = self._counts.get(t) or dict.fromkeys(_STATES, 0)
        text = f"{c['free']} free, {c['busy']} busy, {c['down']} preempted"
        text += f", {c['gone']} gone" if c["gone"] else ""
        q = self.quarantined(t)
        return text + (f", {len(q)} quarantined ({', '.join(sl.name for sl in q)})" if q else "")

    def _set_state(self, sl: Slice, state: str) -> None:
        prev = sl.state
        counts = self._counts[sl.tpu_type]
        counts[sl.state] -= 1
        counts[state] += 1
        if sl.state == "free":
            del self._free[sl.tpu_type][sl]
        elif state == "free":
            self._free[sl.tpu_type][sl] = None
        sl.state = state
        if sl.quarantined_until is not None:
            if state == "free" or prev == "free":
                self._qfree[sl.tpu_type] += 1 if state == "free" else -1
        elif state == "free":
            self._push_free(sl)

    def _push_free(self, sl: Slice) -> None:
        heaps = self._suspect_heap if self._quarantine.suspect(sl) else self._free_heap
        heapq.heappush(heaps[sl.tpu_type], sl.index)

    # ----------------------------------------------------------------------------------- acquisition

    def try_acquire(
        self, holder: str, tpu_type: str, counts: Sequence[int], since: float | None = None
    ) -> list[FleetLease] | None:
        """All-or-nothing: leases on the largest count in ``counts`` whose slices are all free now (lowest
        numbered first), or ``None`` when none fits now. Raises ``Unschedulable(permanent=True)`` when no
        count can ever fit (fewer slices exist than the smallest count).

        A fair queue per type: a holder that gets ``None`` waits in line (first come, first served) for as
        long as it keeps asking (an entry not renewed for ``waiter_ttl`` seconds is dropped: a job that
        stopped asking). Free slices are reserved for the holders ahead in line (their largest count
        each: what each of them takes when it fits), so a younger holder gets slices only out of what is
        left after every older one is served (backfill that delays no older waiter). ``since`` (e.g. the
        job's submission time) is when the holder came: it goes ahead of waiters that came later but asked
        first (see ``FairQueue``).

        >>> fleet = Fleet({"v4-16": 2})
        >>> _ = fleet.try_acquire("a", "v4-16", [1])
        >>> fleet.try_acquire("big", "v4-16", [2]) is None      # waits for a's slice
        True
        >>> fleet.try_acquire("small", "v4-16", [1]) is None    # the free slice is held for "big"
        True
        >>> fleet.queue("v4-16")
        ['big', 'small']
        """
        spec = get_tpu_spec(tpu_type)
        wanted = sorted(set(counts), reverse=True)
        if not wanted:
            raise ValueError("Fleet.try_acquire: counts is empty; give at least one slice count")
        if self.on_demand and len(self._free.get(spec.name, ())) < wanted[0]:
            # up to the fleet's limit: beyond it, the job waits for slices as on any fleet
            have = sum(self._counts[spec.name].values()) if spec.name in self._counts else 0
            room = MAX_FLEET_SLICES - have
            if room > 0:
                self.add_slices(spec.name, min(room, wanted[0] - len(self._free.get(spec.name, ()))))
        existing = self.count(spec.name)
        queue = self._queues.get(spec.name)
        if existing < wanted[-1]:
            if queue:
                queue.leave(holder)
            raise self.unschedulable(wanted, spec.name, permanent=True)
        free: Mapping[Slice, None] = self._free.get(spec.name, {})
        avail = len(free)
        if self._quarantine:
            avail -= self._qfree[spec.name]
        if queue is None:
            if avail >= wanted[-1]:  # nobody waits: the common case costs no queue
                c = next(c for c in wanted if avail >= c)
                return self._take_group(spec.name, c, holder)
            queue = self._queues[spec.name] = FairQueue(self._waiter_ttl)
        c = queue.admit(holder, wanted, avail, self.clock.now(), since=since)
        return None if c is None else self._take_group(spec.name, c, holder)

    def _take_group(self, tpu_type: str, c: int, holder: str) -> list[FleetLease]:
        leases = [self._take(sl, holder) for sl in self._pick(tpu_type, c)]
        group = _Group(leases)
        for lease in leases:
            lease.group = group
        return leases

    def acquire(
        self,
        holder: str,
        tpu_type: str,
        counts: Sequence[int],
        deadline: float,
        idle: Callable[[float], None],
        since: float | None = None,
    ) -> list[FleetLease]:
        """:meth:`try_acquire` until it fits, or ``Unschedulable`` (with :meth:`unschedulable`'s diagnosis)
        once the fleet's clock reaches ``deadline``. The one wait-for-capacity loop of every driver:
        ``idle(deadline)`` lets time pass (a driver on a fake clock advances it to its next event, one on
        threads waits on its lock's condition); it may return early, the loop asks again."""
        while True:
            got = self.try_acquire(holder, tpu_type, counts, since)
            if got is not None:
                return got
            if self.clock.now() >= deadline:
                raise self.unschedulable(counts, tpu_type, holder=holder)
            idle(deadline)

    def _pick(self, tpu_type: str, c: int) -> list[Slice]:
        """``c`` free slices that are not quarantined: healthy ones first, then those with a device failure
        on record, lowest numbered first in each. The caller made sure there are enough."""
        by_index = self._by_type[tpu_type]
        chosen: list[Slice] = []
        seen: set[int] = set()
        for heap, suspect in ((self._free_heap[tpu_type], False), (self._suspect_heap[tpu_type], True)):
            while len(chosen) < c and heap:
                i = heapq.heappop(heap)
                sl = by_index[i]
                if (
                    i in seen
                    or sl.state != "free"
                    or sl.quarantined_until is not None
                    or (sl.device_failures is not None) is not suspect
                ):
                    continue  # stale: taken, quarantined, or moved to the other heap
                seen.add(i)
                chosen.append(sl)
        return chosen

    def free_slices(self, tpu_type: str, holder: str | None = None) -> int:
        """Free slices of a type that ``holder`` could take now: not quarantined and not reserved for a
        holder waiting in the queue (for one not in line, every waiter is ahead of it). What an elastic
        job asks while it runs, to know whether it could grow.

        >>> fleet = Fleet({"v4-16": 3})
        >>> _ = fleet.try_acquire("elastic", "v4-16", [1])
        >>> fleet.free_slices("v4-16", "elastic")
        2
        >>> _ = fleet.try_acquire("other", "v4-16", [1])
        >>> fleet.try_acquire("big", "v4-16", [2]) is None       # waits in line, reserving the free slice
        True
        >>> fleet.free_slices("v4-16", "elastic")
        0
        """
        spec = get_tpu_spec(tpu_type)
        avail = len(self._free.get(spec.name, ()))
        if self._quarantine:
            self._lift_expired()
            avail -= self._qfree.get(spec.name, 0)
        queue = self._queues.get(spec.name)
        if queue:
            avail -= queue.reserved_ahead(holder or "", self.clock.now())
        return max(0, avail)

    def queue(self, tpu_type: str) -> list[str]:
        """The holders waiting for slices of a type, oldest first."""
        q = self._queues.get(get_tpu_spec(tpu_type).name)
        return q.members(self.clock.now()) if q is not None else []

    def leave_queue(self, holder: str) -> None:
        """``holder`` stops waiting (e.g. its job was terminated), so it no longer holds younger ones back."""
        for q in self._queues.values():
            q.leave(holder)

    def take(self, slice_name: str, holder: str) -> FleetLease:
        """Acquire one named free slice (e.g. another job occupying it)."""
        sl = self.slice(slice_name)
        if sl.state != "free":
            raise ValueError(f"{slice_name!r} is {sl.state}; only a free slice can be taken")
        return self._take(sl, holder)

    def _take(self, sl: Slice, holder: str) -> FleetLease:
        self._set_state(sl, "busy")
        lease = sl.lease = FleetLease(sl, holder)
        return lease

    def unschedulable(
        self, counts: Sequence[int], tpu_type: str, *, permanent: bool = False, holder: str | None = None
    ) -> Unschedulable:
        """The error for a request that does not fit now (or, ``permanent``, ever), with a diagnosis.

        It tells the runner which case it is: ``held=True`` when enough slices exist but other holders
        have them (the job waits its turn, as long as it takes), else capacity is missing (slices
        preempted and not back); ``reason`` is the job's pending reason (with ``holder``'s place in line).

        >>> fleet = Fleet({"v4-16": 2})
        >>> _ = fleet.try_acquire("train-a", "v4-16", [1])
        >>> e = fleet.unschedulable([2], "v4-16")
        >>> e.held, e.reason
        (True, 'queued for 2 x v4-16; fleet: 1 free, 1 held by train-a')
        >>> fleet.try_acquire("train-b", "v4-16", [2]) is None
        True
        >>> fleet.unschedulable([2], "v4-16", holder="train-b").reason
        'queued: 1st for 2 x v4-16; fleet: 1 free, 1 held by train-a'
        >>> fleet.preempt("v4-16-1", restore_after=60.0)
        >>> e = fleet.unschedulable([2], "v4-16")
        >>> e.held, e.reason
        (False, 'waiting for capacity: 1 of 2 x v4-16 exist (1 preempted, restoring)')
        """
        tpu_type = get_tpu_spec(tpu_type).name
        asked = f"{' or '.join(map(str, counts))} x {tpu_type}"
        if permanent:
            return Unschedulable(
                f"asked: {asked}; fleet has {self.count(tpu_type)} {tpu_type} slice(s) in all "
                f"({self.describe(tpu_type)}), so this can never fit",
                permanent=True,
            )
        message = f"asked: {asked}; fleet has: {self.describe(tpu_type)}"
        need = min(counts)
        c = self._counts.get(tpu_type) or dict.fromkeys(_STATES, 0)
        quarantined = self.quarantined(tpu_type)
        qfree = sum(sl.state == "free" for sl in quarantined)
        queue = self._queues.get(tpu_type)
        missing = [f"{c['down']} preempted, restoring"] if c["down"] else []
        missing += [f"{c['gone']} gone"] if c["gone"] else []
        held, reason = pending_reason(
            tpu_type,
            need,
            up=c["free"] + c["busy"] - qfree,
            free=c["free"] - qfree,
            busy=c["busy"],
            holders=(sl.lease.holder for sl in self._by_type.get(tpu_type, ()) if sl.lease is not None),
            place=queue.place(holder, self.clock.now()) if queue is not None and holder is not None else None,
            quarantined=[self._quarantine.reason(sl, sl.name) for sl in quarantined],
            missing=missing,
        )
        return Unschedulable(message, held=held, reason=reason)

    def release(self, lease: FleetLease) -> bool:
        """Give a slice back; idempotent, and only frees the slice if the lease still holds it. Faults
        armed for the lease's attempt that have not fired are cancelled. True if the slice became free."""
        if lease.released:
            return False
        lease.released = True
        lease.group = None  # (no cycle between a group's leases outlives the attempt)
        if lease._timers:
            for t in lease._timers:
                t.cancel()
            lease._timers = None
        sl = lease.slice
        if sl.lease is lease:
            sl.lease = None
            if sl.draining is not None:  # noticed: it is going away, no one gets it before it has been and come back
                deadline, restore_after = sl.draining
                self._preempt_slice(
                    sl, None if restore_after is None else max(0.0, deadline - self.clock.now()) + restore_after
                )
                return False
            self._set_state(sl, "free")
            return True
        return False

    def lease_state(self, lease: FleetLease) -> str:
        """What the control plane can tell of a held slice now: ``"lost"`` (preempted, and detected:
        ``detection_delay`` after the loss), ``"draining"`` (a preemption notice is pending, see
        ``lease.notice``) or ``"intact"`` (as far as anyone can see: a loss not yet detected is intact).

        >>> from fray_core.testing import FakeClock
        >>> fleet = Fleet({"v4-16": 1}, FakeClock(), detection_delay=15.0)
        >>> [lease] = fleet.try_acquire("job", "v4-16", [1])
        >>> fleet.preempt("v4-16-0")
        >>> lease.lost, fleet.lease_state(lease)
        (True, 'intact')
        >>> fleet.clock.advance(15.0)
        >>> fleet.lease_state(lease)
        'lost'
        """
        if lease.lost:
            return "lost" if self.detected(lease) else "intact"
        return "draining" if lease.notice is not None and not lease.released else "intact"

    def detected(self, lease: FleetLease) -> bool:
        """Whether the loss of a lost lease is known to the runner by now (``detection_delay`` after it)."""
        return lease.lost_at is not None and self.clock.now() >= lease.lost_at + self.detection_delay

    def detected_at(self, lease: FleetLease) -> float | None:
        """When the loss of a lost lease is (or was) detected, on the fleet's clock; ``None`` if not lost."""
        return None if lease.lost_at is None else lease.lost_at + self.detection_delay

    # ---------------------------------------------------------------------------------------- faults

    def preempt(self, slice_name: str, restore_after: float | None = 0.0) -> None:
        """Preempt a slice now: the lease holding it is lost (its ``on_lost`` runs) and the slice is down;
        a fresh incarnation is free after ``restore_after`` seconds (``None``: gone until :meth:`restore`)."""
        restore_after = check_seconds("preempt: restore_after", restore_after)
        self._preempt_slice(self.slice(slice_name), restore_after)

    def _preempt_slice(self, sl: Slice, restore_after: float | None) -> None:
        if sl.state in ("down", "gone"):
            return
        lease = sl.lease
        sl.incarnation += 1
        sl.preemptions += 1
        sl.lease = None
        sl.draining = None
        self._occupied.pop(sl.name, None)
        self._set_state(sl, "gone" if restore_after is None else "down")
        if lease is not None:
            lease.lost = True
            lease.lost_at = self.clock.now()
            if lease.on_lost is not None:
                lease.on_lost(lease)
        if restore_after is not None:
            if restore_after <= 0:
                self._restore(sl, sl.incarnation)
            else:
                self.clock.call_later(restore_after, self._restore, sl, sl.incarnation)

    def _restore(self, sl: Slice, incarnation: int) -> None:
        # only the preemption that scheduled it: a slice restored and preempted again keeps its new timer
        if sl.state == "down" and sl.incarnation == incarnation:
            self._fresh(sl)

    def _fresh(self, sl: Slice) -> None:
        """A fresh VM: no stale device lock (a broken device stays broken until repaired)."""
        if sl.sick:
            for h in [h for h, v in sl.sick.items() if v is HostHealth.DIRTY]:
                del sl.sick[h]
        if self.on_dirt is not None:
            for h in range(sl.hosts):
                self.on_dirt(sl.name, h, False)
        self._set_state(sl, "free")

    def restore(self, slice_name: str) -> None:
        """Bring a down or gone slice back now, as a fresh incarnation."""
        sl = self.slice(slice_name)
        if sl.state in ("down", "gone"):
            self._fresh(sl)

    def remove(self, slice_name: str) -> None:
        """Capacity loss: the slice is preempted and gone until :meth:`restore`."""
        self.preempt(slice_name, restore_after=None)

    def occupy(self, slice_name: str, holder: str = "(another job)") -> None:
        """Another job takes a free slice (it counts as busy) until :meth:`vacate`."""
        sl = self.slice(slice_name)
        if sl.state != "free":
            raise ValueError(f"occupy({slice_name!r}): the slice is {sl.state}, only a free slice can be occupied")
        self._occupied[slice_name] = self.take(slice_name, holder)

    def vacate(self, slice_name: str) -> None:
        """The other job (:meth:`occupy`) gives the slice back."""
        lease = self._occupied.pop(slice_name, None)
        if lease is not None:
            self.release(lease)

    def notify_preemption(self, slice_name: str, grace: float, restore_after: float | None = 0.0) -> float:
        """A preemption notice: the slice is taken away ``grace`` seconds from now (a fresh incarnation back
        ``restore_after`` seconds after that; ``None``: gone). The lease holding it learns of it at once
        (``lease.notice``, its ``on_notice(lease)``: the driver signals the hosts) and reads ``"draining"`` in
        :meth:`lease_state`; what still holds it at the deadline is preempted. Released before then, the
        slice is not handed out again until it has come back. A free slice is taken away at once. Returns the
        deadline on the fleet's clock.

        >>> from fray_core.testing import FakeClock
        >>> fleet = Fleet({"v4-16": 1}, FakeClock())
        >>> [lease] = fleet.try_acquire("job", "v4-16", [1])
        >>> fleet.notify_preemption("v4-16-0", grace=30.0)
        30.0
        >>> fleet.lease_state(lease), lease.notice
        ('draining', 30.0)
        >>> fleet.clock.advance(30.0)
        >>> lease.lost, fleet.slice("v4-16-0").incarnation
        (True, 1)
        """
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0.0 <= grace < float("inf"):
            raise ValueError(f"notify_preemption: grace must be seconds >= 0, got {grace!r}")
        restore_after = check_seconds("notify_preemption: restore_after", restore_after)
        sl = self.slice(slice_name)
        deadline = self.clock.now() + grace
        lease = sl.lease
        if sl.state != "busy" or lease is None:
            if sl.state == "free":
                self._preempt_slice(sl, None if restore_after is None else grace + restore_after)
            return deadline
        if sl.draining is not None and sl.draining[0] <= deadline:
            return sl.draining[0]  # an earlier notice stands
        sl.draining = (deadline, restore_after)
        lease.notice = deadline
        self.clock.call_later(grace, self._notice_due, sl, sl.incarnation, deadline)
        if lease.on_notice is not None:
            lease.on_notice(lease)
        return deadline

    def _notice_due(self, sl: Slice, incarnation: int, deadline: float) -> None:
        if sl.incarnation == incarnation and sl.draining is not None and sl.draining[0] == deadline:
            self._preempt_slice(sl, sl.draining[1])

    def drop_capacity(self, tpu_type: str, to: int, duration: float | None = 1.0) -> list[str]:
        """Only ``to`` slices of ``tpu_type`` stay up; the others (free ones first, then busy ones) are
        preempted and come back after ``duration`` seconds (``None``: never). Returns their names."""
        check_number("drop_capacity: to", to, integer=True)
        duration = check_seconds("drop_capacity: duration", duration)
        up = [s for s in self.slices(tpu_type) if s.state in ("free", "busy")]
        up.sort(key=lambda s: s.state != "free")
        victims = up[: max(0, len(up) - to)]
        for s in victims:
            self.preempt(s.name, restore_after=duration)
        return [s.name for s in victims]

    def _set_health(self, slice_name: str, host: int, health: HostHealth, caller: str = "break_host") -> Slice:
        sl = self.slice(slice_name)
        check_number(f"{caller}: host", host, integer=True)
        if not 0 <= host < sl.hosts:
            raise ValueError(
                f"{caller}: host must be in [0, {sl.hosts}) for {slice_name} ({sl.tpu_type}), got {host!r}"
            )
        if health is HostHealth.HEALTHY:
            if sl.sick:
                sl.sick.pop(host, None)
        else:
            if sl.sick is None:
                sl.sick = {}
            sl.sick[host] = health
        return sl

    def break_host(self, slice_name: str, host: int) -> None:
        """Every process started on this host fails with a device error until :meth:`repair_host`."""
        self._set_health(slice_name, host, HostHealth.BROKEN)

    def repair_host(self, slice_name: str, host: int) -> None:
        """Undo :meth:`break_host` (the host is healthy and clean again): its device failures are forgotten
        and its slice leaves quarantine."""
        sl = self._set_health(slice_name, host, HostHealth.HEALTHY, caller="repair_host")
        until = sl.quarantined_until
        if until is not None:
            self._lift(sl, until)  # back in the suspect heap, if still a suspect
        if self._quarantine.repaired(sl, host) and sl.state == "free":
            self._push_free(sl)  # no failure on record any more: with the healthy ones
        if self.on_dirt is not None:
            self.on_dirt(slice_name, host, False)

    def make_dirty(self, slice_name: str, host: int) -> None:
        """Leave a stale device lock on a host, as a crashed TPU process does."""
        sl = self.slice(slice_name)
        if sl.health(host) is not HostHealth.BROKEN:
            self._set_health(slice_name, host, HostHealth.DIRTY, caller="make_dirty")
        if self.on_dirt is not None:
            self.on_dirt(slice_name, host, True)

    def clean(self, slice_name: str, host: int) -> bool:
        """Remove a stale device lock; True if the host was dirty."""
        sl = self.slice(slice_name)
        dirty = sl.health(host) is HostHealth.DIRTY
        was = dirty or (self.dirt_probe is not None and self.dirt_probe(slice_name, host))
        if dirty:
            self._set_health(slice_name, host, HostHealth.HEALTHY, caller="clean")
        if self.on_dirt is not None:
            self.on_dirt(slice_name, host, False)
        return was

    # ------------------------------------------------------------------------------------ quarantine

    def device_failed(self, slice_name: str, host: int, what: str = "device error") -> bool:
        """A process on this host could not use its device (``what``: ``"device error"``, ``"device
        busy"``). After ``quarantine_after`` of them within ``quarantine_window``, the slice is quarantined
        for ``quarantine_for`` seconds. Returns True if this put the slice in quarantine.

        >>> from fray_core.testing import FakeClock
        >>> fleet = Fleet({"v4-16": 2}, FakeClock())
        >>> fleet.device_failed("v4-16-0", 1)
        False
        >>> fleet.clock.advance(600.0)
        >>> fleet.device_failed("v4-16-0", 1)
        True
        >>> fleet.describe("v4-16"), fleet.slice("v4-16-0").quarantine_note
        ('2 free, 0 busy, 0 preempted, 1 quarantined (v4-16-0)', 'device error twice in 10 min')
        >>> [lease.slice.name for lease in fleet.try_acquire("job", "v4-16", [1])]
        ['v4-16-1']
        """
        sl = self.slice(slice_name)
        q = self._quarantine
        first = not q.suspect(sl)
        until = q.failed(sl, host, self.clock.now(), what)
        if first and sl.state == "free" and sl.quarantined_until is None:
            self._push_free(sl)  # into the suspect heap
        if until is None:
            return False
        if sl.state == "free":
            self._qfree[sl.tpu_type] += 1
        self.clock.call_later(q.duration, self._lift, sl, until)
        return True

    def quarantined(self, tpu_type: str | None = None) -> list[Slice]:
        """The slices in quarantine now (of a type, or all)."""
        if not self._quarantine:
            return []
        self._lift_expired()
        t = get_tpu_spec(tpu_type).name if tpu_type else None
        slices: list[Slice] = self._quarantine.active(self.clock.now())  # type: ignore[assignment]
        return [sl for sl in slices if t is None or sl.tpu_type == t]

    def _lift(self, sl: Slice, until: float) -> None:
        if self._quarantine.lift(sl, until) and sl.state == "free":
            self._qfree[sl.tpu_type] -= 1
            self._push_free(sl)

    def _lift_expired(self) -> None:
        for sl in self._quarantine.due(self.clock.now()):
            self._lift(sl, sl.quarantined_until)  # type: ignore[arg-type]

    def host_health(self, slice_name: str, host: int) -> HostHealth:
        """``HEALTHY``, ``BROKEN`` (:meth:`break_host`) or ``DIRTY`` (:meth:`make_dirty`, or a stale device
        lock the driver's ``dirt_probe`` found)."""
        health = self.slice(slice_name).health(host)
        if health is HostHealth.HEALTHY and self.dirt_probe is not None and self.dirt_probe(slice_name, host):
            return HostHealth.DIRTY
        return health

    # ------------------------------------------------------------------------------------ fault plan

    def arm(self, attempt: int, leases: Sequence[FleetLease]) -> None:
        """Apply the plan's faults for attempt ``attempt`` to its slices (``leases``, in slice order).
        Timed faults are armed on these leases: releasing them cancels what has not fired yet."""
        faults = self.fault_plan.for_attempt(attempt)
        if not faults or not leases:
            return
        owner = leases[0]
        for f in faults:
            if isinstance(f, PreemptSlice):
                if f.slice_index < len(leases):
                    lease = leases[f.slice_index]
                    self._arm(lease, f.after, self._fault_preempt, lease, f.restore_after)
            elif isinstance(f, DropCapacity):
                self._arm(owner, f.after, self._fault_drop, owner, f)
            elif isinstance(f, FailHost):
                if f.slice_index < len(leases):
                    lease = leases[f.slice_index]
                    if lease._host_faults is None:
                        lease._host_faults = {}
                    lease._host_faults[f.host_index] = f
            elif isinstance(f, DirtyHost):
                if f.slice_index < len(leases):
                    self.make_dirty(leases[f.slice_index].slice.name, f.host_index)

    def _arm(self, lease: FleetLease, after: float, fn: Callable[..., None], *args: Any) -> None:
        if after <= 0:
            fn(*args)
            return
        if lease._timers is None:
            lease._timers = []
        lease._timers.append(self.clock.call_later(after, fn, *args))

    def _fault_preempt(self, lease: FleetLease, restore_after: float | None) -> None:
        if lease.live:  # only the incarnation, and the attempt, it was armed for
            self.preempt(lease.slice.name, restore_after=restore_after)

    def _fault_drop(self, owner: FleetLease, f: DropCapacity) -> None:
        if not owner.released:
            self.drop_capacity(f.tpu_type, f.to, f.duration)

    def start_slice(self, lease: FleetLease, attempt: int) -> None:
        """A driver starts the hosts of a slice of attempt ``attempt``: the first slice of an acquisition to
        start arms the plan's faults for that attempt on all of its slices (once per attempt, whichever
        driver asks, however many slices start)."""
        group = lease.group
        if group is not None and not group.armed:
            group.armed = True
            self.arm(attempt, [x for x in group.leases if not x.released])

    def host_fate(self, lease: FleetLease, host: int) -> HostFate:
        """What happens to a process started now on host ``host`` of the lease's slice, decided here and
        applied to the model: a broken device fails it (PREEMPTED, counted towards the host's quarantine); a
        stale device lock is cleaned (``clean_hosts``) or fails it with device busy (PREEMPTED, counted); a
        ``FailHost`` fault fails it (FAILED), a crashing one leaves the host dirty.

        >>> from fray_core.testing import FakeClock
        >>> fleet = Fleet({"v4-16": 1}, FakeClock())
        >>> [lease] = fleet.try_acquire("job", "v4-16", [1])
        >>> fleet.break_host("v4-16-0", 1)
        >>> fleet.host_fate(lease, 1).kind, fleet.host_fate(lease, 0).kind
        ('PREEMPTED', None)
        """
        sl = lease.slice
        fault = lease._host_faults.get(host) if lease._host_faults else None
        health = sl.sick.get(host) if sl.sick else None
        if fault is None and health is None:
            return _HEALTHY_FATE
        cleaned = False
        if health is HostHealth.BROKEN:
            self.device_failed(sl.name, host, "device error")
            return HostFate(
                "PREEMPTED", f"TpuDeviceError: the TPU device of {sl.name} host {host} is broken (device init failed)"
            )
        if health is HostHealth.DIRTY:
            if not self.clean_hosts:
                self.device_failed(sl.name, host, "device busy")
                return HostFate(
                    "PREEMPTED",
                    f"DeviceBusyError: TPU in use: a stale device lock is on {sl.name} host {host} (device "
                    f"init failed)",
                )
            cleaned = self.clean(sl.name, host)
        if fault is None:
            return HostFate(cleaned=cleaned)
        if fault.crash:
            self.make_dirty(sl.name, host)  # a crashed TPU process leaves its lock behind
            return HostFate(
                "FAILED",
                f"HostCrashed: simulated crash on {sl.name} host {host}: {fault.message}",
                crash=True,
                cleaned=cleaned,
            )
        return HostFate("FAILED", f"SimulatedHostFailure: {fault.message}", cleaned=cleaned)

    def chaos(self, seed: int, rate: float, **kw: Any) -> FaultPlan:
        """Install ``FaultPlan.chaos(seed, rate, ...)`` as this fleet's plan and return it."""
        self.fault_plan = FaultPlan.chaos(seed, rate, **kw)
        return self.fault_plan


def simulated_fleet(cluster: object) -> Fleet | None:
    """The fleet model a cluster simulates its TPU slices on (a ``LocalCluster``'s ``fleet.model``), else
    ``None`` (a cluster on real slices): what ``fray doctor``, ``fray launch`` and the dashboard show and check.

    >>> simulated_fleet(object()) is None
    True
    """
    model = getattr(getattr(cluster, "fleet", None), "model", None)
    return model if model is not None and hasattr(model, "slices") else None
