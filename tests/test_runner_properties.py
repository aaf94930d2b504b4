"""Property tests of the gang runner over the in-memory provider, on a fake clock (no processes, no sleeps).

The main property lets hypothesis drive random interleavings: hosts succeed, fail, are preempted (a
preemption takes the whole slice), capacity is lost and restored, other jobs take and give back
slices, and the job is terminated, at any point where the runner waits. After every step and at the end
it checks what users rely on: retry budgets are exact, no host runs after its attempt ended or after
terminate, every acquired slice is released exactly once, the MEGASCALE env of every attempt is
consistent, a success returns one result per host in (slice, host) order, the largest acceptable slice
count that is free is taken, and ``JobInfo.attempts`` tells what happened to each attempt.

Then come exact-oracle properties (budgets, never-fits, largest count) and the levanter scenarios as
plain examples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fray_core.runner import GangRunner, HostOutcomeKind, HostSpec, RetryPolicy, RunOutcome
from fray_core.testing import FakeClock, HostScript, InMemorySliceProvider, RunRecord
from fray_core.types import (
    Attempt,
    AttemptOutcome,
    Entrypoint,
    JobInfo,
    JobRequest,
    JobStatus,
    ResourceConfig,
    create_environment,
)

ENTRY = Entrypoint(binary="train")
MEGASCALE = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_PORT", "MEGASCALE_SLICE_ID")
BAD_FOR_PREEMPTION_BUDGET = (AttemptOutcome.PREEMPTED, AttemptOutcome.UNSCHEDULABLE)


def tpu_request(
    tpu: str = "v4-16", replicas: int | tuple[int, ...] = 1, *, preemptions: int = 100, failures: int = 0, **env: str
) -> JobRequest:
    return JobRequest(
        name="job",
        entrypoint=ENTRY,
        resources=ResourceConfig.with_tpu(tpu, slice_count=replicas),
        environment=create_environment(env_vars=env) if env else None,
        max_retries_preemption=preemptions,
        max_retries_failure=failures,
    )


def make_runner(
    request: JobRequest,
    provider: InMemorySliceProvider,
    clock: FakeClock,
    policy: RetryPolicy | None = None,
    job_id: str = "job-1",
) -> GangRunner:
    return GangRunner(
        job_id,
        request,
        provider,
        policy=policy or RetryPolicy(backoff_initial=1.0, schedule_timeout=10.0, poll_interval=1.0, cancel_grace=1.0),
        clock=clock,
        wall=clock.wall,
        sleep=clock.sleep,
    )


# ------------------------------------------------------------------------------------ the checks


@attrs.define
class StopMark:
    """Where the provider's counters stood when the test terminated the job."""

    acquire_calls: int
    start_calls: int
    at: float


def check_env(job_id: str, attempt: Attempt, group: list[Any], runs: list[RunRecord], user_env: dict[str, str]) -> None:
    n = len(group)
    coordinators = set()
    for r in runs:
        env = r.env
        where = f"attempt {attempt.index} slice {r.slice_index} host {r.host_index}: {env}"
        assert r.lease_record is group[r.slice_index], where
        assert env["FRAY_JOB_ID"] == job_id, where
        assert env["FRAY_ATTEMPT"] == str(attempt.index) == str(r.attempt), where
        assert env["FRAY_SLICE_ID"] == str(r.slice_index), where
        assert env["FRAY_HOST_ID"] == env["TPU_WORKER_ID"] == str(r.host_index), where
        assert env["FRAY_NUM_SLICES"] == str(n), where
        assert env["FRAY_HOSTS_PER_SLICE"] == str(r.lease.hosts), where
        assert env["TPU_NAME"] == r.lease.name, where
        for k, v in user_env.items():
            assert env[k] == v, where
        if n > 1:
            addr0 = group[0].lease.host_addresses[0]
            assert env["MEGASCALE_COORDINATOR_ADDRESS"] == f"{addr0}:{env['MEGASCALE_PORT']}", where
            assert env["MEGASCALE_NUM_SLICES"] == str(n), where
            assert env["MEGASCALE_SLICE_ID"] == str(r.slice_index), where
            coordinators.add(env["MEGASCALE_COORDINATOR_ADDRESS"])
        else:
            assert not any(k in env for k in MEGASCALE), f"single slice must not get MEGASCALE_*: {where}"
    assert len(coordinators) <= 1, f"attempt {attempt.index} has several coordinators: {coordinators}"


