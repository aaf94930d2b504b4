"""Elastic multislice (``JobRequest.elastic``): a TPU job with several acceptable slice counts grows when
slices have been free for ``grow_after`` seconds (the attempt ends RESIZED, spending no budget) and
shrinks after a preemption. On the fake clock, then once on the simulated fleet with real processes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fray_core import ElasticConfig
from fray_core.runner import GangRunner, RetryPolicy
from fray_core.testing import HANG, FakeClock, HostScript, InMemorySliceProvider
from fray_core.types import (
    AttemptOutcome,
    Entrypoint,
    JobRequest,
    JobStatus,
    ResourceConfig,
    TpuConfig,
    summarize_request,
)

ENTRY = Entrypoint(binary="train")


def elastic_request(replicas: list[int], grow_after: float = 600.0, grace: float = 30.0, **kw: Any) -> JobRequest:
    return JobRequest(
        name="elastic",
        entrypoint=ENTRY,
        resources=ResourceConfig(device=TpuConfig(type="v4-16"), replicas=replicas),
        elastic=ElasticConfig(grow_after=grow_after, grace=grace),
        **kw,
    )


def runner_for(request: JobRequest, provider: InMemorySliceProvider, clock: FakeClock) -> GangRunner:
    policy = RetryPolicy(backoff_initial=5.0, schedule_timeout=10.0, poll_interval=1.0, cancel_grace=1.0)
    return GangRunner("job-1", request, provider, policy=policy, clock=clock, wall=clock.wall, sleep=clock.sleep)


# ------------------------------------------------------------------------------------------ the types


def test_elastic_config_is_validated_naming_field_value_and_what_is_allowed() -> None:
    assert ElasticConfig(grow_after=600, grace=0).grace == 0.0
    for kw, msg in [
        ({"grow_after": 0}, "ElasticConfig.grow_after: expected seconds > 0, got 0"),
        ({"grow_after": float("inf")}, "ElasticConfig.grow_after: expected seconds > 0, got inf"),
        ({"grace": -1.0}, "ElasticConfig.grace: expected seconds >= 0, got -1.0"),
        ({"grace": "30"}, "ElasticConfig.grace: expected seconds >= 0, got '30'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ElasticConfig(**kw)


@pytest.mark.parametrize(
    "resources",
    [
        ResourceConfig.with_tpu("v4-16", slice_count=2),
        ResourceConfig.with_tpu("v4-16", slice_count=[2, 2]),
        ResourceConfig.with_cpu(replicas=2),
    ],
)
def test_elastic_needs_a_tpu_device_and_more_than_one_count(resources: ResourceConfig) -> None:
    with pytest.raises(
        ValueError, match=r"JobRequest.elastic: needs a TPU device and more than one acceptable slice count"
    ):
        JobRequest(name="j", entrypoint=ENTRY, resources=resources, elastic=ElasticConfig())
    with pytest.raises(TypeError, match="JobRequest.elastic: expected ElasticConfig"):
        JobRequest(name="j", entrypoint=ENTRY, resources=resources, elastic={"grow_after": 1.0})  # type: ignore[arg-type]


def test_the_job_record_keeps_the_elastic_config() -> None:
    assert summarize_request(elastic_request([4, 2, 1]))["elastic"] == {"grow_after": 600.0, "grace": 30.0}
    assert summarize_request(JobRequest(name="j", entrypoint=ENTRY))["elastic"] is None


# ---------------------------------------------------------------------------------- on the fake clock


def test_grows_when_slices_free_up_then_shrinks_after_a_preemption_and_grows_again() -> None:
    clock = FakeClock(horizon=10_000.0)

    def script(attempt: int, s: int, h: int) -> Any:
        if attempt == 1 and s == 1 and h == 0:  # on 2 slices: slice 1 is lost for 1000 s
            return HostScript("PREEMPTED", after=10.0, restore_after=1000.0)
        if attempt == 3:
            return HostScript("SUCCEEDED", after=5.0)
        return HANG

    provider = InMemorySliceProvider({"v4-16": 2}, clock, script=script)
    provider.occupy("v4-16-1")  # another job holds it until t=100
    clock.call_at(100.0, provider.vacate, "v4-16-1")
    runner = runner_for(
        elastic_request([2, 1], grow_after=600.0, grace=30.0, max_retries_preemption=1), provider, clock
    )
    outcome = runner.run()

    assert outcome.status is JobStatus.SUCCEEDED
    attempts = runner.info.attempts
    assert [a.outcome for a in attempts] == [
        AttemptOutcome.RESIZED,
        AttemptOutcome.PREEMPTED,
        AttemptOutcome.RESIZED,
        AttemptOutcome.SUCCEEDED,
    ]
    assert [len(a.slices) for a in attempts] == [1, 2, 1, 2]
    ended = [a.ended_at - clock.WALL_EPOCH for a in attempts]
    # free from t=100: grown 600 s later; preempted at 710, 5 s backoff, 1 slice; back at 1710: grown at 2310
    assert ended == [700.0, 710.0, 2310.0, 2315.0]
    assert "free for 600 s; growing from 1 slice(s)" in (attempts[0].cause or "")
    # RESIZED spends neither budget: one preemption allowed, one used
    assert (runner.info.preemptions, runner.info.failures) == (1, 0)
    # a graceful stop with the job's grace, to the host(s) of the attempt being resized
    assert provider.graceful_cancels == [(700.0, 30.0, 2), (2310.0, 30.0, 2)]
    for a in attempts:
        envs = [r.env for r in provider.runs_of(a.index)]
        assert {e["FRAY_ELASTIC"] for e in envs} == {"1"} and {e["FRAY_ELASTIC_GRACE"] for e in envs} == {"30"}
        assert {e["FRAY_NUM_SLICES"] for e in envs} == {str(len(a.slices))}
        assert {e.get("MEGASCALE_NUM_SLICES") for e in envs} == ({"2"} if len(a.slices) == 2 else {None})
    assert len(outcome.results) == 4
    g = runner.info.goodput
    # resized attempts are lost time: 700 + 10 + (2310 - 715) s; productive: the last 5 s
    assert (g.productive_s, g.lost_s) == (5.0, 700.0 + 10.0 + 1595.0)
    assert g.wall_s == pytest.approx(runner.info.finished_at - runner.info.submitted_at)
    provider.check()


def test_growth_needs_grow_after_seconds_of_free_capacity_without_a_break() -> None:
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider({"v4-16": 2}, clock, script=lambda a, s, h: HANG if a == 0 else "SUCCEEDED")
    provider.occupy("v4-16-1")
    clock.call_at(100.0, provider.vacate, "v4-16-1")
    clock.call_at(400.0, provider.occupy, "v4-16-1")  # taken again before 600 s were up
    clock.call_at(500.0, provider.vacate, "v4-16-1")
    runner = runner_for(elastic_request([2, 1], grow_after=600.0), provider, clock)
    assert runner.run().status is JobStatus.SUCCEEDED
    assert [a.outcome for a in runner.info.attempts] == [AttemptOutcome.RESIZED, AttemptOutcome.SUCCEEDED]
    assert runner.info.attempts[0].ended_at - clock.WALL_EPOCH == 1100.0
    provider.check()


def test_a_job_waiting_in_the_fleet_queue_keeps_the_free_slices() -> None:
    """Free slices reserved for a queued job do not count: the elastic job does not take them from it."""
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider({"v4-16": 3}, clock, script=lambda a, s, h: HANG if a == 0 else "SUCCEEDED")
    provider.occupy("v4-16-1")
    provider.occupy("v4-16-2")

    def queued_job_asks() -> None:  # another job waits for 2 slices, renewing its place in line
        provider.fleet.try_acquire("big", "v4-16", [2])
        if clock.now() < 1000.0:
            clock.call_later(1.0, queued_job_asks)

    clock.call_at(10.0, queued_job_asks)
    clock.call_at(100.0, provider.vacate, "v4-16-1")  # 1 free, but "big" is ahead and wants 2
    runner = runner_for(elastic_request([2, 1], grow_after=60.0), provider, clock)
    assert runner.run().status is JobStatus.SUCCEEDED
    first = runner.info.attempts[0]
    assert first.outcome is AttemptOutcome.RESIZED
    # "big" stops asking at 1000 and leaves the queue waiter_ttl (5 s) later; then 60 s of free capacity
    assert first.ended_at - clock.WALL_EPOCH >= 1000.0 + 60.0
    provider.check()


def test_a_provider_that_cannot_tell_free_slices_never_grows() -> None:
    class NoFreeSlices(InMemorySliceProvider):
        def free_slices(self, tpu_type: str) -> int | None:
            return None  # the base class's default: cannot tell

    clock = FakeClock(horizon=10_000.0)
    provider = NoFreeSlices({"v4-16": 2}, clock, script=lambda a, s, h: HostScript("SUCCEEDED", after=2000.0))
    provider.occupy("v4-16-1")
    clock.call_at(100.0, provider.vacate, "v4-16-1")
    runner = runner_for(elastic_request([2, 1], grow_after=10.0), provider, clock)
    assert runner.run().status is JobStatus.SUCCEEDED
    assert [(a.outcome, len(a.slices)) for a in runner.info.attempts] == [(AttemptOutcome.SUCCEEDED, 1)]
    provider.check()


def test_a_job_that_is_not_elastic_never_grows() -> None:
    clock = FakeClock(horizon=10_000.0)
    provider = InMemorySliceProvider({"v4-16": 2}, clock, script=lambda a, s, h: HostScript("SUCCEEDED", after=2000.0))
    provider.occupy("v4-16-1")
    clock.call_at(100.0, provider.vacate, "v4-16-1")
    request = JobRequest(name="j", entrypoint=ENTRY, resources=ResourceConfig.with_tpu("v4-16", slice_count=[2, 1]))
    runner = runner_for(request, provider, clock)
    assert runner.run().status is JobStatus.SUCCEEDED
    assert [(a.outcome, len(a.slices)) for a in runner.info.attempts] == [(AttemptOutcome.SUCCEEDED, 1)]
    assert "FRAY_ELASTIC" not in provider.runs_of(0)[0].env
    provider.check()


# ------------------------------------------------------------------------------------ property tests

SLICES = 3
PROBE = 0.5  # how often the test samples the fleet (the runner polls every 1 s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    replicas=st.sampled_from([[2, 1], [3, 1], [3, 2, 1], [3, 2]]),
    grow_after=st.sampled_from([5.0, 20.0, 45.0]),
    budget=st.integers(0, 3),
)
def test_elastic_properties(seed: int, replicas: list[int], grow_after: float, budget: int) -> None:
    """Random other jobs taking and giving back slices (every 10 s at most) and random host fates: RESIZED
    never counts against either budget, a job grows only after ``grow_after`` s of continuous room for a
    larger count (and does grow when it had that room), and goodput's parts add up to the wall time."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    clock = FakeClock(horizon=100_000.0)

    def script(attempt: int, s: int, h: int) -> Any:
        r = rng.random()
        if r < 0.85:
            return HANG
        kind = "SUCCEEDED" if r < 0.92 else "FAILED" if r < 0.96 else "PREEMPTED"
        return HostScript(kind, after=rng.uniform(1.0, 200.0), restore_after=rng.choice([0.0, 30.0]))

    provider = InMemorySliceProvider({"v4-16": SLICES}, clock, script=script)
    others: dict[str, bool] = {}

    def other_job() -> None:  # take or give back a slice another job holds, if one is free / held
        name = f"v4-16-{rng.randrange(SLICES)}"
        if others.get(name):
            provider.vacate(name)
            others[name] = False
        elif provider.slice_states()[name] == "free":
            provider.occupy(name)
            others[name] = True
        if clock.now() < 600.0:
            clock.call_later(10.0 * rng.randint(1, 5), other_job)

    samples: list[tuple[float, int]] = []

    def probe() -> None:
        samples.append((clock.now(), provider.free_slices("v4-16")))
        if clock.now() < 1000.0:
            clock.call_later(PROBE, probe)

    for i in range(1, rng.randint(1, SLICES - 1) + 1):  # other jobs hold some slices at the start
        provider.occupy(f"v4-16-{i}")
        others[f"v4-16-{i}"] = True
    clock.call_at(5.0, other_job)
    clock.call_at(0.25, probe)
    request = elastic_request(
        replicas, grow_after=grow_after, max_retries_preemption=budget, max_retries_failure=budget
    )
    runner = runner_for(request, provider, clock)
    clock.call_at(1000.0, runner.stop)
    runner.run()
    info = runner.info
    outcomes = [a.outcome for a in info.attempts]
    # budgets: exactly the PREEMPTED/UNSCHEDULABLE and FAILED attempts, never the RESIZED ones
    assert info.preemptions == sum(o in (AttemptOutcome.PREEMPTED, AttemptOutcome.UNSCHEDULABLE) for o in outcomes)
    assert info.failures == sum(o is AttemptOutcome.FAILED for o in outcomes)
    g = info.goodput
    assert g.wall_s == pytest.approx(info.finished_at - info.submitted_at)
    assert g.productive_s + g.lost_s <= info.finished_at - info.submitted_at + 1e-6
    largest = max(replicas)

    def room(held: int, free: int) -> bool:
        return any(held < c <= held + free for c in replicas)

    for a in info.attempts:
        if a.acquired_at is None or a.ended_at is None:
            continue
        t0, t1 = a.acquired_at - clock.WALL_EPOCH, a.ended_at - clock.WALL_EPOCH
        held = len(a.slices)
        during = [(t, free) for t, free in samples if t0 < t < t1]
        if a.outcome is AttemptOutcome.RESIZED:
            assert held < largest and t1 - t0 >= grow_after
            # room for a larger count all through the grow_after seconds before it ended
            assert all(room(held, free) for t, free in during if t >= t1 - grow_after), (a, during)
        elif held < largest:
            # no run of room longer than grow_after (+ a poll either side) went unused
            run_start = None
            for t, free in during:
                if not room(held, free):
                    run_start = None
                    continue
                run_start = t if run_start is None else run_start
                assert t - run_start < grow_after + 2.0, (a, t, run_start)
    provider.check()


