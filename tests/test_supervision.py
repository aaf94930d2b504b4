"""Job supervision and the job store under pressure (issue 32): a full disk, no file descriptors, no threads,
two launches with one id, planted records, signals to a detached supervisor.

Each test reproduced its problem before the change it covers (fray_core/supervisor.py, fray_core/records.py,
fray_local/_detached.py); docs/troubleshooting.md says what a user sees.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_core.errors import FrayError, RecordError
from fray_core.records import MAX_RECORD_BYTES, JobStore
from fray_core.status import Attempt, AttemptOutcome
from fray_core.types import JobInfo
from fray_local import LocalCluster
from fray_local.testing import TEST_POLICY

from helpers import wait_for


def _value(x: int = 7) -> int:
    return x


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def _flood(lines: int) -> int:
    line = "x" * 200
    for _ in range(lines):
        print(line)
    return lines


def _req(name: str = "job", fn: Any = _value, **kwargs: Any) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint(callable=fn, function_args=kwargs))


def _fray(jobs_dir: Path | str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FRAY_JOBS_DIR=str(jobs_dir))
    env.pop("FRAY_CLUSTER_SPEC", None)
    return subprocess.run(
        [sys.executable, "-m", "fray_core.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _on_disk(jobs_dir: Path | str, job_id: str) -> JobInfo:
    """What another process sees: a fresh store's view of the record."""
    return JobStore(str(jobs_dir)).read_info(job_id)[0]


# ------------------------------------------------------------------------------------ full disk, no fds


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (root only: skipped where mounting is not permitted)."""
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 2 MB tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_still_ends_the_record_on_disk(small_disk: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Before: FAILED in memory, RUNNING on disk (every other process saw RUNNING), and an uncaught
    traceback from the supervisor's thread."""
    jobs_dir = small_disk / "jobs"
    cluster = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)
    try:
        job_id = cluster.launch(_req("flood", _flood, lines=50_000))  # ~10 MB of output into a 2 MB disk
        info = cluster.wait(job_id, timeout=120)
    finally:
        cluster.close()
    assert info.status is JobStatus.FAILED and "No space left" in (info.error or ""), info.error
    disk = _on_disk(jobs_dir, job_id)
    assert disk.status is JobStatus.FAILED, disk
    assert "No space left" in (disk.error or "") or "could not write the final record" in (disk.error or ""), disk.error
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err


_FD_SCRIPT = """
import ctypes, json, resource, sys
from fray_core import Entrypoint, JobRequest
from fray_core.errors import FrayError
from fray_local import LocalCluster
from fray_local.testing import TEST_POLICY

def value(i):
    return i

# glibc loads libgcc_s when a thread exits through pthread_exit (daemon threads at interpreter exit): without
# a descriptor to load it, it aborts the process. Loaded now, as any process that ran a while has it.
ctypes.CDLL("libgcc_s.so.1")
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
cluster = LocalCluster(jobs_dir=sys.argv[1], retry_policy=TEST_POLICY)
ids, refused = [], 0
for i in range(30):
    try:
        request = JobRequest(name=f"fd{i}", entrypoint=Entrypoint(callable=value, function_args={"i": i}))
        ids.append(cluster.launch(request))
    except FrayError as e:
        refused += 1
        print("refused:", e, file=sys.stderr)
final = {}
for job_id in ids:
    final[job_id] = cluster.wait(job_id, timeout=240).status.value
cluster.close()
print(json.dumps({"final": final, "refused": refused}))
"""


