"""Ray-specific behaviour on the emulated multi-node TPU cluster (one per session, see conftest.py):
preemption classified by exception type, jobs that outlive their driver, the job context as Ray tasks and
actors, non-preemptible placement, requests that can never fit, and no leaked placement groups or actors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from helpers import wait_for, write_whole

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from ray.util import placement_group_table  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from fray_core import Entrypoint, JobId, JobInfo, JobRequest, JobStatus, ResourceConfig, fray_job_ctx, using_cluster  # noqa: E402
from fray_core.cluster import cluster_from_spec  # noqa: E402
from fray_core.errors import FrayError  # noqa: E402
from fray_core.records import pid_alive  # noqa: E402
from fray_ray import RayCluster  # noqa: E402
from fray_ray._host import gce_preempted  # noqa: E402
from fray_ray.provider import PREEMPTION_ERRORS  # noqa: E402
from fray_ray.supervisor import SUPERVISOR_PREFIX  # noqa: E402
from fray_ray.testing import FAST_RAY_POLICY  # noqa: E402

TPU = "v4-16"


def hold(marker_dir: str) -> str:
    write_whole(
        Path(
            marker_dir,
            f"started-a{os.environ['FRAY_ATTEMPT']}-s{os.environ['FRAY_SLICE_ID']}-h{os.environ['FRAY_HOST_ID']}",
        ),
        str(os.getpid()),
    )
    release = Path(marker_dir, f"release-a{os.environ['FRAY_ATTEMPT']}")
    end = time.monotonic() + 120
    while not release.exists() and time.monotonic() < end:
        time.sleep(0.05)
    return os.environ["TPU_NAME"]


def head_node_id() -> str:
    """The emulated cluster's head node (not a TPU host)."""
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])


def started(marker_dir: Path, attempt: int) -> int:
    return len(list(marker_dir.glob(f"started-a{attempt}-*")))


def fail() -> None:
    raise RuntimeError("the user's code failed")


def use_the_job_context() -> dict[str, Any]:
    ctx = fray_job_ctx()
    squares = ctx.get([ctx.run(pow, i, 2) for i in range(4)])
    counter = ctx.create_actor(
        Counter, name=f"counter-{os.environ['FRAY_JOB_ID']}-{os.environ['FRAY_HOST_ID']}", get_if_exists=True
    )
    ctx.get([counter.incr.remote() for _ in range(3)])
    total = ctx.get(counter.incr.remote())
    ray.kill(counter)
    return {"squares": squares, "total": total, "ctx": type(ctx).__name__}


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n


def node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def tpu_request(fn: Callable[..., Any], slices: int = 1, **kw: Any) -> JobRequest:
    budgets = {k: kw.pop(k) for k in ("max_retries_preemption", "max_retries_failure") if k in kw}
    return JobRequest(
        name=fn.__name__.replace("_", "-"),
        entrypoint=Entrypoint(callable=fn, function_args=kw),
        resources=ResourceConfig.with_tpu(TPU, slice_count=slices),
        **budgets,
    )


