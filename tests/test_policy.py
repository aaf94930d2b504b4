"""Scheduling policy written once in fray_core: goodput, pending (not preempted) while capacity is held,
the fleet's fair queue, bad-host quarantine. On the fake clock unless said otherwise."""

from __future__ import annotations

from fray_core import Goodput
from fray_core.runner import GangRunner, RetryPolicy, SliceProvider
from fray_core.testing import FakeClock, HostScript, InMemorySliceProvider
from fray_core.types import AttemptOutcome, Entrypoint, JobInfo, JobRequest, JobStatus, ResourceConfig

ENTRY = Entrypoint(binary="train")


def tpu_request(
    tpu: str = "v4-16", replicas: int | list[int] = 1, *, preemptions: int = 10, failures: int = 0
) -> JobRequest:
    return JobRequest(
        name="job",
        entrypoint=ENTRY,
        resources=ResourceConfig.with_tpu(tpu, slice_count=replicas),
        max_retries_preemption=preemptions,
        max_retries_failure=failures,
    )


def runner_for(request: JobRequest, provider: InMemorySliceProvider, clock: FakeClock, **policy: float) -> GangRunner:
    kw = dict(backoff_initial=5.0, schedule_timeout=10.0, poll_interval=1.0, cancel_grace=1.0)
    kw.update(policy)
    return GangRunner(
        "job-1", request, provider, policy=RetryPolicy(**kw), clock=clock, wall=clock.wall, sleep=clock.sleep
    )


# ------------------------------------------------------------------------------------------------ goodput


def test_goodput_splits_wall_time_into_pending_productive_and_lost() -> None:
    clock = FakeClock()

    def script(attempt: int, s: int, h: int) -> object:
        return HostScript("PREEMPTED", after=2.0) if attempt == 0 else HostScript("SUCCEEDED", after=3.0)

    provider = InMemorySliceProvider({"v4-16": 2}, clock, script=script)
    provider.preempt("v4-16-1", restore_after=4.0)  # the 2-slice job waits 4 s for its second slice
    runner = runner_for(tpu_request("v4-16", 2), provider, clock)
    outcome = runner.run()
    assert outcome.status is JobStatus.SUCCEEDED
    g = runner.info.goodput
    # 4 s waiting, 2 s on a preempted attempt, 5 s backoff, 3 s that produced the result
    assert g == Goodput(
        pending_s=9.0,
        productive_s=3.0,
        lost_s=2.0,
        pending_chip_s=9.0 * 16,
        productive_chip_s=3.0 * 16,
        lost_chip_s=2.0 * 16,
    )
    assert g.ratio == 3.0 / 14.0 and g.chip_ratio == 3.0 / 14.0
    assert [a.acquired_at - clock.WALL_EPOCH for a in runner.info.attempts] == [4.0, 11.0]
    record = runner.info.to_json()  # another process reads the record
    assert record["goodput"]["productive_s"] == 3.0 and JobInfo.from_json(record).goodput == g
    provider.check()


def test_goodput_of_a_cpu_job_has_no_chip_seconds() -> None:
    clock = FakeClock()
    provider = InMemorySliceProvider({}, clock)
    request = JobRequest(name="cpu", entrypoint=ENTRY, resources=ResourceConfig.with_cpu(replicas=2))
    runner = runner_for(request, provider, clock)
    assert runner.run().status is JobStatus.SUCCEEDED
    g = runner.info.goodput
    assert (g.productive_s, g.lost_s, g.pending_s, g.ratio, g.chip_ratio) == (1.0, 0.0, 0.0, 1.0, 0.0)


