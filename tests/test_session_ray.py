"""Held sessions on the emulated Ray TPU cluster (conftest's ``ray_tpu_cluster``: 2 x v4-16): the session's host
tasks are its persistent workers, pinned to the slices' placement-group bundles by the Ray provider. The whole
"done when" list of issue 15 on Ray: reuse, fresh processes, preemptions between and during calls, exact budgets,
failure propagation, close releasing the slices, ``fray list/status/stop`` and the ``@job`` decorator."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import helpers

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import (  # noqa: E402
    AttemptOutcome,
    Entrypoint,
    JobFailedError,
    JobRequest,
    JobStatus,
    RemoteCallError,
    ResourceConfig,
    job,
    using_cluster,
    worker_state,
)
from fray_core.records import pid_alive  # noqa: E402

V4 = ResourceConfig.with_tpu("v4-16", slice_count=2)


def remember() -> dict:
    state = worker_state()
    state["calls"] = state.get("calls", 0) + 1
    return {
        "pid": os.getpid(),
        "calls": state["calls"],
        "slice": os.environ["TPU_NAME"],
        "where": (os.environ["FRAY_SLICE_ID"], os.environ["TPU_WORKER_ID"]),
        "attempt": os.environ["FRAY_ATTEMPT"],
    }


def mark_then_block(marker_dir: str) -> tuple[str, str]:
    if os.environ["FRAY_ATTEMPT"] == "0":
        Path(marker_dir, f"{os.environ['FRAY_SLICE_ID']}-{os.environ['TPU_WORKER_ID']}").write_text(str(os.getpid()))
        import threading

        threading.Event().wait(300)  # the preemption kills this process long before
        raise AssertionError("not preempted")
    return os.environ["FRAY_ATTEMPT"], os.environ["TPU_NAME"]


def test_ray_session_reuses_host_workers_and_ends_by_terminate(ray_tpu_cluster: Any) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    cluster = fake.cluster
    with cluster.hold(V4, name="ray-session") as session:
        live = sorted(n for names in fake.slices().values() for n in names)
        assert sorted(session.slices) == live
        first, second = session.run(remember), session.run(remember)
        assert [r["where"] for r in first] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
        assert [r["pid"] for r in first] == [r["pid"] for r in second] and [r["calls"] for r in second] == [2] * 4
        (listed,) = [i for i in cluster.list_jobs() if i.job_id == session.job_id]
        assert listed.kind == "session" and listed.status is JobStatus.RUNNING
        assert listed.calls == 2 and len(listed.attempts) == 1
    assert cluster.poll(session.job_id).status is JobStatus.SUCCEEDED  # closed: the workers exited
    with cluster.hold(ResourceConfig.with_tpu("v4-16")) as session:
        session.run(remember)
        cluster.terminate(session.job_id)
        with pytest.raises(JobFailedError, match="STOPPED"):
            session.run(remember)


def test_ray_session_call_interrupted_by_a_preemption_is_retried(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    markers = tmp_path / "m"
    markers.mkdir()
    try:
        with fake.cluster.hold(V4, max_retries_preemption=3) as session:
            before = session.slices
            fut = session.submit(mark_then_block, str(markers))
            helpers.wait_for(lambda: len(list(markers.iterdir())) == 4, 120, "the call to run on every host")
            fake.preempt(before[0], restore_after=0.0)  # a fresh slice (a new name) joins
            out = fut.result(timeout=300)
            after = session.slices
        assert len(out) == 4 and len({a for a, _ in out}) == 1 and out[0][0] != "0"  # one later attempt answered
        assert before[0] not in {name for _, name in out}
        assert [name for _, name in out] == [after[0], after[0], after[1], after[1]]
        assert fake.cluster.poll(session.job_id).preemptions >= 1
    finally:
        fake.wait_settled()


def boom(msg: str) -> None:
    raise ValueError(f"boom: {msg}")


def tpu_name() -> str:
    return os.environ["TPU_NAME"]


@job(tpu="v4-16", slices=2, max_retries_failure=0)
def where(steps: int) -> tuple[int, str, str, str, int]:
    env = os.environ
    return steps, env.get("TPU_NAME", "-"), env.get("FRAY_SLICE_ID", "-"), env.get("TPU_WORKER_ID", "-"), os.getpid()


def pids(results: list[dict]) -> set[int]:
    return {r["pid"] for r in results}


def preempted(session: Any, attempt: int) -> bool:
    """The runner saw ``attempt`` end. (An emulated host's worker process outlives its removed raylet for a
    moment and could still answer a call; a preempted VM cannot.)"""
    info = session.info
    return len(info.attempts) > attempt and info.attempts[attempt].outcome is not None or info.status.is_terminal()


def test_ray_fresh_process_runs_every_call_in_a_new_process(ray_tpu_cluster: Any) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    with fake.cluster.hold(V4, fresh_process=True) as session:
        first, second = session.run(remember), session.run(remember)
    assert pids(first).isdisjoint(pids(second)) and len(pids(first)) == 4
    assert [r["calls"] for r in first + second] == [1] * 8  # nothing carried over
    assert [r["where"] for r in second] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert fake.cluster.poll(session.job_id).status is JobStatus.SUCCEEDED


def test_ray_preemption_between_calls_restarts_the_workers_on_the_new_slices(ray_tpu_cluster: Any) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    try:
        with fake.cluster.hold(V4, max_retries_preemption=1) as session:
            before = session.run(remember)
            lost = before[0]["slice"]
            fake.preempt(lost, restore_after=0.0)  # a fresh slice (a new name) joins
            helpers.wait_for(lambda: preempted(session, 0), 120, "the runner to see the preemption")
            after = session.run(remember)
            now = session.slices
        assert len(after) == 4 and {r["attempt"] for r in after} == {"1"} and [r["calls"] for r in after] == [1] * 4
        assert [r["slice"] for r in after] == [now[0], now[0], now[1], now[1]] and lost not in now
        assert pids(before).isdisjoint(pids(after))
        info = fake.cluster.poll(session.job_id)
        assert info.status is JobStatus.SUCCEEDED and info.preemptions == 1 and info.calls == 2
        assert [a.outcome for a in info.attempts] == [AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED]
    finally:
        fake.wait_settled()


def test_ray_preemption_budget_is_exact(ray_tpu_cluster: Any) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    try:
        with fake.cluster.hold(ResourceConfig.with_tpu("v4-16"), max_retries_preemption=1) as session:
            for expected_attempt in ("0", "1"):  # one preemption is within the budget
                out = session.run(remember)
                assert {r["attempt"] for r in out} == {expected_attempt}
                fake.preempt(out[0]["slice"], restore_after=0.0)
                helpers.wait_for(
                    lambda expected_attempt=expected_attempt: preempted(session, int(expected_attempt)),
                    120,
                    "the runner to see the preemption",
                )
            with pytest.raises(JobFailedError) as e:  # the second is not
                session.run(remember)
        info = e.value.info
        assert info.status is JobStatus.FAILED and info.preemptions == 2
        assert [a.outcome for a in info.attempts] == [AttemptOutcome.PREEMPTED] * 2  # the attempt history
        assert "max_retries_preemption=1" in str(e.value)
    finally:
        fake.wait_settled()


def test_ray_failing_call_raises_the_host_exception_and_spends_the_failure_budget(ray_tpu_cluster: Any) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    with fake.cluster.hold(ResourceConfig.with_tpu("v4-16"), max_retries_failure=1) as session:
        before = session.run(remember)
        with pytest.raises(ValueError, match="boom: one") as e:
            session.run(boom, "one")
        assert isinstance(e.value, RemoteCallError) and e.value.host in {(0, 0), (0, 1)}
        assert "in boom" in e.value.cause and 'raise ValueError(f"boom: {msg}")' in e.value.cause  # remote traceback
        after = session.run(remember)  # within the budget: new workers
        assert pids(before).isdisjoint(pids(after)) and [r["calls"] for r in after] == [1, 1]
        assert session.info.failures == 1
        with pytest.raises(ValueError, match="boom: two"):
            session.run(boom, "two")
        with pytest.raises(JobFailedError) as ended:  # the budget is spent: the session ended FAILED
            session.run(remember)
    info = ended.value.info
    assert info.status is JobStatus.FAILED and info.failures == 2 and info.preemptions == 0
    assert "max_retries_failure=1" in (info.error or "")


def test_ray_close_releases_the_slices_for_the_next_job(ray_tpu_cluster: Any) -> None:
    from ray.util import placement_group_table

    fake = ray_tpu_cluster
    fake.wait_settled()
    cluster = fake.cluster
    session = cluster.hold(V4)
    held = session.slices
    workers = pids(session.run(remember))
    session.close()
    assert cluster.poll(session.job_id).status is JobStatus.SUCCEEDED
    groups = [g for g in placement_group_table().values() if g["name"].startswith(f"fray-{session.job_id}-")]
    assert groups and {g["state"] for g in groups} == {"REMOVED"}  # every slice released when close() returns
    request = JobRequest(name="next", entrypoint=Entrypoint(callable=tpu_name), resources=V4, max_retries_preemption=0)
    info = cluster.wait(cluster.launch(request), timeout=120, raise_on_failure=True)
    assert len(info.attempts) == 1 and sorted(info.attempts[0].slices) == sorted(held)
    helpers.wait_for(lambda: not any(pid_alive(p) for p in workers), 60, "the host workers to exit")
    with pytest.raises(Exception, match="closed"):
        session.run(remember)


def test_ray_fray_list_status_and_stop_see_the_session(ray_tpu_cluster: Any) -> None:
    import json
    import subprocess
    import sys

    fake = ray_tpu_cluster
    fake.wait_settled()
    script = Path(sys.executable).with_name("fray")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fray_core.cli"]
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLUSTER_SPEC"}
    spec = f"ray?address={fake.address}&jobs_dir={fake.cluster.store.root}"

    def fray(*args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*command, *args, "--cluster", spec], env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    with fake.cluster.hold(ResourceConfig.with_tpu("v4-16"), name="ray-held") as session:
        workers = pids(session.run(remember) + session.run(remember))
        (record,) = [j for j in json.loads(fray("list", "--json").stdout) if j["job_id"] == session.job_id]
        assert (record["kind"], record["calls"], record["status"], len(record["attempts"])) == (
            "session",
            2,
            "RUNNING",
            1,
        )
        assert "session (held slices), 2 call(s) so far" in fray("status", session.job_id).stdout
        assert "STOPPED" in fray("stop", session.job_id).stdout  # another process, through the supervisor actor
        with pytest.raises(JobFailedError, match="STOPPED"):
            session.run(remember)
    assert fake.cluster.poll(session.job_id).status is JobStatus.STOPPED
    helpers.wait_for(lambda: not any(pid_alive(p) for p in workers), 60, "the host workers to be killed")


def test_ray_job_decorator_three_forms(ray_tpu_cluster: Any) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    with using_cluster(fake.cluster):
        out = where(5)  # a job on current_cluster(): blocks, one result per host
        assert [(r[0], r[2], r[3]) for r in out] == [(5, "0", "0"), (5, "0", "1"), (5, "1", "0"), (5, "1", "1")]
        assert len({r[1] for r in out}) == 2 and os.getpid() not in {r[4] for r in out}
        job_id = where.launch(7)  # the id at once
        info = fake.cluster.wait(job_id, timeout=120, raise_on_failure=True)
        assert info.name == "where" and info.kind == "job" and [r[0] for r in info.result] == [7] * 4
        assert where.local(3)[0] == 3 and where.local(3)[4] == os.getpid()  # in this process, no job
    with pytest.raises(JobFailedError):
        with using_cluster(fake.cluster):
            job(tpu="v4-16")(boom)("x")
