"""A simulated TPU fleet: named slices with hosts, capacity that jobs hold, and faults.

::

    fleet = TpuFleet({"v4-16": 2, "v5litepod-4": 4})
    cluster = LocalCluster(fleet=fleet)
    fleet.preempt("v4-16-0", restore_after=0.5)          # kill that slice's hosts now, back in 0.5 s
    fleet.fault_plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=2.0)])
    fleet.fault_plan = FaultPlan.chaos(seed=7, rate=0.3)  # random preemptions, replayable from the seed

Every host of a slice is a real subprocess started by the local backend; a preemption kills them the way
a real one does (SIGKILL, no cleanup). Each host has a ``libtpu_lockfile`` in the fleet's state dir: a host
process that crashes leaves it behind and the host stays "dirty" (device busy) until cleaned; the local
backend cleans stale lockfiles before starting a host, as the Ray backend does on real TPU VMs.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import attrs

from fray_core.errors import Unschedulable
from fray_core.runner import SliceLease
from fray_core.tpu import get_tpu_spec, normalize_tpu_type

__all__ = [
    "DirtyHost",
    "DropCapacity",
    "FailHost",
    "Fault",
    "FaultPlan",
    "PreemptSlice",
    "SimSlice",
    "TpuFleet",
    "parse_fleet",
]

# ------------------------------------------------------------------------------------------ fault plan


@attrs.frozen
class PreemptSlice:
    """Preempt slice ``slice_index`` of attempt ``attempt`` ``after`` seconds into it."""

    attempt: int
    slice_index: int = 0
    after: float = 0.5
    restore_after: float | None = 0.0


@attrs.frozen
class FailHost:
    """Fail host ``host_index`` of slice ``slice_index`` in attempt ``attempt`` (``crash=True``: the host
    process dies hard and leaves its lockfile, so the host is dirty until cleaned)."""

    attempt: int
    slice_index: int = 0
    host_index: int = 0
    message: str = "injected host failure"
    crash: bool = False


@attrs.frozen
class DropCapacity:
    """When attempt ``attempt`` starts (plus ``after`` s), only ``to`` slices of ``tpu_type`` stay up for
    ``duration`` seconds (the others are preempted and come back after it)."""

    attempt: int
    tpu_type: str
    to: int
    duration: float = 1.0
    after: float = 0.0


@attrs.frozen
class DirtyHost:
    """Before attempt ``attempt`` starts, leave a stale lockfile on host ``host_index`` of slice
    ``slice_index`` (as a crashed process would)."""

    attempt: int
    slice_index: int = 0
    host_index: int = 0


Fault = Union[PreemptSlice, FailHost, DropCapacity, DirtyHost]


@attrs.frozen
class FaultPlan:
    """Faults keyed by attempt index; the local backend applies them to every job on the fleet."""

    faults: tuple[Fault, ...] = attrs.field(default=(), converter=tuple)
    seed: int | None = None

    def for_attempt(self, attempt: int) -> list[Fault]:
        return [f for f in self.faults if f.attempt == attempt]

    @staticmethod
    def chaos(
        seed: int, rate: float, *, attempts: int = 50, max_slices: int = 8, horizon: float = 2.0
    ) -> FaultPlan:
        """Random preemptions: in each of the first ``attempts`` attempts, each slice is preempted with
        probability ``rate`` at a random time within ``horizon`` seconds. The same seed gives the same plan.

        >>> FaultPlan.chaos(seed=1, rate=0.5) == FaultPlan.chaos(seed=1, rate=0.5)
        True
        """
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"FaultPlan.chaos: rate must be in [0, 1], got {rate!r}")
        rng = random.Random(seed)
        faults: list[Fault] = []
        for a in range(attempts):
            for s in range(max_slices):
                if rng.random() < rate:
                    faults.append(PreemptSlice(attempt=a, slice_index=s, after=round(rng.uniform(0, horizon), 3)))
        return FaultPlan(faults, seed=seed)


# ----------------------------------------------------------------------------------------------- fleet


@attrs.define(eq=False)
class SimSlice:
    name: str
    tpu_type: str
    hosts: int
    state: str = "free"  # free | busy | down | gone
    holder: str | None = None
    incarnation: int = 0
    preemptions: int = 0
    # kill callbacks of the host processes running on this slice now
    kills: list[Callable[[], None]] = attrs.field(factory=list)


def parse_fleet(text: str) -> dict[str, int]:
    """``"v4-16:2,v5litepod-4:4"`` -> ``{"v4-16": 2, "v5litepod-4": 4}`` (a missing count means 1)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition(":")
        get_tpu_spec(name)
        try:
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(f"fleet spec {text!r}: count of {name!r} must be an int, got {count!r}") from None
        if n < 1:
            raise ValueError(f"fleet spec {text!r}: count of {name!r} must be >= 1, got {n}")
        out[normalize_tpu_type(name)] = out.get(normalize_tpu_type(name), 0) + n
    return out


