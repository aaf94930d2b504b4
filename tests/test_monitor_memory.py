"""``Cluster.monitor`` in bounded memory: its log pump waits for a slow view instead of queueing the whole log,
stops when the monitor ends, and prints nothing of its own (an unknown job id only raises in the caller)."""

from __future__ import annotations

import io
import sys
import threading
import time
import tracemalloc

import pytest

from fray_core import Entrypoint, JobRequest, JobStatus
from fray_core.cluster import MonitorView
from fray_core.errors import JobNotFoundError
from fray_local import LocalCluster

BIG = 64 << 20  # characters the job prints, with no newline


class SlowOut(io.TextIOBase):
    """An output sink slower than the disk: counts what it is given, keeps none of it."""

    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay
        self.job_chars = 0  # the job's 'x's that came through
        self.fray_lines: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if s.startswith("[fray]"):
            self.fray_lines.append(s)
        elif s != "\n":
            self.job_chars += s.count("x")
            time.sleep(self.delay)
        return len(s)


def _pump_threads(job_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"fray-monitor-{job_id}"]


@pytest.fixture
def cluster(tmp_local_cluster: LocalCluster) -> LocalCluster:
    return tmp_local_cluster


@pytest.fixture
def big_job(cluster: LocalCluster) -> str:
    """A job that printed BIG characters without a newline, and ended."""
    code = f"import sys\nsys.stdout.write('x' * {BIG})\nsys.stdout.flush()"
    job_id = cluster.launch(JobRequest(name="big", entrypoint=Entrypoint(binary=sys.executable, args=["-c", code])))
    assert cluster.wait(job_id, timeout=60).status is JobStatus.SUCCEEDED
    return job_id


def test_monitor_memory_is_bounded_with_a_slow_output(cluster: LocalCluster, big_job: str) -> None:
    """The whole log is there already and the view is slow: the pump used to read all of it into its queue
    (peak ~ the log's size); now it waits for the view, holding a few MiB whatever the log's size."""
    out = SlowOut()
    tracemalloc.start()
    try:
        for _ in cluster.logs(big_job):  # what reading the log costs by itself (fray logs): not the monitor's
            pass
        _, reading = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        info = cluster.monitor(big_job, out=out, timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.status is JobStatus.SUCCEEDED
    assert out.job_chars == BIG  # every character shown, once
    assert any("SUCCEEDED" in line for line in out.fray_lines), out.fray_lines
    assert peak < reading + (12 << 20), (
        f"monitor held {peak / (1 << 20):.0f} MiB for a {BIG >> 20} MiB log (reading it: {reading / (1 << 20):.0f} MiB)"
    )


def test_monitor_pump_stops_when_the_view_fails(cluster: LocalCluster, big_job: str) -> None:
    """The monitor ends (its view raised) while the pump waits for room: the pump stops, nothing deadlocks."""

    class Failing(MonitorView):
        def log(self, line: str) -> None:
            raise RuntimeError("sink gone")

    with pytest.raises(RuntimeError, match="sink gone"):
        cluster.monitor(big_job, view=Failing(io.StringIO()), timeout=60)
    deadline = time.monotonic() + 10
    while _pump_threads(big_job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pump_threads(big_job), "the log pump still runs after monitor() raised"


def test_monitor_unknown_job_raises_and_prints_nothing(
    cluster: LocalCluster, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hooked: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    with pytest.raises(JobNotFoundError, match="nope"):
        cluster.monitor("nope", out=io.StringIO(), timeout=10)
    for t in _pump_threads("nope"):
        t.join(10)
    assert not hooked, [str(h.exc_value) for h in hooked]
    captured = capfd.readouterr()
    assert captured.err == "", captured.err
    assert "Exception in thread" not in captured.out
