"""Blame the right thing (issue 30) on the emulated Ray cluster: a preemption notice delivered through Ray's own
drain (DrainNode, reason PREEMPTION, with a deadline), and siblings of a removed slice failing long before Ray
declares its nodes dead. Runs under the machine-wide Ray lock (see COMMON rules / conftest)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for, write_whole

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import AttemptOutcome, Entrypoint, JobRequest, JobStatus, ResourceConfig  # noqa: E402


def checkpoints_on_notice(flags: str) -> str:
    import fray_core

    if os.environ["FRAY_ATTEMPT"] != "0":
        return os.environ["TPU_NAME"]

    def on_term(signum: int, frame: object) -> None:
        write_whole(Path(flags, f"checkpoint-{os.environ['FRAY_HOST_ID']}"), repr(fray_core.preemption_notice()))
        time.sleep(1.0)  # a checkpoint takes a while: the host's output (the notice's line) reaches the log
        os._exit(1)  # a non-zero exit after a notice still costs no failure budget

    signal.signal(signal.SIGTERM, on_term)
    Path(flags, f"up-{os.environ['FRAY_HOST_ID']}").touch()
    threading.Event().wait(120)
    return "unreachable"


def test_a_drain_for_preemption_is_a_notice_the_users_handler_gets_with_its_deadline(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    cluster = ray_tpu_cluster.cluster
    req = JobRequest(
        name="notice",
        entrypoint=Entrypoint(callable=checkpoints_on_notice, function_args={"flags": str(tmp_path)}),
        resources=ResourceConfig.with_tpu("v4-16"),
        max_retries_failure=0,
    )
    job = cluster.launch(req)
    wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 2, timeout=120, what="both hosts of attempt 0")
    name = cluster.poll(job).attempts[0].slices[0]
    t0 = time.time()
    deadline = ray_tpu_cluster.drain(name, grace=20.0)
    info = cluster.wait(job, timeout=180)
    assert info.status is JobStatus.SUCCEEDED, info.error
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED]
    assert info.failures == 0 and "preemption notice" in (info.attempts[0].cause or "")
    for h in (0, 1):  # every host's handler read the deadline Ray was given
        assert float((tmp_path / f"checkpoint-{h}").read_text()) == pytest.approx(deadline, abs=0.01)
    assert (info.attempts[0].ended_at or 0) < t0 + 20.0  # the hosts were stopped before the deadline
    assert info.attempts[1].slices != [name]  # not on the draining slice
    # pushed by the supervisor process (its notice board), not read from Ray's KV once a second by every host
    notices = [line for line in cluster.logs(job) if "[fray] preemption notice" in line]
    assert len(notices) == 2 and all("(from its supervisor)" in line for line in notices), notices
    ray_tpu_cluster.wait_settled()


def sibling_fails_when_peer_is_gone(flags: str) -> str:
    if os.environ["FRAY_ATTEMPT"] != "0":
        return "ok"
    Path(flags, f"up-{os.environ['FRAY_SLICE_ID']}-{os.environ['FRAY_HOST_ID']}").touch()
    while not Path(flags, "lost").exists():  # the collective breaks when the other slice goes
        time.sleep(0.05)
    if os.environ["FRAY_SLICE_ID"] == "0":
        raise RuntimeError("collective failed: peer unreachable")
    threading.Event().wait(120)
    return "unreachable"


def test_siblings_failing_before_ray_declares_the_lost_slice_dead_cost_no_failure_budget(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    import attrs

    from fray_ray import RayCluster
    from fray_ray.testing import FAST_RAY_POLICY

    # cancelled siblings are collected for less than Ray's node-death detection time: only the attribution
    # window (lease health until detection_delay after the first failure) can see the loss
    cluster = RayCluster(
        address=ray_tpu_cluster.address,
        retry_policy=attrs.evolve(FAST_RAY_POLICY, cancel_grace=0.5),
        warm_supervisor=False,
    )
    req = JobRequest(
        name="sibling-first",
        entrypoint=Entrypoint(callable=sibling_fails_when_peer_is_gone, function_args={"flags": str(tmp_path)}),
        resources=ResourceConfig.with_tpu("v4-16", slice_count=2),
        max_retries_failure=0,
    )
    job = cluster.launch(req)
    wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 4, timeout=120, what="the 4 hosts of attempt 0")
    lost = cluster.poll(job).attempts[0].slices[1]
    ray_tpu_cluster.preempt(lost, restore_after=0.0)
    (tmp_path / "lost").touch()  # slice 0 fails now, before Ray's health checks declare slice 1's nodes dead
    info = cluster.wait(job, timeout=240)
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED], info.attempts[
        0
    ].cause
    assert info.failures == 0 and info.status is JobStatus.SUCCEEDED
    ray_tpu_cluster.wait_settled()


def beats_then_hangs() -> str:
    import fray_core

    if os.environ["FRAY_ATTEMPT"] != "0":
        fray_core.heartbeat(50)
        time.sleep(1.5)  # the runner reads heartbeats of running hosts only: stay a few polls
        return "ok"
    for step in range(3):
        fray_core.heartbeat(step)
        time.sleep(0.5)
    threading.Thread(target=lambda: threading.Event().wait(120), name="data-loader", daemon=True).start()
    a_deadlocked_collective()
    return "unreachable"


def a_deadlocked_collective() -> None:
    threading.Event().wait(120)


def test_a_stalled_job_on_ray_is_restarted_with_its_stacks_in_the_log_and_its_last_step_shown(
    ray_tpu_cluster: Any,
) -> None:
    cluster = ray_tpu_cluster.cluster
    req = JobRequest(
        name="stall",
        entrypoint=Entrypoint(callable=beats_then_hangs),
        resources=ResourceConfig.with_tpu("v4-16"),
        max_retries_failure=1,
        stall_timeout=4.0,
    )
    job = cluster.launch(req)
    info = cluster.wait(job, timeout=180)
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.STALLED, AttemptOutcome.SUCCEEDED], info.attempts[
        0
    ].cause
    assert info.failures == 1 and info.last_step == 50
    log = list(cluster.logs(job))
    for host in ("a0 s0/h0", "a0 s0/h1"):  # every host's stacks, every thread, before it was killed
        mine = [line for line in log if host in line]
        assert any("a_deadlocked_collective" in line for line in mine), "\n".join(log[-60:])
        assert sum("most recent call first" in line for line in mine) >= 2  # not only the main thread
    # nothing of its heartbeats is left in Ray's KV: attempt 1's host removed its key as it ended, attempt 0's
    # (killed) the provider, as the job was released
    from ray.experimental import internal_kv

    wait_for(
        lambda: not internal_kv._internal_kv_list(f"fray-hb:{job}:", namespace="fray"),
        timeout=30,
        what="the job's heartbeat keys to be removed",
    )


def test_a_hosts_heartbeat_is_aged_by_the_supervisors_clock_not_the_hosts(ray_tpu_cluster: Any) -> None:
    """A host whose clock is an hour behind (or ahead) of the head's is not a stalled host: a beat's age is
    how long the job's provider has seen it unchanged, on its own clock (issue 28: one clock)."""
    from fray_ray._host import HostConfig
    from fray_ray.provider import RaySliceProvider

    class Run:
        def __init__(self, tag: str) -> None:
            self.handle = type("Handle", (), {"tag": tag})()

    gcs = ray._private.worker.global_worker.gcs_client
    provider = RaySliceProvider("clock-skew-job", HostConfig(sys_path=(), cwd="", supervisor=None))
    behind, ahead = Run("s0/h0"), Run("s0/h1")
    keys = [f"fray-hb:clock-skew-job:{r.handle.tag}".encode() for r in (behind, ahead)]
    try:
        gcs.internal_kv_put(keys[0], f"{time.time() - 3600!r} 7".encode(), True, b"fray")
        gcs.internal_kv_put(keys[1], f"{time.time() + 3600!r} 8".encode(), True, b"fray")
        beats = provider.heartbeats([behind, ahead])
        assert beats[behind].step == 7 and beats[ahead].step == 8
        assert 0 <= beats[behind].age < 5 and 0 <= beats[ahead].age < 5, beats
        again = provider.heartbeats([behind, ahead])  # unchanged since: older, by this process's clock
        assert again[behind].age >= beats[behind].age and again[behind].age < 5
        # a host removes its key as it ends, before its result is in: it beat, so it is not "silent" now
        # (a startup_timeout would call it stalled at startup and throw its result away)
        gcs.internal_kv_del(keys[0], False, b"fray")
        ended = provider.heartbeats([behind, ahead])
        assert behind in ended and ended[behind].step == 7 and ended[behind].age >= again[behind].age
    finally:
        for k in keys:
            gcs.internal_kv_del(k, False, b"fray")