def test_out_of_file_descriptors_every_record_ends_as_in_memory(tmp_path: Path) -> None:
    """30 jobs at 48 file descriptors. Before: on disk 18 SUCCEEDED and 11 PENDING, all FAILED in memory."""
    jobs_dir = tmp_path / "jobs"
    done = subprocess.run(
        [sys.executable, "-c", _FD_SCRIPT, str(jobs_dir)], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    store = JobStore(str(jobs_dir))
    on_disk = {info.job_id: info for info, _ in store.list_infos()}
    assert set(on_disk) == set(out["final"]), "a launch that failed left a record, or a launched job has none"
    for job_id, status in out["final"].items():
        assert on_disk[job_id].status.value == status, (job_id, on_disk[job_id], status)
    assert len(out["final"]) + out["refused"] == 30


# ------------------------------------------------------------------------------------------- no threads


def test_a_launch_that_cannot_start_a_thread_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``RuntimeError: can't start new thread`` after the PENDING record was written (a phantom job
    in every listing), then ``close()`` blocked 60 s and left the spool dir and the fleet behind."""
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    jobs_dir = tmp_path / "jobs"
    cluster = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)
    first = JobRequest(name="first", entrypoint=Entrypoint(callable=_value), resources=ResourceConfig.with_tpu("v4-8"))
    cluster.wait(cluster.launch(first), timeout=60)  # the spool dir, the fleet's dir and the stop watcher exist
    assert len(list(private.iterdir())) >= 2, "no spool or fleet dir: this test would check nothing"
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("fray-job-"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(FrayError, match="cannot start a thread.*not launched"):
        cluster.launch(_req("phantom"))
    monkeypatch.undo()
    assert [i.name for i in cluster.list_jobs()] == ["first"]
    assert [i.name for i in LocalCluster(jobs_dir=str(jobs_dir)).list_jobs()] == ["first"]
    assert sorted(p.name for p in jobs_dir.iterdir() if p.name.startswith("phantom")) == []
    spool = cluster._spool_dir
    assert spool is not None and os.path.isdir(spool)
    t0 = time.monotonic()
    cluster.close()
    assert time.monotonic() - t0 < 10
    assert not os.path.exists(spool)
    assert sorted(p.name for p in private.iterdir()) == []  # nor the fleet's dir


def test_a_record_that_cannot_be_written_at_launch_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs_dir = tmp_path / "jobs"
    cluster = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)

    def full(*_: Any, **__: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cluster.store, "write", full)
    with pytest.raises(FrayError, match="cannot record the job.*No space left.*not launched"):
        cluster.launch(_req("unrecorded"))
    monkeypatch.undo()
    assert cluster.list_jobs() == [] and list(jobs_dir.iterdir()) == []
    cluster.close()


# --------------------------------------------------------------------------------------------- one id


def test_two_launches_with_the_same_id_never_share_a_job_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the job dir was not created exclusively; one record survived, the other job's result was lost
    and the logs interleaved."""
    import fray_core.records as records

    ids = iter(["same-id", "same-id", "same-id-2"])
    monkeypatch.setattr(records, "new_job_id", lambda name: next(ids))
    jobs_dir = tmp_path / "jobs"
    a = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)  # two processes' clusters on one store
    b = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)
    try:
        first = a.launch(_req("same", x=1))
        second = b.launch(_req("same", x=2))
        assert (first, second) == ("same-id", "same-id-2")
        assert a.wait(first, timeout=60).result == [1]
        assert b.wait(second, timeout=60).result == [2]
        assert JobStore(str(jobs_dir)).read_result(first) == [1]
    finally:
        a.close()
        b.close()


def test_new_job_gives_up_loudly_when_every_id_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fray_core.records as records

    store = JobStore(str(tmp_path / "jobs"))
    monkeypatch.setattr(records, "new_job_id", lambda name: "taken")
    store.new_job("taken")
    with pytest.raises(FrayError, match="fresh ids.*existed already"):
        store.new_job("taken")


# ------------------------------------------------------------------------------------- planted records


def _plant(jobs_dir: Path, job_id: str, text: str | bytes, name: str = "record.json") -> None:
    (jobs_dir / job_id).mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    (jobs_dir / job_id / name).write_bytes(data)


def _record(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "name": job_id, "status": "SUCCEEDED", "submitted_at": 1.0, "backend": "local", **fields}


