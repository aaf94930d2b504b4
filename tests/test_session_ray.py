"""Held sessions on the emulated Ray TPU cluster (conftest's ``ray_tpu_cluster``: 2 x v4-16): the session's host
tasks are its persistent workers, pinned to the slices' placement-group bundles by the Ray provider."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import helpers

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import JobFailedError, JobStatus, ResourceConfig, worker_state  # noqa: E402
from fray_core.records import pid_alive  # noqa: E402

V4 = ResourceConfig.with_tpu("v4-16", slice_count=2)


def remember() -> dict:
    state = worker_state()
    state["calls"] = state.get("calls", 0) + 1
    return {"pid": os.getpid(), "calls": state["calls"], "slice": os.environ["TPU_NAME"],
            "where": (os.environ["FRAY_SLICE_ID"], os.environ["TPU_WORKER_ID"]), "attempt": os.environ["FRAY_ATTEMPT"]}


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
        assert listed.request_summary["kind"] == "session" and listed.status is JobStatus.RUNNING
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
        assert {a for a, _ in out} != {"0"} and before[0] not in {name for _, name in out}
        assert sorted({name for _, name in out}) == sorted(after)
        assert fake.cluster.poll(session.job_id).preemptions >= 1
    finally:
        fake.wait_settled()