def check_job(
    runner: GangRunner,
    provider: InMemorySliceProvider,
    outcome: RunOutcome,
    stop: StopMark | None,
    user_env: dict[str, str] | None = None,
) -> None:
    """Everything that must hold once ``run()`` returned, whatever happened."""
    provider.check()  # every lease released exactly once, no host running, none left unreported at release
    info: JobInfo = runner.info
    req = runner.request
    attempts = info.attempts
    P, F = req.max_retries_preemption, req.max_retries_failure
    counts = req.resources.replica_counts
    groups = provider.lease_groups()

    # JobInfo.attempts: numbered, closed, with an outcome, and a cause for every attempt that did not succeed
    assert [a.index for a in attempts] == list(range(len(attempts)))
    for a in attempts:
        assert a.outcome is not None and a.ended_at is not None and a.ended_at >= a.started_at, a
        assert (a.cause is None) == (a.outcome is AttemptOutcome.SUCCEEDED), a

    # attempts that got slices <-> the provider's successful acquisitions, in order
    with_slices = [a for a in attempts if a.slices]
    assert [a.slices for a in with_slices] == [[r.name for r in g] for g in groups]
    for g in groups:  # the largest acceptable count that was free
        assert g[0].counts == counts
        assert len(g) == max(c for c in counts if c <= g[0].free_before), (g[0].counts, g[0].free_before)

    for a in attempts:
        runs = provider.runs_of(a.index)
        if not a.slices:
            assert not runs
            assert a.outcome in (AttemptOutcome.UNSCHEDULABLE, AttemptOutcome.CANCELLED), a
            if a.outcome is AttemptOutcome.UNSCHEDULABLE:
                assert "asked: " in a.cause and "fleet has" in a.cause, a.cause
            continue
        group = groups[with_slices.index(a)]
        check_env(str(runner.job_id), a, group, runs, user_env or {})
        all_hosts = [(s, h) for s, lease in enumerate(group) for h in range(lease.lease.hosts)]
        if stop is None:  # every host of every slice started, once
            assert [(r.slice_index, r.host_index) for r in runs] == all_hosts
        reported = sorted((r for r in runs if r.reported), key=lambda r: r.report_seq)
        kinds = [r.kind for r in reported]
        lost = any(rec.lost for rec in group)
        if a.outcome is AttemptOutcome.SUCCEEDED:
            assert a is attempts[-1]
            assert len(reported) == len(all_hosts) and set(kinds) == {HostOutcomeKind.SUCCEEDED}
        elif a.outcome is AttemptOutcome.CANCELLED:
            assert stop is not None, "an attempt was CANCELLED but nobody terminated the job"
        elif a.outcome is AttemptOutcome.PREEMPTED:
            assert HostOutcomeKind.PREEMPTED in kinds or lost, (kinds, lost)
            assert "preempted" in a.cause.lower(), a.cause
        elif a.outcome is AttemptOutcome.FAILED:
            assert HostOutcomeKind.PREEMPTED not in kinds and not lost, (kinds, lost)
            first_bad = next(r for r in reported if r.kind is not HostOutcomeKind.SUCCEEDED)
            assert first_bad.kind is HostOutcomeKind.FAILED
            assert first_bad.error in a.cause  # the first failed host's error and traceback are kept
        else:
            raise AssertionError(f"attempt with slices ended {a.outcome}")

    # budgets: exact, and the job FAILS exactly when one is exceeded
    n_pre = sum(a.outcome in BAD_FOR_PREEMPTION_BUDGET for a in attempts)
    n_fail = sum(a.outcome is AttemptOutcome.FAILED for a in attempts)
    permanent = bool(outcome.error and outcome.error.startswith("unschedulable:"))
    assert info.failures == n_fail
    assert info.preemptions == n_pre - permanent
    assert n_pre <= P + 1 and n_fail <= F + 1
    assert info.status is outcome.status
    if outcome.status is JobStatus.SUCCEEDED:
        last = attempts[-1]
        assert n_pre <= P and n_fail <= F
        expected = [(last.index, s, h) for s, lease in enumerate(groups[-1]) for h in range(lease.lease.hosts)]
        assert outcome.results == info.result == expected  # one entry per host, (slice, host) order
        assert outcome.error is None
    else:
        assert outcome.results is None and info.result is None
    if outcome.status is JobStatus.FAILED:
        last = attempts[-1]
        if permanent:
            assert last.outcome is AttemptOutcome.UNSCHEDULABLE and "can never fit" in outcome.error
            assert n_pre - 1 <= P and n_fail <= F
        elif last.outcome is AttemptOutcome.FAILED:
            assert n_fail == F + 1 and n_pre <= P
            assert outcome.error.startswith(f"failed {F + 1} time(s)"), outcome.error
        else:
            assert last.outcome in BAD_FOR_PREEMPTION_BUDGET
            assert n_pre == P + 1 and n_fail <= F
            assert "preempted" in outcome.error and f" {P + 1} time(s)" in outcome.error, outcome.error
    else:
        assert n_pre <= P and n_fail <= F, "the job should have FAILED: a budget was exceeded"

    # goodput: pending + productive + lost is the job's wall time; productive is the winning attempt's
    g = info.goodput
    assert g is not None and info.finished_at is not None
    assert abs(g.wall_s - (info.finished_at - info.submitted_at)) < 1e-6, (g, info.finished_at - info.submitted_at)
    won = [a for a in attempts if a.outcome is AttemptOutcome.SUCCEEDED]
    assert g.productive_s == (won[0].ended_at - won[0].acquired_at if won else 0.0), (g, won)
    assert min(g.pending_s, g.productive_s, g.lost_s) >= 0 and 0.0 <= g.ratio <= 1.0
    assert JobInfo.from_json(info.to_json()).goodput == g

    # terminate: nothing acquired or started afterwards; the job ends STOPPED unless it had already won
    if stop is None:
        assert outcome.status is not JobStatus.STOPPED
    else:
        assert provider.acquire_calls == stop.acquire_calls, "acquire() after terminate"
        assert provider.start_calls == stop.start_calls, "a host started after terminate"
        assert outcome.status is JobStatus.STOPPED or outcome.status is JobStatus.SUCCEEDED or permanent, outcome