def test_one_planted_record_never_breaks_the_listing(tmp_path: Path) -> None:
    """Before: a deeply nested record or calls.json -> RecursionError traceback, ``submitted_at: Infinity``
    -> OverflowError traceback, a 5,000-digit integer or NaN -> exit 2, for every user of the store."""
    jobs_dir = tmp_path / "jobs"
    cluster = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)
    good = cluster.launch(_req("good"))
    cluster.wait(good, timeout=60)
    cluster.close()
    _plant(jobs_dir, "deep", '{"a": ' * 100_000 + "1" + "}" * 100_000)
    _plant(
        jobs_dir, "infinity", json.dumps(_record("infinity")).replace('"submitted_at": 1.0', '"submitted_at": Infinity')
    )
    _plant(jobs_dir, "nan", json.dumps(_record("nan")).replace('"submitted_at": 1.0', '"submitted_at": NaN'))
    _plant(
        jobs_dir,
        "huge-float",
        json.dumps(_record("huge-float")).replace('"submitted_at": 1.0', '"submitted_at": 1e308'),
    )
    _plant(
        jobs_dir,
        "digits",
        json.dumps(_record("digits")).replace('"submitted_at": 1.0', '"submitted_at": ' + "9" * 5000),
    )
    _plant(jobs_dir, "session", json.dumps(_record("session", request={"kind": "session"}, status="RUNNING")))
    _plant(jobs_dir, "session", '{"calls": ' + "[" * 2000 + "]" * 2000 + "}", name="calls.json")
    _plant(jobs_dir, "oversize", b"{" + b" " * (MAX_RECORD_BYTES + 10) + b"}")

    done = _fray(jobs_dir, "list")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()}
    assert {good, "deep", "infinity", "nan", "huge-float", "digits", "session", "oversize"} <= listed, done.stdout
    infos = {i.job_id: i for i in LocalCluster(jobs_dir=str(jobs_dir)).list_jobs()}
    assert infos[good].status is JobStatus.SUCCEEDED
    why = {
        "deep": "nests deeper than",
        "infinity": "Infinity is not a number",
        "nan": "NaN is not a number",
        "huge-float": "out of range",
        "digits": "5000 digits",
        "session": "calls.json",
        "oversize": f"larger than {MAX_RECORD_BYTES} bytes",
    }
    for job_id, text in why.items():
        assert infos[job_id].status is JobStatus.UNKNOWN and text in (infos[job_id].error or ""), (
            job_id,
            infos[job_id].error,
        )


def test_a_record_with_a_huge_field_is_written_readable(tmp_path: Path) -> None:
    """Before: a 20-million-character name made a record over 16 MB: UNKNOWN to every other process,
    with nothing said where the job was launched."""
    store = JobStore(str(tmp_path / "jobs"))
    info = JobInfo(job_id="huge", name="n" * 20_000_000, status=JobStatus.FAILED, error="e" * 20_000_000)
    store.write(info)
    assert os.path.getsize(tmp_path / "jobs" / "huge" / "record.json") < MAX_RECORD_BYTES
    read = JobStore(str(tmp_path / "jobs")).read_info("huge")[0]
    assert (
        read.status is JobStatus.FAILED
        and read.name.startswith("nnnn")
        and "[cut: 20000000 characters in all]" in read.name
    )


def test_what_fray_writes_is_within_the_read_limits(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "jobs"))
    info = JobInfo(job_id="big", name="big", status=JobStatus.RUNNING,
                   request_summary={"max_retries_failure": 10**40, "cpu": float("inf"), "x": float("nan")})  # fmt: skip
    store.write(info)
    summary = JobStore(str(tmp_path / "jobs")).read_info("big")[0].request_summary
    assert summary == {"max_retries_failure": "an integer of 133 bits (out of range)", "cpu": "inf", "x": "nan"}


