"""A Ray cluster keeps its job records itself by default (issue 28): ``ray-kv://GCS/NAMESPACE``, an fsspec
filesystem over the GCS's key-value store (``fray_ray.kvfs``), so any machine that reaches the cluster's
address lists, follows and stops its jobs. On the session's emulated cluster (its real GCS)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig  # noqa: E402
from fray_core.records import JobStore  # noqa: E402
from fray_ray import RayCluster, kvfs  # noqa: E402
from fray_ray.testing import FAST_RAY_POLICY  # noqa: E402


def fresh_store(fake: Any) -> JobStore:
    return JobStore(kvfs.kv_root(fake.cluster.gcs_address, f"t-{uuid.uuid4().hex[:8]}"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["write", "append"]), st.binary(max_size=40)), min_size=1, max_size=8),
    chunk=st.integers(1, 16),
    inline=st.sampled_from([0, 24, kvfs.INLINE]),
)
def test_a_file_reads_back_as_written_and_appended_whatever_its_chunks(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch, ops: list[tuple[str, bytes]], chunk: int, inline: int
) -> None:
    """Whatever its chunks, and whether it is kept inline, grows out of it, or is rewritten back into it."""
    monkeypatch.setattr(kvfs, "CHUNK", chunk)
    monkeypatch.setattr(kvfs, "INLINE", inline)
    store = fresh_store(ray_tpu_cluster)
    path = f"{store._root_path}/job/job.log"
    want = b""
    for op, data in ops:
        with store.fs.open(path, "wb" if op == "write" else "ab") as f:
            f.write(data)
        want = data if op == "write" else want + data
        with store.fs.open(path, "rb") as f:
            assert f.read() == want
            f.seek(max(0, len(want) - 5))  # a log's tail, as `fray logs` reads it
            assert f.read() == want[-5:]
        assert store.fs.info(path)["size"] == len(want)
    store.fs.rm(store._root_path, recursive=True)
    assert not store.fs.exists(path)


def test_a_record_is_read_in_one_gcs_call_and_rewritten_in_one(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: whoever waits on a job reads its record once a second, and on a large cluster every GCS call
    queues behind the GCS's other work: a record (a few KB) is one KV value, not metadata plus a chunk. A
    rewrite leaves no bytes of the file it replaced."""
    from fray_core.types import JobInfo

    store = fresh_store(ray_tpu_cluster)
    job_id = store.new_job("j")
    info = JobInfo(job_id=job_id, name="j", status=JobStatus.PENDING, submitted_at=0.0)
    calls: list[str] = []
    real = kvfs.RayKVFileSystem._call

    def counted(fn: Any, *args: Any) -> Any:
        calls.append(fn.__name__)
        return real(fn, *args)

    monkeypatch.setattr(kvfs.RayKVFileSystem, "_call", staticmethod(counted))
    store.write(info)
    writes, calls[:] = list(calls), []
    assert store.read(job_id)["status"] == "PENDING"
    assert calls == ["internal_kv_get"], calls
    assert writes.count("internal_kv_put") == 1 and len(writes) <= 2, writes
    # its supervisor rewrites it at each state: a rewrite by the process that wrote it last is one call
    info.status = JobStatus.RUNNING
    calls[:] = []
    store.write(info)
    assert calls == ["internal_kv_put"], calls
    assert store.read(job_id)["status"] == "RUNNING"
    # a file that outgrows INLINE is chunked; rewritten small, it is inline again and its chunks are gone
    path = f"{store._root_path}/{job_id}/big.bin"
    with store.fs.open(path, "wb") as f:
        f.write(b"x" * (kvfs.INLINE + 1))
    with store.fs.open(path, "wb") as f:
        f.write(b"small")
    with store.fs.open(path, "rb") as f:
        assert f.read() == b"small"
    gcs = kvfs._gcs(ray_tpu_cluster.cluster.gcs_address)
    rest = store.fs._split(path)[1]
    assert real(gcs.internal_kv_keys, f"d:{rest}:".encode()) == []


def test_records_and_logs_list_and_go_away_and_a_file_too_big_for_the_gcs_says_what_to_use(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = fresh_store(ray_tpu_cluster)
    assert not store.is_local and store.list_ids() == []
    from fray_core.types import JobInfo

    ids = [store.new_job(f"j{i}") for i in range(3)]
    for job_id in ids:
        store.write(JobInfo(job_id=job_id, name="j", status=JobStatus.PENDING, submitted_at=0.0))
    assert store.list_ids() == sorted(ids)
    # another client of the same cluster, with nothing but the URL (a GCS client of its own, no Ray worker)
    other = JobStore(store.root)
    assert [i.job_id for i, _ in other.list_infos()] == [i.job_id for i, _ in store.list_infos()]
    store.discard(ids[0])
    assert other.list_ids() == sorted(ids[1:])
    monkeypatch.setattr(kvfs, "MAX_FILE", 100)
    with pytest.raises(OSError, match=r"at most 100 bytes per file .*jobs_dir='gs://"):
        with store.fs.open(store.log_path(ids[1]), "wb") as f:
            f.write(b"x" * 101)
    assert not store.fs.exists(store.log_path(ids[1]))  # nothing of a failed write is kept
    # a log grows by appends up to the limit, then is cut there, saying so, and takes nothing more
    for part in (b"a" * 60 + b"\n", b"b" * 60 + b"\n", b"c" * 60 + b"\n"):
        with store.fs.open(store.log_path(ids[1]), "ab") as f:
            f.write(part)
    lines, _ = store.read_log(ids[1])
    assert lines[0] == "a" * 60 and lines[1] == "b" * 39 and "the log is cut here" in lines[2], lines
    assert len(lines) == 3 and "gs://" in lines[2]


def test_a_job_launched_with_no_store_named_keeps_its_record_and_log_in_the_cluster(
    ray_tpu_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FRAY_JOBS_DIR", raising=False)
    cluster = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY, warm_supervisor=False)
    assert cluster.store.root == f"ray-kv://{cluster.gcs_address}/fray"
    job_id = cluster.launch(
        JobRequest(
            name="kv-store",
            entrypoint=Entrypoint(binary="python", args=["-c", "print('hello from the cluster store')"]),
            resources=ResourceConfig.with_cpu(),
        )
    )
    info = cluster.wait(job_id, timeout=120)
    assert info.status is JobStatus.SUCCEEDED, info.error
    reader = JobStore(cluster.store.root)  # any machine with the address
    assert reader.read(job_id)["status"] == "SUCCEEDED"
    lines, _ = reader.read_log(job_id)  # all of it once the job is seen ended (uploaded before the final record)
    assert lines == ["[a0 r0] hello from the cluster store"], lines
    reader.discard(job_id)