def check_midway(runner: GangRunner, provider: InMemorySliceProvider, fleet_size: int) -> None:
    """What must hold whenever the runner waits: only the current attempt's hosts run, on held slices."""
    assert provider.violations == []
    held = provider.held_leases()
    assert len(held) <= fleet_size
    assert len({lease.handle.group for lease in held}) <= 1, "slices of two attempts held at once"
    current = len(runner.info.attempts) - 1
    for run in provider.running_runs():
        assert isinstance(run, RunRecord)
        assert run.attempt == current, f"a host of attempt {run.attempt} runs during attempt {current}"
        assert run.lease_record.released == 0, "a host runs on a released slice"


# ------------------------------------------------------------------------ the main random property

TPU_TYPES = ["v4-16", "v4-32", "v5litepod-4"]  # 2, 4 and 1 host(s) per slice
REPLICAS = [1, 2, 3, (1, 2), (2, 3), (1, 2, 3), (1, 3)]
RESTORE = [0.0, 3.0, None]  # a preempted slice comes back at once, after 3 s, or never

host_plans = st.one_of(
    st.just("SUCCEEDED"),
    st.builds(
        HostScript,
        st.sampled_from(["SUCCEEDED", "FAILED", "PREEMPTED", None]),
        after=st.sampled_from([0.0, 1.0, 2.5]),
        restore_after=st.sampled_from(RESTORE),
    ),
)
# how often each event happens when the runner waits (sampled_from shrinks towards the first)
EVENTS = (
    ["pass"] * 4
    + ["finish"] * 5
    + ["all_ok"] * 2
    + ["preempt", "preempt", "remove", "restore", "occupy", "vacate", "terminate"]
)
MAX_EVENTS = 30


@attrs.define
class Scenario:
    tpu: str
    slices: int
    replicas: int | tuple[int, ...]
    preemptions: int
    failures: int
    backoff: float
    schedule_timeout: float
    poll: float
    stop_at: float | None


scenarios = st.builds(
    Scenario,
    tpu=st.sampled_from(TPU_TYPES),
    slices=st.sampled_from([2, 3, 1, 4, 0]),
    replicas=st.sampled_from(REPLICAS),
    preemptions=st.integers(0, 4),
    failures=st.integers(0, 4),
    backoff=st.sampled_from([0.0, 2.0]),
    schedule_timeout=st.sampled_from([0.0, 3.0, 12.0]),
    poll=st.sampled_from([1.0, 4.0]),
    stop_at=st.one_of(st.none(), st.floats(0.0, 40.0)),
)