def says_tpu_in_use() -> str:
    if os.environ["FRAY_ATTEMPT"] == "0" and os.environ["TPU_WORKER_ID"] == "1":
        # what libtpu says when another process holds the device (none does here: only the signature tells)
        raise RuntimeError("TPU initialization failed: The TPU is already in use by process with pid 4242")
    return "ok"


def test_a_known_device_fault_signature_on_ray_is_a_preemption_counted_towards_quarantine(
    ray_tpu_cluster: Any,
) -> None:
    from fray_ray.scheduler import SCHEDULER_NAME

    cluster = ray_tpu_cluster.cluster
    req = JobRequest(
        name="signature",
        entrypoint=Entrypoint(callable=says_tpu_in_use),
        resources=ResourceConfig.with_tpu("v4-16"),
        max_retries_failure=0,
    )
    info = cluster.wait(cluster.launch(req), timeout=180)
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED], info.attempts[
        0
    ].cause
    [bad] = info.attempts[0].slices
    assert info.failures == 0
    assert f"DeviceFault: device busy (TPU is already in use) on {bad} host 1" in (info.attempts[0].cause or "")
    scheduler = ray.get_actor(SCHEDULER_NAME, namespace=cluster.namespace)
    try:
        assert ray.get(scheduler.state.remote())["device_failures"].get(bad) == [1]  # host 1's, on record
    finally:
        ray.get(scheduler.repair.remote(bad))  # the session's other tests see a clean record