def test_read_limits_are_plain_record_errors() -> None:
    from fray_core.records import loads_record

    for text, why in [
        (b"[" * 65 + b"]" * 65, "deeper"),
        (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": 1' + b"0" * 19 + b"}", "20 digits"),
    ]:
        with pytest.raises(RecordError, match=why):
            loads_record(text, "x")
    assert loads_record(b'{"a": [1.5, -3, 1700000000.25]}', "x") == {"a": [1.5, -3, 1700000000.25]}


# ------------------------------------------------------------------------------ a final record, marked


def test_a_final_record_that_cannot_be_written_is_marked_for_every_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When neither the record nor the reserved space can be written, the reserve is renamed
    ``ended.<STATUS>``: readers see the job ended, and why its record says otherwise."""
    import fray_core.records as records

    store = JobStore(str(tmp_path / "jobs"))
    job_id = store.new_job("marked")
    info = JobInfo(job_id=job_id, name="marked", status=JobStatus.RUNNING)
    store.write(info)
    info.status = JobStatus.FAILED
    info.error = "boom"

    def no_fds(*_: Any, **__: Any) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(store, "write", no_fds)
    monkeypatch.setattr(store, "_write_into_reserve", no_fds)
    monkeypatch.setattr(records, "FINAL_WRITE_DEADLINE", 0.2)
    problem = store.write_final(info)
    assert problem is not None and "Too many open files" in problem and "ended.FAILED" in problem
    seen = JobStore(str(tmp_path / "jobs")).read_info(job_id)[0]
    assert (
        seen.status is JobStatus.FAILED
        and "could not write the final record" in (seen.error or "")
        and "RUNNING" in seen.error
    )


def test_the_final_record_goes_into_the_reserved_space_when_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(str(tmp_path / "jobs"))
    job_id = store.new_job("reserved")
    store.write(JobInfo(job_id=job_id, name="reserved", status=JobStatus.RUNNING))
    real_write = store.write

    def full(*_: Any, **__: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "write", full)
    assert (
        store.write_final(JobInfo(job_id=job_id, name="reserved", status=JobStatus.STOPPED, error="terminated")) is None
    )
    monkeypatch.setattr(store, "write", real_write)
    seen = JobStore(str(tmp_path / "jobs")).read_info(job_id)[0]
    assert seen.status is JobStatus.STOPPED and seen.error == "terminated"
    assert sorted(os.listdir(tmp_path / "jobs" / job_id)) == ["job.log", "record.json"]  # the reserve was used


# ------------------------------------------------------------------------------------- jobs dir, signals


def test_an_unusable_jobs_dir_is_one_line_naming_it(tmp_path: Path) -> None:
    """Before: ``FRAY_JOBS_DIR=http://...`` gave an ImportError traceback."""
    done = _fray("http://example.invalid/fray", "list")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'http://example.invalid/fray'" in done.stderr and "supported:" in done.stderr
    with pytest.raises(ValueError, match="jobs_dir='nosuchproto://x'.*supported"):
        JobStore("nosuchproto://x")