class Driver:
    """Called by the provider whenever the runner waits; draws what happens next from hypothesis."""

    def __init__(self, data: st.DataObject, sc: Scenario) -> None:
        self.data = data
        self.sc = sc
        self.steps = 0
        self.chaotic: dict[int, bool] = {}  # per attempt: do its hosts draw their own fates?
        self.stop: StopMark | None = None
        self.runner: GangRunner | None = None
        self.provider: InMemorySliceProvider | None = None

    def terminate(self) -> None:
        assert self.runner is not None and self.provider is not None
        if self.stop is None:
            p = self.provider
            self.stop = StopMark(p.acquire_calls, p.start_calls, p.clock.now())
        self.runner.stop()

    def script(self, attempt: int, s: int, h: int) -> Any:
        if self.steps >= MAX_EVENTS:
            return "SUCCEEDED"
        if attempt not in self.chaotic:
            self.chaotic[attempt] = self.data.draw(st.booleans(), label=f"attempt {attempt} has scripted faults")
        if not self.chaotic[attempt]:
            return "SUCCEEDED"  # after 1 s, unless an event ends it first
        return self.data.draw(host_plans, label=f"a{attempt} s{s}/h{h}")

    def __call__(self, p: InMemorySliceProvider) -> None:
        assert self.runner is not None
        check_midway(self.runner, p, self.sc.slices)
        self.steps += 1
        names = list(p.slice_states())
        if self.steps > MAX_EVENTS:  # wind down: capacity back, every host succeeds, so the job ends
            for name, state in p.slice_states().items():
                if state in ("down", "gone"):
                    p.restore(name)
                elif state == "occupied":
                    p.vacate(name)
            for run in p.running_runs():
                p.finish(run, "SUCCEEDED")
            return
        event = self.data.draw(st.sampled_from(EVENTS), label="event")
        running = p.running_runs()
        if event == "finish" and running:
            run = running[self.data.draw(st.integers(0, len(running) - 1), label="host")]
            kind = self.data.draw(st.sampled_from(["SUCCEEDED", "FAILED", "PREEMPTED"]), label="kind")
            p.finish(run, kind, restore_after=self.data.draw(st.sampled_from(RESTORE), label="restore"))
        elif event == "all_ok":
            for run in running:
                p.finish(run, "SUCCEEDED")
        elif event in ("preempt", "remove", "restore", "occupy", "vacate") and names:
            name = names[self.data.draw(st.integers(0, len(names) - 1), label="slice")]
            state = p.slice_states()[name]
            if event == "preempt":
                p.preempt(name, restore_after=self.data.draw(st.sampled_from(RESTORE), label="restore"))
            elif event == "remove":
                p.remove(name)
            elif event == "restore":
                p.restore(name)
            elif event == "occupy" and state == "free":
                p.occupy(name)
            elif event == "vacate":
                p.vacate(name)
        elif event == "terminate":
            self.terminate()
        # "pass": let time pass until the next due event or the runner's timeout


@settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_interleavings_keep_every_invariant(data: st.DataObject) -> None:
    sc = data.draw(scenarios, label="scenario")
    clock = FakeClock(horizon=100_000.0)
    driver = Driver(data, sc)
    provider = InMemorySliceProvider({sc.tpu: sc.slices}, clock, script=driver.script, on_idle=driver)
    request = tpu_request(sc.tpu, sc.replicas, preemptions=sc.preemptions, failures=sc.failures, WANDB_MODE="offline")
    policy = RetryPolicy(
        backoff_initial=sc.backoff,
        backoff_max=8.0,
        schedule_timeout=sc.schedule_timeout,
        poll_interval=sc.poll,
        cancel_grace=1.0,
    )
    runner = make_runner(request, provider, clock, policy)
    driver.runner, driver.provider = runner, provider
    if sc.stop_at is not None:
        clock.call_at(sc.stop_at, driver.terminate)
    outcome = runner.run()
    check_job(runner, provider, outcome, driver.stop, {"WANDB_MODE": "offline"})


# ------------------------------------------------------------------------------ exact-oracle properties

