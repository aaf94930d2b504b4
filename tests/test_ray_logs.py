"""Logs once: host output reaches a ``fray launch --wait`` once, rank-prefixed (Ray's log-to-driver copy is
off); a remote store's log grows by appends, not by re-uploading it whole; a host sends its lines in
batches, at most one in flight, with bounded memory; Fray's own actors record no Ray task events."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
fsspec = pytest.importorskip("fsspec")

from fray_core._logupload import append_upload  # noqa: E402


class Counting:
    """An fsspec filesystem wrapper counting the bytes written through it (``merge``: composing, as gcsfs)."""

    def __init__(self, fs: Any, merge: bool) -> None:
        self.fs = fs
        self.written = 0
        if merge:
            self.merge = self._merge

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def open(self, path: str, mode: str = "rb") -> Any:
        f = self.fs.open(path, mode)
        return _CountedFile(f, self) if "w" in mode or "a" in mode else f

    def _merge(self, path: str, paths: list[str]) -> None:  # server-side compose: no bytes from the client
        self.fs.pipe_file(path, b"".join(self.fs.cat_file(p) for p in paths))


class _CountedFile:
    def __init__(self, f: Any, owner: Counting) -> None:
        self.f, self.owner = f, owner

    def write(self, data: bytes) -> int:
        self.owner.written += len(data)
        return self.f.write(data)

    def __enter__(self) -> _CountedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()


@pytest.mark.parametrize("merge", [False, True], ids=["append", "compose"])
def test_a_remote_log_is_appended_not_reuploaded(tmp_path: Path, merge: bool) -> None:
    fs = Counting(fsspec.filesystem("memory"), merge)
    src, dst = tmp_path / "job.log", f"/store-{merge}/job/job.log"
    offset = 0
    with open(src, "wb") as log:
        for i in range(200):
            log.write(f"[s0/h0] line {i} {'x' * 80}\n".encode())
            log.flush()
            offset = append_upload(fs, str(src), dst, offset)
        log.write(b"a half line")  # not sent until it is whole
        log.flush()
        offset = append_upload(fs, str(src), dst, offset)
    size = src.stat().st_size - len(b"a half line")
    assert fs.fs.cat_file(dst) == src.read_bytes()[:size] and offset == size
    assert fs.written == size  # linear in the log's length (re-uploading wrote ~100x as much here)


def test_fray_launch_wait_prints_each_host_line_once(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "chatty.py").write_text(
        "import os\n\ndef main():\n    print('hello from host', os.environ['FRAY_HOST_ID'], flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), str(tmp_path)])}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fray_core.cli",
            "launch",
            "--cluster",
            f"ray?address={ray_tpu_cluster.address}",
            "--tpu",
            "v4-16",
            "--wait",
            "chatty:main",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    both = out.stdout + out.stderr
    for h in (0, 1):
        assert both.count(f"hello from host {h}") == 1, both


def test_a_hosts_log_batches_are_one_in_flight_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor that does not answer: the host keeps sending nothing more than one batch, keeps at most
    LOG_PENDING_MAX lines and says how many it dropped."""
    from fray_ray import _host

    sent: list[list[str]] = []
    endings: list[bool] = []

    class Stuck:
        class append_log:  # noqa: N801 (Ray's method-handle shape)
            @staticmethod
            def remote(job_id: str, tag: str, lines: list[str], ending: bool = False) -> Any:
                sent.append(lines)
                endings.append(ending)
                return object()

    monkeypatch.setattr(_host, "LOG_PENDING_MAX", 50)
    monkeypatch.setattr(ray, "wait", lambda refs, **kw: ([], list(refs)))  # the batch in flight never completes
    pump = _host._LogPump.__new__(_host._LogPump)  # its state only: no fds redirected
    pump.tag, pump.supervisor, pump._pending, pump._dropped, pump._last_send = "s0/h0", Stuck, [], 0, None
    pump.job_id, pump._closed = "job-1", False
    pump._lock = threading.Lock()
    pump.tail = collections.deque(maxlen=5)
    for i in range(10):
        pump.feed(f"line {i}")
    pump._flush()
    for i in range(10, 200):
        pump.feed(f"line {i}")
        pump._flush()
    assert len(sent) == 1 and len(pump._pending) == 50  # one batch in flight; the rest waits, bounded
    pump._flush(last=True)
    assert sent[-1][0] == "[fray] 140 line(s) of this host dropped: the job's supervisor could not keep up"
    assert sent[-1][1:] == [f"line {i}" for i in range(150, 200)]
    assert endings == [False, True]  # the last batch says the host is ending (RaySliceProvider.mark_ending)
    pump._pending, pump._dropped = [], 0
    pump._flush(last=True)  # with nothing left to send, the host still says it is ending
    assert sent[-1] == [] and endings[-1] is True


@pytest.mark.parametrize("fails", ["reaper", "pump", "stacks"])
def test_a_host_that_fails_before_its_log_pump_exists_still_says_it_is_ending(
    fails: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor must know a host is ending before its task's reply exists (it never cancels such a task:
    Ray 2.60's cancel-vs-reply race crashes the supervisor's process). A host whose reaper or log pump cannot
    start (no fds, no fork) has no last batch to say it: it says so itself, then fails with its own error.
    One that fails just after (``stacks``: the stack dump's signal handler) closes its pump, which says it."""
    from fray_ray import _host

    calls: list[tuple[str, str, list[str], bool]] = []
    finished: list[str] = []

    class Supervisor:
        class append_log:  # noqa: N801 (Ray's method-handle shape)
            @staticmethod
            def remote(job_id: str, tag: str, lines: list[str], ending: bool = False) -> Any:
                calls.append((job_id, tag, lines, ending))
                return "ref"

    class Reaper:
        token = "t"

        def finish(self) -> None:
            finished.append(self.token)

    def broken(*_a: Any, **_k: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: None)  # the call's reply: no cluster needed

    class Pump:
        def __init__(self, *_a: Any) -> None:
            pass

        def close(self) -> None:
            finished.append("pump")

    if fails == "reaper":
        monkeypatch.setattr(_host, "_Reaper", broken)
    elif fails == "pump":
        monkeypatch.setattr(_host, "_Reaper", Reaper)
        monkeypatch.setattr(_host, "_LogPump", broken)
    else:
        monkeypatch.setattr(_host, "_Reaper", Reaper)
        monkeypatch.setattr(_host, "_LogPump", Pump)
        monkeypatch.setattr(_host.faulthandler, "register", broken)
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # _run_host sets it; restored after the test
    config = _host.HostConfig(sys_path=(), cwd=os.getcwd(), supervisor=Supervisor, job_id="job-1")
    with pytest.raises(OSError, match="Too many open files"):
        _host._run_host(b"", {}, "a0 s0/h0", "host 0", config)
    # a reaper that started is told the host is over; a pump that started is closed (its last batch says it)
    assert finished == {"reaper": [], "pump": ["t"], "stacks": ["t", "pump"]}[fails]
    assert calls == ([] if fails == "stacks" else [("job-1", "a0 s0/h0", [], True)])


def test_frays_own_actors_record_no_task_events() -> None:
    from fray_ray.cluster import _Supervisor
    from fray_ray.scheduler import _SchedulerActor

    for actor in (_Supervisor, _SchedulerActor):
        assert actor._default_options.get("enable_task_events") is False, actor
