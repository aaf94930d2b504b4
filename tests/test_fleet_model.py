"""The fleet model (``fray_core.fleet.Fleet``), property-tested once on a fake clock.

Both simulated fleets drive this one model: ``InMemorySliceProvider`` (fake clock) and ``fray_local.TpuFleet``
(real time, a process per host). Hypothesis drives random operations (acquire, release, preempt, restore,
capacity drops, fault plans armed for attempts, broken/dirty/repaired hosts, time passing) at random
instants; after every step the bookkeeping must be consistent, acquisition all-or-nothing and lowest-numbered
first, a preempted slice back exactly when due, and every planned fault must land on exactly the lease
(job, attempt) it was armed for, at the planned instant, and never after that lease was released. The same
operations replay the same history. Hypothesis prints the failing example (and its seed) when one fails.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fray_core.errors import Unschedulable
from fray_core.fleet import FailHost, FaultPlan, Fleet, FleetLease, HostHealth, PreemptSlice
from fray_core.runner import GangRunner, RetryPolicy
from fray_core.testing import FakeClock, HostScript, InMemorySliceProvider
from fray_core.types import Entrypoint, JobRequest, ResourceConfig

TYPES = {"v4-16": 3, "v4-8": 2}  # 2 hosts and 1 host per slice
NAMES = [f"{t}-{i}" for t, n in TYPES.items() for i in range(n)]
RESTORE = st.sampled_from([0.0, 1.5, 4.0, None])

ACQUIRE = st.tuples(
    st.just("acquire"), st.sampled_from(list(TYPES)), st.lists(st.integers(1, 4), min_size=1, max_size=3)
)
RELEASE = st.tuples(st.just("release"), st.integers(0, 50))
ARM = st.tuples(
    st.just("arm"),
    st.integers(0, 2),
    st.lists(
        st.tuples(st.integers(0, 2), st.floats(0.0, 6.0).map(lambda x: round(x, 2)), RESTORE), min_size=1, max_size=3
    ),
)
op = st.one_of(
    ACQUIRE,
    ACQUIRE,
    RELEASE,
    RELEASE,
    ARM,
    ARM,
    st.tuples(st.just("preempt"), st.sampled_from(NAMES), RESTORE),
    st.tuples(st.just("restore"), st.sampled_from(NAMES)),
    st.tuples(st.just("drop"), st.sampled_from(list(TYPES)), st.integers(0, 3), RESTORE),
    st.tuples(
        st.just("health"),
        st.sampled_from(NAMES),
        st.integers(0, 1),
        st.sampled_from(["break", "repair", "dirty", "clean"]),
    ),
    st.tuples(st.just("advance"), st.floats(0.0, 5.0).map(lambda x: round(x, 2))),
)


class Probe:
    """Drives a Fleet with operations and checks it against what a user of the model relies on."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(TYPES, self.clock)
        self.leases: list[FleetLease] = []  # every lease ever acquired, in order
        self.history: list[tuple[Any, ...]] = []  # what happened, to compare replays
        self.lost_at: dict[FleetLease, float] = {}
        self.released_at: dict[FleetLease, float] = {}
        self.armed: set[tuple[FleetLease, float]] = set()  # (lease, when its planned preemption is due)
        self.attempt = 0
        self.passing = False  # time is passing (only timers act): every loss must be a planned fault

    def _lost(self, lease: FleetLease) -> None:
        now = self.clock.now()
        if self.passing:
            assert (lease, now) in self.armed, f"{lease} lost at {now} by a fault not armed on it for then"
        self.lost_at[lease] = now
        self.history.append(("lost", lease.slice.name, lease.incarnation, self.clock.now()))

    def step(self, o: tuple[Any, ...]) -> None:
        fleet, kind = self.fleet, o[0]
        if kind == "acquire":
            _, tpu, counts = o
            free = sorted((s for s in fleet.slices(tpu) if s.state == "free"), key=lambda s: s.index)
            exist = fleet.count(tpu)
            try:
                got = fleet.try_acquire(f"job-{len(self.leases)}", tpu, counts)
            except Unschedulable as e:
                assert e.permanent and exist < min(counts) and "can never fit" in str(e)
                self.history.append(("never", tpu, tuple(counts)))
                return
            assert exist >= min(counts)
            fits = [c for c in counts if c <= len(free)]
            if not fits:
                assert got is None
                # it now waits in line, holding younger holders back (tests/test_scheduling.py is about
                # that); here each acquire is a one-off, so it gives up its place
                assert f"job-{len(self.leases)}" in fleet.queue(tpu)
                fleet.leave_queue(f"job-{len(self.leases)}")
                return
            assert (
                got is not None and [lease.slice for lease in got] == free[: max(fits)]
            )  # all or nothing, lowest first
            for lease in got:
                lease.on_lost = self._lost
            self.leases.extend(got)
            self.history.append(("acquired", tuple(lease.slice.name for lease in got)))
        elif kind == "release" and self.leases:
            lease = self.leases[o[1] % len(self.leases)]
            if not lease.released:
                self.released_at[lease] = self.clock.now()
            fleet.release(lease)
            assert lease.released and lease.slice.lease is not lease
        elif kind == "preempt":
            fleet.preempt(o[1], o[2])
        elif kind == "restore":
            fleet.restore(o[1])
            assert fleet.slice(o[1]).state in ("free", "busy")
        elif kind == "drop":
            fleet.drop_capacity(o[1], o[2], o[3])
            if o[3] != 0.0:  # (restore_after=0: back at once)
                assert fleet.count(o[1], "free") + fleet.count(o[1], "busy") <= o[2]
        elif kind == "arm":
            # the last acquired group is attempt `self.attempt`; its plan preempts some of its slices later
            live = [lease for lease in self.leases if lease.live]
            if not live:
                return
            group = [lease for lease in live if lease.holder == live[-1].holder]
            faults = [
                PreemptSlice(attempt=self.attempt, slice_index=s, after=after, restore_after=r) for s, after, r in o[2]
            ]
            fleet.fault_plan = FaultPlan(faults)
            now = self.clock.now()
            for f in faults:
                if f.slice_index < len(group) and f.after > 0:
                    self.armed.add((group[f.slice_index], now + f.after))
            fleet.arm(self.attempt, group)
            self.attempt += 1
        elif kind == "health":
            _, name, host, what = o
            sl = fleet.slice(name)
            host = min(host, sl.hosts - 1)
            was = fleet.host_health(name, host)
            if what == "break":
                fleet.break_host(name, host)
                assert fleet.host_health(name, host) is HostHealth.BROKEN
            elif what == "repair":
                fleet.repair_host(name, host)
                assert fleet.host_health(name, host) is HostHealth.HEALTHY
            elif what == "dirty":
                fleet.make_dirty(name, host)
                assert fleet.host_health(name, host) is (
                    HostHealth.BROKEN if was is HostHealth.BROKEN else HostHealth.DIRTY
                )
            else:
                assert fleet.clean(name, host) == (was is HostHealth.DIRTY)
        elif kind == "advance":
            # one timer instant at a time: a slice preempted while time passes is one a planned fault
            # armed on its live lease for this instant
            target = self.clock.now() + o[1]
            self.passing = True
            while (due := self.clock.next_due()) is not None and due <= target:
                before = {sl.name: (sl.preemptions, sl.lease) for sl in fleet.slices()}
                self.clock.advance_to(due)
                for sl in fleet.slices():
                    n, held = before[sl.name]
                    if sl.preemptions != n:
                        assert held is not None and (held, due) in self.armed, (
                            f"{sl.name} preempted at {due} by no fault of its holder"
                        )
            self.passing = False
            self.clock.advance_to(target)
        self.check()

    def check(self) -> None:
        fleet, now = self.fleet, self.clock.now()
        for tpu in TYPES:
            slices = fleet.slices(tpu)
            for state in ("free", "busy", "down"):
                assert fleet.count(tpu, state) == sum(s.state == state for s in slices), (tpu, state)
            assert fleet.count(tpu) == sum(s.state != "gone" for s in slices)
            desc = fleet.describe(tpu)
            assert desc.startswith(f"{fleet.count(tpu, 'free')} free, {fleet.count(tpu, 'busy')} busy")
        for sl in fleet.slices():
            # a busy slice is held by exactly one live lease, of its current incarnation; no other state is held
            if sl.state == "busy":
                assert sl.lease is not None and sl.lease.live and sl.lease.incarnation == sl.incarnation, sl
            else:
                assert sl.lease is None, sl
        live = [lease for lease in self.leases if lease.live]
        assert len({lease.slice.name for lease in live}) == len(live), "a slice held twice"
        for lease in live:
            assert lease.slice.lease is lease
        for lease, t in self.lost_at.items():
            # lost only while held: never after its release
            assert lease not in self.released_at or self.released_at[lease] >= t, lease
        for lease, when in self.armed:
            # a planned preemption lands on the lease it was armed for, at the planned instant, if that
            # lease still holds the slice then; a lease released (or lost) before never feels it
            if when > now:
                continue
            released = self.released_at.get(lease)
            lost = self.lost_at.get(lease)
            if released is not None and released < when:
                assert lost is None or lost <= released, (lease, when, lost, released)
            elif lost is None:
                raise AssertionError(f"{lease} was still held at {when}, when its planned preemption was due")
            else:
                assert lost <= when, (lease, when, lost)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=40))