def test_goodput_counts_pending_from_when_the_job_reached_its_runner_not_by_its_clients_clock() -> None:
    """On a cluster, the record's submitted_at is the client's wall clock (another machine's): a client an
    hour behind must not make an hour of pending; the runner counts from ``received_at``, by its own clock."""
    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": 1}, clock)
    info = JobInfo(job_id="job-1", name="job", status=JobStatus.PENDING, submitted_at=clock.wall() - 3600.0)
    clock.advance(2.0)  # the job travels to its runner for 2 s
    received = clock.wall()
    clock.advance(1.0)  # and its runner starts 1 s later
    runner = GangRunner(
        "job-1", tpu_request(), provider, policy=RetryPolicy(poll_interval=1.0), clock=clock, wall=clock.wall,
        sleep=clock.sleep, info=info, received_at=received,
    )  # fmt: skip
    assert runner.run().status is JobStatus.SUCCEEDED
    g = runner.info.goodput
    assert (g.pending_s, g.productive_s) == (1.0, 1.0)
    assert runner.info.submitted_at == clock.WALL_EPOCH - 3600.0  # what the user submitted at, kept as stamped


def test_a_bad_goodput_field_names_the_field() -> None:
    import pytest

    record = JobInfo(job_id="j", name="n", status=JobStatus.SUCCEEDED).to_json()
    record["goodput"] = {"pending_s": "soon"}
    with pytest.raises(ValueError, match="field 'goodput'"):
        JobInfo.from_json(record)


# ------------------------------------------------------------------- waiting is not a preemption


def watch(runner: GangRunner) -> list[tuple[str, str | None, int]]:
    """Every state the runner reports: (status, pending_reason, number of attempts recorded)."""
    seen: list[tuple[str, str | None, int]] = []
    runner._on_change = lambda info: seen.append((info.status.value, info.pending_reason, len(info.attempts)))
    return seen


def test_waiting_for_slices_other_jobs_hold_is_pending_with_no_attempt_and_no_budget() -> None:
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider({"v4-16": 2}, clock)
    provider.occupy("v4-16-1")  # another job holds it for 1000 s: 100 schedule timeouts
    clock.call_at(1000.0, provider.vacate, "v4-16-1")
    runner = runner_for(tpu_request("v4-16", 2, preemptions=0), provider, clock)
    seen = watch(runner)
    outcome = runner.run()
    assert outcome.status is JobStatus.SUCCEEDED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.SUCCEEDED]
    assert runner.info.preemptions == 0 and clock.now() == 1001.0
    waiting = [s for s in seen if s[1] is not None]
    assert waiting and set(waiting) == {
        ("PENDING", "looking for 2 x v4-16", 0),  # until the provider's first answer
        ("PENDING", "queued: 1st for 2 x v4-16; fleet: 1 free, 1 held by (another job)", 0),
    }
    # until it has its slices a PENDING job says why (then its progress says its hosts are starting)
    assert all(reason for status, reason, n in seen if status == "PENDING" and n == 0), seen
    assert runner.info.pending_reason is None and runner.info.goodput.pending_s == 1000.0
    provider.check()


def test_missing_capacity_is_unschedulable_after_schedule_timeout_with_a_reason() -> None:
    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": 2}, clock)
    provider.preempt("v4-16-1", restore_after=1000.0)  # preempted, restoring late; held by no one
    runner = runner_for(tpu_request("v4-16", 2, preemptions=1), provider, clock)
    seen = watch(runner)
    outcome = runner.run()
    assert outcome.status is JobStatus.FAILED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.UNSCHEDULABLE] * 2
    assert ("PENDING", "waiting for capacity: 1 of 2 x v4-16 exist (1 preempted, restoring)", 0) in seen
    assert clock.now() == 10.0 + 5.0 + 10.0
    provider.check()