PLANS = st.lists(st.sampled_from(["ok", "fail", "preempt", "unschedulable"]), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(plan=PLANS, P=st.integers(0, 4), F=st.integers(0, 4), replicas=st.sampled_from([1, 2]))
def test_budgets_are_exact(plan: list[str], P: int, F: int, replicas: int) -> None:
    """Attempt k does plan[k] (the last entry repeats); the attempts and the verdict follow the budgets."""
    clock = FakeClock(horizon=1e6)

    def what(k: int) -> str:
        return plan[min(k, len(plan) - 1)]

    def script(attempt: int, s: int, h: int) -> Any:
        kind = {"ok": "SUCCEEDED", "fail": "FAILED", "preempt": "PREEMPTED"}[what(attempt)]
        return HostScript(kind, after=1.0) if (s, h) == (replicas - 1, 1) else HostScript("SUCCEEDED", after=0.5)

    provider = InMemorySliceProvider({"v4-16": replicas}, clock, script=script)
    runner = make_runner(tpu_request("v4-16", replicas, preemptions=P, failures=F), provider, clock)

    # before each acquisition, an "unschedulable" attempt finds every slice gone (capacity missing; slices
    # held by other jobs would make it wait its turn instead, spending nothing)
    real_acquire = provider.acquire

    def acquire(resources: Any, counts: Any, deadline: float) -> Any:
        missing = what(len(runner.info.attempts)) == "unschedulable"  # the attempt is recorded once it has slices
        for name, st_ in provider.slice_states().items():
            if missing and st_ == "free":
                provider.preempt(name, restore_after=1e6)  # down, restoring (not gone: that can never fit)
            elif not missing and st_ == "down":
                provider.restore(name)
        return real_acquire(resources, counts, deadline)

    provider.acquire = acquire  # type: ignore[method-assign]
    outcome = runner.run()

    expected: list[AttemptOutcome] = []
    pre = fail = 0
    verdict = JobStatus.SUCCEEDED
    for k in range(1000):
        w = what(k)
        if w == "ok":
            expected.append(AttemptOutcome.SUCCEEDED)
            break
        if w == "fail":
            expected.append(AttemptOutcome.FAILED)
            fail += 1
        else:
            expected.append(AttemptOutcome.PREEMPTED if w == "preempt" else AttemptOutcome.UNSCHEDULABLE)
            pre += 1
        if fail > F or pre > P:
            verdict = JobStatus.FAILED
            break
    assert [a.outcome for a in runner.info.attempts] == expected
    assert outcome.status is verdict
    if verdict is JobStatus.FAILED and expected[-1] is AttemptOutcome.FAILED:
        assert outcome.error.startswith(f"failed {F + 1} time(s), max_retries_failure={F}")
        assert "scripted failure" in outcome.error  # the last error is kept
    elif verdict is JobStatus.FAILED:
        assert f"{P + 1} time(s), max_retries_preemption={P}" in outcome.error
        assert outcome.error.startswith(
            "preempted" if expected[-1] is AttemptOutcome.PREEMPTED else "preempted or unschedulable"
        )
    check_job(runner, provider, outcome, None)


@settings(max_examples=200, deadline=None)
@given(
    tpu=st.sampled_from(TPU_TYPES),
    have=st.integers(0, 3),
    extra=st.integers(1, 3),
    P=st.integers(0, 5),
    F=st.integers(0, 5),
)
def test_a_request_that_can_never_fit_fails_at_once(tpu: str, have: int, extra: int, P: int, F: int) -> None:
    clock = FakeClock()
    provider = InMemorySliceProvider({tpu: have}, clock)
    want = have + extra
    runner = make_runner(tpu_request(tpu, (want, want + 1), preemptions=P, failures=F), provider, clock)
    outcome = runner.run()
    assert outcome.status is JobStatus.FAILED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.UNSCHEDULABLE]
    assert f"asked: {want + 1} or {want} x {tpu}; fleet has {have} {tpu} slice(s) in all" in outcome.error
    assert "can never fit" in runner.info.attempts[0].cause
    assert clock.now() == 0.0, "waited for capacity that can never exist"
    assert provider.acquire_calls == 1 and provider.hosts_started == 0
    check_job(runner, provider, outcome, None)


@settings(max_examples=200, deadline=None)
@given(
    slices=st.integers(1, 4),
    occupied=st.integers(0, 4),
    replicas=st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True),
    P=st.integers(0, 2),
)
def test_the_largest_acceptable_count_that_is_free_is_taken(
    slices: int, occupied: int, replicas: list[int], P: int
) -> None:
    occupied = min(occupied, slices)
    free = slices - occupied
    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": slices}, clock)
    taken = list(provider.slice_states())[:occupied]
    for name in taken:
        provider.occupy(name)
    clock.call_at(500.0, lambda: [provider.vacate(name) for name in taken])  # 50 schedule timeouts later
    runner = make_runner(tpu_request("v4-16", tuple(replicas), preemptions=P), provider, clock)
    outcome = runner.run()
    fitting = [c for c in replicas if c <= free]
    if fitting:
        n = max(fitting)
        assert outcome.status is JobStatus.SUCCEEDED
        assert len(runner.info.attempts[-1].slices) == n
        assert len(outcome.results) == 2 * n
    elif min(replicas) <= slices:  # fits once the other job lets go: the job waits for it, spending nothing
        assert outcome.status is JobStatus.SUCCEEDED and clock.now() == 501.0
        assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.SUCCEEDED]
        assert len(runner.info.attempts[0].slices) == max(c for c in replicas if c <= slices)
    else:
        assert outcome.status is JobStatus.FAILED and "can never fit" in outcome.error
    check_job(runner, provider, outcome, None)


# ---------------------------------------------------------------------- the levanter scenarios, by example


def run_job(
    request: JobRequest,
    fleet: dict[str, int],
    script: Callable[[int, int, int], Any] | None = None,
    setup: Callable[[InMemorySliceProvider, GangRunner, FakeClock], None] | None = None,
) -> tuple[RunOutcome, GangRunner, InMemorySliceProvider, FakeClock]:
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider(fleet, clock, script=script)
    runner = make_runner(request, provider, clock)
    if setup is not None:
        setup(provider, runner, clock)
    outcome = runner.run()
    return outcome, runner, provider, clock