def test_a_removed_node_is_a_preemption_by_exception_type_and_the_job_completes(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    cluster = ray_tpu_cluster.cluster
    job_id = cluster.launch(tpu_request(hold, marker_dir=str(tmp_path), max_retries_preemption=3))
    wait_for(lambda: started(tmp_path, 0) == 2, what="both hosts of attempt 0")
    ray_tpu_cluster.preempt(cluster.poll(job_id).attempts[0].slices[0], restore_after=0.0)
    wait_for(lambda: started(tmp_path, 1) == 2, timeout=120, what="both hosts of attempt 1")
    (tmp_path / "release-a1").touch()
    info = cluster.wait(job_id, timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert info.preemptions == 1 and info.failures == 0
    # the host's task comes back with one of these, or as a crashed worker whose lease the window saw lost
    names = {cls.__name__ for cls in PREEMPTION_ERRORS} | {"WorkerCrashedError"}
    assert any(name in info.attempts[0].cause for name in names), info.attempts[0].cause
    assert info.result == [info.attempts[1].slices[0]] * 2


def test_the_job_outlives_its_driver_and_is_pollable_by_id(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    driver = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from fray_ray import RayCluster
        from test_ray import tpu_request, hold
        cluster = RayCluster(address={ray_tpu_cluster.address!r})
        print(cluster.launch(tpu_request(hold, marker_dir={str(tmp_path)!r})))
        """
    )
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    cluster = ray_tpu_cluster.cluster
    wait_for(lambda: started(tmp_path, 0) == 2, what="the job's hosts (the driver has exited)")
    wait_for(lambda: cluster.poll(job_id).status == JobStatus.RUNNING, what="RUNNING (every host reported in)")
    (tmp_path / "release-a0").touch()
    info = cluster.wait(job_id, timeout=120)
    assert info.status == JobStatus.SUCCEEDED, info.error
    assert len(info.result) == 2


def test_job_context_runs_ray_tasks_and_actors_inside_a_job(ray_tpu_cluster: Any) -> None:
    ray_tpu_cluster.wait_settled()  # no actor of this job may land on a removed host Ray still counts alive
    cluster = ray_tpu_cluster.cluster
    info = cluster.wait(cluster.launch(tpu_request(use_the_job_context)), timeout=120, raise_on_failure=True)
    assert info.result == [{"squares": [0, 1, 4, 9], "total": 4, "ctx": "RayJobContext"}] * 2
    with using_cluster(cluster):
        ctx = fray_job_ctx()
        ref = ctx.run(pow, 2, 10)
        assert isinstance(ref, ray.ObjectRef) and ctx.get(ref) == 1024
        ready, not_ready = ctx.wait([ref, ctx.put(5)], num_returns=2, timeout=30)
        assert len(ready) == 2 and not not_ready
        with pytest.raises(ValueError, match="num_returns"):
            ctx.wait([ref], num_returns=2)


def test_non_preemptible_work_runs_on_the_head_node(ray_tpu_cluster: Any) -> None:
    cluster = ray_tpu_cluster.cluster
    head = head_node_id()
    req = JobRequest(
        name="head", entrypoint=Entrypoint(callable=node_id), resources=ResourceConfig(preemptible=False, replicas=2)
    )
    info = cluster.wait(cluster.launch(req), timeout=120, raise_on_failure=True)
    assert info.result == [head, head]


def test_the_emulated_cluster_keeps_no_idle_ray_workers(ray_tpu_cluster: Any) -> None:
    """Every emulated node shares this machine's cores, so fake_tpu_cluster turns Ray's idle worker pool
    off: with it, the head prestarted a worker for each driver-submitted gang (bench/NOTES.md) and kept
    finished ones; here a finished task's worker is gone within seconds (Ray's default keeps it)."""
    head = head_node_id()
    strategy = NodeAffinitySchedulingStrategy(head, soft=False)
    pid = ray.get(
        ray.remote(num_cpus=1)(lambda: os.getpid()).options(scheduling_strategy=strategy).remote(), timeout=60
    )
    wait_for(lambda: not pid_alive(pid), timeout=10, what=f"the idle worker {pid} on the head to exit")


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_the_worker_a_cpu_host_ran_in_goes_once_idle(ray_tpu_cluster: Any) -> None:
    """A CPU replica runs in a worker Ray may reuse; once its job ended, nothing of Fray's in that worker
    holds a Ray object reference (a worker holding one is never idle to Ray, which then keeps it for good: a
    host watching its preemption notice for over a second left one behind, CI 2026-11-28)."""
    cluster = ray_tpu_cluster.cluster
    req = JobRequest(
        name="idle-after",
        entrypoint=Entrypoint(callable=_pid_after, function_args={"seconds": 2.5}),  # past the notice watch's 1 s
        resources=ResourceConfig.with_cpu(cpu=1, ram="64m"),
    )
    job = cluster.launch(req)
    assert cluster.wait(job, timeout=120).status == JobStatus.SUCCEEDED
    host = cluster.result(job)[0]
    wait_for(lambda: not pid_alive(host), timeout=20, what=f"the host's worker {host} to go once idle")


def test_a_request_that_can_never_fit_fails_at_once(ray_tpu_cluster: Any) -> None:
    cluster = ray_tpu_cluster.cluster
    info = cluster.wait(cluster.launch(tpu_request(fail, slices=3)), timeout=60)
    assert info.status == JobStatus.FAILED and len(info.attempts) == 1
    assert info.attempts[0].outcome.value == "UNSCHEDULABLE"
    assert "asked: 3 x v4-16; the Ray cluster has 2 slice(s) of v4-16 in all" in info.error
    other = JobRequest(name="v5p", entrypoint=Entrypoint(callable=fail), resources=ResourceConfig.with_tpu("v5p-8"))
    info = cluster.wait(cluster.launch(other), timeout=60)
    assert info.status == JobStatus.FAILED and "0 slice(s) of v5p-8" in info.error


def _hold_until_released(marker: str) -> int:
    write_whole(Path(marker, "pid"), str(os.getpid()))
    end = time.monotonic() + 120
    while not Path(marker, "release").exists() and time.monotonic() < end:
        time.sleep(0.05)
    return os.getpid()


def _hold_and_say_where(marker: str) -> int:
    """Host body: write the Ray node this runs on, then hold until released."""
    import ray as ray_

    write_whole(Path(marker, "node"), ray_.get_runtime_context().get_node_id())
    return _hold_until_released(marker)


def test_a_one_replica_job_whose_node_dies_is_preempted_and_runs_again_elsewhere(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    """A one-replica CPU job has no placement group; when its node dies, its lease is LOST (the node is asked
    after by id) and the attempt PREEMPTED, whatever error Ray gives for the host's worker: the preemption
    budget pays, never the failure budget (``max_retries_failure=0`` here), and the retry runs elsewhere."""
    ray_tpu_cluster.wait_settled()
    client = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY)
    head = next(n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    held, victim = tmp_path / "held", tmp_path / "victim"
    held.mkdir()
    victim.mkdir()
    # the head's CPUs held, so that the job goes to an emulated TPU host (1 CPU each), which can be killed
    holder = client.launch(
        JobRequest(
            name="holder",
            entrypoint=Entrypoint(callable=_hold_until_released, function_args={"marker": str(held)}),
            resources=ResourceConfig.with_cpu(cpu=int(head["Resources"]["CPU"]), ram="64m"),
        )
    )
    wait_for(lambda: (held / "pid").exists(), what="the holder to run")
    job = client.launch(
        JobRequest(
            name="victim",
            entrypoint=Entrypoint(callable=_hold_and_say_where, function_args={"marker": str(victim)}),
            resources=ResourceConfig.with_cpu(cpu=1, ram="64m"),
            max_retries_failure=0,
            max_retries_preemption=2,
        )
    )
    wait_for(lambda: (victim / "node").exists(), what="the job to run")
    node = (victim / "node").read_text()
    where = [
        (name, h) for name, nodes in ray_tpu_cluster._nodes.items() for h, n in enumerate(nodes) if n.node_id == node
    ]
    assert where, f"the job ran on {node}, not on an emulated TPU host"
    (victim / "node").unlink()
    ray_tpu_cluster.kill_host(*where[0])
    wait_for(lambda: (victim / "node").exists(), timeout=120, what="the job's retry to run")
    assert (victim / "node").read_text() != node
    (victim / "release").touch()
    info = client.wait(job, timeout=120)
    assert info.status is JobStatus.SUCCEEDED, info.error
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"], info.attempts
    assert info.failures == 0 and info.preemptions == 1, info
    (held / "release").touch()
    assert client.wait(holder, timeout=120).status is JobStatus.SUCCEEDED
    client.close()
    ray_tpu_cluster.wait_settled()


def test_a_cpu_job_behind_others_waits_past_the_schedule_timeout_and_one_that_never_fits_fails_at_once(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    """CPUs other work holds are not missing capacity: a queue of CPU jobs on a busy cluster waits as long as
    it takes, saying why (no ``schedule_timeout``, no ``host_start_timeout``, no budget spent); a request no
    node has room for fails at ``launch``'s first look, as a TPU request for more slices than the cluster has.
    A one-replica job waits in Ray's own queue, with no placement group (issue 29: one per job made small
    jobs 21x slower)."""
    policy = attrs.evolve(FAST_RAY_POLICY, schedule_timeout=2.0, host_start_timeout=2.0)
    client = RayCluster(address=ray_tpu_cluster.address, retry_policy=policy)
    most = int(max(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]))
    one_node = ResourceConfig.with_cpu(cpu=most, ram="64m")  # room for it on the largest node(s) only
    rooms = sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= most)
    holders = []
    for i in range(rooms):
        (tmp_path / str(i)).mkdir()
        holders.append(
            client.launch(
                JobRequest(
                    name="holder",
                    entrypoint=Entrypoint(
                        callable=_hold_until_released, function_args={"marker": str(tmp_path / str(i))}
                    ),
                    resources=one_node,
                )
            )
        )
    wait_for(lambda: all((tmp_path / str(i) / "pid").exists() for i in range(rooms)), what="the holders to run")
    waiting = client.launch(JobRequest(name="behind", entrypoint=Entrypoint(callable=os.getpid), resources=one_node))
    wait_for(lambda: "Ray's queue" in (client.poll(waiting).pending_reason or ""), what="a pending reason")
    time.sleep(3 * policy.schedule_timeout)  # what is asserted is that nothing happens within the timeouts
    info = client.poll(waiting)
    assert info.status is JobStatus.PENDING and info.preemptions == info.failures == 0, info
    assert "waiting in Ray's queue" in info.pending_reason and "held by other work" in info.pending_reason, info
    assert [a.acquired_at for a in info.attempts] == [None], info.attempts  # queued: it holds nothing yet
    groups = [g.get("name", "") for g in placement_group_table().values() if g.get("state") != "REMOVED"]
    assert not [g for g in groups if g.startswith(f"fray-{waiting}")], groups
    for i in range(rooms):
        (tmp_path / str(i) / "release").touch()
    assert client.wait(waiting, timeout=120).status is JobStatus.SUCCEEDED
    assert all(i.status is JobStatus.SUCCEEDED for i in client.wait(holders, timeout=120))
    huge = client.launch(
        JobRequest(
            name="huge", entrypoint=Entrypoint(callable=os.getpid), resources=ResourceConfig.with_cpu(cpu=10_000)
        )
    )
    info = client.wait(huge, timeout=60)
    assert info.status is JobStatus.FAILED and info.attempts[0].outcome.value == "UNSCHEDULABLE"
    assert "have room for 0 in all" in info.error, info.error
    client.close()


def test_the_preemption_probe_turns_a_host_failure_into_a_preemption(ray_tpu_cluster: Any) -> None:
    probing = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY, preemption_probe=lambda: True)
    info = probing.wait(probing.launch(tpu_request(fail, max_retries_preemption=1)), timeout=120)
    probing.close()
    assert info.status == JobStatus.FAILED
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "PREEMPTED"] and info.failures == 0
    assert (
        "HostPreemptedError" in info.attempts[0].cause
        and "RuntimeError: the user's code failed" in info.attempts[0].cause
    )
    # the default probe (GCE metadata) answers "not preempted" off GCE, so the same failure is the user's
    info = ray_tpu_cluster.cluster.wait(ray_tpu_cluster.cluster.launch(tpu_request(fail)), timeout=120)
    assert [a.outcome.value for a in info.attempts] == ["FAILED"] and info.failures == 1
    assert gce_preempted(timeout=0.2) is False


def test_terminate_from_another_cluster_object(
    ray_tpu_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = ray_tpu_cluster.cluster.launch(tpu_request(hold, slices=2, marker_dir=str(tmp_path)))
    wait_for(lambda: started(tmp_path, 0) == 4, what="all 4 hosts")
    owner = ray_tpu_cluster.cluster.store.read(job_id)["owner"]  # as the running supervisor wrote it
    assert (owner["address"], owner["cluster"]) == (ray_tpu_cluster.address, f"ray?address={ray_tpu_cluster.address}")
    other = cluster_from_spec(owner["cluster"])  # a client that knows only the record
    assert isinstance(other, RayCluster)
    # the CLI after Ctrl-C: `fray stop ID` with no flags, no cluster in the environment (the default is local)
    for var in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("FRAY_JOBS_DIR", ray_tpu_cluster.cluster.store.root)
    from fray_core.cli import main

    assert main(["stop", job_id]) == 0
    assert capsys.readouterr().out.strip() == f"{job_id}: STOPPED"
    info = ray_tpu_cluster.cluster.poll(job_id)
    assert info.status == JobStatus.STOPPED and info.attempts[-1].outcome.value == "CANCELLED"
    assert [line for line in other.logs(job_id)] == list(ray_tpu_cluster.cluster.logs(job_id))


def test_a_job_whose_supervisor_is_gone_is_failed_not_running_forever(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    # launch writes the record just before it creates the supervisor, and says so in Ray's KV store: a poll in
    # between sees PENDING; a launcher that died there left its marker, trusted for the grace by the poller's clock
    from fray_ray.cluster import SUPERVISOR_START_GRACE
    from fray_ray.supervisor import launching_key

    records = RayCluster(address=ray_tpu_cluster.address, jobs_dir=str(tmp_path / "records"))
    fresh = JobInfo(job_id=JobId("launching-20261123-000000-000000"), name="x", status=JobStatus.PENDING, backend="ray")
    records._kv("put", launching_key(fresh.job_id), b"1")
    try:
        records.store.write(fresh)
        assert records.poll(fresh.job_id).status == JobStatus.PENDING
        records._launch_seen[fresh.job_id] -= SUPERVISOR_START_GRACE
        assert records.poll(fresh.job_id).status == JobStatus.FAILED
    finally:
        records._kv("del", launching_key(fresh.job_id))
    # no launch under way and no supervisor: FAILED at once, whatever the launching client's clock said (an
    # hour ahead of this machine's: no grace is taken from comparing two machines' clocks)
    ahead = attrs.evolve(fresh, job_id=JobId("clock-ahead-20261123-000000-000000"), submitted_at=time.time() + 3600)
    records.store.write(ahead)
    assert records.poll(ahead.job_id).status == JobStatus.FAILED
    cluster = ray_tpu_cluster.cluster
    # a running job whose supervisor died (its node died, or the Ray cluster restarted)
    job_id = cluster.launch(tpu_request(hold, marker_dir=str(tmp_path)))
    wait_for(lambda: not cluster._kv("get", launching_key(job_id)), what="its launching marker removed")
    wait_for(lambda: started(tmp_path, 0) == 2, what="both hosts")
    ray.kill(cluster._supervisor(job_id), no_restart=True)
    info = wait_for(lambda: (i := cluster.poll(job_id)).status.is_terminal() and i, what="the job to be reported ended")
    assert info.status == JobStatus.FAILED and "supervisor" in info.error and "is gone" in info.error
    # the hosts' tasks were owned by the supervisor: Ray ends them with it, and its placement groups
    for m in tmp_path.glob("started-a0-*"):
        pid = int(m.read_text())
        wait_for(lambda pid=pid: not pid_alive(pid), what=f"host {m.name} to die with its supervisor")


def test_a_clients_jobs_share_a_supervisor_process_until_it_is_full_then_the_next_is_started_ahead(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.util import list_named_actors

    from fray_ray import cluster as cluster_module
    from fray_ray.cluster import _Supervisor

    def alive(name: str) -> bool:
        return any(a["name"] == name for a in list_named_actors(all_namespaces=True))

    def owner(job_id: str) -> str:
        return client.store.read(job_id)["owner"]["ray_actor"]

    monkeypatch.setattr(cluster_module, "JOBS_PER_SUPERVISOR", 4)  # the client's cap, given to its supervisors
    client = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY)
    request = JobRequest(name="shared", entrypoint=Entrypoint(callable=os.getpid))
    first = [client.launch(request) for _ in range(2)]  # the first starts a supervisor, kept for the next ones
    assert owner(first[1]) == owner(first[0])  # no process started for the second job
    assert client._spare is not None  # it took half its jobs: the next one is started ahead
    spare = client._spare[0]
    first += [client.launch(request) for _ in range(2)]
    assert {owner(j) for j in first} == {owner(first[0])} and client._standby[0] == spare  # full: the spare is next
    fifth = client.launch(request)
    assert owner(fifth) == spare
    results = client.wait([*first, fifth], timeout=120, raise_on_failure=True)
    assert all(i.status == JobStatus.SUCCEEDED for i in results)
    # the full supervisor took its last job: it goes once they all ended; the next one stays, idle
    wait_for(lambda: not alive(owner(first[0])), what="the full supervisor to go once its jobs ended")
    assert alive(spare)
    client.close()
    wait_for(lambda: not alive(spare), what="close() to retire the idle supervisor")
    # one that no client retires goes away by itself
    name = "fray-supervisor-expiry-test"
    _Supervisor.options(name=name, namespace="fray", lifetime="detached", num_cpus=0, max_concurrency=4).remote(
        name, idle_timeout=1.0
    )
    wait_for(lambda: alive(name), what="the standby to start")
    wait_for(lambda: not alive(name), what="an idle standby to remove itself")


def test_a_job_that_never_reached_its_supervisor_is_failed_with_the_reason(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``launch`` hands a job to its client's supervisor without waiting for the answer. A launcher that exits
    before the supervisor was up to take it (here at once, no clean-up, as ``kill -9`` would) loses the call:
    the PENDING record names a supervisor that does not run the job. Once the launching marker outlived its
    grace, a poll from anywhere says so: the supervisor does not have the job, or never started."""
    from fray_ray import cluster as cluster_module
    from fray_ray.cluster import SUPERVISOR_START_GRACE, SUPERVISOR_START_TIMEOUT, _Supervisor
    from fray_ray.supervisor import launching_key

    monkeypatch.setattr(cluster_module, "PING_TIMEOUT", 2.0)
    never = f"{SUPERVISOR_PREFIX}never-up-{os.getpid()}"
    driver = textwrap.dedent(
        f"""
        import os
        from fray_core import Entrypoint, JobRequest
        from fray_ray import RayCluster
        from fray_ray.cluster import _Supervisor
        from fray_ray.code import code_runtime_env, upload_code
        cluster = RayCluster(address={ray_tpu_cluster.address!r}, jobs_dir={str(tmp_path)!r})
        request = JobRequest(name="never-taken", entrypoint=Entrypoint(callable=os.getpid))
        # the client's supervisor as if still starting: no node has what it asks for
        actor = _Supervisor.options(
            name={never!r}, namespace="fray", lifetime="detached", num_cpus=0, resources={{"fray-test-nowhere": 1}}
        ).remote({never!r})
        cluster._standby, cluster._standby_env = ({never!r}, actor, 1), upload_code(code_runtime_env(request))
        print(cluster.launch(request), flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    # e.g. `fray status` (records of its own: the session's checks would call these jobs left behind)
    poller = RayCluster(address=ray_tpu_cluster.address, jobs_dir=str(tmp_path), warm_supervisor=False)
    try:
        assert poller.store.read(job_id)["owner"]["ray_actor"] == never
        pending = poller.poll(job_id)  # within the grace: it may still come up, and the job says what it waits for
        assert pending.status is JobStatus.PENDING, pending.error
        assert pending.pending_reason == f"handed to its supervisor actor {never!r}, which has not taken it yet"
        poller._launch_seen[job_id] -= SUPERVISOR_START_GRACE
        # past the grace but not created yet: it may be setting up its runtime_env, which takes minutes
        assert poller.poll(job_id).status is JobStatus.PENDING
        poller._launch_seen[job_id] -= SUPERVISOR_START_TIMEOUT
        info = poller.poll(job_id)
        assert info.status is JobStatus.FAILED and never in info.error and "has not started" in info.error, info.error
        assert info.pending_reason is None
    finally:
        ray.kill(ray.get_actor(never, namespace="fray"), no_restart=True)
    # a live supervisor that does not have the job (the call lost after it was up)
    live = f"{SUPERVISOR_PREFIX}live-{os.getpid()}"
    actor = _Supervisor.options(name=live, namespace="fray", lifetime="detached", num_cpus=0).remote(live)
    assert ray.get(actor.ping.remote(), timeout=60) == []
    lost = JobInfo(job_id=JobId("lost-20261127-000000-000000"), name="x", status=JobStatus.PENDING, backend="ray")
    poller.store.write(lost, owner=poller._owner(live))
    poller._kv("put", launching_key(lost.job_id), b"1")
    try:
        assert poller.poll(lost.job_id).status is JobStatus.PENDING
        poller._launch_seen[lost.job_id] -= SUPERVISOR_START_GRACE
        info = poller.poll(lost.job_id)
        assert info.status is JobStatus.FAILED and f"never reached its supervisor actor {live!r}" in info.error
    finally:
        poller._kv("del", launching_key(lost.job_id))
        ray.kill(actor, no_restart=True)


def test_a_job_whose_supervisor_ray_never_creates_fails_with_the_reason_instead_of_waiting_forever(
    ray_tpu_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch that starts its job's supervisor gives the job with the actor's creation (no launching marker:
    Ray delivers it even if the launcher exits). When Ray never creates that actor (here: no node has the
    resource it must run on) the job says what it waits for, and once ``SUPERVISOR_START_TIMEOUT`` passed (660 s;
    3 s here) a poll fails it with the reason and kills the actor (it must not run the job after the poll said
    FAILED). Before, the job stayed PENDING forever."""
    from fray_ray import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "SUPERVISOR_START_TIMEOUT", 3.0)
    client = RayCluster(
        address=ray_tpu_cluster.address,
        jobs_dir=str(tmp_path),
        non_preemptible_resource="fray-test-nowhere",
        warm_supervisor=False,
    )
    client._store_ok = True  # the store check's task would wait for the same resource (20 s), then go on
    job = client.launch(JobRequest(name="never-created", entrypoint=Entrypoint(callable=os.getpid)))
    name = client.store.read(job)["owner"]["ray_actor"]
    try:
        info = client.poll(job)  # a poll first sees it waiting: the timeout counts from here
        assert info.status is JobStatus.PENDING, info
        assert info.pending_reason == f"waiting for its supervisor actor {name!r} to start", info.pending_reason
        info = wait_for(lambda: (i := client.poll(job)).status.is_terminal() and i, timeout=60, what="a verdict")
        assert info.status is JobStatus.FAILED and info.pending_reason is None, info
        assert f"supervisor actor {name!r}" in info.error and "was not created" in info.error, info.error
        assert "fray-test-nowhere" in info.error, info.error
        wait_for(
            lambda: name not in {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)},
            what="the never-created supervisor to be killed",
        )
        info = client.poll(job)  # and it stays so, saying why (not only that the killed actor is gone)
        assert info.status is JobStatus.FAILED and "was not created" in info.error, info.error
    finally:
        try:
            ray.kill(ray.get_actor(name, namespace="fray"), no_restart=True)
        except ValueError:
            pass  # killed by the poll, as it should
        client.close()