def test_launch_detached_records_the_job_in_the_clusters_jobs_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``LocalCluster(jobs_dir=X).launch_detached()`` wrote the record to the default store, not X."""
    mine, default = tmp_path / "mine", tmp_path / "default"
    monkeypatch.setenv("FRAY_JOBS_DIR", str(default))
    cluster = LocalCluster(jobs_dir=str(mine))
    job_id = cluster.launch_detached(_req("detached"))
    info = cluster.wait(job_id, timeout=120)
    assert info.status is JobStatus.SUCCEEDED and info.result == [7]
    assert not default.exists() or not any(default.iterdir())


def _owner_pid(jobs_dir: Path, job_id: str) -> int:
    return int(json.loads((jobs_dir / job_id / "record.json").read_text())["owner"]["pid"])


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_a_stop_signal_to_a_detached_supervisor_ends_the_job_stopped(tmp_path: Path, sig: signal.Signals) -> None:
    """Before: SIGHUP/SIGQUIT/SIGUSR1 killed the detached supervisor: the job ended FAILED ("supervisor died")."""
    jobs_dir = tmp_path / "jobs"
    cluster = LocalCluster(jobs_dir=str(jobs_dir))
    job_id = cluster.launch_detached(_req("signalled", _sleep, seconds=120))
    wait_for(lambda: cluster.poll(job_id).status is JobStatus.RUNNING, timeout=60, what="the job runs")
    pid = _owner_pid(jobs_dir, job_id)
    os.kill(pid, signal.SIGUSR1)  # ignored: the job goes on
    os.kill(pid, signal.SIGUSR2)
    time.sleep(0.5)  # a signal's default action would have killed the supervisor by now
    assert cluster.poll(job_id).status is JobStatus.RUNNING
    os.kill(pid, sig)
    info = cluster.wait(job_id, timeout=60)
    assert info.status is JobStatus.STOPPED, info.error


def test_local_cluster_job_context_runs_in_threads_and_the_base_has_no_default(tmp_path: Path) -> None:
    from fray_core.cluster import Cluster
    from fray_core.context import LocalJobContext

    assert isinstance(LocalCluster(jobs_dir=str(tmp_path)).job_context(), LocalJobContext)

    class Remote(Cluster):
        launch = poll = terminate = list_jobs = logs = lambda *a, **k: None  # type: ignore[assignment]

    with pytest.raises(NotImplementedError, match="Remote does not say where fray_job_ctx"):
        Remote().job_context()


# ------------------------------------------------------------------------------ the record-backed cluster


def test_a_record_cluster_needs_only_the_owner_hook(tmp_path: Path) -> None:
    """``RecordCluster`` answers poll/list_jobs/logs from the store; a backend says when an owner is gone."""
    from fray_core.supervisor import RecordCluster

    class Minimal(RecordCluster):
        listed_backend = "minimal"

        def __init__(self, root: str, dead: set[str]) -> None:
            self.store = JobStore(root)
            self.dead = dead

        def owner_gone(self, info: JobInfo, record: dict[str, Any]) -> str | None:
            return "its supervisor is gone" if record["owner"] in self.dead else None

        launch = terminate = lambda *a, **k: None  # type: ignore[assignment]

    root = str(tmp_path / "jobs")
    store = JobStore(root)
    for job_id, status, owner in [
        ("a", JobStatus.RUNNING, "alive"),
        ("b", JobStatus.RUNNING, "gone"),
        ("c", JobStatus.SUCCEEDED, "gone"),
    ]:
        store.write(
            JobInfo(job_id=job_id, name=job_id, status=status, backend="minimal", submitted_at=ord(job_id)), owner=owner
        )
    store.write(JobInfo(job_id="other", name="other", status=JobStatus.RUNNING, backend="local"), owner="gone")
    b, _ = store.read_info("b")  # b's supervisor died with its second attempt open
    b.attempts = [Attempt(0, ["s0"], 1.0, 2.0, AttemptOutcome.PREEMPTED), Attempt(1, ["s1"], started_at=3.0)]
    b.preemptions = 1
    store.write(b, owner="gone")
    (tmp_path / "jobs" / "b" / "job.log").write_text("[r0] hello\n")
    cluster = Minimal(root, dead={"gone"})
    assert cluster.poll("a").status is JobStatus.RUNNING
    gone = cluster.poll("b")
    assert gone.status is JobStatus.FAILED and gone.error == "its supervisor is gone"
    # the verdict is on disk: the open attempt ended with its cause, no budget charged, one finished_at
    on_disk, record = store.read_info("b")
    assert on_disk.status is JobStatus.FAILED and on_disk.finished_at == gone.finished_at is not None
    assert [(a.outcome, a.cause) for a in on_disk.attempts] == [
        (AttemptOutcome.PREEMPTED, None),
        (AttemptOutcome.CANCELLED, "its supervisor is gone"),
    ]
    assert on_disk.attempts[1].ended_at == on_disk.finished_at and (on_disk.failures, on_disk.preemptions) == (0, 1)
    assert record["owner"] == "gone" and cluster.poll("b").finished_at == gone.finished_at
    assert cluster.poll("c").status is JobStatus.SUCCEEDED  # a finished job's owner does not matter
    assert [(i.job_id, i.status) for i in cluster.list_jobs()] == [
        ("a", JobStatus.RUNNING),
        ("b", JobStatus.FAILED),
        ("c", JobStatus.SUCCEEDED),
    ]
    assert list(cluster.logs("b")) == ["[r0] hello"]


def test_a_crash_in_the_provider_ends_the_job_failed_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before (local): the supervisor thread re-raised, so every such crash also printed an uncaught thread
    traceback; the reason is now in the record and the traceback in the job's log."""
    from fray_local.provider import LocalSliceProvider

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("provider bug")

    monkeypatch.setattr(LocalSliceProvider, "acquire", broken)
    jobs_dir = tmp_path / "jobs"
    cluster = LocalCluster(jobs_dir=str(jobs_dir), retry_policy=TEST_POLICY)
    try:
        info = cluster.wait(cluster.launch(_req("crash")), timeout=60)
    finally:
        cluster.close()
    assert info.status is JobStatus.FAILED
    assert info.error == "internal error in the local supervisor: RuntimeError: provider bug"
    assert _on_disk(jobs_dir, info.job_id).error == info.error
    log = (jobs_dir / info.job_id / "job.log").read_text()
    assert "[fray] Traceback" in log and "RuntimeError: provider bug" in log
    assert "Exception in thread" not in capfd.readouterr().err


