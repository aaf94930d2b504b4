"""``SliceProvider.start`` is all or nothing, and so is an attempt's start (issue 32's "half-started gang
leaks"): when a host of slice ``s`` cannot be started (a fork failing with EAGAIN), the provider stops the
hosts of slice ``s`` it had already started, the runner stops and collects the hosts of the slices started
before it, and only then is the attempt retried. No host of attempt k is alive when attempt k+1 starts, and
none outlives the job."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fray_core.provider import HostRun, HostSpec, SliceLease
from fray_core.records import pid_alive
from fray_core.runner import GangRunner, RetryPolicy
from fray_core.testing import FakeClock, InMemorySliceProvider
from fray_core.types import AttemptOutcome, Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY

from helpers import wait_for

ENTRY = Entrypoint(binary="true")


# ------------------------------------------------------------------------------------ the runner's part


class _ForkFailsOnSlice(InMemorySliceProvider):
    """Slice ``bad`` of attempt 0 cannot be started (as a provider that undid its partial start)."""

    bad = 1

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        if hosts[0].attempt == 0 and hosts[0].slice_index == self.bad:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable (fork)")
        return super().start(lease, hosts, entrypoint)


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_a_slice_that_cannot_start_stops_the_slices_started_before_it(bad: int) -> None:
    clock = FakeClock()
    provider = _ForkFailsOnSlice({"v4-16": 3}, clock, script=lambda a, s, h: None if a == 0 else "SUCCEEDED")
    provider.bad = bad
    request = JobRequest(name="j", entrypoint=ENTRY, resources=ResourceConfig.with_tpu("v4-16", slice_count=3))
    policy = RetryPolicy(backoff_initial=1.0, poll_interval=1.0)
    runner = GangRunner("j", request, provider, policy=policy, clock=clock, wall=clock.wall, sleep=clock.sleep)
    assert runner.run().status is JobStatus.SUCCEEDED
    first, second = runner.info.attempts
    assert first.outcome is AttemptOutcome.PREEMPTED and "host start failed: BlockingIOError: [Errno 11]" in first.cause
    started = provider.runs_of(0)
    assert len(started) == 2 * bad  # the slices before the bad one, 2 hosts each
    assert all(r.kind is not None and r.kind.value == "CANCELLED" and r.reported for r in started)
    # stopped and collected before attempt 0's slices were released, so before attempt 1 acquired anything
    attempt1 = min(r.started_at for r in provider.runs_of(1))
    assert all(r.ended_at is not None and r.ended_at <= attempt1 for r in started)
    assert second.outcome is AttemptOutcome.SUCCEEDED
    provider.check()  # every lease released once, no host running when its slice was released


# ----------------------------------------------------------------------------------- the local backend


def hang_in_attempt_0(marker_dir: str) -> int:
    """Marks its pid; in attempt 0 runs until killed (120 s at most), later returns at once."""
    name = f"a{os.environ['FRAY_ATTEMPT']}-s{os.environ['FRAY_SLICE_ID']}-h{os.environ['FRAY_HOST_ID']}"
    Path(marker_dir, name).write_text(str(os.getpid()))
    if os.environ["FRAY_ATTEMPT"] == "0":
        time.sleep(120)
    return os.getpid()


@pytest.mark.parametrize("fail_at", [2, 3])  # the 3rd / 4th of 4 host forks of attempt 0 fails with EAGAIN
def test_local_a_failed_fork_leaves_no_host_of_the_attempt_running(
    fail_at: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fray_local._proc as proc

    real_spawn = proc.spawn
    spawned: dict[str, list[subprocess.Popen]] = {}  # attempt -> its guardians, in fork order
    alive_at_next: list[str] = []

    def spawn(argv: list[str], **kw: Any) -> subprocess.Popen:
        attempt = kw["env"]["FRAY_ATTEMPT"]
        if attempt == "1" and "1" not in spawned:  # the first fork of attempt 1: is anything of attempt 0 left?
            alive_at_next.extend(f"guardian {p.pid}" for p in spawned.get("0", []) if pid_alive(p.pid))
            alive_at_next.extend(
                f"{m.name} (pid {m.read_text()})" for m in tmp_path.glob("a0-*") if pid_alive(int(m.read_text()))
            )
        forks = spawned.setdefault(attempt, [])
        if attempt == "0" and len(forks) == fail_at:
            # let the hosts already forked reach the user's code, so there is something to leak
            wait_for(lambda: len(list(tmp_path.glob("a0-*"))) == fail_at, what="the earlier hosts to run")
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        p = real_spawn(argv, **kw)
        forks.append(p)
        return p

    monkeypatch.setattr(proc, "spawn", spawn)
    fleet = TpuFleet({"v4-16": 2}, state_dir=str(tmp_path / "fleet"))
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    try:
        request = JobRequest(
            name="fork-fails",
            entrypoint=Entrypoint(callable=hang_in_attempt_0, function_args={"marker_dir": str(tmp_path)}),
            resources=ResourceConfig.with_tpu("v4-16", slice_count=2),
            max_retries_preemption=1,
        )
        info = cluster.wait(cluster.launch(request), timeout=120)
    finally:
        cluster.close()
        fleet.close()
    assert info.status is JobStatus.SUCCEEDED, info.error
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert "host start failed: BlockingIOError: [Errno 11]" in info.attempts[0].cause
    assert len(spawned["0"]) == fail_at
    assert alive_at_next == []  # nothing of attempt 0 was running when attempt 1 started
    for m in tmp_path.glob("a*-s*-h*"):  # and nothing outlived the job
        assert not pid_alive(int(m.read_text())), m.name