def test_a_job_its_supervisor_refuses_is_taken_back_by_a_fresh_one(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's supervisor exited (here: retired while idle) before the hand-over reached it: ``launch``
    has returned already; the job is started by a fresh supervisor, which takes the client's next jobs.
    A poll while the fresh one is being started does not read the gone one as the job's end (a CI run had
    such a job FAILED "supervisor ... is gone", then PENDING again under its new supervisor)."""
    import fray_ray.cluster as ray_cluster

    client = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY)
    request = JobRequest(name="taken-back", entrypoint=Entrypoint(callable=os.getpid))
    first = client.launch(request)
    assert client.wait(first, timeout=120).status is JobStatus.SUCCEEDED
    name, actor, _ = client._standby
    ray.get(actor.retire.remote(), timeout=30)  # no job: it exits
    wait_for(
        lambda: name not in {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)},
        what="the retired supervisor to exit",
    )
    # the launching marker's grace over at once, as when the hand-over's answer took longer than it
    monkeypatch.setattr(ray_cluster, "SUPERVISOR_START_GRACE", 0.0)
    during: list[JobInfo] = []
    cold_start = RayCluster._cold_start

    def polled_first(self: RayCluster, info: JobInfo, *args: Any, **kwargs: Any) -> None:
        during.append(self.poll(info.job_id))
        cold_start(self, info, *args, **kwargs)

    monkeypatch.setattr(RayCluster, "_cold_start", polled_first)
    second = client.launch(request)
    info = client.wait(second, timeout=120)
    assert info.status is JobStatus.SUCCEEDED, info.error
    assert [i.status for i in during] == [JobStatus.PENDING], [(i.status, i.error) for i in during]
    new_owner = client.store.read(second)["owner"]["ray_actor"]
    assert new_owner != name and client._standby[0] == new_owner
    client.close()


def test_a_stop_while_a_refused_job_goes_to_a_new_supervisor_stops_it_there(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``terminate`` while the client gives a refused job to a new supervisor waits for that hand-over and stops
    the job there; it does not look for the job at the gone supervisor its record still names (it would find
    none, and after a minute report that the job "did not stop" while the new one ran it)."""
    client = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY)
    # this module's code, as the held job's: a supervisor only takes jobs of the code it loaded
    first = client.launch(JobRequest(name="warm", entrypoint=Entrypoint(callable=_takes, function_args={"x": 1})))
    assert client.wait(first, timeout=120).status is JobStatus.SUCCEEDED
    name, actor, _ = client._standby
    ray.get(actor.retire.remote(), timeout=30)  # no job: it exits, and refuses the next one
    wait_for(
        lambda: name not in {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)},
        what="the retired supervisor to exit",
    )
    stop: dict[str, Any] = {}
    cold_start = RayCluster._cold_start
    waiting = threading.Event()  # terminate has reached its wait for the take-back

    class Observed(threading.Condition):
        def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
            waiting.set()
            return super().wait_for(predicate, timeout)

    client._taken_back = Observed(client._standby_lock)

    def stopped_meanwhile(self: RayCluster, info: JobInfo, *args: Any, **kwargs: Any) -> None:
        stop["taking back"] = info.job_id in self._taking_back  # not a launch's own cold start

        def terminate() -> None:
            try:
                self.terminate(info.job_id)
            except Exception as e:
                stop["error"] = e

        stop["thread"] = threading.Thread(target=terminate)
        stop["thread"].start()
        stop["waited"] = waiting.wait(timeout=60)  # the stop under way before the new supervisor has the job
        cold_start(self, info, *args, **kwargs)

    monkeypatch.setattr(RayCluster, "_cold_start", stopped_meanwhile)
    job = client.launch(
        JobRequest(name="held", entrypoint=Entrypoint(callable=_hold_cpu, function_args={"marker": str(tmp_path)}))
    )
    info = client.wait(job, timeout=120)
    stop["thread"].join(timeout=120)
    assert stop["taking back"] and stop["waited"]
    assert not stop["thread"].is_alive() and "error" not in stop, stop.get("error")
    assert info.status is JobStatus.STOPPED, (info.status, info.error)
    assert client.store.read(job)["owner"]["ray_actor"] != name
    client.close()