# ------------------------------------------------------------------- the simulated fleet (real processes)

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from fray_local import LocalCluster, TpuFleet  # noqa: E402
from fray_local.testing import TEST_POLICY  # noqa: E402

import helpers  # noqa: E402


def elastic_host(marks: str, hold: list[int]) -> dict[str, str]:
    """Note what this host saw; on an attempt in ``hold``, run until stopped (checkpointing on SIGTERM)."""
    env = {
        k: os.environ.get(k, "")
        for k in ("FRAY_ATTEMPT", "FRAY_NUM_SLICES", "FRAY_ELASTIC", "TPU_NAME", "FRAY_HOST_ID")
    }
    tag = f"a{env['FRAY_ATTEMPT']}-{env['TPU_NAME']}-h{env['FRAY_HOST_ID']}"
    held = int(env["FRAY_ATTEMPT"]) in hold
    if held:

        def checkpoint(_sig: int, _frame: object) -> None:
            open(os.path.join(marks, f"checkpointed-{tag}"), "w").close()
            sys.exit(0)

        signal.signal(signal.SIGTERM, checkpoint)  # before the mark: a test may stop the host once it sees it
    with open(os.path.join(marks, f"started-{tag}"), "w") as f:
        json.dump(env, f)
    if held:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("held for 60 s and never stopped")
    return env