class TpuFleet:
    """Slices of TPU types that jobs acquire whole and release; with ``on_demand=True`` (what
    ``LocalCluster()`` uses) slices are created when asked, so any TPU code runs on a laptop.

    >>> fleet = TpuFleet({"v4-16": 2})
    >>> [s.name for s in fleet.slices()]
    ['v4-16-0', 'v4-16-1']
    """

    def __init__(
        self,
        capacity: Mapping[str, int] | None = None,
        *,
        on_demand: bool = False,
        fault_plan: FaultPlan | None = None,
        clean_lockfiles: bool = True,
        state_dir: str | None = None,
    ) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._slices: dict[str, SimSlice] = {}
        self.on_demand = on_demand
        self.fault_plan = fault_plan or FaultPlan()
        self.clean_lockfiles = clean_lockfiles
        self._state_dir = state_dir  # made on first use: most fleets never need one
        self._timers: list[threading.Timer] = []
        for tpu_type, n in (capacity or {}).items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"TpuFleet: count of {tpu_type!r} must be an int >= 1, got {n!r}")
            for _ in range(n):
                self._add_slice(normalize_tpu_type(tpu_type))

    def __repr__(self) -> str:
        return f"TpuFleet({self.capacity()}, on_demand={self.on_demand})"

    @property
    def state_dir(self) -> str:
        """Where the simulated hosts keep their lockfiles."""
        with self._cond:
            if self._state_dir is None:
                self._state_dir = tempfile.mkdtemp(prefix="fray-fleet-")
                # a dir we made is removed by close(), else at exit
                self._state_cleanup = weakref.finalize(self, shutil.rmtree, self._state_dir, True)
            return self._state_dir

    # ------------------------------------------------------------------------------------- inventory

    def _add_slice(self, tpu_type: str) -> SimSlice:
        spec = get_tpu_spec(tpu_type)
        idx = sum(1 for s in self._slices.values() if s.tpu_type == spec.name)
        sl = SimSlice(name=f"{spec.name}-{idx}", tpu_type=spec.name, hosts=spec.hosts)
        self._slices[sl.name] = sl
        return sl

    def slices(self, tpu_type: str | None = None) -> list[SimSlice]:
        with self._cond:
            t = normalize_tpu_type(tpu_type) if tpu_type else None
            return [s for s in self._slices.values() if t is None or s.tpu_type == t]

    def slice(self, name: str) -> SimSlice:
        with self._cond:
            try:
                return self._slices[name]
            except KeyError:
                raise KeyError(f"no slice named {name!r}; slices: {', '.join(self._slices) or 'none'}") from None

    def capacity(self) -> dict[str, int]:
        """Slices per type that exist (free, busy or coming back)."""
        with self._cond:
            out: dict[str, int] = {}
            for s in self._slices.values():
                if s.state != "gone":
                    out[s.tpu_type] = out.get(s.tpu_type, 0) + 1
            return out

    def describe(self, tpu_type: str) -> str:
        """``"1 free, 1 busy, 0 preempted"`` for a type."""
        with self._cond:
            states = [s.state for s in self._slices.values() if s.tpu_type == tpu_type]
            return (
                f"{states.count('free')} free, {states.count('busy')} busy, "
                f"{states.count('down')} preempted" + (f", {states.count('gone')} gone" if "gone" in states else "")
            )

    def host_dir(self, slice_name: str, host: int) -> str:
        d = os.path.join(self.state_dir, slice_name, f"host{host}")
        os.makedirs(d, exist_ok=True)
        return d

    def lockfile(self, slice_name: str, host: int) -> str:
        return os.path.join(self.host_dir(slice_name, host), "libtpu_lockfile")

    def is_dirty(self, slice_name: str, host: int) -> bool:
        return os.path.exists(self.lockfile(slice_name, host))

    def make_dirty(self, slice_name: str, host: int) -> None:
        """Leave a stale lockfile on a host, as a crashed TPU process does."""
        with open(self.lockfile(slice_name, host), "w") as f:
            f.write("stale")

    def clean(self, slice_name: str, host: int) -> bool:
        """Remove a stale lockfile; True if there was one."""
        try:
            os.remove(self.lockfile(slice_name, host))
            return True
        except FileNotFoundError:
            return False

    # ----------------------------------------------------------------------------------- acquisition

    def acquire(
        self,
        job_id: str,
        tpu_type: str,
        counts: Sequence[int],
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> list[SliceLease]:
        """All-or-nothing: the largest count in ``counts`` whose slices are all free, or ``Unschedulable``."""
        spec = get_tpu_spec(tpu_type)
        counts = sorted(set(counts), reverse=True)
        with self._cond:
            while True:
                if self.on_demand:
                    while len([s for s in self.slices(spec.name) if s.state == "free"]) < counts[0]:
                        self._add_slice(spec.name)
                existing = self.capacity().get(spec.name, 0)
                if existing < counts[-1]:
                    raise Unschedulable(
                        f"asked: {self._asked(counts, spec.name)}; fleet has {existing} {spec.name} slice(s) "
                        f"in all ({self.describe(spec.name)}), so this can never fit",
                        permanent=True,
                    )
                free = [s for s in self._slices.values() if s.tpu_type == spec.name and s.state == "free"]
                for c in counts:
                    if len(free) >= c:
                        leases = []
                        for s in free[:c]:
                            s.state, s.holder = "busy", job_id
                            leases.append(
                                SliceLease(
                                    name=s.name,
                                    device_type=s.tpu_type,
                                    hosts=s.hosts,
                                    host_addresses=("127.0.0.1",) * s.hosts,
                                    handle=(s, s.incarnation),
                                )
                            )
                        return leases
                remaining = deadline - clock()
                if remaining <= 0:
                    raise Unschedulable(
                        f"asked: {self._asked(counts, spec.name)}; fleet has: {self.describe(spec.name)}"
                    )
                self._cond.wait(min(remaining, 0.5))

    @staticmethod
    def _asked(counts: Sequence[int], tpu_type: str) -> str:
        return f"{' or '.join(map(str, counts))} x {tpu_type}"

    def release(self, lease: SliceLease) -> None:
        """Give a slice back; idempotent, and a no-op for a slice preempted while held."""
        sl, incarnation = lease.handle
        with self._cond:
            if sl.incarnation == incarnation and sl.state == "busy":
                sl.state, sl.holder = "free", None
                sl.kills.clear()
                self._cond.notify_all()

    def was_preempted(self, lease: SliceLease) -> bool:
        sl, incarnation = lease.handle
        return sl.incarnation != incarnation

    def register_kill(self, lease: SliceLease, kill: Callable[[], None]) -> bool:
        """Attach a host process's kill to its slice; False if the slice was preempted meanwhile."""
        sl, incarnation = lease.handle
        with self._cond:
            if sl.incarnation != incarnation:
                return False
            sl.kills.append(kill)
            return True

    # ---------------------------------------------------------------------------------------- faults

    def preempt(self, slice_name: str, restore_after: float | None = 0.0) -> None:
        """Preempt a slice now: its host processes are killed and it is down; a fresh incarnation of it
        comes back after ``restore_after`` seconds (``None``: gone for good)."""
        with self._cond:
            sl = self.slice(slice_name)
            if sl.state in ("down", "gone"):
                return
            sl.incarnation += 1
            sl.preemptions += 1
            sl.state, sl.holder = ("gone" if restore_after is None else "down"), None
            kills, sl.kills = sl.kills, []
            self._cond.notify_all()
        for kill in kills:
            kill()
        if restore_after is not None:
            self._later(restore_after, lambda: self._restore(sl))

    def _restore(self, sl: SimSlice) -> None:
        with self._cond:
            if sl.state == "down":
                sl.state = "free"
                for h in range(sl.hosts):  # a fresh VM: no stale lockfile
                    self.clean(sl.name, h)
                self._cond.notify_all()

    def drop_capacity(self, tpu_type: str, to: int, duration: float | None = 1.0) -> list[str]:
        """Only ``to`` slices of ``tpu_type`` stay up; the others (free ones first, then busy ones) are
        preempted and come back after ``duration`` seconds (``None``: never). Returns their names."""
        with self._cond:
            up = [s for s in self.slices(tpu_type) if s.state in ("free", "busy")]
            up.sort(key=lambda s: s.state != "free")
            victims = up[: max(0, len(up) - to)]
        for s in victims:
            self.preempt(s.name, restore_after=duration)
        return [s.name for s in victims]

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        if delay <= 0:
            fn()
            return
        t = threading.Timer(delay, fn)
        t.daemon = True
        self._timers.append(t)
        t.start()

    def apply_plan(self, attempt: int, leases: Sequence[SliceLease]) -> dict[tuple[int, int], dict[str, str]]:
        """Apply this attempt's faults to the slices it holds; returns extra env per (slice, host)."""
        extra: dict[tuple[int, int], dict[str, str]] = {}
        for f in self.fault_plan.for_attempt(attempt):
            if isinstance(f, PreemptSlice) and f.slice_index < len(leases):
                lease = leases[f.slice_index]
                self._later(f.after, lambda lease=lease, f=f: self._preempt_lease(lease, f.restore_after))
            elif isinstance(f, FailHost) and f.slice_index < len(leases):
                key = "FRAY_SIM_CRASH" if f.crash else "FRAY_SIM_FAIL"
                extra.setdefault((f.slice_index, f.host_index), {})[key] = f.message
            elif isinstance(f, DropCapacity):
                self._later(f.after, lambda f=f: self.drop_capacity(f.tpu_type, f.to, f.duration))
            elif isinstance(f, DirtyHost) and f.slice_index < len(leases):
                self.make_dirty(leases[f.slice_index].name, f.host_index)
        return extra

    def _preempt_lease(self, lease: SliceLease, restore_after: float | None) -> None:
        sl, incarnation = lease.handle
        if sl.incarnation == incarnation:  # only the incarnation this attempt held
            self.preempt(sl.name, restore_after=restore_after)

    def chaos(self, seed: int, rate: float, **kw: Any) -> FaultPlan:
        """Install ``FaultPlan.chaos(seed, rate, ...)`` as this fleet's plan and return it."""
        self.fault_plan = FaultPlan.chaos(seed, rate, **kw)
        return self.fault_plan

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
        cleanup = getattr(self, "_state_cleanup", None)
        if cleanup is not None:  # only a dir we made ourselves
            cleanup()
            with self._cond:
                self._state_dir = self._state_cleanup = None