def test_a_supervisor_killed_with_9_ends_each_of_its_jobs_with_the_truth(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    """Two running jobs share a supervisor process; ``kill -9`` of it: both are reported FAILED naming their
    supervisor (no hang, no retry charged), their hosts die with it, and the slice comes back."""
    cluster = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY, warm_supervisor=False)
    tpu_job = cluster.launch(tpu_request(hold, marker_dir=str(tmp_path)))
    cpu_marker = tmp_path / "cpu"
    cpu_marker.mkdir()
    cpu_job = cluster.launch(
        JobRequest(
            name="cpu-hold", entrypoint=Entrypoint(callable=_hold_cpu, function_args={"marker": str(cpu_marker)})
        )
    )
    owner = cluster.store.read(tpu_job)["owner"]
    assert cluster.store.read(cpu_job)["owner"]["ray_actor"] == owner["ray_actor"]
    wait_for(lambda: started(tmp_path, 0) == 2 and (cpu_marker / "pid").exists(), what="every host of both jobs")
    handle = ray.get_actor(owner["ray_actor"], namespace=owner["namespace"])
    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=30)
    os.kill(pid, signal.SIGKILL)
    for job_id in (tpu_job, cpu_job):
        info = wait_for(lambda j=job_id: (i := cluster.poll(j)).status.is_terminal() and i, what=f"{job_id} ended")
        assert info.status == JobStatus.FAILED and owner["ray_actor"] in info.error and "is gone" in info.error
        assert all(a.outcome is None or a.outcome.value != "FAILED" for a in info.attempts)  # nothing charged
    host_pids = [int(m.read_text()) for m in tmp_path.glob("started-a0-*")] + [int((cpu_marker / "pid").read_text())]
    for host in host_pids:
        wait_for(lambda p=host: not pid_alive(p), what=f"host {host} to die with its supervisor")
    follow = cluster.launch(tpu_request(os.getpid))  # the slice came back
    assert cluster.wait(follow, timeout=180).status == JobStatus.SUCCEEDED
    cluster.close()