def test_the_ray_providers_detection_time_is_the_clusters_own_health_check_config(ray_tpu_cluster: Any) -> None:
    from fray_ray.provider import health_checks

    # the session cluster's head was started with 1 s checks, 2 s timeouts, 4 failures (fake_tpu_cluster's
    # health_check_period=1.0), not Ray's defaults (3 s x 5)
    assert health_checks() == (1.0, 2.0, 4)


def crashes_on_host_1() -> str:
    if os.environ["FRAY_ATTEMPT"] == "0" and os.environ["FRAY_HOST_ID"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer or a segfault does to the process
    return "ok"


def test_a_host_process_that_dies_while_its_node_is_up_costs_the_failure_budget_not_the_preemption_one(
    ray_tpu_cluster: Any,
) -> None:
    # Ray says WorkerCrashedError both for a process that crashed and, at times, for one on a node going away:
    # only the lease's health over the attribution window tells them apart. Here the node stays up.
    cluster = ray_tpu_cluster.cluster
    req = JobRequest(
        name="crash",
        entrypoint=Entrypoint(callable=crashes_on_host_1),
        resources=ResourceConfig.with_tpu("v4-16"),
        max_retries_failure=1,
        max_retries_preemption=3,
    )
    info = cluster.wait(cluster.launch(req), timeout=180)
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED], info.attempts[
        0
    ].cause
    assert info.failures == 1 and info.preemptions == 0
    assert "WorkerCrashedError" in (info.attempts[0].cause or "")