def test_a_provider_that_cannot_tell_keeps_the_schedule_timeout() -> None:
    """A provider raising a plain Unschedulable (the Ray provider) behaves as before: capacity missing."""
    from fray_core.errors import Unschedulable

    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": 2}, clock)
    provider.occupy("v4-16-1")
    real = provider.acquire

    def acquire(resources, counts, deadline):  # type: ignore[no-untyped-def]
        try:
            return real(resources, counts, deadline)
        except Unschedulable as e:
            raise Unschedulable(str(e), permanent=e.permanent) from None

    provider.acquire = acquire  # type: ignore[method-assign]
    runner = runner_for(tpu_request("v4-16", 2, preemptions=1), provider, clock)
    seen = watch(runner)
    assert runner.run().status is JobStatus.FAILED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.UNSCHEDULABLE] * 2
    reason = "waiting for capacity: asked: 2 x v4-16; fleet has: 1 free, 1 busy, 0 preempted"
    assert ("PENDING", reason, 0) in seen


# ------------------------------------------------------------------------------------- the fair queue

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fray_core.fleet import Fleet  # noqa: E402

COUNTS = [(1,), (2,), (3,), (4,), (2, 1), (4, 2), (4, 2, 1)]


@settings(max_examples=300, deadline=None)
@given(
    slices=st.integers(1, 4),
    jobs=st.lists(st.tuples(st.integers(0, 20), st.sampled_from(COUNTS), st.integers(1, 10)), min_size=1, max_size=12),
    preemptions=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.sampled_from([1.0, 7.0])), max_size=4),
    data=st.data(),
)
def test_no_job_starts_after_a_younger_one_on_the_fleet_model(
    slices: int,
    jobs: list[tuple[int, tuple[int, ...], int]],
    preemptions: list[tuple[int, int, float]],
    data: st.DataObject,
) -> None:
    """Jobs arrive (several at one instant, submitted in order), wait in the fleet's queue, run, release;
    slices are preempted (ending the job on them) and come back. Every waiting job asks again whenever
    something happens, in an order hypothesis picks (a younger job may ask first, even before an older one
    asked at all, as jobs' runners do). FCFS by submission with reservation: whatever the order of asking,
    no job starts after a younger job admitted once the older one had asked; and every job starts."""
    clock = FakeClock(horizon=10_000.0)
    fleet = Fleet({"v4-16": slices}, clock, waiter_ttl=1e9)
    arrivals = sorted((float(t), i, counts, dur) for i, (t, counts, dur) in enumerate(jobs) if min(counts) <= slices)
    submitted = {i: t + i / 100 for t, i, _, _ in arrivals}  # the order of submission, within an instant too
    asks = 0  # every try_acquire, numbered
    first_ask: dict[int, int] = {}
    admitted_at: dict[int, int] = {}
    started: dict[int, float] = {}
    leases: dict[int, list] = {}
    waiting: list[int] = []
    events: list[float] = [a[0] for a in arrivals] + [float(t) for t, _, _ in preemptions]
    pending_pre = sorted(preemptions)
    info = {i: (t, counts, dur) for t, i, counts, dur in arrivals}
    ends: dict[int, float] = {}
    while len(started) < len(arrivals):
        due = [t for t in events if t >= clock.now()]
        nxt = min(due) if due else clock.next_due()
        assert nxt is not None, f"jobs {sorted(set(info) - set(started))} never started"
        clock.advance_to(nxt)
        events = [t for t in events if t > clock.now()]
        now = clock.now()
        for i, end in list(ends.items()):  # jobs that finished
            if end <= now:
                for lease in leases.pop(i):
                    fleet.release(lease)
                del ends[i]
        while pending_pre and pending_pre[0][0] <= now:
            _, k, restore = pending_pre.pop(0)
            name = f"v4-16-{k % slices}"
            victim = fleet.slice(name).holder
            fleet.preempt(name, restore_after=restore)
            events.append(now + restore)
            if victim is not None:  # the job on it ends (its other slices are given back)
                i = int(victim)
                for lease in leases.pop(i):
                    fleet.release(lease)
                ends.pop(i)
        waiting += [i for t, i, _, _ in arrivals if t == now]
        for _ in range(len(waiting) + 1):  # ask until nobody gets anything more
            order = data.draw(st.permutations(waiting), label=f"who asks first at t={now}")
            got_any = False
            for i in order:
                asks += 1
                first_ask.setdefault(i, asks)
                got = fleet.try_acquire(str(i), "v4-16", info[i][1], since=submitted[i])
                if got is not None:
                    admitted_at[i] = asks
                    started[i], leases[i], got_any = now, got, True
                    ends[i] = now + info[i][2]
                    events.append(ends[i])
                    waiting.remove(i)
            if not got_any:
                break
    print("starts:", started)
    order = [i for _, i, _, _ in arrivals]
    for a, older in enumerate(order):
        for younger in order[a + 1 :]:
            if admitted_at[younger] > first_ask[older]:  # (nothing can hold a job for one that never asked)
                assert started[older] <= started[younger], (older, younger, started)