def _hold_cpu(marker: str) -> None:
    write_whole(Path(marker, "pid"), str(os.getpid()))
    time.sleep(300)


def _idle_standby(actor: dict[str, str]) -> bool:
    """A warm supervisor with no job yet (another ``RayCluster`` of this process launched, e.g. the compat
    layer's ``current_cluster()``): not a supervisor outliving a job; it goes with its client or after its
    idle timeout."""
    try:
        handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
        return not ray.get(handle.ping.remote(), timeout=10)
    except Exception:
        return False  # gone meanwhile (the next look says so) or not answering: counted


def test_no_placement_group_or_supervisor_outlives_its_job(ray_tpu_cluster: Any) -> None:
    """Runs last in this module: every job above (and the conformance suite's, when run before) has ended."""
    from ray.util import list_named_actors, placement_group_table

    cluster = ray_tpu_cluster.cluster
    assert all(j.status.is_terminal() for j in cluster.list_jobs())

    # straight from the GCS (the state API needs the dashboard, which a loaded machine may not have up)
    def fray_groups() -> list[dict[str, Any]]:
        return [pg for pg in placement_group_table().values() if pg["name"].startswith("fray-")]

    def leftovers() -> tuple[list[str], list[str]]:
        pgs = [pg["name"] for pg in fray_groups() if pg["state"] != "REMOVED"]
        warm = {cluster._standby[0]} if cluster._standby else set()  # the next job's supervisor, idle
        actors = [
            a
            for a in list_named_actors(all_namespaces=True)
            if a["name"].startswith(SUPERVISOR_PREFIX) and a["name"] not in warm
        ]
        return pgs, [a["name"] for a in actors if not _idle_standby(a)]

    # removal is asynchronous in Ray: give it a bounded moment, then it must be empty
    end = time.monotonic() + 30
    while leftovers() != ([], []) and time.monotonic() < end:
        time.sleep(0.2)
    assert leftovers() == ([], [])
    assert fray_groups()  # jobs did run here


