"""No process outlives its job on the local backend, even when the host's guardian cannot clean up.

The guardian (``fray_local._host``) kills its subtree when its host ends; it cannot when it is itself
SIGKILLed (the OOM killer) or stopped. A grandchild that called ``setsid`` is outside the guardian's process
group, so only the supervisor's sweep of the host run's mark (``fray_local._proc.sweep_run``) reaches it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from fray_core import Entrypoint, JobRequest, JobStatus
from fray_core._procfs import start_ticks, stat_fields
from fray_local import LocalCluster, _proc

import helpers

pytestmark = pytest.mark.skipif(not _proc.LINUX, reason="the sweep reads /proc (Linux)")


# ------------------------------------------------------------------------------- the job (runs in the worker)


def orphaning_job(pid_dir: str, stop_guardian: bool) -> None:
    """Double-fork a ``setsid`` grandchild (``sleep``), write its pid and the guardian's, then wait; with
    ``stop_guardian``, SIGSTOP the guardian (our parent) first."""
    import os
    import signal
    import time

    from fray_core.testing.conformance import write_whole

    guardian = os.getppid()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        child = os.fork()
        if child == 0:
            os.execvp("sleep", ["sleep", "300"])
        write_whole(os.path.join(pid_dir, "orphan"), str(child))
        os._exit(0)
    os.waitpid(middle, 0)
    if stop_guardian:
        os.kill(guardian, signal.SIGSTOP)
    write_whole(os.path.join(pid_dir, "guardian"), str(guardian))
    time.sleep(300)


# ------------------------------------------------------------------------------------------------ helpers


def _alive(pid: int, born: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``born`` (a zombie or a reused pid is not)."""
    return born is not None and start_ticks(pid) == born


def _kill(pid: int, born: int | None, *sigs: int) -> None:
    for sig in sigs:
        if _alive(pid, born):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


@pytest.fixture
def cluster(tmp_local_cluster: LocalCluster) -> LocalCluster:
    return tmp_local_cluster


def _launch(cluster: LocalCluster, pid_dir: Path, stop_guardian: bool) -> tuple[str, dict[str, tuple[int, int | None]]]:
    """Launch the job and wait until it wrote both pids: ``{name: (pid, start ticks)}``."""
    request = JobRequest(
        name="orphans",
        entrypoint=Entrypoint(
            callable=orphaning_job, function_args={"pid_dir": str(pid_dir), "stop_guardian": stop_guardian}
        ),
    )
    job_id = cluster.launch(request)
    helpers.wait_for(lambda: (pid_dir / "guardian").exists(), 60, "the job to start its grandchild", interval=0.02)
    pids = {}
    for name in ("orphan", "guardian"):
        pid = int((pid_dir / name).read_text())
        pids[name] = (pid, start_ticks(pid))
    return job_id, pids


# -------------------------------------------------------------------------------------------------- tests


def test_a_setsid_grandchild_dies_when_the_guardian_is_sigkilled(cluster: LocalCluster, tmp_path: Path) -> None:
    pids: dict[str, tuple[int, int | None]] = {}
    try:
        job_id, pids = _launch(cluster, tmp_path, stop_guardian=False)
        orphan, guardian = pids["orphan"], pids["guardian"]
        session = {pid: (stat_fields(pid) or ["", "", "", ""])[3] for pid in (orphan[0], guardian[0])}
        assert _alive(*orphan) and session[orphan[0]] != session[guardian[0]]  # outside the guardian's group
        assert b"fray_local._host" in Path(f"/proc/{guardian[0]}/cmdline").read_bytes()
        os.kill(guardian[0], signal.SIGKILL)  # as the OOM killer would: the guardian cannot clean up
        info = cluster.wait(job_id, timeout=60)
        assert info.status == JobStatus.FAILED and "SIGKILL" in (info.error or ""), info.error
        helpers.wait_for(lambda: not _alive(*orphan), 5, f"the orphaned grandchild {orphan[0]} to be killed")
    finally:
        for pid, born in pids.values():
            _kill(pid, born, signal.SIGKILL)


def test_a_setsid_grandchild_dies_when_a_stopped_guardian_is_terminated(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_proc, "TEARDOWN_GRACE", 1.0)  # the stopped guardian's group is killed after 1 s
    pids: dict[str, tuple[int, int | None]] = {}
    try:
        job_id, pids = _launch(cluster, tmp_path, stop_guardian=True)
        orphan, guardian = pids["orphan"], pids["guardian"]
        helpers.wait_for(lambda: (stat_fields(guardian[0]) or ["?"])[0] == "T", 10, "the guardian to be stopped")
        cluster.terminate(job_id)
        info = cluster.wait(job_id, timeout=60)
        assert info.status == JobStatus.STOPPED, info
        helpers.wait_for(lambda: not _alive(*orphan), 5, f"the orphaned grandchild {orphan[0]} to be killed")
    finally:
        if "guardian" in pids:
            _kill(*pids["guardian"], signal.SIGCONT, signal.SIGKILL)
        if "orphan" in pids:
            _kill(*pids["orphan"], signal.SIGKILL)


def test_a_sweep_kills_only_what_carries_the_run_token(tmp_path: Path) -> None:
    """The sweep kills every process with the run's token, in any session, and nothing else."""
    import subprocess

    token = "test-" + os.urandom(8).hex()
    env = dict(os.environ, **{_proc.RUN_ENV: f"outer,{token}"})
    other_env = dict(os.environ, **{_proc.RUN_ENV: f"{token}x"})
    kw = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "start_new_session": True}
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, **kw)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=other_env, **kw)
    try:
        helpers.wait_for(lambda: _proc._carries(marked.pid, token.encode()), 10, "the marked process to exec")
        assert _proc.sweep_run(token, since=start_ticks(os.getpid())) == 1
        assert marked.wait(5) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for p in (marked, other):
            p.kill()
            p.wait()