def outcomes(runner: GangRunner) -> list[str]:
    return [a.outcome.value for a in runner.info.attempts]


def test_single_slice_runs_once_then_again_on_the_freed_slice() -> None:
    clock = FakeClock()
    provider = InMemorySliceProvider({"v4-16": 1}, clock)
    for job in ("job-1", "job-2"):
        runner = make_runner(tpu_request(), provider, clock, job_id=job)
        outcome = runner.run()
        assert outcome.status is JobStatus.SUCCEEDED
        assert outcome.results == [(0, 0, 0), (0, 0, 1)]
        assert runner.info.attempts[0].slices == ["v4-16-0"]
    provider.check()
    assert provider.slice_states() == {"v4-16-0": "free"}


def test_fail_once_then_succeed() -> None:
    outcome, runner, provider, _ = run_job(
        tpu_request(failures=1), {"v4-16": 1}, script=lambda a, s, h: "FAILED" if (a, h) == (0, 1) else "SUCCEEDED"
    )
    assert outcome.status is JobStatus.SUCCEEDED
    assert outcomes(runner) == ["FAILED", "SUCCEEDED"]
    assert "scripted failure on attempt 0 slice 0 host 1" in runner.info.attempts[0].cause
    assert "Traceback" in runner.info.attempts[0].cause
    provider.check()


def test_always_fails_keeps_the_error() -> None:
    outcome, runner, provider, _ = run_job(tpu_request(failures=2), {"v4-16": 1}, script=lambda a, s, h: "FAILED")
    assert outcome.status is JobStatus.FAILED
    assert outcomes(runner) == ["FAILED"] * 3
    assert outcome.error.startswith("failed 3 time(s), max_retries_failure=2; last error: failed on slice 0")
    assert runner.info.error == outcome.error
    provider.check()


def test_preemption_is_recovered_and_not_counted_as_a_failure() -> None:
    outcome, runner, provider, _ = run_job(
        tpu_request(failures=0),
        {"v4-16": 2},
        script=lambda a, s, h: HostScript("PREEMPTED", after=5.0) if a == 0 else "SUCCEEDED",
    )
    assert outcome.status is JobStatus.SUCCEEDED
    assert outcomes(runner) == ["PREEMPTED", "SUCCEEDED"]
    assert (runner.info.preemptions, runner.info.failures) == (1, 0)
    assert "preempted" in runner.info.attempts[0].cause
    provider.check()


def test_preemption_budget_exhausted() -> None:
    outcome, runner, provider, _ = run_job(tpu_request(preemptions=2), {"v4-16": 1}, script=lambda a, s, h: "PREEMPTED")
    assert outcome.status is JobStatus.FAILED
    assert outcomes(runner) == ["PREEMPTED"] * 3
    assert outcome.error.startswith("preempted 3 time(s), max_retries_preemption=2")
    provider.check()


def test_multislice_env_on_every_host() -> None:
    outcome, runner, provider, _ = run_job(tpu_request("v4-32", 3), {"v4-32": 3})
    assert outcome.status is JobStatus.SUCCEEDED
    runs = provider.runs_of(0)
    assert len(runs) == 12 and len(outcome.results) == 12
    coordinator = f"{provider.leases[0].lease.host_addresses[0]}:8081"
    assert {r.env["MEGASCALE_COORDINATOR_ADDRESS"] for r in runs} == {coordinator}
    assert sorted({r.env["MEGASCALE_SLICE_ID"] for r in runs}) == ["0", "1", "2"]
    assert {r.env["MEGASCALE_NUM_SLICES"] for r in runs} == {"3"}
    assert [r.env["TPU_WORKER_ID"] for r in runs] == ["0", "1", "2", "3"] * 3


def test_multislice_env_is_recomputed_after_a_preemption() -> None:
    """Attempt 1 gets a fresh incarnation of slice 0: its coordinator must be the new address."""
    outcome, runner, provider, _ = run_job(
        tpu_request("v4-16", 2), {"v4-16": 2}, script=lambda a, s, h: "PREEMPTED" if (a, s) == (0, 0) else "SUCCEEDED"
    )
    assert outcomes(runner) == ["PREEMPTED", "SUCCEEDED"]
    coord = [{r.env["MEGASCALE_COORDINATOR_ADDRESS"] for r in provider.runs_of(a)} for a in (0, 1)]
    assert len(coord[0]) == len(coord[1]) == 1 and coord[0] != coord[1]
    assert {r.env["FRAY_ATTEMPT"] for r in provider.runs_of(1)} == {"1"}
    check_job(runner, provider, outcome, None)