def _cannot_load() -> Any:
    raise ImportError("no module named 'only_on_my_laptop'")


class _LoadsNowhere:
    """Pickles fine in the launcher; loading it fails, as a class from a module the cluster lacks does."""

    def __reduce__(self) -> Any:
        return (_cannot_load, ())


def _takes(x: Any) -> None:
    return None


def test_a_request_the_supervisor_cannot_load_ends_failed_with_the_reason(ray_tpu_cluster: Any) -> None:
    """The one path of the Ray supervisor that ends a job before fray_core's Supervisor runs it."""
    cluster = ray_tpu_cluster.cluster
    request = JobRequest(
        name="unloadable", entrypoint=Entrypoint(callable=_takes, function_args={"x": _LoadsNowhere()})
    )
    info = cluster.wait(cluster.launch(request), timeout=120)
    assert info.status == JobStatus.FAILED
    assert "cannot be loaded on the Ray cluster" in info.error and "only_on_my_laptop" in info.error, info.error
    assert cluster.store.read_info(info.job_id)[0].status == JobStatus.FAILED


def test_a_store_the_cluster_cannot_reach_fails_launch_in_the_caller_naming_it(ray_tpu_cluster: Any) -> None:
    """A store only this process sees (here fsspec's in-memory one; on real machines, a local jobs dir): the
    head cannot read the job's record, so launch fails within seconds saying so, and the job is FAILED."""
    root = f"memory://fray-unreachable-{os.getpid()}-{time.monotonic_ns()}"
    client = RayCluster(address=ray_tpu_cluster.address, jobs_dir=root, warm_supervisor=False)
    start = time.monotonic()
    with pytest.raises(FrayError, match=f"cannot reach the job store {root!r}: JobNotFoundError") as e:
        client.launch(tpu_request(fail))
    assert time.monotonic() - start < 20.0
    [info] = client.list_jobs()
    assert info.status is JobStatus.FAILED and info.error == str(e.value)


