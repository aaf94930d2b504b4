"""LocalCluster: real subprocesses, env, logs, retries, terminate, binaries, records, the job context."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fray_core import (
    CpuConfig,
    Entrypoint,
    JobFailedError,
    JobNotFoundError,
    JobRequest,
    JobStatus,
    ResourceConfig,
    create_environment,
    current_cluster,
    fray_job_ctx,
    using_cluster,
)
from fray_core.records import pid_alive
from fray_local import LocalCluster
from fray_local.testing import TEST_POLICY

import helpers


@pytest.fixture
def cluster(tmp_path: Path):
    c = LocalCluster(jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    with using_cluster(c):
        yield c
    c.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll a condition with a deadline (for state owned by other processes)."""
    return helpers.wait_for(predicate, timeout, what, interval=0.02)


# ------------------------------------------------------------------------------- functions run in jobs


def vllm_server_worker(model: str, request_queue: list, response_queue: list) -> str:
    return f"served {model} with {len(request_queue)} requests queued, {len(response_queue)} responses"


def whoami(tag: str) -> dict:
    return {
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "tag": tag,
        **{k: v for k, v in os.environ.items() if k.startswith("FRAY_") or k == "MY_VAR"},
    }


def shout(n: int) -> int:
    print(f"replica {os.environ['FRAY_REPLICA_ID']} says {n}")
    print(f"to stderr {os.environ['FRAY_REPLICA_ID']}", file=sys.stderr)
    return n * 10 + int(os.environ["FRAY_REPLICA_ID"])


def fail_fast_or_hang(pid_dir: str) -> None:
    rid = os.environ["FRAY_REPLICA_ID"]
    Path(pid_dir, f"{os.environ['FRAY_ATTEMPT']}-{rid}.pid").write_text(str(os.getpid()))
    if rid == "0":
        sibling = Path(pid_dir, f"{os.environ['FRAY_ATTEMPT']}-1.pid")
        end = time.monotonic() + 60
        while not sibling.exists() and time.monotonic() < end:  # fail only once the sibling runs
            time.sleep(0.01)
        raise ValueError(f"replica 0 broke in attempt {os.environ['FRAY_ATTEMPT']}")
    time.sleep(600)


def fail_first_attempt(marker: str) -> str:
    if os.environ["FRAY_ATTEMPT"] == "0":
        raise RuntimeError("transient failure")
    return "ok on attempt " + os.environ["FRAY_ATTEMPT"]


def spawn_grandchild_and_hang(pid_file: str) -> None:
    child = subprocess.Popen(["sleep", "600"])
    Path(pid_file + ".tmp").write_text(f"{os.getpid()} {child.pid}")
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(600)


def square(x: int) -> int:
    return x * x


class Counter:
    def __init__(self, start: int) -> None:
        self.n = start

    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n


# ------------------------------------------------------------------------------------------------ tests


def test_seed_call_site_runs_as_written(cluster: LocalCluster) -> None:
    m, q1, q2 = "llama-8b", ["a", "b"], []
    resource_config = ResourceConfig(cpu=1, ram="16", disk="10g", device=CpuConfig(), replicas=1, regions=["eu-west4"])
    from fray_core import create_environment as _ce

    job_request = JobRequest(
        name="vllm-inference-pool",
        entrypoint=Entrypoint(
            callable=vllm_server_worker, function_args={"model": m, "request_queue": q1, "response_queue": q2}
        ),
        resources=resource_config,
        environment=_ce(),
    )
    ctx = current_cluster()
    job_id = ctx.launch(job_request)
    info = ctx.wait(job_id)
    assert info.status == JobStatus.SUCCEEDED
    assert info.result == ["served llama-8b with 2 requests queued, 0 responses"]


def test_jobs_run_in_subprocesses_with_their_own_env_and_the_callers_cwd(cluster: LocalCluster) -> None:
    req = JobRequest(
        name="env",
        entrypoint=Entrypoint(callable=whoami, function_args={"tag": "t"}),
        resources=ResourceConfig(replicas=2),
        environment=create_environment(env_vars={"MY_VAR": "hello"}),
    )
    job_id = cluster.launch(req)
    info = cluster.wait(job_id, timeout=60, raise_on_failure=True)
    assert len(info.result) == 2
    for rid, r in enumerate(info.result):
        assert r["pid"] != os.getpid()
        assert r["cwd"] == os.getcwd()
        assert r["MY_VAR"] == "hello"
        assert r["FRAY_JOB_ID"] == job_id
        assert (r["FRAY_REPLICA_ID"], r["FRAY_NUM_REPLICAS"], r["FRAY_ATTEMPT"]) == (str(rid), "2", "0")
    assert info.result[0]["pid"] != info.result[1]["pid"]