def test_variable_multislice_takes_what_is_free() -> None:
    # one of two slices busy with another job: [1, 2] runs on one slice, without MEGASCALE env
    outcome, runner, provider, _ = run_job(
        tpu_request("v4-16", (1, 2)), {"v4-16": 2}, setup=lambda p, r, c: p.occupy("v4-16-1")
    )
    assert outcome.status is JobStatus.SUCCEEDED and runner.info.attempts[0].slices == ["v4-16-0"]
    assert not any(k.startswith("MEGASCALE") for r in provider.runs for k in r.env)
    outcome, runner, provider, _ = run_job(tpu_request("v4-16", (1, 2)), {"v4-16": 2})
    assert runner.info.attempts[0].slices == ["v4-16-0", "v4-16-1"] and len(outcome.results) == 4


def test_multislice_where_slice_0_fails_once() -> None:
    outcome, runner, provider, _ = run_job(
        tpu_request("v4-16", 2, failures=1),
        {"v4-16": 2},
        script=lambda a, s, h: (
            HostScript("FAILED", after=0.5) if (a, s, h) == (0, 0, 0) else HostScript(None if a == 0 else "SUCCEEDED")
        ),
    )
    assert outcomes(runner) == ["FAILED", "SUCCEEDED"]
    # the other three hosts of attempt 0 were hanging: they were cancelled before the slices went back
    assert sorted(r.kind.value for r in provider.runs_of(0)) == ["CANCELLED"] * 3 + ["FAILED"]
    assert all(r.cancelled for r in provider.runs_of(0) if r.kind is HostOutcomeKind.CANCELLED)
    check_job(runner, provider, outcome, None)


def test_multislice_where_one_slice_always_fails() -> None:
    outcome, runner, provider, _ = run_job(
        tpu_request("v4-16", 2, failures=2),
        {"v4-16": 2},
        script=lambda a, s, h: HostScript("FAILED", after=2.0) if s == 1 else HostScript(None),
    )
    assert outcome.status is JobStatus.FAILED and outcomes(runner) == ["FAILED"] * 3
    assert "slice 1" in outcome.error
    check_job(runner, provider, outcome, None)


def test_terminate_stops_every_host_and_frees_capacity() -> None:
    stop: list[StopMark] = []

    def setup(p: InMemorySliceProvider, r: GangRunner, c: FakeClock) -> None:
        def terminate() -> None:
            stop.append(StopMark(p.acquire_calls, p.start_calls, c.now()))
            r.stop()

        c.call_at(30.0, terminate)

    outcome, runner, provider, clock = run_job(
        tpu_request("v4-16", 2), {"v4-16": 2}, script=lambda a, s, h: None, setup=setup
    )
    assert outcome.status is JobStatus.STOPPED and outcomes(runner) == ["CANCELLED"]
    assert {r.kind for r in provider.runs} == {HostOutcomeKind.CANCELLED} and len(provider.runs) == 4
    assert set(provider.slice_states().values()) == {"free"}
    assert clock.now() <= 31.0  # noticed within one poll interval
    check_job(runner, provider, outcome, stop[0])


def test_terminate_while_the_slices_arrive_is_not_a_success() -> None:
    """Regression: stop() landing inside acquire() used to end the job SUCCEEDED with results []."""
    stop: list[StopMark] = []

    def setup(p: InMemorySliceProvider, r: GangRunner, c: FakeClock) -> None:
        p.occupy("v4-16-0")

        def vacate_and_terminate() -> None:
            p.vacate("v4-16-0")
            stop.append(StopMark(p.acquire_calls, p.start_calls, c.now()))
            r.stop()

        c.call_at(3.0, vacate_and_terminate)

    outcome, runner, provider, _ = run_job(tpu_request(), {"v4-16": 1}, setup=setup)
    assert outcome.status is JobStatus.STOPPED and outcome.results is None
    assert outcomes(runner) == ["CANCELLED"] and provider.hosts_started == 0
    check_job(runner, provider, outcome, stop[0])


def test_unschedulable_counts_against_the_preemption_budget_with_a_diagnosis() -> None:
    outcome, runner, provider, clock = run_job(
        tpu_request("v4-16", 2, preemptions=1),
        {"v4-16": 2},
        setup=lambda p, r, c: p.preempt("v4-16-1", restore_after=1e6),
    )  # capacity missing (preempted, not back): slices held by another job would make it wait its turn instead
    assert outcome.status is JobStatus.FAILED and outcomes(runner) == ["UNSCHEDULABLE", "UNSCHEDULABLE"]
    diagnosis = "asked: 2 x v4-16; fleet has: 1 free, 0 busy, 1 preempted"
    assert runner.info.attempts[0].cause == f"Unschedulable: {diagnosis}"
    assert (
        outcome.error
        == f"preempted or unschedulable 2 time(s), max_retries_preemption=1; last cause: Unschedulable: {diagnosis}"
    )
    assert clock.now() == 10.0 + 1.0 + 10.0  # two schedule timeouts and one backoff, no real time
    check_job(runner, provider, outcome, None)


