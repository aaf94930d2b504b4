"""The same TPU scenarios (levanter's run_on_pod test suite, and more) on every backend:
``LocalCluster()`` (slices made on demand), ``LocalCluster(fleet=TpuFleet({"v4-16": 2}))`` and the
emulated multi-node Ray TPU cluster (one per test session, see tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from helpers import check_hosts, wait_for

from fray_core import Cluster, Entrypoint, JobRequest, JobStatus, ResourceConfig, create_environment
from fray_core.records import pid_alive
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY

TPU = "v4-16"  # 2 hosts per slice; every backend below has 2 slices of it


@attrs.define
class Harness:
    name: str
    cluster: Cluster
    preempt: Callable[..., None]
    fixed_capacity: bool  # False: slices are made on demand, so nothing is ever short of capacity
    spec: str  # a cluster spec another process uses to reach the same jobs
    all_free: Callable[[], bool] = lambda: True  # both slices exist and no job holds them


def _ray_all_free(fake: object) -> Callable[[], bool]:
    def check() -> bool:
        import ray

        from fray_core.tpu import get_tpu_spec

        fake.wait_settled()  # type: ignore[attr-defined]
        live = len(fake.slices().get(TPU, []))  # type: ignore[attr-defined]
        return live == 2 and ray.available_resources().get(get_tpu_spec(TPU).head_resource, 0) >= 2

    return check


@pytest.fixture(params=["local", "fleet", pytest.param("ray", marks=pytest.mark.ray)])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "ray":
        try:
            fake = request.getfixturevalue("ray_tpu_cluster")
        except pytest.FixtureLookupError:
            pytest.skip("the emulated Ray cluster fixture is not available")
        yield Harness("ray", fake.cluster, fake.preempt, True, f"ray?address={fake.address}", _ray_all_free(fake))
        return
    fleet = TpuFleet({TPU: 2}, state_dir=str(tmp_path / "fleet")) if request.param == "fleet" else None
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    all_free = (lambda: fleet.describe(TPU).startswith("2 free")) if fleet is not None else (lambda: True)
    yield Harness(request.param, cluster, cluster.fleet.preempt, fleet is not None, f"local?jobs_dir={tmp_path / 'jobs'}", all_free)
    cluster.close()



# ---------------------------------------------------------------------------- functions the hosts run


def host_info(marker_dir: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("FRAY_", "TPU_", "MEGASCALE_"))}
    env["pid"] = str(os.getpid())
    return env


def _mark(marker_dir: str) -> None:
    name = f"a{os.environ['FRAY_ATTEMPT']}-s{os.environ['FRAY_SLICE_ID']}-h{os.environ['FRAY_HOST_ID']}"
    Path(marker_dir, name + ".tmp").write_text(str(os.getpid()))
    os.replace(Path(marker_dir, name + ".tmp"), Path(marker_dir, name))


def run_until_released(marker_dir: str) -> dict[str, str]:
    """Marks that it started, then runs until the test drops a `release-a<attempt>` file (or 120 s)."""
    _mark(marker_dir)
    release = Path(marker_dir, f"release-a{os.environ['FRAY_ATTEMPT']}")
    end = time.monotonic() + 120
    while not release.exists() and time.monotonic() < end:
        time.sleep(0.05)
    return host_info()


def fail_on_slice0_first_attempt(marker_dir: str) -> dict[str, str]:
    if os.environ["FRAY_ATTEMPT"] == "0" and os.environ["FRAY_SLICE_ID"] == "0" and os.environ["FRAY_HOST_ID"] == "0":
        raise RuntimeError("slice 0 host 0 failed in attempt 0")
    return host_info()


def always_fail_on_slice1(marker_dir: str) -> dict[str, str]:
    if os.environ["FRAY_SLICE_ID"] == "1":
        raise ValueError(f"slice 1 is broken (attempt {os.environ['FRAY_ATTEMPT']})")
    return host_info()


def always_fail(marker_dir: str) -> None:
    raise ValueError("this function always fails")


def tpu_job(fn: Callable[..., object], marker_dir: Path, slices: int | list[int] = 1, **kw: int) -> JobRequest:
    return JobRequest(
        name=fn.__name__.replace("_", "-"),
        entrypoint=Entrypoint(callable=fn, function_args={"marker_dir": str(marker_dir)}),
        resources=ResourceConfig.with_tpu(TPU, slice_count=slices),
        **kw,
    )


def markers(marker_dir: Path, attempt: int) -> list[Path]:
    return sorted(marker_dir.glob(f"a{attempt}-s*-h*"))


# ------------------------------------------------------------------------------------------- scenarios


def test_single_slice_simple_run(harness: Harness, tmp_path: Path) -> None:
    job_id = harness.cluster.launch(tpu_job(host_info, tmp_path))
    info = harness.cluster.wait(job_id, timeout=120, raise_on_failure=True)
    check_hosts(info.result, 1, 0)
    assert [a.outcome.value for a in info.attempts] == ["SUCCEEDED"]


def test_single_slice_run_twice(harness: Harness, tmp_path: Path) -> None:
    for _ in range(2):  # the slice is released after the first job
        info = harness.cluster.wait(harness.cluster.launch(tpu_job(host_info, tmp_path)), timeout=120)
        assert info.status == JobStatus.SUCCEEDED
        check_hosts(info.result, 1, 0)


def test_multislice_simple_run(harness: Harness, tmp_path: Path) -> None:
    info = harness.cluster.wait(harness.cluster.launch(tpu_job(host_info, tmp_path, slices=2)), timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error
    check_hosts(info.result, 2, 0)
    assert len(info.attempts[0].slices) == 2


def test_multislice_fail_once_recomputes_env(harness: Harness, tmp_path: Path) -> None:
    job = tpu_job(fail_on_slice0_first_attempt, tmp_path, slices=2, max_retries_failure=1)
    info = harness.cluster.wait(harness.cluster.launch(job), timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error
    assert [a.outcome.value for a in info.attempts] == ["FAILED", "SUCCEEDED"]
    assert "RuntimeError: slice 0 host 0 failed in attempt 0" in info.attempts[0].cause
    check_hosts(info.result, 2, 1)


def test_multislice_one_slice_always_fails(harness: Harness, tmp_path: Path) -> None:
    job = tpu_job(always_fail_on_slice1, tmp_path, slices=2, max_retries_failure=2)
    info = harness.cluster.wait(harness.cluster.launch(job), timeout=120)
    assert info.status == JobStatus.FAILED
    assert [a.outcome.value for a in info.attempts] == ["FAILED"] * 3 and info.failures == 3
    assert all("ValueError: slice 1 is broken" in a.cause for a in info.attempts)
    assert "failed 3 time(s), max_retries_failure=2" in info.error


def test_single_slice_catches_failure(harness: Harness, tmp_path: Path) -> None:
    info = harness.cluster.wait(harness.cluster.launch(tpu_job(always_fail, tmp_path)), timeout=120)
    assert info.status == JobStatus.FAILED and info.failures == 1 and info.preemptions == 0
    assert "ValueError: this function always fails" in info.attempts[0].cause
    assert "Traceback" in info.attempts[0].cause and "always_fail" in info.attempts[0].cause


def test_preemption_is_retried_on_a_restored_slice(harness: Harness, tmp_path: Path) -> None:
    job_id = harness.cluster.launch(tpu_job(run_until_released, tmp_path, slices=2, max_retries_preemption=2))
    wait_for(lambda: len(markers(tmp_path, 0)) == 4, what="all 4 hosts of attempt 0 to start")
    victim = harness.cluster.poll(job_id).attempts[0].slices[1]
    harness.preempt(victim, restore_after=0.0)
    wait_for(lambda: len(markers(tmp_path, 1)) == 4, timeout=120, what="all 4 hosts of attempt 1 to start")
    (tmp_path / "release-a1").touch()
    info = harness.cluster.wait(job_id, timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert info.preemptions == 1 and info.failures == 0
    check_hosts(info.result, 2, 1)
    # every host of the preempted attempt is gone, the surviving slice's included (all-or-nothing)
    for m in markers(tmp_path, 0):
        pid = int(m.read_text())
        wait_for(lambda pid=pid: not pid_alive(pid), what=f"host {m.name} of the preempted attempt to die")


def test_preemption_budget_exhausted(harness: Harness, tmp_path: Path) -> None:
    job_id = harness.cluster.launch(tpu_job(run_until_released, tmp_path, max_retries_preemption=1))
    for attempt in (0, 1):
        wait_for(lambda a=attempt: len(markers(tmp_path, a)) == 2, timeout=120, what=f"attempt {attempt} to start")
        harness.preempt(harness.cluster.poll(job_id).attempts[attempt].slices[0], restore_after=0.0)
    info = harness.cluster.wait(job_id, timeout=120)
    assert info.status == JobStatus.FAILED
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "PREEMPTED"]
    assert info.preemptions == 2 and info.failures == 0
    assert "preempted 2 time(s), max_retries_preemption=1" in info.error


def test_variable_multislice_takes_the_largest_count_that_fits(harness: Harness, tmp_path: Path) -> None:
    # "largest that fits" is judged at acquire time: start from a fleet whose 2 slices are both free
    # (an earlier test's preempted slice may still be coming back)
    wait_for(harness.all_free, timeout=120, what="both slices to be free")
    info = harness.cluster.wait(harness.cluster.launch(tpu_job(host_info, tmp_path, slices=[1, 2])), timeout=120)
    assert info.status == JobStatus.SUCCEEDED
    check_hosts(info.result, 2, 0)
    if not harness.fixed_capacity:
        return
    # with one slice held by another job, [1, 2] runs on the one that is left
    blocker_dir = tmp_path / "blocker"
    blocker_dir.mkdir()
    blocker = harness.cluster.launch(tpu_job(run_until_released, blocker_dir))
    wait_for(lambda: len(markers(blocker_dir, 0)) == 2, what="the blocker to hold a slice")
    info = harness.cluster.wait(harness.cluster.launch(tpu_job(host_info, tmp_path, slices=[1, 2])), timeout=120)
    assert info.status == JobStatus.SUCCEEDED
    check_hosts(info.result, 1, 0)
    (blocker_dir / "release-a0").touch()
    assert harness.cluster.wait(blocker, timeout=120).status == JobStatus.SUCCEEDED


def test_terminate_stops_every_host_and_frees_capacity(harness: Harness, tmp_path: Path) -> None:
    job_id = harness.cluster.launch(tpu_job(run_until_released, tmp_path, slices=2))
    wait_for(lambda: len(markers(tmp_path, 0)) == 4, what="all hosts to start")
    harness.cluster.terminate(job_id)
    info = harness.cluster.wait(job_id, timeout=60)
    assert info.status == JobStatus.STOPPED and info.attempts[-1].outcome.value == "CANCELLED"
    for m in markers(tmp_path, 0):
        pid = int(m.read_text())
        wait_for(lambda pid=pid: not pid_alive(pid), what=f"host {m.name} to die")
    # both slices are free again: a 2-slice job runs at once
    again = harness.cluster.wait(harness.cluster.launch(tpu_job(host_info, tmp_path, slices=2)), timeout=120)
    assert again.status == JobStatus.SUCCEEDED


def test_bad_input_fails_at_launch(harness: Harness, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"TpuConfig.type: unknown TPU type 'v4-15'"):
        ResourceConfig.with_tpu("v4-15")
    with pytest.raises(TypeError, match="launch: expected a JobRequest"):
        harness.cluster.launch("not a request")  # type: ignore[arg-type]
    unpicklable = JobRequest(name="x", entrypoint=Entrypoint(callable=host_info, function_args={"marker_dir": threading.Lock()}))
    with pytest.raises(TypeError, match=r"Entrypoint.callable: .*host_info.* cannot be pickled"):
        harness.cluster.launch(unpicklable)
    with pytest.raises(KeyError, match="no-such-job"):
        harness.cluster.poll("no-such-job")


def test_cpu_replicas_and_binaries(harness: Harness, tmp_path: Path) -> None:
    req = JobRequest(name="cpu", entrypoint=Entrypoint(callable=host_info), resources=ResourceConfig(replicas=3))
    info = harness.cluster.wait(harness.cluster.launch(req), timeout=120)
    assert info.status == JobStatus.SUCCEEDED
    assert [r["FRAY_REPLICA_ID"] for r in info.result] == ["0", "1", "2"]
    assert not any(k.startswith(("TPU_", "MEGASCALE_")) for r in info.result for k in r)
    bad = JobRequest(name="bin", entrypoint=Entrypoint.from_binary("sh", ["-c", "echo to-stderr >&2; exit 4"]))
    info = harness.cluster.wait(harness.cluster.launch(bad), timeout=120)
    assert info.status == JobStatus.FAILED and "exit code 4" in info.attempts[0].cause
    assert "to-stderr" in info.attempts[0].cause
    killed = JobRequest(name="killed", entrypoint=Entrypoint.from_binary("sh", ["-c", "kill -9 $$"]))
    info = harness.cluster.wait(harness.cluster.launch(killed), timeout=120)
    assert info.status == JobStatus.FAILED and "killed by SIGKILL" in info.attempts[0].cause  # the signal, by name


def test_env_vars_reach_every_host(harness: Harness, tmp_path: Path) -> None:
    req = JobRequest(
        name="env",
        entrypoint=Entrypoint(callable=host_info),
        resources=ResourceConfig.with_tpu(TPU),
        environment=create_environment(env_vars={"FRAY_TEST_FLAG": "on", "WANDB_MODE": "offline"}),
    )
    info = harness.cluster.wait(harness.cluster.launch(req), timeout=120, raise_on_failure=True)
    assert [r.get("FRAY_TEST_FLAG") for r in info.result] == ["on", "on"]
    assert all(r.get("FRAY_JOB_ID") == info.job_id for r in info.result)


def test_a_job_is_pollable_from_a_second_process(harness: Harness, tmp_path: Path) -> None:
    job_id = harness.cluster.launch(tpu_job(run_until_released, tmp_path))
    wait_for(lambda: len(markers(tmp_path, 0)) == 2, what="the job's hosts to start")
    # RUNNING once every host reported in (on Ray the report reaches the runner a moment after the marker)
    wait_for(lambda: harness.cluster.poll(job_id).status == JobStatus.RUNNING, what="the job to be RUNNING")
    script = (
        "import json, sys\n"
        "from fray_core.cluster import cluster_from_spec\n"
        "c = cluster_from_spec(sys.argv[1])\n"
        "info = c.poll(sys.argv[2])\n"
        "print(json.dumps({'status': info.status.value, 'slices': info.attempts[-1].slices if info.attempts else []}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, harness.spec, job_id], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"status": "RUNNING", "slices": harness.cluster.poll(job_id).attempts[-1].slices}
    (tmp_path / "release-a0").touch()
    info = harness.cluster.wait(job_id, timeout=120)
    assert info.status == JobStatus.SUCCEEDED
    check_hosts(info.result, 1, 0)