def test_a_supervisor_that_cannot_start_its_job_fails_it_with_the_reason_and_drops_it(ray_tpu_cluster: Any) -> None:
    """The store check passed once (or was skipped), yet the head cannot read this job's record: the supervisor
    says why and drops the job; the job is FAILED at once (not PENDING for the supervisor start grace)."""
    client = RayCluster(
        address=ray_tpu_cluster.address, jobs_dir=f"memory://fray-gone-{os.getpid()}", warm_supervisor=False
    )
    client._store_ok = True  # as if the head had read this store before
    job_id = client.launch(tpu_request(fail))
    actor = client.store.read(job_id)["owner"]["ray_actor"]
    info = wait_for(
        lambda: (i := client.poll(job_id)).status is JobStatus.FAILED and i, timeout=30, what="the job to fail"
    )
    assert "could not start on the Ray cluster: JobNotFoundError" in info.error, info.error
    assert info.submitted_at > time.time() - 30  # well within SUPERVISOR_START_GRACE of the launch
    handle = ray.get_actor(actor, namespace="fray")
    wait_for(lambda: job_id not in ray.get(handle.ping.remote(), timeout=10), timeout=30, what="the job dropped")
    client.close()  # its client's supervisor, idle: retired, it exits
    wait_for(
        lambda: actor not in {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)},
        timeout=30,
        what="the supervisor to exit",
    )