def test_the_fleet_model_keeps_its_books_and_faults_land_only_on_their_attempt(ops: list[tuple[Any, ...]]) -> None:
    first, second = Probe(), Probe()
    for o in ops:
        first.step(o)
    first.step(("advance", 50.0))
    for o in ops:
        second.step(o)
    second.step(("advance", 50.0))
    assert first.history == second.history  # the same operations replay the same history
    # a preempted slice is back after its restore time (at most 4 s here): nothing is down 50 s on
    for sl in first.fleet.slices():
        assert sl.state != "down", sl


def test_a_preempted_slice_comes_back_when_its_own_restore_is_due() -> None:
    """A restore armed by an earlier preemption does not bring back a later one early."""
    clock = FakeClock()
    fleet = Fleet({"v4-8": 1}, clock)
    fleet.preempt("v4-8-0", restore_after=5.0)
    fleet.restore("v4-8-0")  # back by hand at t=0
    clock.advance(1.0)
    fleet.preempt("v4-8-0", restore_after=10.0)  # again at t=1: back at t=11
    clock.advance(5.0)  # t=6: the first restore's time
    assert fleet.slice("v4-8-0").state == "down"
    clock.advance(5.0)
    assert fleet.slice("v4-8-0").state == "free" and fleet.slice("v4-8-0").incarnation == 2