def test_results_are_in_replica_order_and_logs_are_tagged_per_replica(cluster: LocalCluster) -> None:
    job_id = cluster.launch(
        JobRequest(
            name="shout", entrypoint=Entrypoint.from_callable(shout, args=(4,)), resources=ResourceConfig(replicas=3)
        )
    )
    info = cluster.wait(job_id, timeout=60, raise_on_failure=True)
    assert info.result == [40, 41, 42]
    lines = list(cluster.logs(job_id))
    for rid in range(3):
        assert f"[a0 r{rid}] replica {rid} says 4" in lines
        assert f"[a0 r{rid}] to stderr {rid}" in lines


def test_a_failing_replica_stops_its_siblings_and_the_job_retries_within_the_failure_budget(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    job_id = cluster.launch(
        JobRequest(
            name="fail",
            entrypoint=Entrypoint(callable=fail_fast_or_hang, function_args={"pid_dir": str(tmp_path)}),
            resources=ResourceConfig(replicas=2),
            max_retries_failure=1,
        )
    )
    info = cluster.wait(job_id, timeout=60)
    assert info.status == JobStatus.FAILED
    assert [a.outcome.value for a in info.attempts] == ["FAILED", "FAILED"]  # 1 retry = 2 attempts
    assert info.failures == 2 and info.preemptions == 0
    assert "failed 2 time(s), max_retries_failure=1" in info.error
    cause = info.attempts[0].cause
    assert "ValueError: replica 0 broke in attempt 0" in cause and "Traceback" in cause and "fail_fast_or_hang" in cause
    # the hanging sibling of every attempt was killed
    for attempt in (0, 1):
        sibling = int((tmp_path / f"{attempt}-1.pid").read_text())
        wait_for(lambda sibling=sibling: not pid_alive(sibling), what=f"sibling of attempt {attempt} to die")
    with pytest.raises(JobFailedError, match=r"ended FAILED: failed 2 time\(s\)"):
        cluster.wait(job_id, raise_on_failure=True)


def test_fail_once_then_succeed(cluster: LocalCluster, tmp_path: Path) -> None:
    job_id = cluster.launch(
        JobRequest(
            name="flaky",
            entrypoint=Entrypoint(callable=fail_first_attempt, function_args={"marker": str(tmp_path)}),
            max_retries_failure=1,
        )
    )
    info = cluster.wait(job_id, timeout=60)
    assert info.status == JobStatus.SUCCEEDED and info.result == ["ok on attempt 1"]
    assert [a.outcome.value for a in info.attempts] == ["FAILED", "SUCCEEDED"]


def test_terminate_kills_the_whole_process_tree(cluster: LocalCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    job_id = cluster.launch(
        JobRequest(
            name="hang",
            entrypoint=Entrypoint(callable=spawn_grandchild_and_hang, function_args={"pid_file": str(pid_file)}),
        )
    )
    wait_for(pid_file.exists, what="the job to start its grandchild")
    host_pid, grandchild = map(int, pid_file.read_text().split())
    cluster.terminate(job_id)
    info = cluster.poll(job_id)
    assert info.status == JobStatus.STOPPED and info.attempts[-1].outcome.value == "CANCELLED"
    wait_for(lambda: not pid_alive(host_pid) and not pid_alive(grandchild), what="host and grandchild to die")


def test_binary_entrypoint_exit_code_and_stderr_tail(cluster: LocalCluster) -> None:
    ok = cluster.launch(JobRequest(name="echo", entrypoint=Entrypoint(binary="echo", args=["hi", "there"])))
    assert cluster.wait(ok, timeout=30).status == JobStatus.SUCCEEDED
    assert "[a0 r0] hi there" in list(cluster.logs(ok))
    bad = cluster.launch(
        JobRequest(name="bad", entrypoint=Entrypoint.from_binary("sh", ["-c", "echo doom >&2; exit 7"]))
    )
    info = cluster.wait(bad, timeout=30)
    assert info.status == JobStatus.FAILED
    assert "exit code 7" in info.attempts[0].cause and "doom" in info.attempts[0].cause


def test_unknown_job_id_is_a_key_error_naming_the_id(cluster: LocalCluster) -> None:
    with pytest.raises(JobNotFoundError, match="unknown job id 'nope'"):
        cluster.poll("nope")
    with pytest.raises(KeyError):
        cluster.poll("nope")
    with pytest.raises(KeyError):
        cluster.logs("nope")


def test_unpicklable_callable_fails_at_launch_in_the_caller(cluster: LocalCluster) -> None:
    lock = threading.Lock()

    def holds_a_lock() -> bool:
        return lock.locked()

    before = set(cluster.store.list_ids())
    with pytest.raises(TypeError, match=r"Entrypoint.callable: .*holds_a_lock.* cannot be pickled"):
        cluster.launch(JobRequest(name="nope", entrypoint=Entrypoint(callable=holds_a_lock)))
    assert set(cluster.store.list_ids()) == before  # nothing was started or recorded


def test_records_are_visible_to_another_cluster_object(cluster: LocalCluster) -> None:
    job_id = cluster.launch(JobRequest(name="shout", entrypoint=Entrypoint.from_callable(shout, args=(7,))))
    cluster.wait(job_id, timeout=30)
    other = LocalCluster(jobs_dir=cluster.store.root)
    info = other.poll(job_id)
    assert info.status == JobStatus.SUCCEEDED and info.result == [70]
    assert job_id in [j.job_id for j in other.list_jobs()]
    assert "[a0 r0] replica 0 says 7" in list(other.logs(job_id))


LAUNCHER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from fray_core import Entrypoint, JobRequest
    from fray_local import LocalCluster
    from test_local_cluster import {fn}
    c = LocalCluster(jobs_dir={jobs!r})
    job_id = c.launch(JobRequest(name="child", entrypoint=Entrypoint(callable={fn}, function_args={args!r})))
    print(job_id, flush=True)
    {then}
    """
)


def run_launcher(tmp_path: Path, jobs: str, fn: str, args: dict, then: str) -> str:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER.format(tests=str(Path(__file__).parent), jobs=jobs, fn=fn, args=args, then=then))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[0]


def test_a_job_from_another_process_is_pollable_by_id(cluster: LocalCluster, tmp_path: Path) -> None:
    job_id = run_launcher(tmp_path, cluster.store.root, "square", {"x": 5}, "c.wait(job_id, timeout=60)")
    info = cluster.poll(job_id)
    assert info.status == JobStatus.SUCCEEDED and info.result == [25]


def test_a_job_whose_launcher_died_shows_as_failed_and_its_hosts_die(cluster: LocalCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    job_id = run_launcher(
        tmp_path,
        cluster.store.root,
        "spawn_grandchild_and_hang",
        {"pid_file": str(pid_file)},
        f"\nwhile not os.path.exists({str(pid_file)!r}): time.sleep(0.02)\nos._exit(0)",
    )
    info = cluster.poll(job_id)
    assert info.status == JobStatus.FAILED and "died before the job ended" in info.error
    host_pid, _ = map(int, pid_file.read_text().split())
    wait_for(lambda: not pid_alive(host_pid), what="the orphaned host to exit")


def test_terminate_from_another_cluster_object_stops_the_owners_job(cluster: LocalCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    job_id = cluster.launch(
        JobRequest(
            name="hang",
            entrypoint=Entrypoint(callable=spawn_grandchild_and_hang, function_args={"pid_file": str(pid_file)}),
        )
    )
    wait_for(pid_file.exists, what="the job to start")
    LocalCluster(jobs_dir=cluster.store.root).terminate(job_id)  # goes through the stop request in the store
    assert cluster.poll(job_id).status == JobStatus.STOPPED


def test_job_context_tasks_and_actors(cluster: LocalCluster) -> None:
    ctx = fray_job_ctx()  # the local context (threads), even when this session also holds a Ray connection
    assert type(ctx).__name__ == "LocalJobContext"
    fut = ctx.run(square, 3)
    assert ctx.get(fut) == 9
    futs = [ctx.run(square, i) for i in range(5)]
    assert ctx.get(futs) == [0, 1, 4, 9, 16]
    ready, not_ready = ctx.wait(futs, num_returns=5, timeout=10)
    assert len(ready) == 5 and not not_ready
    ref = ctx.put(12)
    assert ctx.get(ref) == 12 and ctx.get(ctx.run(square, ref)) == 144  # a ref resolves as an argument
    counter = ctx.create_actor(Counter, 10, name="ctr-test")
    assert ctx.get([counter.incr.remote() for _ in range(3)]) == [11, 12, 13]
    again = ctx.create_actor(Counter, 0, name="ctr-test", get_if_exists=True)
    assert ctx.get(again.incr.remote(5)) == 18
    with pytest.raises(ValueError, match="an actor named 'ctr-test' exists"):
        ctx.create_actor(Counter, 0, name="ctr-test")


def cwd_now() -> str:
    return os.getcwd()


def test_workspace_is_the_working_dir_and_missing_pip_packages_warn(cluster: LocalCluster, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    req = JobRequest(
        name="ws", entrypoint=Entrypoint(callable=cwd_now), environment=create_environment(workspace=str(ws))
    )
    assert cluster.wait(cluster.launch(req), timeout=30).result == [str(ws)]
    with pytest.warns(UserWarning, match=r"pip_packages: 'surely-not-installed-pkg==1.0' not installed"):
        job = cluster.launch(
            JobRequest(
                name="p",
                entrypoint=Entrypoint(callable=cwd_now),
                environment=create_environment(pip_packages=["attrs>=20", "surely-not-installed-pkg==1.0"]),
            )
        )
    cluster.wait(job, timeout=30)
    with pytest.raises(ValueError, match=r"EnvironmentConfig.workspace: '/no/such/dir' is not a directory"):
        cluster.launch(
            JobRequest(
                name="w",
                entrypoint=Entrypoint(callable=cwd_now),
                environment=create_environment(workspace="/no/such/dir"),
            )
        )