def test_a_clients_own_module_travels_with_the_job(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    """A client whose code lives only in its own directory (removed as soon as launch returns: the cluster
    shares nothing else with it) runs its module's code on every host; no client path is on a host's sys.path."""
    proj = tmp_path / "client-only"
    proj.mkdir()
    (proj / "client_only_mod.py").write_text(
        "import os, sys\n\ndef main():\n    return [__file__, os.getcwd(), [p for p in sys.path if "
        "'client-only' in p]]\n"
    )
    driver = textwrap.dedent(
        f"""
        import shutil, sys
        sys.path.insert(0, {str(proj)!r})
        import client_only_mod
        from fray_core import Entrypoint, JobRequest, ResourceConfig
        from fray_ray import RayCluster
        cluster = RayCluster(address={ray_tpu_cluster.address!r}, warm_supervisor=False)
        job = cluster.launch(JobRequest(
            name="own-code",
            entrypoint=Entrypoint(callable=client_only_mod.main),
            resources=ResourceConfig.with_tpu({TPU!r}),
        ))
        shutil.rmtree({str(proj)!r})
        print(job)
        """
    )
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    info = ray_tpu_cluster.cluster.wait(out.stdout.strip().splitlines()[-1], timeout=180)
    assert info.status is JobStatus.SUCCEEDED, info.error
    for file, cwd, client_paths in info.result:
        assert (
            not file.startswith(str(proj))
            and file.endswith("client_only_mod.py")
            and cwd != str(proj)
            and client_paths == []
        )


def test_a_folder_that_changes_between_launches_keeps_one_supervisor_and_each_job_sees_its_own_files(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    """A script that writes beside itself while it launches (a log, data) ships a new package each launch. Its
    jobs still share the client's supervisor process (one per launch before: ~100 MB each), and each job's
    hosts see the files as they were at its own launch; an edit of a module starts a supervisor with the new
    code."""
    proj = tmp_path / "changing"
    proj.mkdir()
    (proj / "changing_mod.py").write_text(
        "VERSION = 1\n\ndef main():\n    with open('data.txt') as f:\n        return [VERSION, f.read()]\n"
    )
    (proj / "data.txt").write_text("one")
    driver = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {str(proj)!r})
        import changing_mod
        from fray_core import Entrypoint, JobRequest, ResourceConfig
        from fray_ray import RayCluster
        cluster = RayCluster(address={ray_tpu_cluster.address!r}, warm_supervisor=False)
        req = JobRequest(name="changing", entrypoint=Entrypoint(callable=changing_mod.main),
                         resources=ResourceConfig.with_cpu(cpu=1))
        jobs = [cluster.launch(req)]
        with open(os.path.join({str(proj)!r}, "data.txt"), "w") as f:
            f.write("two")
        jobs.append(cluster.launch(req))
        with open(os.path.join({str(proj)!r}, "changing_mod.py"), "a") as f:
            f.write("VERSION = 2\\n")
        os.utime(os.path.join({str(proj)!r}, "changing_mod.py"), ns=(0, time.time_ns() + 10**9))
        jobs.append(cluster.launch(req))
        for job in jobs:
            print(job, cluster.store.read(job)["owner"]["ray_actor"])
        """
    )
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (a, owner_a), (b, owner_b), (c, owner_c) = (line.split() for line in out.stdout.strip().splitlines()[-3:])
    results = []
    for job in (a, b, c):
        info = ray_tpu_cluster.cluster.wait(job, timeout=180)
        assert info.status is JobStatus.SUCCEEDED, info.error
        results.append(info.result[0])
    # the module is not reloaded in the client: VERSION stays 1 there, and the shipped file of job c says 2
    assert results == [[1, "one"], [1, "two"], [2, "two"]], results
    assert owner_a == owner_b != owner_c


def test_launch_refuses_a_working_dir_too_big_to_ship(
    ray_tpu_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fray launch --working-dir DIR`` over the code size limit: one line, exit 2, in the caller; nothing
    is launched. (A sparse file: its size counts, it costs no disk.)"""
    from fray_core.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("FRAY_JOBS_DIR", str(tmp_path / "jobs"))
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "weights.bin", "wb") as f:
        f.truncate(101 * 2**20)
    assert main(["launch", "--address", ray_tpu_cluster.address, "--working-dir", str(big), "json:dumps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"EnvironmentConfig.working_dir is in {big} (over 100 MiB" in err, err
    assert not (tmp_path / "jobs").exists() or os.listdir(tmp_path / "jobs") == []


@pytest.mark.ray
def test_doctor_sees_the_ray_clusters_tpu_slices(ray_tpu_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``fray doctor --address ADDR`` (as ``ray job --address``): Ray's version, the nodes, the TPU slices
    their ``ray.io/tpu-*`` labels show. (Here, not in test_cli_usability.py: the session's Ray cluster connects
    this process to Ray, and the tests before the Ray modules see a process outside Ray.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS")}
    env.update(FRAY_JOBS_DIR=str(tmp_path / "jobs"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    r = subprocess.run(
        [*__import__("test_cli").FRAY, "doctor", "--address", ray_tpu_cluster.address],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(from --address)" in r.stdout and "ray 2." in r.stdout
    assert re.search(r"tpu slices +2 x v4-16", r.stdout), r.stdout