# --------------------------------------------------------------------- the model behind the runner


REQUEST = JobRequest(
    name="train", entrypoint=Entrypoint(binary="train"), resources=ResourceConfig.with_tpu("v4-16", slice_count=2)
)


def run(
    provider: InMemorySliceProvider, request: JobRequest = REQUEST, job_id: str = "job-1", **budgets: int
) -> GangRunner:
    import attrs

    runner = GangRunner(
        job_id, attrs.evolve(request, **budgets), provider, policy=RetryPolicy(backoff_initial=1.0, backoff_max=1.0),
        clock=provider.clock, wall=provider.clock.wall, sleep=provider.clock.sleep,
    )  # fmt: skip
    runner.run()
    provider.check()
    return runner


def outcomes(runner: GangRunner) -> list[str]:
    return [a.outcome.value for a in runner.info.attempts]


def test_a_fault_armed_for_an_attempt_never_lands_on_the_next_one() -> None:
    # attempt 0 fails at once (its host 0 is failed by the plan); its preemption, planned 5 s in, must not
    # hit attempt 1, which runs on the same slices from t=1 to t=11
    plan = FaultPlan(
        [FailHost(attempt=0, slice_index=0, host_index=0), PreemptSlice(attempt=0, slice_index=0, after=5.0)]
    )
    provider = InMemorySliceProvider(
        {"v4-16": 2}, fault_plan=plan, script=lambda a, s, h: HostScript("SUCCEEDED", after=10.0)
    )
    runner = run(provider, max_retries_failure=1)
    assert outcomes(runner) == ["FAILED", "SUCCEEDED"]
    assert "SimulatedHostFailure: injected host failure" in runner.info.attempts[0].cause
    assert provider.slice_preemptions == 0


def test_a_fault_armed_for_one_job_never_lands_on_the_next_job() -> None:
    plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=5.0)])
    provider = InMemorySliceProvider(
        {"v4-16": 2}, fault_plan=plan, script=lambda a, s, h: HostScript("SUCCEEDED", after=1.0)
    )
    first = run(provider, job_id="a")  # done at t=1, before its planned preemption
    assert outcomes(first) == ["SUCCEEDED"]
    provider.script = lambda a, s, h: HostScript("SUCCEEDED", after=10.0)
    second = run(provider, job_id="b")  # its own attempt 0 is preempted 5 s in (t=6), not at t=5
    assert outcomes(second) == ["PREEMPTED", "SUCCEEDED"]
    assert [r.ended_at for r in provider.runs_of(0, "b") if r.slice_index == 1] == [6.0, 6.0]
    assert provider.slice_preemptions == 1