@settings(max_examples=200, deadline=None)
@given(
    slices=st.integers(1, 4),
    want=st.integers(1, 4),
    held=st.lists(st.integers(1, 200), min_size=0, max_size=4),
    timeout=st.sampled_from([0.0, 1.0, 10.0]),
)
def test_waiting_for_held_slices_never_spends_budget(slices: int, want: int, held: list[int], timeout: float) -> None:
    """Other jobs hold some slices for random times; however long that is (and however short the
    schedule timeout), the job has one attempt, spends no budget, and starts the moment enough are free."""
    want = min(want, slices)
    held = held[:slices]
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider({"v4-16": slices}, clock)
    for k, until in enumerate(held):
        provider.occupy(f"v4-16-{k}")
        clock.call_at(float(until), provider.vacate, f"v4-16-{k}")
    runner = runner_for(tpu_request("v4-16", want, preemptions=0), provider, clock, schedule_timeout=timeout)
    outcome = runner.run()
    free_at = sorted([0] * (slices - len(held)) + held)[want - 1]  # when the want-th slice is free
    assert outcome.status is JobStatus.SUCCEEDED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.SUCCEEDED]
    assert runner.info.preemptions == 0
    assert runner.info.attempts[0].acquired_at - clock.WALL_EPOCH == free_at
    provider.check()


class _Flapping(SliceProvider):
    """A provider whose every acquire round ends in ``Unschedulable``, held or missing by ``pattern``
    (cycled): a slice that keeps looking free and failing, between rounds where others hold it."""

    def __init__(self, clock: FakeClock, pattern: list[bool]) -> None:
        self.clock, self.pattern, self.rounds = clock, pattern, []

    def acquire(self, resources: ResourceConfig, counts: list[int], deadline: float) -> list:
        from fray_core.errors import Unschedulable

        held = self.pattern[len(self.rounds) % len(self.pattern)]
        start = self.clock()
        self.clock.sleep(max(0.0, deadline - start))
        self.rounds.append((held, self.clock() - start))
        raise Unschedulable("flapping", held=held, reason="queued" if held else "waiting for capacity")

    def release(self, leases: list) -> None:
        pass

    def start(self, lease: object, hosts: list, entrypoint: object) -> list:
        raise AssertionError("never acquires, so never starts")

    wait_any = cancel = start  # type: ignore[assignment]


@settings(max_examples=100, deadline=None)
@given(
    pattern=st.lists(st.booleans(), min_size=1, max_size=6).filter(lambda p: not all(p)),
    timeout=st.sampled_from([0.0, 2.5, 10.0]),
)
def test_rounds_that_alternate_between_held_and_missing_still_end_the_attempt(
    pattern: list[bool], timeout: float
) -> None:
    """schedule_timeout is spent by the rounds that found capacity missing, added up: held rounds in
    between pause it but never give it back, so no interleaving waits forever."""
    clock = FakeClock(horizon=10_000.0)
    provider = _Flapping(clock, pattern)
    runner = runner_for(tpu_request("v4-16", preemptions=0), provider, clock, schedule_timeout=timeout)  # type: ignore[arg-type]
    assert runner.run().status is JobStatus.FAILED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.UNSCHEDULABLE]
    missing = sum(d for held, d in provider.rounds if not held)
    assert timeout <= missing <= timeout + 1.0  # 1.0: the poll interval, one round at most
    assert not provider.rounds[-1][0]  # it ended on a missing round


