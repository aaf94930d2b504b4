"""Hardening (issue 32): signals named by name, no guardian traceback, bounded output, bounded listeners,
validated numbers, sane size limits, monotonic durations, unpicklable session results with context."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray_core import Entrypoint, JobRequest, JobStatus
from fray_local import LocalCluster
from fray_local.testing import TEST_POLICY

REPO = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guardian and /proc are Linux-only")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLUSTER_SPEC"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    yield c
    c.close()


# ------------------------------------------------------------------------- 1. signals, named by name


def kill_myself(sig: int) -> None:
    os.kill(os.getpid(), sig)


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_host_killed_by_a_signal_is_reported_by_its_name(cluster: LocalCluster, sig: int) -> None:
    job_id = cluster.launch(JobRequest(name="oom", entrypoint=Entrypoint(callable=kill_myself, function_args={"sig": sig})))
    info = cluster.wait(job_id, timeout=60)
    cause = info.attempts[0].cause or ""
    name = signal.Signals(sig).name
    assert info.status == JobStatus.FAILED and f"killed by {name}" in cause, cause
    assert "exited with code" not in cause
    log = "\n".join(cluster.logs(job_id))
    assert "Traceback" not in log and "Errno 22" not in log, log  # the guardian's own traceback, before the fix


def test_a_command_killed_by_a_signal_is_reported_by_its_name(cluster: LocalCluster) -> None:
    job_id = cluster.launch(JobRequest(name="cmd", entrypoint=Entrypoint.from_binary("sh", ["-c", "kill -9 $$"])))
    info = cluster.wait(job_id, timeout=60)
    assert "CommandFailed: killed by SIGKILL" in (info.attempts[0].cause or ""), info.attempts[0].cause


def test_describe_exit_names_signals() -> None:
    from fray_core._exits import describe_exit, exit_code_text

    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(3) == "exited with code 3"
    assert exit_code_text(-signal.SIGSEGV) == "killed by SIGSEGV" and exit_code_text(7) == "exit code 7"
    assert describe_exit(-200) == "killed by signal 200"


@linux_only
def test_the_readme_demo_and_fray_sim_print_no_traceback(tmp_path: Path) -> None:
    env = _env(FRAY_JOBS_DIR=str(tmp_path / "jobs"))
    demo = subprocess.run(
        [sys.executable, str(REPO / "examples" / "multislice_demo.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "PREEMPTED" in demo.stdout  # the simulated preemption did happen
    assert "Traceback" not in demo.stdout + demo.stderr, demo.stdout + demo.stderr
    sim = subprocess.run(
        [sys.executable, "-m", "fray_core.cli", "sim", "--preemptions", "1", "--seed", "3", "--steps", "4", "--step-time", "0.2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert "PREEMPTED" in sim.stdout
    assert "Traceback" not in sim.stdout + sim.stderr, sim.stdout + sim.stderr
