"""The simulated TPU fleet: fault plans, dirty hosts, capacity drops, unschedulable requests, chaos."""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
import pytest

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_local import DirtyHost, DropCapacity, FailHost, FaultPlan, LocalCluster, PreemptSlice, TpuFleet
from fray_local.testing import TEST_POLICY


def slow_host(seconds: float = 1.5) -> str:
    time.sleep(seconds)
    return f"{os.environ['TPU_NAME']}/{os.environ['TPU_WORKER_ID']}@{os.environ['FRAY_ATTEMPT']}"


def quick_host() -> str:
    return f"{os.environ['TPU_NAME']}/{os.environ['TPU_WORKER_ID']}@{os.environ['FRAY_ATTEMPT']}"


def tpu_request(fn=quick_host, slices: int = 2, **kw) -> JobRequest:
    return JobRequest(
        name="sim",
        entrypoint=Entrypoint(callable=fn),
        resources=ResourceConfig.with_tpu("v4-16", slice_count=slices),
        **kw,
    )


def make_cluster(tmp_path: Path, fleet: TpuFleet, **policy) -> LocalCluster:
    return LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=attrs.evolve(TEST_POLICY, **policy))


def outcomes(info) -> list[str]:
    return [a.outcome.value for a in info.attempts]


def test_fleet_has_named_slices_with_hosts_from_the_catalog() -> None:
    fleet = TpuFleet({"v4-16": 2, "v5litepod-16": 1})
    assert [(s.name, s.hosts) for s in fleet.model.slices()] == [("v4-16-0", 2), ("v4-16-1", 2), ("v5litepod-16-0", 4)]
    assert fleet.model.capacity() == {"v4-16": 2, "v5litepod-16": 1}
    with pytest.raises(ValueError, match="^TpuFleet: capacity: unknown TPU type 'v4-3'"):  # the argument, named
        TpuFleet({"v4-3": 1})


def test_fault_plan_preemption_is_recovered(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 2}, fault_plan=FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=0.3)]))
    cluster = make_cluster(tmp_path, fleet)
    info = cluster.wait(cluster.launch(tpu_request(slow_host)), timeout=60)
    assert info.status == JobStatus.SUCCEEDED and outcomes(info) == ["PREEMPTED", "SUCCEEDED"]
    assert "v4-16-1 was preempted" in info.attempts[0].cause
    assert info.result == ["v4-16-0/0@1", "v4-16-0/1@1", "v4-16-1/0@1", "v4-16-1/1@1"]
    assert fleet.model.slice("v4-16-1").preemptions == 1
    cluster.close()


def test_injected_host_failure_counts_against_the_failure_budget(tmp_path: Path) -> None:
    fleet = TpuFleet(
        {"v4-16": 2}, fault_plan=FaultPlan([FailHost(attempt=0, slice_index=1, host_index=1, message="bad HBM")])
    )
    cluster = make_cluster(tmp_path, fleet)
    info = cluster.wait(cluster.launch(tpu_request(max_retries_failure=1)), timeout=60)
    assert outcomes(info) == ["FAILED", "SUCCEEDED"] and info.failures == 1
    assert (
        "slice 1 (v4-16-1) host 1" in info.attempts[0].cause
        and "SimulatedHostFailure: bad HBM" in info.attempts[0].cause
    )
    cluster.close()


def test_a_crashed_host_stays_dirty_until_cleaned_before_the_next_start(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 1}, fault_plan=FaultPlan([FailHost(attempt=0, host_index=1, crash=True)]))
    cluster = make_cluster(tmp_path, fleet)
    job_id = cluster.launch(tpu_request(slices=1, max_retries_failure=1))
    info = cluster.wait(job_id, timeout=60)
    assert outcomes(info) == ["FAILED", "SUCCEEDED"]
    assert "exited with code 139" in info.attempts[0].cause
    assert any("[a1 s0/h1] [fray] removed stale" in line and "libtpu_lockfile" in line for line in cluster.logs(job_id))
    assert not fleet.is_dirty("v4-16-0", 1)
    cluster.close()


def test_without_hygiene_a_dirty_host_is_a_retryable_device_error_not_the_users_fault(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 1}, clean_lockfiles=False, fault_plan=FaultPlan([DirtyHost(attempt=0, host_index=0)]))
    cluster = make_cluster(tmp_path, fleet)
    info = cluster.wait(cluster.launch(tpu_request(slices=1, max_retries_preemption=1)), timeout=60)
    assert info.status == JobStatus.FAILED and info.failures == 0
    assert outcomes(info) == ["PREEMPTED", "PREEMPTED"]  # the lockfile stays: nobody cleans it
    assert "DeviceBusyError: TPU in use" in info.attempts[0].cause
    assert "preempted 2 time(s)" in info.error
    cluster.close()