def test_a_chaos_seed_replays_the_same_faults_attempt_by_attempt() -> None:
    # hosts run 2 s; the plan's preemptions land within 3 s of an attempt's start, so an attempt is lost iff
    # one of its own faults is due before 2 s. Faults due later (attempts 0 and 1 of seed 31 have some) must
    # not land on the next attempt.
    plan = FaultPlan.chaos(seed=31, rate=0.4, max_slices=2, horizon=3.0)
    expected = []
    for a in range(50):
        hit = any(f.after < 2.0 for f in plan.for_attempt(a))
        expected.append("PREEMPTED" if hit else "SUCCEEDED")
        if not hit:
            break
    assert len(expected) == 3 and any(f.after > 2.0 for f in plan.for_attempt(0) + plan.for_attempt(1))

    def history() -> list[tuple[str, str]]:
        provider = InMemorySliceProvider(
            {"v4-16": 2}, fault_plan=plan, script=lambda a, s, h: HostScript("SUCCEEDED", after=2.0)
        )
        runner = run(provider, max_retries_preemption=50)
        return [(a.outcome.value, a.cause or "") for a in runner.info.attempts]

    runs = [history() for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert [outcome for outcome, _ in runs[0]] == expected


def test_a_broken_host_fails_every_start_as_the_infrastructures_fault_until_repaired() -> None:
    provider = InMemorySliceProvider({"v4-16": 2})
    provider.break_host("v4-16-1", 0)
    runner = run(provider, max_retries_preemption=2)
    # two device failures of the host quarantine its slice (quarantine_after=2): then 2 slices are not there
    assert outcomes(runner) == ["PREEMPTED", "PREEMPTED", "UNSCHEDULABLE"] and runner.info.failures == 0
    assert all(
        "TpuDeviceError: the TPU device of v4-16-1 host 0 is broken" in a.cause for a in runner.info.attempts[:2]
    )
    assert "1 quarantined (v4-16-1)" in runner.info.attempts[2].cause
    assert provider.slice_states() == {"v4-16-0": "free", "v4-16-1": "free"}  # the slice is not preempted
    provider.repair_host("v4-16-1", 0)
    assert outcomes(run(provider, job_id="job-2")) == ["SUCCEEDED"]


def test_a_crashed_host_is_dirty_and_cleaned_before_the_next_start_unless_hygiene_is_off() -> None:
    plan = FaultPlan([FailHost(attempt=0, slice_index=0, host_index=1, crash=True, message="segfault")])
    provider = InMemorySliceProvider({"v4-16": 1}, fault_plan=plan)
    runner = run(provider, REQUEST_1, max_retries_failure=1)
    assert (
        outcomes(runner) == ["FAILED", "SUCCEEDED"]
        and "simulated crash on v4-16-0 host 1" in runner.info.attempts[0].cause
    )
    assert provider.fleet.host_health("v4-16-0", 1) is HostHealth.HEALTHY  # cleaned at the start of attempt 1

    dirty = InMemorySliceProvider({"v4-16": 1}, fault_plan=plan, clean_hosts=False)
    runner = run(dirty, REQUEST_1, max_retries_failure=1, max_retries_preemption=1)
    assert outcomes(runner) == ["FAILED", "PREEMPTED", "PREEMPTED"]
    assert "DeviceBusyError: TPU in use" in runner.info.attempts[1].cause


REQUEST_1 = JobRequest(name="train", entrypoint=Entrypoint(binary="train"), resources=ResourceConfig.with_tpu("v4-16"))


def test_capacity_counts_must_be_whole_numbers() -> None:
    with pytest.raises(ValueError, match="Fleet: count of 'v4-16' must be an int >= 1, got 0"):
        Fleet({"v4-16": 0}, FakeClock())
    with pytest.raises(ValueError, match=r"host must be in \[0, 2\) for v4-16-0"):
        Fleet({"v4-16": 1}, FakeClock()).break_host("v4-16-0", 2)