def test_on_the_simulated_fleet_a_job_grows_when_another_ends_and_shrinks_after_a_preemption(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 2})
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    marks = tmp_path / "marks"
    marks.mkdir()
    go = str(tmp_path / "go")

    def request(name: str, hold: list[int]) -> JobRequest:
        return JobRequest(
            name=name,
            entrypoint=Entrypoint(callable=elastic_host, args=(str(marks), hold)),
            resources=ResourceConfig(device=TpuConfig(type="v4-16"), replicas=[2, 1]),
            elastic=ElasticConfig(grow_after=1.0, grace=1.0),
            max_retries_preemption=1,
        )

    try:
        from test_policy import hold_until

        blocker = cluster.launch(
            JobRequest(
                name="blocker",
                entrypoint=Entrypoint(callable=hold_until, args=(go,)),
                resources=ResourceConfig.with_tpu("v4-16"),
                max_retries_preemption=0,
            )
        )
        helpers.wait_for(lambda: cluster.poll(blocker).status is JobStatus.RUNNING, what="blocker running")
        grows = cluster.launch(request("grows", hold=[0]))
        helpers.wait_for(lambda: cluster.poll(grows).status is JobStatus.RUNNING, what="elastic job running")
        assert [len(a.slices) for a in cluster.poll(grows).attempts] == [1]
        open(go, "w").close()  # the other job ends: its slice is free
        info = cluster.wait(grows, timeout=60)
        assert info.status is JobStatus.SUCCEEDED, info.error
        assert [(a.outcome, len(a.slices)) for a in info.attempts] == [
            (AttemptOutcome.RESIZED, 1),
            (AttemptOutcome.SUCCEEDED, 2),
        ]
        assert (info.preemptions, info.failures) == (0, 0)
        assert len(info.result) == 4 and {r["FRAY_NUM_SLICES"] for r in info.result} == {"2"}
        assert {r["FRAY_ELASTIC"] for r in info.result} == {"1"}
        # attempt 0's hosts were stopped gracefully: both checkpointed on SIGTERM
        assert sorted(p.name for p in marks.glob("checkpointed-a0-*")) == [
            f"checkpointed-a0-{info.attempts[0].slices[0]}-h{h}" for h in (0, 1)
        ]

        shrinks = cluster.launch(request("shrinks", hold=[0]))
        first = helpers.wait_for(
            lambda: (i := cluster.poll(shrinks)).status is JobStatus.RUNNING and i.attempts and i.attempts[0],
            what="running",
        )
        assert len(first.slices) == 2
        fleet.model.preempt(first.slices[1], restore_after=None)  # that slice is gone: the job shrinks to 1
        info = cluster.wait(shrinks, timeout=60)
        assert info.status is JobStatus.SUCCEEDED, info.error
        assert [(a.outcome, len(a.slices)) for a in info.attempts] == [
            (AttemptOutcome.PREEMPTED, 2),
            (AttemptOutcome.SUCCEEDED, 1),
        ]
        assert info.preemptions == 1 and len(info.result) == 2
        assert {r["FRAY_NUM_SLICES"] for r in info.result} == {"1"} and {r["FRAY_ELASTIC"] for r in info.result} == {
            "1"
        }
    finally:
        open(go, "w").close()
        cluster.close()
        fleet.close()


def test_the_cli_timeline_draws_a_resized_attempt() -> None:
    from fray_core.cli.output import timeline
    from fray_core.types import Attempt, JobInfo

    info = JobInfo(
        job_id="j",
        name="j",
        status=JobStatus.SUCCEEDED,
        submitted_at=100.0,
        finished_at=104.0,
        attempts=[
            Attempt(0, ["s-0"], 100.0, 102.0, AttemptOutcome.RESIZED, "resized", acquired_at=100.0),
            Attempt(1, ["s-0", "s-1"], 102.0, 104.0, AttemptOutcome.SUCCEEDED, acquired_at=102.0),
        ],
    )
    lines = timeline(info, width=21)
    assert lines[0] == "s-0 |0+++++++++1==========|"
    assert lines[-1] == "N attempt N starts  = succeeded  + resized (stopped to grow)  attempt 1 resized 1 -> 2 slices"