# ------------------------------------------------------------------- the simulated fleet (real processes)

import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from fray_local import LocalCluster, TpuFleet  # noqa: E402
from fray_local.testing import TEST_POLICY  # noqa: E402

import helpers  # noqa: E402


def hold_until(path: str) -> str:
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.environ["TPU_NAME"]


def where() -> str:
    return os.environ["TPU_NAME"]


def lite_request(name: str, slices: int, fn=where, *args: object) -> JobRequest:
    return JobRequest(
        name=name,
        entrypoint=Entrypoint(callable=fn, args=args),
        resources=ResourceConfig.with_tpu("v5litepod-4", slice_count=slices),
        max_retries_preemption=0,
    )


def test_a_4_slice_job_submitted_first_starts_before_later_1_slice_jobs(tmp_path: Path) -> None:
    fleet = TpuFleet({"v5litepod-4": 4})  # 1 host per slice
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    go = str(tmp_path / "go")
    try:
        blocker = cluster.launch(lite_request("blocker", 1, hold_until, go))
        helpers.wait_for(lambda: cluster.poll(blocker).status is JobStatus.RUNNING, what="blocker running")
        big = cluster.launch(lite_request("big", 4))
        helpers.wait_for(
            lambda: (cluster.poll(big).pending_reason or "").startswith("queued: 1st for 4 x v5litepod-4"),
            what="big queued",
        )
        assert (
            cluster.poll(big).pending_reason == "queued: 1st for 4 x v5litepod-4; fleet: 3 free, 1 held by " + blocker
        )
        small = [cluster.launch(lite_request(f"small-{i}", 1)) for i in range(3)]
        for i, job in enumerate(small):  # 3 slices are free, but held for the older 4-slice job
            helpers.wait_for(
                lambda job=job, i=i: (cluster.poll(job).pending_reason or "").startswith(f"queued: {i + 2}"),
                what=f"small-{i} queued",
            )
        assert all(cluster.poll(j).status is JobStatus.PENDING and not cluster.poll(j).attempts for j in small)
        open(go, "w").close()
        infos = {j: cluster.wait(j, timeout=60) for j in [blocker, big, *small]}
        assert all(i.status is JobStatus.SUCCEEDED and len(i.attempts) == 1 for i in infos.values())
        assert sorted(infos[big].result) == [f"v5litepod-4-{k}" for k in range(4)]
        assert all(infos[big].attempts[0].acquired_at < infos[j].attempts[0].acquired_at for j in small)
        assert infos[big].goodput.pending_s > 0 and infos[big].pending_reason is None
    finally:
        open(go, "w").close()
        cluster.close()
        fleet.close()


def test_a_terminated_queued_job_leaves_the_fleets_queue_at_once(tmp_path: Path) -> None:
    fleet = TpuFleet({"v5litepod-4": 2})
    fleet.model.waiter_ttl = 3600.0  # an entry outlives the test unless the job's end removes it
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    go = str(tmp_path / "go")
    try:
        blocker = cluster.launch(lite_request("blocker", 1, hold_until, go))
        helpers.wait_for(lambda: cluster.poll(blocker).status is JobStatus.RUNNING, what="blocker running")
        big = cluster.launch(lite_request("big", 2))
        helpers.wait_for(lambda: (cluster.poll(big).pending_reason or "").startswith("queued: 1st"), what="big queued")
        small = cluster.launch(lite_request("small", 1))
        helpers.wait_for(
            lambda: (cluster.poll(small).pending_reason or "").startswith("queued: 2nd"), what="small queued"
        )
        cluster.terminate(big)
        assert cluster.poll(big).status is JobStatus.STOPPED
        info = cluster.wait(small, timeout=60)  # the free slice was reserved for "big": no longer
        assert info.status is JobStatus.SUCCEEDED and cluster.poll(blocker).status is JobStatus.RUNNING
    finally:
        open(go, "w").close()
        cluster.close()
        fleet.close()