def test_waiting_for_capacity_is_unschedulable_with_a_diagnosis_then_runs(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 2})
    cluster = make_cluster(tmp_path, fleet, schedule_timeout=0.3)
    fleet.model.drop_capacity("v4-16", to=1, duration=1.5)
    info = cluster.wait(cluster.launch(tpu_request(max_retries_preemption=50)), timeout=60)
    assert info.status == JobStatus.SUCCEEDED
    assert outcomes(info)[0] == "UNSCHEDULABLE" and outcomes(info)[-1] == "SUCCEEDED"
    assert "asked: 2 x v4-16; fleet has: 1 free, 0 busy, 1 preempted" in info.attempts[0].cause
    assert info.preemptions == len(info.attempts) - 1  # unschedulable attempts count against that budget
    cluster.close()


def test_capacity_drop_in_a_fault_plan_preempts_running_slices(tmp_path: Path) -> None:
    fleet = TpuFleet(
        {"v4-16": 2}, fault_plan=FaultPlan([DropCapacity(attempt=0, tpu_type="v4-16", to=0, duration=0.5, after=0.3)])
    )
    cluster = make_cluster(tmp_path, fleet)
    info = cluster.wait(cluster.launch(tpu_request(slow_host)), timeout=60)
    assert info.status == JobStatus.SUCCEEDED and outcomes(info)[0] == "PREEMPTED"
    cluster.close()


def test_a_request_that_can_never_fit_fails_at_once(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, TpuFleet({"v4-16": 2}))
    info = cluster.wait(cluster.launch(tpu_request(slices=3)), timeout=30)
    assert info.status == JobStatus.FAILED and outcomes(info) == ["UNSCHEDULABLE"]
    assert (info.preemptions, info.failures) == (0, 0)  # as docs/index.md's JSON table says: no budget spent
    assert "asked: 3 x v4-16; fleet has 2 v4-16 slice(s) in all" in info.error and "can never fit" in info.error
    other = cluster.wait(
        cluster.launch(
            JobRequest(name="x", entrypoint=Entrypoint(callable=quick_host), resources=ResourceConfig.with_tpu("v5p-8"))
        ),
        timeout=30,
    )
    assert other.status == JobStatus.FAILED and "fleet has 0 v5p-8 slice(s) in all" in other.error
    cluster.close()


def test_a_slice_gone_for_good_shrinks_the_fleet(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 2})
    fleet.model.preempt("v4-16-0", restore_after=None)
    assert fleet.model.capacity() == {"v4-16": 1}
    cluster = make_cluster(tmp_path, fleet)
    info = cluster.wait(cluster.launch(tpu_request(slices=[1, 2])), timeout=30)
    assert info.status == JobStatus.SUCCEEDED and info.attempts[0].slices == ["v4-16-1"]
    cluster.close()


def test_chaos_replays_exactly_from_its_seed(tmp_path: Path) -> None:
    plan = FaultPlan.chaos(seed=4, rate=0.5, max_slices=2, horizon=0.2)
    assert plan == FaultPlan.chaos(seed=4, rate=0.5, max_slices=2, horizon=0.2)
    assert plan != FaultPlan.chaos(seed=3, rate=0.5, max_slices=2, horizon=0.2)
    # every chaos preemption lands within 0.2 s, hosts run 1.5 s: the outcomes follow from the plan alone
    expected, a = [], 0
    while True:
        hit = bool(plan.for_attempt(a))
        expected.append("PREEMPTED" if hit else "SUCCEEDED")
        if not hit:
            break
        a += 1
    runs = []
    for i in range(2):
        fleet = TpuFleet({"v4-16": 2})
        fleet.model.chaos(seed=4, rate=0.5, max_slices=2, horizon=0.2)
        cluster = make_cluster(tmp_path / str(i), fleet)
        info = cluster.wait(cluster.launch(tpu_request(slow_host)), timeout=120)
        runs.append(outcomes(info))
        cluster.close()
    assert runs[0] == runs[1] == expected


def test_pytest_fixtures_give_a_cluster_on_a_fleet(local_cluster: LocalCluster, tpu_fleet: TpuFleet) -> None:
    from fray_core import current_cluster

    assert current_cluster() is local_cluster and local_cluster.fleet is tpu_fleet
    info = local_cluster.wait(local_cluster.launch(tpu_request(slices=2)), timeout=60)
    assert info.status == JobStatus.SUCCEEDED and len(info.result) == 4


