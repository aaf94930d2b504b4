"""``@job``: the three call forms on the local backend (with and without a simulated fleet), argument errors
at decoration time, metadata kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fray_core import (
    EnvironmentConfig,
    JobFailedError,
    JobStatus,
    ResourceConfig,
    TpuConfig,
    job,
    using_cluster,
)
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY


@pytest.fixture
def cluster(tmp_path: Path):
    c = LocalCluster(jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    with using_cluster(c):
        yield c
    c.close()


@pytest.fixture
def fleet_cluster(tmp_path: Path):
    fleet = TpuFleet({"v4-16": 2}, state_dir=str(tmp_path / "fleet"))
    c = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    with using_cluster(c):
        yield c
    c.close()


@job(tpu="v4-16", slices=2, max_retries_preemption=10, max_retries_failure=1)
def where(steps: int, scale: int = 1) -> tuple[int, str, str, str, int]:
    """Returns where it ran."""
    return (
        steps * scale,
        os.environ["TPU_NAME"],
        os.environ["FRAY_SLICE_ID"],
        os.environ["TPU_WORKER_ID"],
        os.getpid(),
    )


@job(resources=ResourceConfig(replicas=3), name="cpu-gang", environment=EnvironmentConfig(env_vars={"MY_VAR": "v"}))
def replica() -> tuple[str, str]:
    return os.environ["FRAY_REPLICA_ID"], os.environ["MY_VAR"]


@job
def plain(x: int) -> int:
    return x + 1


@job(tpu="v4-16", slices=2)
def my_pid() -> int:
    return os.getpid()


@job(max_retries_failure=1)
def always_fails() -> None:
    raise ValueError("nope")


def test_call_runs_a_job_on_the_simulated_fleet_and_returns_per_host_results(fleet_cluster: LocalCluster) -> None:
    out = where(5, scale=2)
    assert [(r[0], r[2], r[3]) for r in out] == [(10, "0", "0"), (10, "0", "1"), (10, "1", "0"), (10, "1", "1")]
    assert {r[1] for r in out} == {"v4-16-0", "v4-16-1"}
    assert len({r[4] for r in out} | {os.getpid()}) == 5  # four host processes, none of them this one
    (info,) = fleet_cluster.list_jobs()
    assert info.name == "where" and info.status is JobStatus.SUCCEEDED
    assert info.request_summary["max_retries_preemption"] == 10
    assert info.request_summary["max_retries_failure"] == 1


def test_launch_returns_the_job_id_at_once(fleet_cluster: LocalCluster) -> None:
    job_id = where.launch(3)
    info = fleet_cluster.wait(job_id, timeout=120)
    assert info.status is JobStatus.SUCCEEDED
    assert [r[0] for r in info.result] == [3, 3, 3, 3]


def test_local_calls_the_plain_function_in_this_process(cluster: LocalCluster) -> None:
    assert plain.local(1) == 2
    assert my_pid.local() == os.getpid()
    assert cluster.list_jobs() == []


def test_resources_name_environment_and_bare_form(cluster: LocalCluster) -> None:
    assert replica() == [("0", "v"), ("1", "v"), ("2", "v")]
    assert plain(41) == [42]
    assert [i.name for i in cluster.list_jobs()] == ["cpu-gang", "plain"]


def test_failure_raises_job_failed_error_after_the_failure_budget(cluster: LocalCluster) -> None:
    with pytest.raises(JobFailedError) as e:
        always_fails()
    info = e.value.info
    assert info.status is JobStatus.FAILED and info.failures == 2  # max_retries_failure=1: two attempts
    assert "ValueError: nope" in info.attempts[-1].cause


def test_metadata_is_kept() -> None:
    assert where.__name__ == "where" and where.__doc__ == "Returns where it ran."
    assert where.__wrapped__.__name__ == "where"
    assert where.request.resources == ResourceConfig(device=TpuConfig(type="v4-16"), replicas=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"tpu": "v4-17"}, ValueError, ["v4-17"]),
        ({"tpu": "v4-16", "slices": 0}, ValueError, ["replicas", "0", ">= 1"]),
        ({"tpu": "v4-16", "slices": [1, 0]}, ValueError, ["replicas", "0"]),
        ({"slices": 2}, ValueError, ["slices=2", "tpu="]),
        ({"tpu": "v4-16", "resources": ResourceConfig()}, ValueError, ["either", "resources="]),
        ({"resources": "v4-16"}, TypeError, ["resources", "ResourceConfig"]),
        ({"max_retries_failure": -1}, ValueError, ["max_retries_failure", "-1", ">= 0"]),
        ({"max_retries_preemption": "10"}, ValueError, ["max_retries_preemption", "'10'"]),
        ({"name": ""}, ValueError, ["JobRequest.name"]),
        ({"environment": {"A": "b"}}, TypeError, ["JobRequest.environment"]),
    ],
)
def test_bad_arguments_fail_at_decoration_time(kwargs: dict, error: type, words: list[str]) -> None:
    with pytest.raises(error) as e:
        job(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_decorating_twice_or_a_non_function_fails() -> None:
    with pytest.raises(TypeError, match="already a job function"):
        job(plain)
    with pytest.raises(TypeError, match="expected a function"):
        job(tpu="v4-16")(3)  # type: ignore[arg-type]
