"""The simulated TPU fleet of the local backend: :class:`fray_core.fleet.Fleet` driven in real time.

::

    fleet = TpuFleet({"v4-16": 2, "v5litepod-4": 4})
    cluster = LocalCluster(fleet=fleet)
    fleet.model.preempt("v4-16-0", restore_after=0.5)     # kill that slice's hosts now, back in 0.5 s
    fleet.model.break_host("v4-16-1", 0)                  # every process on that host: device error
    fleet.model.fault_plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=2.0)])
    fleet.model.chaos(seed=7, rate=0.3)                   # random preemptions, replayable from the seed

The fleet's behaviour (slices, incarnations, capacity, leases, host health, fault plans) is the one model in
``fray_core.fleet``, and ``TpuFleet.model`` is that model (under the fleet's lock); this module adds what real
processes need: a lock and timer threads, waiting for capacity, and a device lockfile per host. Every host of
a slice is a real subprocess started by the local backend; a preemption kills them the way a real one does
(SIGKILL, no cleanup). Each host has a ``libtpu_lockfile`` in the fleet's state dir: a host process that
crashes leaves it behind and the host stays "dirty" (device busy) until cleaned; the local backend cleans
stale lockfiles before starting a host, as the Ray backend does on real TPU VMs.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from fray_core._scratch import scratch_dir

# the fault vocabulary is the model's; importable from here (and from fray_local) as before
from fray_core.fleet import (  # noqa: F401
    DirtyHost,
    DropCapacity,
    FailHost,
    Fault,
    FaultPlan,
    Fleet,
    FleetLease,
    HostFate,
    HostHealth,
    PreemptSlice,
    Slice,
)
from fray_core.limits import MAX_FLEET_SLICES, check_flag, check_path, show_text
from fray_core.runner import SliceLease
from fray_core.tpu import get_tpu_spec

__all__ = ["SimSlice", "TpuFleet", "parse_fleet"]

#: a slice of the fleet (``name``, ``tpu_type``, ``hosts``, ``state``, ``holder``, ``incarnation``, ``preemptions``)
SimSlice = Slice


class _ThreadClock:
    """Real time for the model: timers on threads that take the fleet's lock and wake its waiters."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._timers: list[threading.Timer] = []

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> threading.Timer:
        t = threading.Timer(max(0.0, delay), self._fire, (fn, args))
        t.daemon = True
        with self._cond:
            self._timers = [x for x in self._timers if x.is_alive()]
            self._timers.append(t)
            t.start()
        return t

    def _fire(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with self._cond:
            fn(*args)
            self._cond.notify_all()

    def close(self) -> None:
        """Cancel the pending timers (the fleet stays usable: later ones run as before)."""
        with self._cond:
            timers, self._timers = self._timers, []
        for t in timers:
            t.cancel()


def parse_fleet(text: str) -> dict[str, int]:
    """``"v4-16:2,v5litepod-4:4"`` -> ``{"v4-16": 2, "v5litepod-4": 4}`` (a missing count means 1)."""
    out: dict[str, int] = {}
    shown = show_text(text)  # a spec of 5,000 characters is named, not repeated
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition(":")
        try:
            spec = get_tpu_spec(name)
        except ValueError as e:  # the catalog's message (nearest types), and which spec it is in
            raise ValueError(f"fleet spec {shown}: {e}") from None
        digits = count.strip() or "1"
        # ASCII digits only: int() also reads '²' and '-1', and raises its own message past 4,300 digits
        if not (digits.isascii() and digits.isdigit()):
            raise ValueError(
                f"fleet spec {shown}: count of {name.strip()!r} must be an int >= 1, got {show_text(count)}"
            )
        if len(digits.lstrip("0")) > 30:
            raise ValueError(
                f"fleet spec {shown}: at most {MAX_FLEET_SLICES:,} slices of a type allowed, got a count of "
                f"{len(digits):,} digits"
            )
        n = int(digits)
        if n < 1:
            raise ValueError(f"fleet spec {shown}: count of {name.strip()!r} must be >= 1, got {n}")
        if n > MAX_FLEET_SLICES:  # checked before any slice is made: 10**8 of them would take minutes
            raise ValueError(f"fleet spec {shown}: at most {MAX_FLEET_SLICES:,} slices of a type allowed, got {n:,}")
        out[spec.name] = out.get(spec.name, 0) + n
    return out


class _Locked:
    """The fleet's model behind the fleet's lock: what the model is, with every call made holding the lock
    (timer threads and the jobs' providers use the model too) and waking whoever waits for capacity after it."""

    __slots__ = ("_cond", "_model")

    def __init__(self, model: Fleet, cond: threading.Condition) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_cond", cond)

    def __getattr__(self, name: str) -> Any:
        with self._cond:
            value = getattr(self._model, name)
        if not callable(value) or isinstance(value, type):
            return value
        cond = self._cond

        @functools.wraps(value)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with cond:
                try:
                    return value(*args, **kwargs)
                finally:
                    cond.notify_all()  # a change may free capacity: the jobs waiting for it look again

        return locked

    def __setattr__(self, name: str, value: Any) -> None:
        with self._cond:
            setattr(self._model, name, value)
            self._cond.notify_all()

    def __dir__(self) -> list[str]:
        return dir(self._model)

    def __repr__(self) -> str:
        return repr(self._model)


class TpuFleet:
    """Slices of TPU types that jobs acquire whole and release; with ``on_demand=True`` (what
    ``LocalCluster()`` uses) slices are created when asked, so any TPU code runs on a laptop.

    The fleet is its model, :attr:`model` (a :class:`fray_core.fleet.Fleet`: inventory, capacity, the fault
    vocabulary, the fault plan, host health, quarantine), safe to use from any thread. This class adds only
    what real processes need: real time (timer threads), waiting for capacity, a device lockfile per host
    (:attr:`state_dir`) and the process-backed provider's side (:meth:`acquire`, :meth:`host_env`, ...).

    >>> fleet = TpuFleet({"v4-16": 2})
    >>> [s.name for s in fleet.model.slices()]
    ['v4-16-0', 'v4-16-1']
    >>> fleet.model.break_host("v4-16-1", 0); fleet.model.host_health("v4-16-1", 0).value
    'broken'
    """

    def __init__(
        self,
        capacity: Mapping[str, int] | None = None,
        *,
        on_demand: bool = False,
        fault_plan: FaultPlan | None = None,
        clean_lockfiles: bool = True,
        state_dir: str | None = None,
        quarantine_after: int = 2,
        quarantine_window: float = 3600.0,
        quarantine_for: float = 1800.0,
        detection_delay: float = 0.0,
    ) -> None:
        # checked here, naming the argument: the model checks its own (capacity, on_demand, fault_plan, ...);
        # a state dir of the wrong kind failed only at the first host start, inside a job
        check_flag("TpuFleet: clean_lockfiles", clean_lockfiles)
        state_dir = check_path("TpuFleet: state_dir", state_dir)
        if state_dir is not None and os.path.exists(state_dir) and not os.path.isdir(state_dir):
            raise ValueError(f"TpuFleet: state_dir: expected a directory (made if missing), got the file {state_dir!r}")
        self._cond = threading.Condition(threading.RLock())
        self._clock = _ThreadClock(self._cond)
        self.clean_lockfiles = clean_lockfiles
        self._state_dir = state_dir  # made on first use: most fleets never need one
        self._model = Fleet(
            capacity,
            self._clock,
            on_demand=on_demand,
            fault_plan=fault_plan,
            on_dirt=self._on_dirt,
            dirt_probe=self._dirt_probe,
            name="TpuFleet",
            quarantine_after=quarantine_after,
            quarantine_window=quarantine_window,
            quarantine_for=quarantine_for,
            detection_delay=detection_delay,
            clean_hosts=clean_lockfiles,
        )
        self._locked = _Locked(self._model, self._cond)

    @property
    def model(self) -> Fleet:
        """The fleet: ``fleet.model.preempt("v4-16-0")``, ``fleet.model.fault_plan = FaultPlan(...)``,
        ``fleet.model.describe("v4-16")``... (:class:`fray_core.fleet.Fleet`), each call under the fleet's lock.
        Its clock is ``time.monotonic``: instants it returns (``notify_preemption``'s deadline) are on it."""
        return cast(Fleet, self._locked)

    def __repr__(self) -> str:
        return f"TpuFleet({self.model.capacity()}, on_demand={self.model.on_demand})"

    def __getattr__(self, name: str) -> Any:
        # fleet.preempt(...) etc. as before the model was exposed: still works, says where it went
        model = self.__dict__.get("_model")
        if model is not None and not name.startswith("_") and (hasattr(Fleet, name) or name in vars(model)):
            warnings.warn(f"TpuFleet.{name} is the model's: use fleet.model.{name}", DeprecationWarning, stacklevel=2)
            return getattr(self.model, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("fault_plan", "on_demand"):  # settings of the model, as before it was exposed
            warnings.warn(f"TpuFleet.{name} is the model's: set fleet.model.{name}", DeprecationWarning, stacklevel=2)
            setattr(self.model, name, value)
            return
        object.__setattr__(self, name, value)

    @property
    def state_dir(self) -> str:
        """Where the simulated hosts keep their lockfiles."""
        with self._cond:
            if self._state_dir is None:
                self._state_dir = scratch_dir("fray-fleet-")
                # a dir we made is removed by close(), else at exit
                self._state_cleanup = weakref.finalize(self, shutil.rmtree, self._state_dir, True)
            return self._state_dir

    # --------------------------------------------------------------------------------- device locks

    def host_dir(self, slice_name: str, host: int) -> str:
        d = os.path.join(self.state_dir, slice_name, f"host{host}")
        os.makedirs(d, exist_ok=True)
        return d

    def lockfile(self, slice_name: str, host: int) -> str:
        return os.path.join(self.host_dir(slice_name, host), "libtpu_lockfile")

    def is_dirty(self, slice_name: str, host: int) -> bool:
        """Whether the host's lockfile is there (a process holds the device, or died hard and left it)."""
        return os.path.exists(self.lockfile(slice_name, host))

    def _dirt_probe(self, slice_name: str, host: int) -> bool:
        # the model asks (host_health, clean): a crashed process left its lockfile
        return self._state_dir is not None and self.is_dirty(slice_name, host)

    def _on_dirt(self, slice_name: str, host: int, dirty: bool) -> None:
        # the lockfile is the device lock the host processes see (a crashed process leaves it too)
        if dirty:
            with open(self.lockfile(slice_name, host), "w") as f:
                f.write("stale")
        elif self._state_dir is not None:
            try:
                os.remove(self.lockfile(slice_name, host))
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ the process-backed provider's side

    def acquire(
        self,
        job_id: str,
        tpu_type: str,
        counts: Sequence[int],
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
        since: float | None = None,
    ) -> list[SliceLease]:
        """All-or-nothing: the largest count in ``counts`` whose slices are all free (and not reserved for
        a job ahead in the fleet's queue), or ``Unschedulable`` at ``deadline`` (``held=True`` when other
        jobs hold the capacity: the job keeps its place in line while it keeps asking). ``since``: when
        the job was submitted, its place in line (jobs' runners ask in no particular order)."""
        spec = get_tpu_spec(tpu_type)
        wanted = sorted(set(counts), reverse=True)
        # the model's clock is time.monotonic; a caller on another clock gets its deadline translated
        deadline = self._clock.now() + (deadline - clock())

        def idle(until: float) -> None:  # woken by every change of the fleet (its timers and faults notify)
            self._cond.wait(max(0.0, min(until - self._clock.now(), 0.5)))

        with self._cond:
            got = self._model.acquire(job_id, spec.name, wanted, deadline, idle, since)
            return [
                SliceLease(
                    name=lease.slice.name,
                    device_type=lease.slice.tpu_type,
                    hosts=lease.slice.hosts,
                    host_addresses=("127.0.0.1",) * lease.slice.hosts,
                    handle=lease,
                )
                for lease in got
            ]

    def release(self, lease: SliceLease) -> None:
        """Give a slice back; idempotent, and a no-op for a slice preempted while held. Faults armed for
        the attempt that held it and not fired yet are cancelled."""
        with self._cond:
            if self._model.release(lease.handle):
                self._cond.notify_all()

    def was_preempted(self, lease: SliceLease) -> bool:
        """Whether the slice was preempted while the lease held it, as far as the control plane has
        detected (``detection_delay`` after the loss)."""
        fl: FleetLease = lease.handle
        with self._cond:
            return self._model.detected(fl) if fl.lost else fl.slice.incarnation != fl.incarnation

    def detected_at(self, lease: SliceLease) -> float | None:
        """When (``time.monotonic``) the loss of a lost slice is detected; ``None`` when it was not lost."""
        with self._cond:
            return self._model.detected_at(lease.handle)

    def lease_state(self, lease: SliceLease) -> tuple[str, float | None]:
        """``("lost" | "draining" | "intact", deadline)``: the model's :meth:`~fray_core.fleet.Fleet.lease_state`
        and, when draining, the notice's deadline in epoch seconds."""
        with self._cond:
            fl: FleetLease = lease.handle
            state = self._model.lease_state(fl)
            if state == "draining" and fl.notice is not None:
                return state, time.time() + (fl.notice - self._clock.now())
            return state, None

    def device_fault(self, lease: SliceLease, host: int, what: str) -> None:
        """A host process failed with a known device fault (``fray_core.signatures``): counted towards the
        host's quarantine, and its lockfile removed (the next process on it starts clean)."""
        with self._cond:
            self._model.device_failed(lease.name, host, what)
            self._model.clean(lease.name, host)

    def register_kill(self, lease: SliceLease, kill: Callable[[], None]) -> bool:
        """Attach a host process's kill to its slice; False if the slice was preempted meanwhile."""
        fl: FleetLease = lease.handle
        with self._cond:
            if not fl.live:
                return False
            if fl.driver is None:
                fl.driver = []
                fl.on_lost = _kill_all
            fl.driver.append(kill)
            return True

    def start_slice(self, lease: SliceLease, attempt: int) -> None:
        """The hosts of a slice of attempt ``attempt`` start: the model arms that attempt's faults, once."""
        with self._cond:
            self._model.start_slice(lease.handle, attempt)
            self._cond.notify_all()

    def host_env(self, lease: SliceLease, host: int) -> tuple[dict[str, str], str | None]:
        """The simulated-TPU env of a process starting now on a host of the lease (the fate the model
        decided for it), and a log note (the stale lockfile removed before start)."""
        with self._cond:
            lockfile = self.lockfile(lease.name, host)
            if self.is_dirty(lease.name, host) and self._model.slice(lease.name).health(host) is HostHealth.HEALTHY:
                self._model.make_dirty(lease.name, host)  # a process that died hard left its lockfile: the model learns
            fate = self._model.host_fate(lease.handle, host)
            note = f"[fray] removed stale {lockfile} before start" if fate.cleaned else None
            return {"FRAY_SIM_LOCKFILE": lockfile, **_fate_env(fate)}, note

    def close(self) -> None:
        """Cancel pending timers (restores and armed faults) and remove the state dir this fleet made."""
        self._clock.close()
        cleanup = self.__dict__.get("_state_cleanup")
        if cleanup is not None:  # only a dir we made ourselves
            cleanup()
            with self._cond:
                self._state_dir = self._state_cleanup = None


def _fate_env(fate: HostFate) -> dict[str, str]:
    """How the simulated host process (``fray_local._host``) meets the fate the model decided for it: it
    ends with that error (a device error: the infrastructure's; else the user's), or dies hard."""
    if fate.kind is None:
        return {}
    if fate.kind == "PREEMPTED":
        return {"FRAY_SIM_DEVICE_ERROR": fate.error or "TpuDeviceError"}
    return {"FRAY_SIM_CRASH" if fate.crash else "FRAY_SIM_FAIL": fate.error or "injected failure"}


def _kill_all(lease: FleetLease) -> None:
    kills, lease.driver = lease.driver, []
    for kill in kills:
        kill()
