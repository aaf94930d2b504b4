"""The ``fray`` command line, run for real: the console script (or ``python -m fray_core.cli``) in a
subprocess, against the local backend, with ``FRAY_JOBS_DIR`` in a temp dir.

No sleeps as synchronisation: tests wait on marker files or on commands that block until a job ends
(``fray launch --wait``, ``fray logs -f``), always with a deadline.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import wait_for

from fray_core.cli import _parse_call_args, format_table, main
from fray_core.cluster import describe_progress
from fray_core.types import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY

JOBS_MOD = '''
import os, time

def add(x, y=0):
    print(f"adding {x} + {y}", flush=True)
    return x + y

def fail():
    raise ValueError("bad input from the job")

def where():
    print(f"host {os.environ['TPU_WORKER_ID']} of {os.environ['TPU_NAME']}", flush=True)
    return [os.environ["FRAY_SLICE_ID"], os.environ["TPU_WORKER_ID"], os.environ.get("MEGASCALE_NUM_SLICES")]

def getenv(name):
    return os.environ.get(name)

def block(marker, limit=120):
    print("blocking", flush=True)
    open(marker, "w").close()
    end = time.time() + limit
    while time.time() < end:
        time.sleep(0.05)
    raise TimeoutError("nobody stopped this job")
'''

SCRIPT = '''
import sys
print("script args:", " ".join(sys.argv[1:]), flush=True)
'''


def _fray_command() -> list[str]:
    """The installed console script next to this Python, else ``python -m fray_core.cli``."""
    script = Path(sys.executable).with_name("fray")
    if script.exists():
        return [str(script)]
    found = shutil.which("fray")
    return [found] if found else [sys.executable, "-m", "fray_core.cli"]


FRAY = _fray_command()


class Fray:
    """Runs ``fray ...`` in a work dir with its own jobs dir."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.jobs_dir = workdir / "jobs"
        self.env = {k: v for k, v in os.environ.items() if k != "FRAY_CLUSTER_SPEC"}
        self.env["FRAY_JOBS_DIR"] = str(self.jobs_dir)

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*FRAY, *args], cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def status(self, job_id: str) -> dict:
        r = self("status", job_id, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def owner_pid(self, job_id: str) -> int:
        return int(json.loads((self.jobs_dir / job_id / "record.json").read_text())["owner"]["pid"])


@pytest.fixture
def fray(tmp_path: Path) -> Fray:
    (tmp_path / "jobs_mod.py").write_text(JOBS_MOD)
    (tmp_path / "script.py").write_text(SCRIPT)
    return Fray(tmp_path)



def launched_id(stdout: str) -> str:
    m = re.search(r"^\[fray\] launched (\S+)", stdout, re.M)
    assert m, stdout
    return m.group(1)


# ------------------------------------------------------------------------------------------- launch


def test_launch_wait_callable_succeeds(fray: Fray) -> None:
    r = fray("launch", "--wait", "jobs_mod:add", "2", "y=3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[a0 r0] adding 2 + 3" in r.stdout
    assert "SUCCEEDED" in r.stdout
    assert "[fray] result[0]: 5" in r.stdout
    assert r.stderr == ""


def test_launch_wait_env_and_name(fray: Fray) -> None:
    r = fray("launch", "--wait", "--name", "env-check", "--env", "FOO=bar baz", "jobs_mod:getenv", "FOO")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result[0]: 'bar baz'" in r.stdout
    assert launched_id(r.stdout).startswith("env-check-")


def test_launch_wait_callable_fails_exit_1(fray: Fray) -> None:
    r = fray("launch", "--wait", "--max-retries-failure", "1", "jobs_mod:fail")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ValueError: bad input from the job" in r.stdout  # the host's traceback, in the streamed log
    assert "attempt 0 FAILED" in r.stdout and "attempt 1 FAILED" in r.stdout  # 1 retry = 2 attempts
    info = fray.status(launched_id(r.stdout))
    assert info["status"] == "FAILED" and info["failures"] == 2
    assert "max_retries_failure=1" in info["error"]


def test_launch_script_prints_only_the_id(fray: Fray) -> None:
    # capture_output would hang here if the detached supervisor kept our stdout/stderr open
    r = fray("launch", "script.py", "--lr", "3e-4")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert r.stdout == job_id + "\n" and job_id.startswith("script-")
    f = fray("logs", "-f", job_id)  # follows until the job ends, exits with its status
    assert f.returncode == 0, f.stdout + f.stderr
    assert "[a0 r0] script args: --lr 3e-4" in f.stdout
    assert fray.status(job_id)["status"] == "SUCCEEDED"


def test_launch_command(fray: Fray) -> None:
    r = fray("launch", "--wait", sys.executable, "-c", "print('from a command')")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[a0 r0] from a command" in r.stdout


def test_tpu_multislice_list_status_logs(fray: Fray) -> None:
    spec = "local?tpu=v4-16:2"
    r = fray("launch", "--wait", "--tpu", "v4-16", "--slices", "2", "--cluster", spec, "jobs_mod:where")
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = launched_id(r.stdout)
    assert "result[3]: ['1', '1', '2']" in r.stdout  # slice 1 host 1, with the multislice env

    listing = fray("list", "--cluster", spec)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "ATTEMPTS", "PREEMPT/FAIL", "AGE"]
    row = next(r for r in rows if r.startswith(job_id))
    assert row.split()[1:5] == ["where", "SUCCEEDED", "1", "0/0"]

    st = fray("status", job_id)
    assert st.returncode == 0, st.stderr
    assert re.search(r"^status\s+SUCCEEDED$", st.stdout, re.M)
    assert "2 x v4-16 (2 host(s) per slice)" in st.stdout
    assert re.search(r"^ATTEMPT\s+SLICES\s+OUTCOME\s+DURATION\s+CAUSE$", st.stdout, re.M)
    assert re.search(r"^0\s+v4-16-0, v4-16-1\s+SUCCEEDED\s+\d", st.stdout, re.M)
    record = fray.status(job_id)
    assert record["attempts"][0]["slices"] == ["v4-16-0", "v4-16-1"]
    assert sorted(map(tuple, record["result"])) == [("0", "0", "2"), ("0", "1", "2"), ("1", "0", "2"), ("1", "1", "2")]

    logs = fray("logs", job_id)
    assert logs.returncode == 0
    for s in (0, 1):
        for h in (0, 1):
            assert f"[a0 s{s}/h{h}] host {h} of v4-16-{s}" in logs.stdout


def test_request_that_can_never_fit_fails(fray: Fray) -> None:
    r = fray("launch", "--wait", "--tpu", "v4-16", "--slices", "3", "--cluster", "local?tpu=v4-16:2", "jobs_mod:where")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "UNSCHEDULABLE" in r.stdout and "can never fit" in r.stdout


# --------------------------------------------------------------------------------------- stop, owner


def test_stop_running_job(fray: Fray) -> None:
    marker = fray.workdir / "started"
    r = fray("launch", "jobs_mod:block", f"marker={marker}")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    wait_for(marker.exists, what="the job to start")
    assert fray.status(job_id)["status"] == "RUNNING"
    s = fray("stop", job_id)
    assert s.returncode == 0, s.stderr
    assert s.stdout.strip() == f"{job_id}: STOPPED"
    info = fray.status(job_id)
    assert info["status"] == "STOPPED"
    assert info["attempts"][-1]["outcome"] == "CANCELLED"
    assert fray("logs", "-f", job_id).returncode == 3  # a STOPPED job
    again = fray("stop", job_id)
    assert again.returncode == 0 and "already ended STOPPED" in again.stdout


def test_job_whose_supervisor_died_is_reported_failed(fray: Fray) -> None:
    marker = fray.workdir / "started"
    job_id = fray("launch", "jobs_mod:block", f"marker={marker}").stdout.strip()
    wait_for(marker.exists, what="the job to start")
    os.kill(fray.owner_pid(job_id), signal.SIGKILL)  # the detached supervisor this test started
    wait_for(lambda: fray.status(job_id)["status"] == "FAILED", what="the job to be reported FAILED")
    assert "died before the job ended" in fray.status(job_id)["error"]


def test_sigterm_to_supervisor_stops_the_job(fray: Fray) -> None:
    marker = fray.workdir / "started"
    job_id = fray("launch", "jobs_mod:block", f"marker={marker}").stdout.strip()
    wait_for(marker.exists, what="the job to start")
    os.kill(fray.owner_pid(job_id), signal.SIGTERM)
    wait_for(lambda: fray.status(job_id)["status"] == "STOPPED", what="the job to stop")


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("command", ["status", "logs", "stop"])
def test_unknown_id_exit_2(fray: Fray, command: str) -> None:
    r = fray(command, "no-such-job")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"fray {command}: error: unknown job id 'no-such-job'" in r.stderr


def test_bad_tpu_type_names_field_and_value(fray: Fray) -> None:
    r = fray("launch", "--tpu", "v4-17", "jobs_mod:add", "1")
    assert r.returncode == 2
    assert "TpuConfig.type" in r.stderr and "'v4-17'" in r.stderr and "v4-16" in r.stderr
    assert "Traceback" not in r.stderr
    assert not fray.jobs_dir.exists() or not any(fray.jobs_dir.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "no_such_module:fn"], "cannot import module 'no_such_module'"),
        (["launch", "jobs_mod:nope"], "has no attribute 'nope'"),
        (["launch", "missing.py"], "no such script: 'missing.py'"),
        (["launch", "no-such-command-xyz"], "command not found"),
        (["launch", "--slices", "2", "jobs_mod:add"], "--slices needs --tpu"),
        (["launch", "--slices", "0", "--tpu", "v4-16", "jobs_mod:add"], "argument --slices"),
        (["launch", "--ram", "lots", "jobs_mod:add"], "ResourceConfig.ram"),
        (["list", "--cluster", "nosuch"], "unknown backend 'nosuch'"),
        (["list", "--cluster", "local?color=red"], "unknown option(s) 'color'"),
    ],
)
def test_bad_input_exit_2(fray: Fray, args: list[str], message: str) -> None:
    r = fray(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_help_documents_exit_codes(fray: Fray) -> None:
    r = fray("--help")
    assert r.returncode == 0
    assert "exit codes:" in r.stdout and "STOPPED" in r.stdout
    for command in ("launch", "list", "status", "logs", "stop", "sim"):
        assert command in r.stdout
    assert fray().returncode == 2  # no command


def test_module_invocation_works(fray: Fray) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fray_core.cli", "list"], cwd=fray.workdir, env=fray.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "no jobs under" in r.stderr


# ---------------------------------------------------------------------------------------------- sim


def test_sim_shows_preempted_then_succeeded(fray: Fray) -> None:
    r = fray("sim", "--tpu", "v4-16", "--slices", "2", "--preemptions", "1", "--seed", "3", "--steps", "4", "--step-time", "0.2")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "[fray] injected: attempt 0: preempt slice" in out
    preempted, succeeded = out.index("[fray] attempt 0 PREEMPTED"), out.index("[fray] attempt 1 SUCCEEDED")
    assert preempted < succeeded
    assert re.search(r"^0\s+v4-16-0, v4-16-1\s+PREEMPTED\s", out, re.M)
    assert re.search(r"^1\s+v4-16-0, v4-16-1\s+SUCCEEDED\s", out, re.M)
    job_id = launched_id(out)
    assert fray.status(job_id)["preemptions"] == 1  # the sim's job is in the store like any other


def test_sim_budget_exhausted_exit_1(fray: Fray) -> None:
    r = fray("sim", "--preemptions", "1", "--max-retries-preemption", "0", "--steps", "4", "--step-time", "0.2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "max_retries_preemption=0" in r.stdout


# ------------------------------------------------------------------------------------ in-process bits


def test_monitor_says_what_a_pending_job_waits_for(tmp_path: Path) -> None:
    release = tmp_path / "release"
    holder_code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
    cluster = LocalCluster(fleet=TpuFleet({"v4-16": 1}), jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    try:
        tpu = ResourceConfig.with_tpu("v4-16")
        holder = cluster.launch(JobRequest(name="holder", entrypoint=Entrypoint(binary=sys.executable, args=["-c", holder_code]), resources=tpu))
        wait_for(lambda: cluster.poll(holder).status is JobStatus.RUNNING, what="the holder to run")
        waiter = cluster.launch(JobRequest(name="waiter", entrypoint=Entrypoint(binary="true"), resources=tpu))
        wait_for(lambda: "waiting for 1 x v4-16" in describe_progress(cluster.poll(waiter)), what="the waiting line")
        out = io.StringIO()
        t = threading.Thread(target=lambda: cluster.monitor(waiter, out=out, timeout=60))
        t.start()
        wait_for(lambda: "waiting for 1 x v4-16" in out.getvalue(), what="monitor to print the wait")
        release.touch()
        t.join(60)
        assert "PENDING | attempt 0: waiting for 1 x v4-16" in out.getvalue()
        assert "attempt 0 SUCCEEDED" in out.getvalue()
        assert cluster.poll(waiter).status is JobStatus.SUCCEEDED
    finally:
        release.touch()
        cluster.close()


def test_format_table_and_call_args() -> None:
    assert format_table(["A", "LONGER"], [["xx", 1], ["y", None]]).splitlines() == ["A   LONGER", "xx  1", "y"]
    assert _parse_call_args(["3", "x=[1, 2]", "name=abc", "flag=true"]) == ([3], {"x": [1, 2], "name": "abc", "flag": True})


def test_main_in_process_returns_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FRAY_JOBS_DIR", str(tmp_path))
    assert main(["status", "nope"]) == 2
    assert "unknown job id 'nope'" in capsys.readouterr().err
    assert main(["launch", "--tpu", "v9-1", "x:y"]) == 2
