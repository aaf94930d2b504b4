"""Blame the right thing (issue 30), on the simulated fleet with a fake clock: attribution of a gang's failure to
a lost slice within the backend's detection time, preemption notices, stall and startup detection.

Faults land at seeded random instants (hypothesis draws them; a failing example prints them, and
``--hypothesis-seed`` replays it); every run is checked against the chaos suites' invariants: the job
ends within a bound, each attempt spends the right budget, nothing is leaked (``provider.problems()``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fray_core.fleet import FaultPlan, PreemptSlice
from fray_core.runner import GangRunner, RetryPolicy
from fray_core.testing import HANG, HostScript, InMemorySliceProvider
from fray_core.types import AttemptOutcome, Entrypoint, JobRequest, JobStatus, ResourceConfig

POLICY = RetryPolicy(backoff_initial=1.0, poll_interval=0.5, cancel_grace=5.0)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)


def request(slices: int = 2, *, failures: int = 0, preemptions: int = 5, **kw: float) -> JobRequest:
    return JobRequest(
        name="train",
        entrypoint=Entrypoint(binary="train"),
        resources=ResourceConfig.with_tpu("v4-16", slice_count=slices),
        max_retries_failure=failures,
        max_retries_preemption=preemptions,
        **kw,  # type: ignore[arg-type]
    )


def run(provider: InMemorySliceProvider, req: JobRequest) -> GangRunner:
    clock = provider.clock
    runner = GangRunner("job-1", req, provider, policy=POLICY, clock=clock, wall=clock.wall, sleep=clock.sleep)
    runner.run()
    assert provider.problems() == []  # nothing leaked: every lease released once, no host left running
    return runner


def outcomes(runner: GangRunner) -> list[AttemptOutcome]:
    return [a.outcome for a in runner.info.attempts]  # type: ignore[misc]


# ----------------------------------------------------------------------------------------- attribution


@SETTINGS
@given(
    delay=st.sampled_from([0.0, 3.0, 15.0, 40.0]),
    loss=st.floats(0.5, 50.0).map(lambda x: round(x, 2)),
    # when slice 0's hosts fail (their collective broke), after the loss: before or after it is detected
    sibling=st.floats(0.0, 2.0).map(lambda x: round(x, 2)),
)
def test_a_lost_slice_never_costs_the_failure_budget_whatever_order_the_outcomes_arrive_in(
    delay: float, loss: float, sibling: float
) -> None:
    sibling_after = sibling * delay if delay else sibling  # 0..2x the detection time after the loss
    print(f"detection_delay={delay} loss at {loss} s, siblings fail {sibling_after} s later")

    def script(attempt: int, s: int, h: int) -> HostScript:
        if attempt == 0:
            return (
                HANG
                if s == 1
                else HostScript("FAILED", after=loss + sibling_after, error="RuntimeError: collective failed")
            )
        return HostScript("SUCCEEDED", after=1.0)

    plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=loss)])
    provider = InMemorySliceProvider({"v4-16": 2}, script=script, fault_plan=plan, detection_delay=delay)
    runner = run(provider, request(failures=0))
    assert outcomes(runner) == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED]
    assert runner.info.status is JobStatus.SUCCEEDED and runner.info.failures == 0 and runner.info.preemptions == 1
    first = runner.info.attempts[0]
    assert "v4-16-1" in (first.cause or "")
    # bounded: attempt 0 ends at the latest when the loss is detected and the siblings were collected
    assert (
        first.ended_at is not None
        and first.ended_at - provider.clock.WALL_EPOCH
        <= loss + max(delay, sibling_after) + POLICY.cancel_grace + POLICY.poll_interval
    )


@SETTINGS
@given(delay=st.sampled_from([0.0, 3.0, 15.0]), fail=st.floats(0.5, 30.0).map(lambda x: round(x, 2)))
def test_a_real_failure_with_every_slice_intact_stays_failed(delay: float, fail: float) -> None:
    print(f"detection_delay={delay} host fails at {fail} s")

    def script(attempt: int, s: int, h: int) -> HostScript:
        return HostScript("FAILED", after=fail) if (s, h) == (0, 1) else HANG

    provider = InMemorySliceProvider({"v4-16": 2}, script=script, detection_delay=delay)
    runner = run(provider, request(failures=1))
    assert outcomes(runner) == [AttemptOutcome.FAILED, AttemptOutcome.FAILED]
    assert runner.info.status is JobStatus.FAILED and runner.info.preemptions == 0 and runner.info.failures == 2
    # the runner waited for the detection time before calling it the user's failure, and no longer
    a0 = runner.info.attempts[0]
    assert a0.ended_at is not None and a0.ended_at - a0.started_at <= fail + delay + POLICY.poll_interval + 1e-9


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    delay=st.sampled_from([0.0, 2.0, 15.0]),
    lose=st.booleans(),
    loss=st.floats(0.5, 20.0).map(lambda x: round(x, 2)),
    fail=st.floats(0.5, 40.0).map(lambda x: round(x, 2)),
)
def test_budgets_follow_the_truth_at_every_instant_and_order(
    seed: int, delay: float, lose: bool, loss: float, fail: float
) -> None:
    """Across random instants: when a slice was lost before the first failure, the attempt is PREEMPTED (never
    the failure budget); when none was lost, it is FAILED (never the preemption budget)."""
    print(f"seed={seed} detection_delay={delay} lose={lose} loss={loss} fail={fail}")
    failing = (seed % 2, seed % 2 + 0)  # which slice's host 0 raises

    def script(attempt: int, s: int, h: int) -> HostScript:
        if attempt > 0:
            return HostScript("SUCCEEDED", after=1.0)
        return HostScript("FAILED", after=fail) if (s, h) == failing else HANG

    plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1 - failing[0], after=loss)] if lose else [])
    provider = InMemorySliceProvider({"v4-16": 2}, script=script, fault_plan=plan, detection_delay=delay)
    runner = run(provider, request(failures=1, preemptions=1))
    first = outcomes(runner)[0]
    if lose and loss <= fail:
        assert first is AttemptOutcome.PREEMPTED and runner.info.failures == 0, runner.info.attempts[0].cause
    elif not lose:
        assert first is AttemptOutcome.FAILED and runner.info.preemptions == 0
    assert runner.info.status is JobStatus.SUCCEEDED  # one of each budget is enough in every case


def test_detection_delay_is_validated() -> None:
    with pytest.raises(ValueError, match=r"detection_delay: expected a finite number of seconds >= 0 .*, got -1$"):
        InMemorySliceProvider({"v4-16": 1}, detection_delay=-1)


# ------------------------------------------------------------------------------------------------ notices


@SETTINGS
@given(at=st.floats(0.5, 20.0).map(lambda x: round(x, 2)), grace=st.sampled_from([1.0, 5.0, 30.0]))
def test_a_notice_stops_every_host_gracefully_until_the_deadline_and_the_next_attempt_avoids_the_slice(
    at: float, grace: float
) -> None:
    print(f"notice at {at} s with {grace} s of grace")
    provider = InMemorySliceProvider({"v4-16": 3}, script=lambda a, s, h: HANG if a == 0 else HostScript("SUCCEEDED"))
    provider.clock.call_later(at, provider.notify_preemption, "v4-16-1", grace, 600.0)  # back 10 min after
    runner = run(provider, request(failures=0))
    assert outcomes(runner) == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED]
    assert runner.info.failures == 0 and "preemption notice: slice v4-16-1 draining" in (
        runner.info.attempts[0].cause or ""
    )
    # every host of the job (both slices) was told the deadline and given the grace until it
    [(when, deadline, hosts)] = provider.notices
    assert hosts == 4 and deadline == pytest.approx(provider.clock.WALL_EPOCH + at + grace, abs=POLICY.poll_interval)
    [(_, given_grace, _)] = provider.graceful_cancels
    assert given_grace == pytest.approx(deadline - provider.clock.WALL_EPOCH - when)
    assert runner.info.attempts[1].slices == ["v4-16-0", "v4-16-2"]  # not the draining one


def test_a_host_that_fails_after_a_notice_still_ends_the_attempt_preempted() -> None:
    def script(a: int, s: int, h: int) -> HostScript:
        if a == 0:
            return HostScript("FAILED", after=3.0, error="SystemExit: 1") if s == 0 else HANG
        return HostScript("SUCCEEDED")

    provider = InMemorySliceProvider({"v4-16": 3}, script=script)
    provider.clock.call_later(3.0, provider.notify_preemption, "v4-16-1", 30.0)  # the same instant as the exit
    runner = run(provider, request(failures=0))
    assert outcomes(runner) == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED] and runner.info.failures == 0


# ------------------------------------------------------------------------------------------------- stalls


@SETTINGS
@given(progress=st.floats(1.0, 50.0).map(lambda x: round(x, 1)), timeout=st.sampled_from([5.0, 30.0]))
def test_a_stall_after_progress_ends_the_attempt_stalled_within_the_timeout_with_stacks(
    progress: float, timeout: float
) -> None:
    print(f"hosts beat every 1 s for {progress} s, then hang; stall_timeout={timeout}")

    def script(a: int, s: int, h: int) -> HostScript:
        if a == 0:
            return HostScript(None, heartbeat_every=1.0, heartbeat_until=progress if (s, h) == (1, 0) else None)
        return HostScript("SUCCEEDED", after=3.0, heartbeat_every=1.0)

    provider = InMemorySliceProvider({"v4-16": 2}, script=script)
    runner = run(provider, request(failures=1, stall_timeout=timeout))
    assert outcomes(runner) == [AttemptOutcome.STALLED, AttemptOutcome.SUCCEEDED]
    assert runner.info.failures == 1 and runner.info.preemptions == 0  # a stall after progress: the failure budget
    a0 = runner.info.attempts[0]
    assert "slice 1 (v4-16-1) host 0" in (a0.cause or "") and "stall_timeout" in (a0.cause or "")
    last_beat = int(progress)  # whole seconds
    assert a0.ended_at is not None and a0.ended_at - a0.started_at <= last_beat + timeout + 1.0 + 1e-9
    [(when, hosts)] = provider.stack_dumps
    assert len(hosts) == 4  # every host of the gang, before they were stopped
    assert runner.info.last_step is not None and runner.info.last_heartbeat_at is not None


def test_a_host_that_never_sends_its_first_heartbeat_is_a_startup_stall_on_the_preemption_budget() -> None:
    def script(a: int, s: int, h: int) -> HostScript:
        if a == 0 and s == 1:
            return HANG  # a multislice init hang: never beats
        return HostScript(None if a == 0 else "SUCCEEDED", after=5.0, heartbeat_every=1.0)

    provider = InMemorySliceProvider({"v4-16": 2}, script=script)
    runner = run(provider, request(failures=0, preemptions=1, startup_timeout=30.0))
    assert outcomes(runner) == [AttemptOutcome.STALLED, AttemptOutcome.SUCCEEDED]
    assert runner.info.failures == 0 and runner.info.preemptions == 1
    a0 = runner.info.attempts[0]
    assert "2 of 4 hosts" in (a0.cause or "") and "startup_timeout" in (a0.cause or "")
    assert 30.0 <= (a0.ended_at or 0) - a0.started_at <= 30.0 + POLICY.poll_interval + 1e-9


def test_stalls_never_exceed_the_budget() -> None:
    provider = InMemorySliceProvider(
        {"v4-16": 1}, script=lambda a, s, h: HostScript(None, heartbeat_every=1.0, heartbeat_until=2.0)
    )
    runner = run(provider, request(1, failures=2, stall_timeout=10.0))
    assert outcomes(runner) == [AttemptOutcome.STALLED] * 3 and runner.info.status is JobStatus.FAILED
    assert runner.info.error and runner.info.error.startswith("failed or stalled 3 time(s), max_retries_failure=2")


def test_without_heartbeats_nothing_is_a_stall() -> None:
    provider = InMemorySliceProvider({"v4-16": 1}, script=lambda a, s, h: HostScript("SUCCEEDED", after=100.0))
    runner = run(provider, request(1, stall_timeout=5.0))
    assert outcomes(runner) == [AttemptOutcome.SUCCEEDED] and runner.info.last_step is None


@pytest.mark.parametrize("field", ["stall_timeout", "startup_timeout"])
@pytest.mark.parametrize("value", [0, -1.0, float("inf"), True, "10"])
def test_timeouts_are_validated(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"JobRequest.{field}: expected seconds > 0 or None, got"):
        request(**{field: value})  # type: ignore[arg-type]


def test_the_last_step_before_a_hang_is_the_one_reported() -> None:
    """Beats a second apart at most, but the latest step always reaches the runner (within a second), with
    the time it was given: a host that beats steps 0..9 quickly and then hangs reports step 9, not 0."""
    import threading
    import time

    from fray_core import hostapi

    got: list[tuple[float, int | None]] = []
    nine = threading.Event()

    def sink(t: float, step: int | None) -> None:
        got.append((t, step))
        if step == 9:
            nine.set()

    hostapi.set_channel(beat=sink)
    try:
        given = []
        for step in range(10):
            given.append(time.time())
            hostapi.heartbeat(step)
        assert nine.wait(5 * hostapi.MIN_INTERVAL), got  # the flusher wrote it: the host beats no more
        assert [s for _, s in got] == [0, 9], got  # coalesced: the first at once, the latest after it
        assert given[9] <= got[1][0] < given[9] + 1.0  # the time of the call, not of the write
        hostapi.heartbeat(10)  # within a second of the last write: held back, then dropped with the channel
        hostapi.set_channel()
    finally:
        hostapi.set_channel()
    assert [s for _, s in got] == [0, 9], got


def test_a_child_forked_while_a_beat_is_being_written_can_still_beat() -> None:
    """A data loader forked while the flusher is inside a slow write (a KV round trip) does not block for good
    in its first heartbeat: it starts with fresh locks."""
    import os
    import select
    import threading

    from fray_core import hostapi

    inside, release = threading.Event(), threading.Event()

    def slow_sink(t: float, step: int | None) -> None:
        if step == 5:
            inside.set()
            release.wait(10)

    hostapi.set_channel(beat=slow_sink)
    try:
        for step in range(6):
            hostapi.heartbeat(step)  # 0 written at once, 5 held back for the flusher
        assert inside.wait(5)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its beats written (its own channel, as a host runner would set)
            try:
                hostapi.set_channel(beat=lambda t, step: os.write(w, b"1"))
                hostapi.heartbeat(99)
            finally:
                os._exit(0)
        os.close(w)
        ready, _, _ = select.select([r], [], [], 10)
        ok = bool(ready) and os.read(r, 1) == b"1"
        if not ok:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)
        assert ok, "the forked child's heartbeat was never written"
    finally:
        release.set()
        hostapi.set_channel()


def test_heartbeat_and_notice_are_harmless_outside_a_job(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import fray_core
    from fray_core import hostapi

    for var in ("FRAY_HEARTBEAT_FILE", "FRAY_NOTICE_FILE", "FRAY_PREEMPTION_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    fray_core.heartbeat()
    fray_core.heartbeat(7)
    assert fray_core.preemption_notice() is None and list(tmp_path.iterdir()) == []
    # in a job: the beat lands in the file the backend named, the notice is read from its file
    monkeypatch.setenv("FRAY_HEARTBEAT_FILE", str(tmp_path / "hb"))
    monkeypatch.setenv("FRAY_NOTICE_FILE", str(tmp_path / "notice"))
    hostapi.set_channel()  # forget the rate limit of the beats above
    fray_core.heartbeat(12)
    t, step = hostapi.read_heartbeat(str(tmp_path / "hb"))  # type: ignore[misc]
    assert step == 12 and t > 0
    assert fray_core.preemption_notice() is None
    hostapi.write_notice(str(tmp_path / "notice"), 1234.5)
    assert fray_core.preemption_notice() == 1234.5
    import os

    assert os.environ["FRAY_PREEMPTION_DEADLINE"] == "1234.5"
    with pytest.raises(TypeError, match="heartbeat\\(step\\): expected an int or None, got 1.5"):
        fray_core.heartbeat(1.5)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------------- chaos


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_chaos_of_losses_notices_failures_and_stalls_keeps_the_invariants(seed: int) -> None:
    """Each fault at a seeded random instant of attempt 0 (a slice loss, a notice, a user failure, a stall), on a
    fleet with a random detection time: the job ends within a bound with nothing leaked, a loss before the first
    failure never costs the failure budget, and with every slice intact a failure never costs the preemption one."""
    import random

    rng = random.Random(seed)
    delay = rng.choice([0.0, 2.0, 15.0])
    loss = round(rng.uniform(0.5, 30.0), 2) if rng.random() < 0.5 else None
    notice = round(rng.uniform(0.5, 30.0), 2) if rng.random() < 0.3 else None
    fail = round(rng.uniform(0.5, 30.0), 2) if rng.random() < 0.5 else None
    stall = round(rng.uniform(1.0, 30.0), 2) if rng.random() < 0.3 else None
    if loss is None and notice is None and fail is None and stall is None:
        loss = 5.0
    print(f"seed={seed} detection_delay={delay} loss={loss} notice={notice} fail={fail} stall={stall}")

    def script(attempt: int, s: int, h: int) -> HostScript:
        if attempt > 0:
            return HostScript("SUCCEEDED", after=2.0, heartbeat_every=1.0)
        if (s, h) == (0, 0) and fail is not None:
            return HostScript("FAILED", after=fail, error="RuntimeError: collective failed")
        return HostScript(None, heartbeat_every=1.0, heartbeat_until=stall if (s, h) == (0, 1) else None)

    plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=loss)] if loss is not None else [])
    provider = InMemorySliceProvider({"v4-16": 4}, script=script, fault_plan=plan, detection_delay=delay)
    if notice is not None:
        provider.clock.call_later(notice, provider.notify_preemption, "v4-16-0", 20.0, 600.0)
    runner = run(provider, request(failures=3, preemptions=5, stall_timeout=10.0))  # checks nothing leaked
    info = runner.info
    assert info.status is JobStatus.SUCCEEDED, info.error
    a0 = info.attempts[0]
    first = min(t for t in (loss, notice, fail, stall + 10.0 if stall is not None else None) if t is not None)
    # bounded: attempt 0 ends within the detection time, a notice's grace and collecting the hosts of its first event
    assert (a0.ended_at or 0) - a0.started_at <= first + max(
        delay, 20.0
    ) + POLICY.cancel_grace + 2 * POLICY.poll_interval
    if loss is not None and (fail is None or loss < fail):
        assert a0.outcome is not AttemptOutcome.FAILED, a0.cause
    if loss is None and notice is None:
        assert info.preemptions == 0 and a0.outcome in (AttemptOutcome.FAILED, AttemptOutcome.STALLED), a0.cause
    if a0.outcome is AttemptOutcome.FAILED:
        assert fail is not None and (loss is None or fail < loss) and (notice is None or fail < notice)