# ---------------------------------------------------------------------------------- bad-host quarantine


def test_a_broken_host_is_quarantined_and_the_job_finishes_on_a_healthy_slice() -> None:
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider({"v4-16": 2}, clock)
    provider.break_host("v4-16-0", 1)
    provider.occupy("v4-16-1")  # the healthy slice is busy with another job until t=100
    clock.call_at(100.0, provider.vacate, "v4-16-1")
    runner = runner_for(tpu_request("v4-16", 1), provider, clock, backoff_initial=1.0)
    seen = watch(runner)
    outcome = runner.run()
    assert outcome.status is JobStatus.SUCCEEDED
    attempts = runner.info.attempts
    assert [a.outcome for a in attempts] == [AttemptOutcome.PREEMPTED] * 2 + [AttemptOutcome.SUCCEEDED]
    assert [a.slices for a in attempts] == [["v4-16-0"], ["v4-16-0"], ["v4-16-1"]]
    assert "TpuDeviceError" in attempts[0].cause
    reasons = {r for _, r, _ in seen if r}
    assert (
        "queued: 1st for 1 x v4-16; fleet: 0 free, 1 held by (another job); "
        "quarantined: v4-16-0 (device error twice in 1 s)"
    ) in reasons
    assert provider.fleet.describe("v4-16") == "2 free, 0 busy, 0 preempted, 1 quarantined (v4-16-0)"
    clock.advance(1800.0)  # the quarantine ends (the host is still broken: it is handed out last)
    assert provider.fleet.quarantined() == [] and provider.fleet.describe("v4-16") == "2 free, 0 busy, 0 preempted"
    provider.check()


def test_attempts_prefer_a_slice_without_device_failures() -> None:
    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": 2}, clock)
    provider.break_host("v4-16-0", 0)
    runner = runner_for(tpu_request("v4-16", 1), provider, clock)
    assert runner.run().status is JobStatus.SUCCEEDED
    assert [a.slices for a in runner.info.attempts] == [["v4-16-0"], ["v4-16-1"]]


def test_only_quarantine_missing_is_unschedulable_with_the_quarantine_as_reason() -> None:
    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": 1}, clock, quarantine_after=1)
    provider.break_host("v4-16-0", 0)
    runner = runner_for(tpu_request("v4-16", 1, preemptions=1), provider, clock)
    seen = watch(runner)
    assert runner.run().status is JobStatus.FAILED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.PREEMPTED, AttemptOutcome.UNSCHEDULABLE]
    # between attempts the status stays RUNNING; pending_reason says what the retry waits for
    assert ("RUNNING", "quarantined: v4-16-0 (device error once in 0 s); 0 of 1 x v4-16 usable", 1) in seen
    assert [g[0].name for g in provider.lease_groups()] == ["v4-16-0"]  # never handed out in quarantine


@settings(max_examples=200, deadline=None)
@given(
    slices=st.integers(1, 3),
    broken=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), max_size=3),
    after=st.integers(1, 3),
    want=st.integers(1, 3),
)
def test_a_quarantined_slice_is_never_handed_out(
    slices: int, broken: list[tuple[int, int]], after: int, want: int
) -> None:
    clock = FakeClock(horizon=100_000.0)
    provider = InMemorySliceProvider({"v4-16": slices}, clock, quarantine_after=after, quarantine_for=50.0)
    handed: list[tuple[float, str]] = []
    real_take = provider.fleet._take

    def take(sl, holder):  # type: ignore[no-untyped-def]
        assert sl.quarantined_until is None, f"{sl.name} handed out in quarantine at t={clock.now()}"
        handed.append((clock.now(), sl.name))
        return real_take(sl, holder)

    provider.fleet._take = take  # type: ignore[method-assign]
    for s, h in broken:
        provider.break_host(f"v4-16-{s % slices}", h)
    clock.call_at(400.0, lambda: [provider.repair_host(f"v4-16-{s % slices}", h) for s, h in broken])
    runner = runner_for(tpu_request("v4-16", min(want, slices), preemptions=50), provider, clock, schedule_timeout=30.0)
    outcome = runner.run()
    assert outcome.status in (JobStatus.SUCCEEDED, JobStatus.FAILED)
    provider.check()