def slower_host() -> str:
    return slow_host(2.5)


def test_a_fault_belongs_to_the_attempt_it_was_armed_for(tmp_path: Path) -> None:
    """Seed 167 preempts slice 0 of attempt 0 at 0.13 s and slice 1 at 1.45 s, nothing in attempt 1: attempt 0
    ends at the first, and its second fault must die with it instead of landing on attempt 1 (or on the
    free slice). Run twice: the same seed replays the same faults."""
    plan = FaultPlan.chaos(seed=167, rate=0.5, max_slices=2, horizon=1.5)
    assert [(f.slice_index, f.after) for f in plan.for_attempt(0)] == [(0, 0.132), (1, 1.45)] and not plan.for_attempt(
        1
    )
    for i in range(2):
        fleet = TpuFleet({"v4-16": 2}, fault_plan=plan)
        cluster = make_cluster(tmp_path / str(i), fleet)
        info = cluster.wait(cluster.launch(tpu_request(slower_host)), timeout=120)
        cluster.close()
        assert outcomes(info) == ["PREEMPTED", "SUCCEEDED"], [a.cause for a in info.attempts]
        assert [fleet.model.slice(n).preemptions for n in ("v4-16-0", "v4-16-1")] == [1, 0]


def test_a_broken_host_fails_every_process_with_a_device_error_until_repaired(tmp_path: Path) -> None:
    fleet = TpuFleet({"v4-16": 1})
    fleet.model.break_host("v4-16-0", 1)
    cluster = make_cluster(tmp_path, fleet)
    info = cluster.wait(cluster.launch(tpu_request(slices=1, max_retries_preemption=1)), timeout=60)
    assert info.status == JobStatus.FAILED and outcomes(info) == ["PREEMPTED", "PREEMPTED"] and info.failures == 0
    assert "TpuDeviceError: the TPU device of v4-16-0 host 1 is broken" in info.attempts[0].cause
    assert "slice 0 (v4-16-0) host 1" in info.attempts[0].cause
    assert fleet.model.slice("v4-16-0").preemptions == 0  # the slice itself was not preempted
    fleet.model.repair_host("v4-16-0", 1)
    info = cluster.wait(cluster.launch(tpu_request(slices=1)), timeout=60)
    assert outcomes(info) == ["SUCCEEDED"] and info.result == ["v4-16-0/0@0", "v4-16-0/1@0"]
    cluster.close()


def test_the_fleet_is_its_model_used_from_any_thread_and_its_old_names_point_there() -> None:
    """``TpuFleet.model`` is the one fleet model (no copy of its names on ``TpuFleet``): calls from another
    thread wake a job waiting for capacity, a stale lockfile shows in the model's host health, and the old
    ``fleet.preempt``/``fleet.fault_plan = ...`` still work while saying where they went."""
    import threading

    from fray_core.fleet import HostHealth, Slice

    fleet = TpuFleet({"v4-16": 1})
    try:
        assert not {"preempt", "describe", "slices", "fault_plan", "break_host", "chaos"} & set(vars(TpuFleet))
        assert isinstance(fleet.model.slice("v4-16-0"), Slice)
        fleet.model.occupy("v4-16-0")
        got: list[object] = []
        waiter = threading.Thread(
            target=lambda: got.extend(fleet.acquire("job", "v4-16", [1], deadline=time.monotonic() + 30))
        )
        waiter.start()
        fleet.model.vacate("v4-16-0")  # from this thread: the waiting job gets the slice
        waiter.join(timeout=30)
        assert [lease.name for lease in got] == ["v4-16-0"]  # type: ignore[attr-defined]
        with open(fleet.lockfile("v4-16-0", 1), "w") as f:
            f.write("left by a process that died hard")
        assert fleet.model.host_health("v4-16-0", 1) is HostHealth.DIRTY
        assert fleet.model.clean("v4-16-0", 1) and not fleet.is_dirty("v4-16-0", 1)
        with pytest.warns(DeprecationWarning, match=r"use fleet\.model\.describe"):
            assert fleet.describe("v4-16") == fleet.model.describe("v4-16")  # type: ignore[attr-defined]
        plan = FaultPlan([PreemptSlice(attempt=0)])
        with pytest.warns(DeprecationWarning, match=r"set fleet\.model\.fault_plan"):
            fleet.fault_plan = plan  # type: ignore[misc]
        assert fleet.model.fault_plan is plan
        with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
            fleet.nonsense  # type: ignore[attr-defined]  # noqa: B018
    finally:
        fleet.close()