def test_a_planted_record_cannot_write_to_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every byte a job (or a planted file) controls is escaped on every CLI path: a dir name, and a record's
    name, error, slices and cause, through list, list --wide, status (its attempts table and timeline), logs
    and the warnings on stderr (tests/test_cli.py covers what a running job prints and returns)."""
    from fray_core.cli import main

    jobs_dir = tmp_path / "jobs"
    hostile = "\x1b]0;title\x07\x1b[2J\u202e"
    _plant(jobs_dir, "ok", json.dumps(_record(
        "ok", name=f"n{hostile}", status="FAILED", error=f"boom {hostile}",
        attempts=[{"index": 0, "slices": [f"s{hostile}"], "started_at": 1.0, "ended_at": 2.0, "outcome": "FAILED",
                   "cause": f"cause {hostile}\nlast {hostile}"}],
    )))  # fmt: skip
    (jobs_dir / "ok" / "job.log").write_text(f"[a0 r0] out {hostile}\n")
    _plant(jobs_dir, f"evil{hostile}", "[]")
    monkeypatch.setenv("FRAY_JOBS_DIR", str(jobs_dir))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    for argv in (["list"], ["list", "--wide"], ["status", "ok"], ["logs", "ok"], ["status", f"evil{hostile}"]):
        main(argv)
        out, err = capsys.readouterr()
        for raw in ("\x1b", "\x07", "\u202e"):
            assert raw not in out and raw not in err, (argv, out, err)
        assert "\\x1b" in out + err, (argv, out, err)  # shown, escaped


def _provider_held_until(event: threading.Event) -> Any:
    """An in-memory provider whose ``acquire`` waits for ``event``: the job's first change ("waiting for ...")
    is then still the newest state when the writer takes it (a writer thread kept idle by the process takes
    work a little later than a fresh one started for it: without this the job could end first, and the final
    record would rightly replace that state unwritten)."""
    from fray_core.clock import FakeClock
    from fray_core.testing import InMemorySliceProvider

    class Held(InMemorySliceProvider):
        def acquire(self, *args: Any, **kwargs: Any) -> Any:
            assert event.wait(60)
            return super().acquire(*args, **kwargs)

    return Held({}, FakeClock(), host_delay=1.0)


def test_a_remote_store_writes_states_behind_the_job_newest_only_and_never_after_the_final_one(
    tmp_path: Path,
) -> None:
    """To a remote store (Ray's KV, ``gs://``; ``memory://`` here) a state that is not final is written behind
    the job: a store that hangs does not hold the runner up, states that came while a write was in flight
    are replaced by the newest, and the final record waits for the write in flight and is the last one."""
    from fray_core.joblog import LogSink
    from fray_core.runner import RetryPolicy
    from fray_core.supervisor import Supervisor

    gate = threading.Event()
    blocked = threading.Event()

    class SlowStore(JobStore):
        written: list[tuple[str, str | None]] = []

        def write_record(self, job_id: str, record: dict[str, Any]) -> int:
            if record["progress"] is not None and record["status"] == "PENDING":  # the runner's first change
                blocked.set()
                assert gate.wait(60)
            self.written.append((record["status"], record["progress"]))
            return super().write_record(job_id, record)

    store = SlowStore(f"memory://fray-write-behind-{os.getpid()}/jobs")
    assert not store.is_local
    job_id = store.new_job("wb")
    request = _req("wb")
    provider = _provider_held_until(blocked)
    sup = Supervisor(
        store, request, provider, LogSink(str(tmp_path / "job.log")),
        info=JobInfo(job_id=job_id, name="wb", status=JobStatus.PENDING), policy=RetryPolicy(poll_interval=0.05),
        owner={"owner": {"test": 1}}, label="test",
    )  # fmt: skip
    sup.start()
    assert blocked.wait(60)
    # the job ran to its end while its first change's write hung
    wait_for(lambda: sup.runner.info.status is JobStatus.SUCCEEDED, what="the job to end with its store hung")
    assert not sup.done.is_set() and store.written == [("PENDING", None)]
    gate.set()
    assert sup.done.wait(60)
    statuses = [s for s, _ in store.written]
    assert statuses[0] == statuses[1] == "PENDING" and statuses[-1] == "SUCCEEDED", store.written
    assert "RUNNING" not in statuses, store.written  # came while the first change was in flight: replaced
    assert len(store.written) == 3, store.written
    assert store.read_info(job_id)[0].status is JobStatus.SUCCEEDED


def test_a_state_written_behind_that_lands_after_the_final_record_is_followed_by_the_final_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that hangs longer than the final record waits (``WRITE_BEHIND_WAIT``): the final record is
    written without it, the stale state lands after it when the store comes back, and its writer writes the
    final record once more, so the record ends final (a poll would otherwise read a SUCCEEDED job as PENDING
    with its supervisor gone)."""
    from fray_core import supervisor as supervisor_module
    from fray_core.joblog import LogSink
    from fray_core.runner import RetryPolicy
    from fray_core.supervisor import Supervisor

    monkeypatch.setattr(supervisor_module, "WRITE_BEHIND_WAIT", 0.2)
    gate = threading.Event()
    blocked = threading.Event()

    class HangingStore(JobStore):
        written: list[str] = []

        def write_record(self, job_id: str, record: dict[str, Any]) -> int:
            if record["progress"] is not None and record["status"] == "PENDING":
                blocked.set()
                assert gate.wait(60)
            self.written.append(record["status"])
            return super().write_record(job_id, record)

    store = HangingStore(f"memory://fray-late-final-{os.getpid()}/jobs")
    job_id = store.new_job("late")
    sup = Supervisor(
        store, _req("late"), _provider_held_until(blocked),
        LogSink(str(tmp_path / "job.log")), info=JobInfo(job_id=job_id, name="late", status=JobStatus.PENDING),
        policy=RetryPolicy(poll_interval=0.05), owner={"owner": {"test": 1}}, label="test",
    )  # fmt: skip
    sup.start()
    assert sup.done.wait(60)  # the final record did not wait for the hung write past WRITE_BEHIND_WAIT
    assert store.written == ["PENDING", "SUCCEEDED"], store.written
    gate.set()
    wait_for(lambda: len(store.written) == 4, what="the hung write to land, then the final record again")
    assert store.written == ["PENDING", "SUCCEEDED", "PENDING", "SUCCEEDED"], store.written
    assert store.read_info(job_id)[0].status is JobStatus.SUCCEEDED