def test_a_broken_host_on_the_simulated_fleet_is_quarantined_and_the_job_finishes_on_a_healthy_slice(
    tmp_path: Path,
) -> None:
    fleet = TpuFleet({"v4-16": 2}, quarantine_after=1)
    fleet.model.break_host("v4-16-0", 0)
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    try:
        request = JobRequest(
            name="q", entrypoint=Entrypoint(callable=where), resources=ResourceConfig.with_tpu("v4-16")
        )
        info = cluster.wait(cluster.launch(request), timeout=60)
        assert info.status is JobStatus.SUCCEEDED
        assert [(a.outcome.value, a.slices) for a in info.attempts] == [
            ("PREEMPTED", ["v4-16-0"]),
            ("SUCCEEDED", ["v4-16-1"]),
        ]
        assert "TpuDeviceError" in info.attempts[0].cause and info.result == ["v4-16-1", "v4-16-1"]
        assert [sl.name for sl in fleet.model.quarantined()] == ["v4-16-0"]
        assert fleet.model.describe("v4-16") == "2 free, 0 busy, 0 preempted, 1 quarantined (v4-16-0)"
        fleet.model.repair_host("v4-16-0", 0)  # repaired: back in service at once
        assert fleet.model.quarantined() == []
    finally:
        cluster.close()
        fleet.close()


# ------------------------------------------------------------------------------------------------ backoff

import math  # noqa: E402

import pytest  # noqa: E402

from fray_core.limits import MAX_SECONDS  # noqa: E402

_SECONDS = st.floats(min_value=0.0, max_value=MAX_SECONDS, allow_nan=False, allow_infinity=False)


@settings(max_examples=500, deadline=None)
@given(
    initial=_SECONDS,
    most=_SECONDS,
    multiplier=st.floats(min_value=1.0, max_value=MAX_SECONDS, allow_nan=False, allow_infinity=False),
    n=st.integers(min_value=-3, max_value=10**6),
)
def test_backoff_is_finite_non_negative_and_at_most_the_max_for_any_count(
    initial: float, most: float, multiplier: float, n: int
) -> None:
    """The count of bad attempts in a row never resets while a job keeps failing: ``2.0 ** 1024`` (about 1,025
    failures, or 36 with a multiplier of 1e9) raised OverflowError inside the runner."""
    policy = RetryPolicy(backoff_initial=initial, backoff_max=most, backoff_multiplier=multiplier)
    delay = policy.backoff(n)
    assert math.isfinite(delay) and 0.0 <= delay <= most


def test_backoff_grows_as_before_and_stays_at_the_max_after_thousands_of_failures() -> None:
    policy = RetryPolicy(backoff_initial=1.0, backoff_max=60.0, backoff_multiplier=2.0)
    assert [policy.backoff(n) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert policy.backoff(1025) == policy.backoff(10**6) == 60.0
    assert RetryPolicy(backoff_multiplier=1e9, backoff_max=MAX_SECONDS).backoff(37) == MAX_SECONDS


@pytest.mark.parametrize("bad", ["x", float("nan"), 0, -1, 0.001, 1e300, True])
def test_progress_interval_is_checked_like_the_other_fields(bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match=r"^RetryPolicy\.progress_interval: expected a finite number"):
        RetryPolicy(progress_interval=bad)  # type: ignore[arg-type]