def test_capacity_that_comes_back_in_time_is_used() -> None:
    outcome, runner, provider, clock = run_job(
        tpu_request("v4-16", 2),
        {"v4-16": 2},
        setup=lambda p, r, c: p.preempt("v4-16-1", restore_after=7.5),  # down, coming back
    )
    assert outcome.status is JobStatus.SUCCEEDED and outcomes(runner) == ["SUCCEEDED"]
    assert clock.now() == 7.5 + 1.0
    check_job(runner, provider, outcome, None)


def test_cpu_gang_is_one_pseudo_slice() -> None:
    request = JobRequest(
        name="cpu", entrypoint=ENTRY, resources=ResourceConfig.with_cpu(replicas=3), max_retries_failure=1
    )
    outcome, runner, provider, _ = run_job(
        request, {}, script=lambda a, s, h: "FAILED" if (a, h) == (0, 2) else "SUCCEEDED"
    )
    assert outcome.status is JobStatus.SUCCEEDED and outcomes(runner) == ["FAILED", "SUCCEEDED"]
    assert outcome.results == [(1, 0, 0), (1, 0, 1), (1, 0, 2)]
    assert "replica 2" in runner.info.attempts[0].cause
    assert not any(k.startswith(("TPU_", "MEGASCALE")) for r in provider.runs for k in r.env)
    provider.check()


# --------------------------------------------------------------------------------- the helpers themselves


def test_provider_reports_each_run_as_its_own_outcome_in_start_order() -> None:
    """wait_any hands back the runs start() gave (one object per host, no copy), carrying how each ended;
    hosts of different slices due at the same instant end in the order they were started."""
    clock = FakeClock()
    p = InMemorySliceProvider({"v4-16": 2}, clock, script=lambda a, s, h: "FAILED" if (s, h) == (1, 0) else "SUCCEEDED")
    leases = p.acquire(ResourceConfig.with_tpu("v4-16", slice_count=2), [2], 0.0)
    runs = [r for s, lease in enumerate(leases)
            for r in p.start(lease, [HostSpec(0, s, h, {}) for h in range(2)], ENTRY)]  # fmt: skip
    assert p.running_runs() == runs
    assert [(r.state, r.reported, r.attempt, r.started_at, r.kind) for r in runs] == [
        ("running", False, 0, 0.0, None)
    ] * 4
    out = p.wait_any(list(reversed(runs)), 5.0)
    assert out == runs and all(o.run is o for o in out)  # same objects, in start (= end) order
    assert all(r.state == "ended" and r.reported and r.ended_at == 1.0 for r in runs)
    assert [r.report_seq for r in runs] == sorted(r.report_seq for r in runs)
    assert [o.kind for o in out] == [HostOutcomeKind.SUCCEEDED] * 2 + [
        HostOutcomeKind.FAILED,
        HostOutcomeKind.SUCCEEDED,
    ]
    assert out[0].result == (0, 0, 0) and out[2].error.startswith("RuntimeError: scripted failure")
    assert p.wait_any(runs, 1.0) == [] and p.running_runs() == []  # each run is reported once
    p.release(leases)
    p.check()


def test_provider_reports_a_runner_that_breaks_the_rules() -> None:
    """The checks above rely on the provider noticing leaks; make sure it does."""
    clock = FakeClock()
    p = InMemorySliceProvider({"v4-16": 2}, clock, script=lambda a, s, h: None)
    res = ResourceConfig.with_tpu("v4-16", slice_count=2)
    leases = p.acquire(res, [2], 0.0)
    env = [HostSpec(0, 0, h, {}) for h in range(2)]
    runs = p.start(leases[0], env, ENTRY)
    assert p.wait_any(runs, 5.0) == [] and clock.now() == 5.0  # hung hosts: the clock moved, no sleep
    p.start(leases[1], env, ENTRY)
    p.start(leases[1], env, ENTRY)
    p.release(leases)
    p.release(leases[:1])
    probs = p.problems()
    assert any("called again" in x for x in probs)
    assert any("was still running when its slice was released" in x for x in probs)
    assert any("released 2 times" in x for x in probs)
    with pytest.raises(AssertionError):
        p.check()
    q = InMemorySliceProvider({"v4-16": 1}, clock)
    q.acquire(ResourceConfig.with_tpu("v4-16"), [1], 0.0)
    assert any("never released" in x for x in q.problems())
