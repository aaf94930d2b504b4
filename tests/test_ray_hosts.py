"""Host-level guarantees on Ray (the session's emulated cluster, conftest.py): no process the user's code
spawned outlives its job, a busy TPU device is a preemption naming the host, and ``preemptible=False`` on a
TPU request is never silently ignored."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for, write_whole

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig, create_environment  # noqa: E402
from fray_core.records import pid_alive  # noqa: E402
from fray_ray import RayCluster  # noqa: E402
from fray_ray.testing import FAST_RAY_POLICY  # noqa: E402

TPU = "v4-16"


def spawn_detached_child(marker_dir: str, hold: float) -> int:
    """Starts a daemon: a process in a new session whose parent exits at once (so it is nobody's child any
    more and survives a kill of this process, its group and its children), then holds."""
    out = subprocess.run(
        ["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    pid = int(out.stdout.strip())
    write_whole(Path(marker_dir, f"child-{os.environ['FRAY_HOST_ID']}"), str(pid))
    time.sleep(hold)
    return pid


def succeed() -> str:
    return os.environ["TPU_NAME"]


def request(fn: Any, **kw: Any) -> JobRequest:
    env = kw.pop("env", None)
    budget = kw.pop("max_retries_preemption", 0)
    return JobRequest(
        name=fn.__name__.replace("_", "-"),
        entrypoint=Entrypoint(callable=fn, function_args=kw),
        resources=ResourceConfig.with_tpu(TPU),
        environment=create_environment(env_vars=env) if env else None,
        max_retries_preemption=budget,
    )


def children(marker_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(marker_dir.glob("child-*"))]


@pytest.mark.parametrize("how", ["terminate", "job end"])
def test_no_process_the_host_spawned_outlives_the_job(ray_tpu_cluster: Any, tmp_path: Path, how: str) -> None:
    cluster = ray_tpu_cluster.cluster
    job_id = cluster.launch(
        request(spawn_detached_child, marker_dir=str(tmp_path), hold=120.0 if how == "terminate" else 0.0)
    )
    pids = wait_for(
        lambda: len(children(tmp_path)) == 2 and children(tmp_path), timeout=120, what="both hosts' children"
    )
    if how == "terminate":
        cluster.terminate(job_id)
        assert cluster.poll(job_id).status == JobStatus.STOPPED
    else:
        assert cluster.wait(job_id, timeout=120).status == JobStatus.SUCCEEDED
    for pid in pids:
        wait_for(lambda pid=pid: not pid_alive(pid), timeout=10, what=f"the host's detached child {pid} to be killed")


def test_a_busy_tpu_device_is_a_preemption_naming_the_host_and_a_stale_lockfile_is_removed(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    cluster = ray_tpu_cluster.cluster
    lockfile = tmp_path / "libtpu_lockfile"
    holder = open(lockfile, "w")  # this process holds the "device": every host finds it busy
    try:
        job_id = cluster.launch(request(succeed, env={"FRAY_TPU_LOCKFILE": str(lockfile)}, max_retries_preemption=30))
        wait_for(
            lambda: (a := cluster.poll(job_id).attempts) and a[0].outcome is not None,
            timeout=120,
            what="attempt 0 to end",
        )
    finally:
        holder.close()  # the holder is gone; its lockfile stays behind, stale
    info = cluster.wait(job_id, timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error
    first = info.attempts[0]
    assert first.outcome.value == "PREEMPTED" and info.failures == 0
    assert (
        "TpuBusyError: TPU device busy on fake-v4-16-" in first.cause and f"held by pid {os.getpid()}" in first.cause
    ), first.cause
    assert not lockfile.exists()
    assert any("removed stale" in line and str(lockfile) in line for line in cluster.logs(job_id))


def test_preemptible_false_on_tpu_fails_at_launch_unless_the_cluster_names_its_capacity(ray_tpu_cluster: Any) -> None:
    on_demand = JobRequest(
        name="od", entrypoint=Entrypoint(callable=succeed), resources=ResourceConfig.with_tpu(TPU, preemptible=False)
    )
    with pytest.raises(
        ValueError, match=r"preemptible: False .* no non-preemptible TPU capacity configured.*non_preemptible_tpu_label"
    ):
        ray_tpu_cluster.cluster.launch(on_demand)
    with pytest.raises(ValueError, match="RayCluster.non_preemptible_tpu_label: 'reserved' is not 'KEY=VALUE'"):
        RayCluster(address=ray_tpu_cluster.address, non_preemptible_tpu_label="reserved")
    # a label no slice carries: unschedulable (never the preemptible slices)
    reserved = RayCluster(
        address=ray_tpu_cluster.address,
        retry_policy=FAST_RAY_POLICY,
        warm_supervisor=False,
        non_preemptible_tpu_label="fray.io/capacity=reserved",
    )
    info = reserved.wait(reserved.launch(on_demand), timeout=120)
    assert (
        info.status == JobStatus.FAILED
        and "0 slice(s) of v4-16 labelled fray.io/capacity=reserved (non-preemptible)" in info.error
    )
    # a label the slices do carry: placed there
    ray_tpu_cluster.wait_settled()
    labelled = RayCluster(
        address=ray_tpu_cluster.address,
        retry_policy=FAST_RAY_POLICY,
        warm_supervisor=False,
        non_preemptible_tpu_label="ray.io/tpu-topology=2x2x2",
    )
    info = labelled.wait(labelled.launch(on_demand), timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error


# Built from source text so that cloudpickle ships it by value: a function of this test module would make
# the host import the module, and with it fray_core's types, which is what this test looks for.
_ns: dict[str, Any] = {"__name__": "fray_test_dynamic"}
exec(
    "def loaded_modules():\n"
    "    import sys\n"
    "    return sorted(m for m in sys.modules if m.split('.')[0] in ('fray_core', 'fray_local', 'fray_ray'))\n",
    _ns,
)
loaded_modules = _ns["loaded_modules"]


def test_a_host_imports_none_of_the_supervisors_machinery(ray_tpu_cluster: Any) -> None:
    """Every host of every attempt starts in a fresh worker, and what it imports before the user's function
    runs is on the critical path of every gang launch. The supervisor's handle (hosts report in through it)
    once made each host import the runner, the job store, the provider and the types: ~100 ms of CPU per
    host on 2 cores (bench/NOTES.md)."""
    cluster = ray_tpu_cluster.cluster
    info = cluster.wait(cluster.launch(request(loaded_modules)), timeout=120, raise_on_failure=True)
    heavy = {
        "fray_core.runner",
        "fray_core.records",
        "fray_core.supervisor",
        "fray_core.types",
        "fray_core.fleet",
        "fray_ray.provider",
    }
    for modules in info.result:
        assert "fray_ray._host" in modules  # it is the host's code
        assert not heavy & set(modules), modules


def sleep_for(seconds: float) -> str:
    time.sleep(seconds)
    return os.environ["TPU_NAME"]


def test_wait_learns_of_the_end_from_the_supervisor_not_by_polling(ray_tpu_cluster: Any) -> None:
    """``wait`` blocks on the job's supervisor (a call that returns when the final record is written) instead
    of reading the record every 0.1 s: fewer than 2 looks per second of waiting."""
    cluster = ray_tpu_cluster.cluster
    job_id = cluster.launch(request(sleep_for, seconds=3.0))
    looks = 0
    poll = cluster.poll

    def counting(j: Any) -> Any:
        nonlocal looks
        looks += 1
        return poll(j)

    cluster.poll = counting
    try:
        t0 = time.monotonic()
        info = cluster.wait(job_id, timeout=120)
        waited = time.monotonic() - t0
    finally:
        del cluster.poll
    assert info.status is JobStatus.SUCCEEDED
    assert waited >= 3.0
    assert looks <= 2 * waited + 2, (looks, waited)


def leave_a_mess(marker_dir: str) -> dict[str, Any]:
    """A CPU job's host that changes its process every way a job can, and starts a daemon."""
    import sys

    seen = {
        "pid": os.getpid(),
        "leaked_env": "FRAY_TEST_LEAK" in os.environ,
        "leaked_path": "/fray-test-leak" in sys.path,
        "cwd": os.getcwd(),
        "job": os.environ["FRAY_JOB_ID"],
    }
    os.environ["FRAY_TEST_LEAK"] = "1"
    sys.path.append("/fray-test-leak")
    os.chdir("/")
    out = subprocess.run(
        ["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    write_whole(Path(marker_dir, f"child-{seen['job']}"), out.stdout.strip())
    print(f"mess made by {seen['job']}", flush=True)
    print(f"and on stderr by {seen['job']}", file=sys.stderr, flush=True)
    return seen


def test_a_cpu_jobs_host_runs_in_a_worker_ray_reuses_which_it_leaves_as_it_found_it(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    """A fresh worker per host cost a small job ~1 CPU-second; a CPU replica runs in a worker Ray reuses. Each
    job sees none of the previous job's environment, path or cwd, its daemon dies with it, and its log has
    its own lines only (fds 1 and 2 restored). Several jobs back to back: at least one reuses a worker (Ray
    keeps an idle worker ~1 s on the emulated cluster, whose pool is otherwise off)."""
    cluster = ray_tpu_cluster.cluster
    req = JobRequest(
        name="mess",
        entrypoint=Entrypoint(callable=leave_a_mess, function_args={"marker_dir": str(tmp_path)}),
        resources=ResourceConfig.with_cpu(cpu=1),
    )
    seen: list[dict[str, Any]] = []
    for _ in range(6):
        job_id = cluster.launch(req)
        info = cluster.wait(job_id, timeout=120, raise_on_failure=True)
        [result] = info.result
        seen.append(result)
        assert not result["leaked_env"] and not result["leaked_path"], seen
        assert result["cwd"] == seen[0]["cwd"] != "/", seen
        child = int((tmp_path / f"child-{job_id}").read_text())
        wait_for(lambda child=child: not pid_alive(child), timeout=10, what=f"{job_id}'s daemon {child} to be killed")
        lines = [line for line in cluster.logs(job_id) if "mess made" in line or "on stderr" in line]
        assert len(lines) == 2 and all(job_id in line for line in lines), lines
        if len({s["pid"] for s in seen}) < len(seen):
            break
    assert len({s["pid"] for s in seen}) < len(seen), f"no worker reused in {len(seen)} jobs: {seen}"
