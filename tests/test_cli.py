"""The ``fray`` command line, run for real: the console script (or ``python -m fray_core.cli``) in a
subprocess, against the local backend, with ``FRAY_JOBS_DIR`` in a temp dir.

No sleeps as synchronisation: tests wait on marker files or on commands that block until a job ends
(``fray launch --wait``, ``fray logs -f``), always with a deadline.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from fray_core.cli import _parse_call_args, format_table, main
from fray_core.cluster import describe_progress
from fray_core.types import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY

from helpers import wait_for

JOBS_MOD = """
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
"""

SCRIPT = """
import sys
print("script args:", " ".join(sys.argv[1:]), flush=True)
"""


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

    def status(self, job_id: str, *extra: str) -> dict:
        r = self("status", job_id, "--json", *extra)
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
    assert header.split() == ["ID", "NAME", "KIND", "STATUS", "ATTEMPTS", "CALLS", "PREEMPT/FAIL", "AGE"]
    row = next(r for r in rows if r.startswith(job_id))
    assert row.split()[1:7] == ["jobs_mod-where", "job", "SUCCEEDED", "1", "-", "0/0"]

    st = fray("status", job_id)
    assert st.returncode == 0, st.stderr
    assert re.search(r"^status\s+SUCCEEDED$", st.stdout, re.M)
    assert "2 x v4-16 (2 host(s) per slice)" in st.stdout
    assert re.search(r"^ATTEMPT\s+SLICES\s+OUTCOME\s+DURATION\s+CAUSE$", st.stdout, re.M)
    assert re.search(r"^0\s+v4-16-0, v4-16-1\s+SUCCEEDED\s+\d", st.stdout, re.M)
    record = fray.status(job_id, "--result")  # results only when asked for
    assert record["attempts"][0]["slices"] == ["v4-16-0", "v4-16-1"]
    assert sorted(map(tuple, record["result"])) == [("0", "0", "2"), ("0", "1", "2"), ("1", "0", "2"), ("1", "1", "2")]

    logs = fray("logs", job_id)
    assert logs.returncode == 0
    for s in (0, 1):
        for h in (0, 1):
            assert f"[a0 s{s}/h{h}] host {h} of v4-16-{s}" in logs.stdout


def test_request_that_can_never_fit_exits_2_at_launch(fray: Fray) -> None:
    """More slices than the fleet has: refused at launch (exit 2, naming what the fleet has), nothing recorded."""
    for wait in ([], ["--wait"]):
        r = fray("launch", *wait, "--tpu", "v4-16", "--slices", "3", "--cluster", "local?tpu=v4-16:2", "jobs_mod:where")
        _one_line_exit_2(r, "--tpu v4-16 --slices 3 can never fit: the fleet of local?tpu=v4-16:2 has 2 x v4-16")
        assert r.stdout == ""
    r = fray("launch", "--tpu", "v4-16", "--slices", "4,3", "--cluster", "local?tpu=v4-16:2", "jobs_mod:where")
    _one_line_exit_2(r, "--tpu v4-16 --slices 4,3 can never fit (even the fewest, 3): the fleet of local?tpu=v4-16:2")
    r = fray("launch", "--tpu", "v4-8", "--cluster", "local?tpu=v4-16:2", "jobs_mod:where")
    _one_line_exit_2(r, "has 2 x v4-16")
    assert not fray.jobs_dir.exists() or not any(fray.jobs_dir.iterdir())


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
        (["launch", "--ram", "lots", "jobs_mod:add", "1"], "ResourceConfig.ram"),
        (["launch", "jobs_mod:add", "1", "2", "3"], "Entrypoint.args: add() cannot take args=(1, 2, 3)"),
        (["launch", "jobs_mod:add", "1", "z=1"], "Entrypoint.function_args: add() cannot take"),
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
        [sys.executable, "-m", "fray_core.cli", "list"],
        cwd=fray.workdir,
        env=fray.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "no jobs under" in r.stderr


# ---------------------------------------------------------------------------------------------- sim


def test_sim_shows_preempted_then_succeeded(fray: Fray) -> None:
    r = fray(
        "sim",
        "--tpu",
        "v4-16",
        "--slices",
        "2",
        "--preemptions",
        "1",
        "--seed",
        "3",
        "--steps",
        "4",
        "--step-time",
        "0.2",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "[fray] injected: attempt 0: preempt slice" in out
    preempted, succeeded = out.index("[fray] attempt 0 PREEMPTED"), out.index("[fray] attempt 1 SUCCEEDED")
    assert preempted < succeeded
    assert re.search(r"^0\s+v4-16-0, v4-16-1\s+PREEMPTED\s", out, re.M)
    assert re.search(r"^1\s+v4-16-0, v4-16-1\s+SUCCEEDED\s", out, re.M)
    job_id = launched_id(out)
    assert fray.status(job_id)["preemptions"] == 1  # the sim's job is in the store like any other
    # the timeline: a row per slice, attempt 0 preempted (P on the slice the plan preempted), then 1 succeeded
    slice_hit = re.search(r"injected: attempt 0: preempt slice (\d)", out).group(1)  # type: ignore[union-attr]
    for s in ("0", "1"):
        row = re.search(rf"^v4-16-{s} \| *0~+(P?) +1=+\|$", out, re.M)
        assert row, out
        assert (row.group(1) == "P") == (s == slice_hit)
    assert "\x1b" not in out  # piped: plain lines, no live redraw
    st = fray("status", job_id)
    assert re.search(rf"^v4-16-{slice_hit} \| *0~+P +1=+\|$", st.stdout, re.M), st.stdout


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
        holder = cluster.launch(
            JobRequest(
                name="holder", entrypoint=Entrypoint(binary=sys.executable, args=["-c", holder_code]), resources=tpu
            )
        )
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
    assert _parse_call_args(["3", "x=[1, 2]", "name=abc", "flag=true"]) == (
        [3],
        {"x": [1, 2], "name": "abc", "flag": True},
    )


def test_main_in_process_returns_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FRAY_JOBS_DIR", str(tmp_path))
    assert main(["status", "nope"]) == 2
    assert "unknown job id 'nope'" in capsys.readouterr().err
    assert main(["launch", "--tpu", "v9-1", "x:y"]) == 2


# ------------------------------------------------------------------------- json, filters, timeline

JOB_FIELDS = {
    "job_id",
    "name",
    "status",
    "backend",
    "submitted_at",
    "finished_at",
    "progress",
    "error",
    "preemptions",
    "failures",
    "max_retries_preemption",
    "max_retries_failure",
    "request",
    "attempts",
    "pending_reason",
    "goodput",
    "kind",
    "calls",
    "last_step",
    "last_heartbeat_at",
}
ATTEMPT_FIELDS = {"index", "slices", "outcome", "started_at", "ended_at", "cause", "acquired_at", "hosts_started_at"}


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Fray, str, str]:
    """A job named alpha that SUCCEEDED, then one named beta that FAILED, in one jobs dir."""
    tmp = tmp_path_factory.mktemp("two_jobs")
    (tmp / "jobs_mod.py").write_text(JOBS_MOD)
    fray = Fray(tmp)
    a = fray("launch", "--wait", "--name", "alpha", "jobs_mod:add", "2", "y=3")
    b = fray("launch", "--wait", "--name", "beta", "jobs_mod:fail")
    assert a.returncode == 0 and b.returncode == 1, a.stdout + b.stdout
    return fray, launched_id(a.stdout), launched_id(b.stdout)


def test_json_fields_are_the_documented_ones(two_jobs: tuple[Fray, str, str]) -> None:
    fray, alpha, beta = two_jobs
    listing = json.loads(fray("list", "--json").stdout)
    assert [j["job_id"] for j in listing] == [alpha, beta]
    for job in listing:
        assert set(job) == JOB_FIELDS
        assert all(set(a) == ATTEMPT_FIELDS for a in job["attempts"])
    status = fray.status(alpha)
    assert set(status) == JOB_FIELDS  # no results unless asked for
    assert status["status"] == "SUCCEEDED" and status["attempts"][0]["outcome"] == "SUCCEEDED"
    assert status["max_retries_failure"] == 0 and status["request"]["entrypoint"]
    assert status["kind"] == "job" and status["calls"] == 0
    assert fray.status(alpha, "--result")["result"] == [5]
    failed = fray.status(beta)
    assert failed["status"] == "FAILED" and "bad input from the job" in failed["attempts"][0]["cause"]
    # the documented table in docs/index.md lists exactly these fields
    doc = (Path(__file__).resolve().parent.parent / "docs" / "index.md").read_text()
    for field in JOB_FIELDS | ATTEMPT_FIELDS:
        assert f"`{field}`" in doc, field


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (["--status", "failed"], ["beta"]),
        (["--status", "SUCCEEDED,failed"], ["alpha", "beta"]),
        (["--status", "running", "--status", "succeeded"], ["alpha"]),
        (["--name", "al*"], ["alpha"]),
        (["--name", "beta"], ["beta"]),
        (["--since", "1h"], ["alpha", "beta"]),
        (["--since", "2999-01-01"], []),
        (["--limit", "1"], ["beta"]),
        (["--limit", "5", "--status", "succeeded"], ["alpha"]),
    ],
)
def test_list_filters(two_jobs: tuple[Fray, str, str], filters: list[str], expected: list[str]) -> None:
    fray = two_jobs[0]
    as_json = fray("list", "--json", *filters)
    assert as_json.returncode == 0, as_json.stderr
    assert [j["name"] for j in json.loads(as_json.stdout)] == expected
    table = fray("list", *filters)
    assert [row.split()[1] for row in table.stdout.splitlines()[1:]] == expected
    if not expected:
        assert "no jobs match the filters" in table.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--status", "bogus"], "argument --status: expected one or more of PENDING, RUNNING"),
        (["list", "--limit", "0"], "argument --limit: expected an int >= 1, got '0'"),
        (["list", "--since", "yesterday"], "argument --since: expected a duration ago"),
    ],
)
def test_bad_filters_exit_2(fray: Fray, args: list[str], message: str) -> None:
    r = fray(*args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_status_shows_timeline(two_jobs: tuple[Fray, str, str]) -> None:
    fray, alpha, _ = two_jobs
    st = fray("status", alpha)
    # one row per slice ("local" for CPU); a few dots of waiting for slices where the machine is busy (the
    # attempt's first record write under load: ~0.03 s of a 0.3 s job, CI 2026-12-07)
    assert re.search(r"^local \| *0\.{0,12}=+\|$", st.stdout, re.M), st.stdout
    assert re.search(r"^\s+0s\s.*s$", st.stdout, re.M)  # the time axis
    assert "N attempt N starts  = succeeded" in st.stdout
    assert "result" not in st.stdout
    with_result = fray("status", alpha, "--result")
    assert "[fray] result[0]: 5" in with_result.stdout


def _attempt(index: int, slices: list[str], start: float, end: float | None, outcome: str | None, cause: str = ""):  # type: ignore[no-untyped-def]
    from fray_core.types import Attempt, AttemptOutcome

    return Attempt(index, slices, start, end, AttemptOutcome(outcome) if outcome else None, cause or None)


def test_timeline_draws_each_outcome() -> None:
    from fray_core.cli.output import timeline
    from fray_core.types import JobInfo

    info = JobInfo(
        job_id="j",
        name="j",
        status=JobStatus.RUNNING,
        submitted_at=1000.0,
        attempts=[
            _attempt(0, ["s-0", "s-1"], 1000.0, 1010.0, "PREEMPTED", "preempted on slice 1 (s-1) host 0: gone"),
            _attempt(1, [], 1012.0, 1020.0, "UNSCHEDULABLE"),  # waited for slices and got none
            _attempt(2, ["s-0"], 1021.0, 1030.0, "FAILED", "ValueError"),  # resized: 2 -> 1 slice
            _attempt(3, ["s-0"], 1031.0, None, None),  # still running
        ],
    )
    lines = timeline(info, width=41, now=1040.0)
    assert lines[0] == "s-0        |0~~~~~~~~~~          2xxxxxxxxx3>>>>>>>>>|"
    assert lines[1] == "s-1        |0~~~~~~~~~P                              |"  # P: the slice preempted
    assert lines[2] == "(no slice) |            1????????                    |"
    assert lines[3].split() == ["0s", "10s", "20s", "30s", "40s"]
    assert lines[4] == (
        "N attempt N starts  ~ preempted  x failed  ? unschedulable  > running  P preemption"
        "  attempt 2 resized 2 -> 1 slices"
    )


def _run_in_terminal(fray: Fray, *args: str, timeout: float = 120, columns: int = 200) -> tuple[int, str]:
    """``fray ARGS`` with its stdout and stderr on a pseudo-terminal; (exit code, everything it wrote)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    # the terminal's size is the pty's: not a COLUMNS/LINES the test runner set (pytest-xdist's workers do)
    env = {k: v for k, v in fray.env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [*FRAY, *args], cwd=fray.workdir, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
    )
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            assert ready, f"no output for {timeout}s: {b''.join(chunks)[-2000:]!r}"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.wait(timeout), b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def test_live_status_line_on_a_terminal(fray: Fray) -> None:
    fray.env.pop("NO_COLOR", None)
    code, out = _run_in_terminal(fray, "sim", "--preemptions", "1", "--seed", "3", "--steps", "4", "--step-time", "0.2")
    assert code == 0, out[-3000:]
    assert "\x1b[33m" in out and "\x1b[32m" in out  # attempts in colour: preempted yellow, succeeded green
    assert "\x1b[2K" in out  # the status line is erased and redrawn in place
    live = re.findall(r"\[fray\] \d+\.\ds \| (RUNNING|PENDING) \| preemptions (\d)/1, failures 0/0", out)
    assert ("RUNNING", "0") in live and ("RUNNING", "1") in live, out[-3000:]
    # 2 slices x 2 hosts: "(4 hosts)" once running, or "k of 4 hosts" while they start (a loaded machine's
    # redraws may fall in either)
    assert re.search(r"\(4 hosts\)|\b\d of 4 hosts\b", out), out[-3000:]
    final = out.rsplit("\x1b[?25h", 1)[-1]  # after the live display ends: plain final state, table, timeline
    assert re.search(r"\[fray\] sim-\S+: SUCCEEDED \| attempt 1 \| preemptions 1, failures 0", final), final
    assert re.search(r"^v4-16-0 \| *0~+P? +1=+\|", final.replace("\r", ""), re.M), final


ESCAPES_MOD = """
def noisy():
    print("\\x1b[2J\\x1b[31mred\\x1b[0m", flush=True)
    return "\\x1b]0;title\\x07"
"""


def test_terminal_escapes_are_shown_escaped(fray: Fray) -> None:
    (fray.workdir / "noisy_mod.py").write_text(ESCAPES_MOD)
    name = "evil\x1b[2Jname"
    r = fray("launch", "--wait", "--name", name, "noisy_mod:noisy")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\x1b" not in r.stdout and "\r" not in r.stdout
    assert "[a0 r0] \\x1b[2J\\x1b[31mred\\x1b[0m" in r.stdout
    assert "result[0]: '\\x1b]0;title\\x07'" in r.stdout
    job_id = launched_id(r.stdout)
    listing = fray("list")
    assert "evil\\x1b[2Jname" in listing.stdout and "\x1b" not in listing.stdout
    st = fray("status", job_id, "--result")
    assert "evil\\x1b[2Jname" in st.stdout and "\x1b" not in st.stdout
    logs = fray("logs", job_id)
    assert "\\x1b[31mred\\x1b[0m" in logs.stdout and "\x1b" not in logs.stdout
    assert fray.status(job_id)["name"] == name  # JSON keeps the real name (JSON escapes it)


# --------------------------------------------------------------------------- bad input, hostile input


def _one_line_exit_2(r: subprocess.CompletedProcess[str], message: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "--replicas", "0", "jobs_mod:add", "1"], "argument --replicas: expected an int >= 1, got '0'"),
        (["launch", "--name", "", "jobs_mod:add", "1"], "argument --name: expected a non-empty job name, got ''"),
        (["launch", "--name", "  ", "jobs_mod:add", "1"], "argument --name: expected a non-empty job name"),
        (["sim", "--steps", "-1"], "argument --steps: expected an int >= 1, got '-1'"),
        (["sim", "--slices", "0"], "argument --slices: expected an int >= 1, got '0'"),
        (["sim", "--step-time", "-0.5"], "argument --step-time: expected a number >= 0"),
        (["sim", "--chaos", "1.5"], "argument --chaos: expected a probability between 0 and 1"),
        (["lst"], "invalid choice: 'lst'"),
    ],
)
def test_bad_arguments_one_line_exit_2(fray: Fray, args: list[str], message: str) -> None:
    _one_line_exit_2(fray(*args), message)
    assert not fray.jobs_dir.exists() or not any(fray.jobs_dir.iterdir())  # nothing was launched


def _unwritable_dir(tmp: Path) -> str:
    if os.geteuid() == 0:  # root writes anywhere chmod allows nothing: sysfs refuses even root
        return "/sys/fray-jobs"
    d = tmp / "readonly"
    d.mkdir()
    d.chmod(0o500)
    return str(d / "jobs")


@pytest.mark.parametrize("kind", ["file", "under-a-file", "unwritable"])
@pytest.mark.parametrize(
    "command", [["list"], ["status", "x"], ["launch", "jobs_mod:add", "1"], ["sim", "--steps", "1"]]
)
def test_unusable_jobs_dir_one_line_exit_2(fray: Fray, kind: str, command: list[str]) -> None:
    plain_file = fray.workdir / "not-a-dir"
    plain_file.write_text("")
    fray.env["FRAY_JOBS_DIR"] = {
        "file": str(plain_file),
        "under-a-file": str(plain_file / "jobs"),
        "unwritable": _unwritable_dir(fray.workdir),
    }[kind]
    r = fray(*command)
    _one_line_exit_2(
        r, fray.env["FRAY_JOBS_DIR"].rsplit("/jobs", 1)[0] if kind == "under-a-file" else fray.env["FRAY_JOBS_DIR"]
    )


def test_missing_home_one_line_exit_2(fray: Fray) -> None:
    home = fray.workdir / "nonexistent"
    for var in ("FRAY_JOBS_DIR", "XDG_CACHE_HOME"):
        fray.env.pop(var, None)
    fray.env["HOME"] = str(home)
    for command in (["list"], ["launch", "jobs_mod:add", "1"], ["sim"]):
        _one_line_exit_2(fray(*command), "set FRAY_JOBS_DIR")
    assert not home.exists()  # no home directory made up


def test_ray_backend_without_ray_one_line_exit_2(fray: Fray) -> None:
    fake = fray.workdir / "no_ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    fray.env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), fray.env.get("PYTHONPATH", "")])
    r = fray("--cluster", "ray", "list")
    _one_line_exit_2(
        r, "the 'ray' backend cannot be loaded (ModuleNotFoundError: No module named 'ray'); the Ray backend needs ray"
    )


def test_memory_jobs_dir_refused_for_detached_launch(fray: Fray) -> None:
    fray.env["FRAY_JOBS_DIR"] = "memory://fray-jobs"
    for args in (["launch", "jobs_mod:add", "1"], ["launch", "--wait", "jobs_mod:add", "1"]):
        r = fray(*args)
        _one_line_exit_2(r, "jobs dir 'memory://fray-jobs' lives in one process's memory")
        assert r.stdout == ""  # no id that `fray status` would then call unknown


@pytest.mark.parametrize(
    "command", [["list"], ["list", "--json"], ["status", "{id}"], ["status", "{id}", "--json"], ["logs", "{id}"]]
)
def test_closed_pipe_is_quiet(two_jobs: tuple[Fray, str, str], command: list[str]) -> None:
    """``fray status ID | head -1``: the reader went away; no traceback, no error."""
    fray, alpha, _ = two_jobs
    proc = subprocess.Popen(
        [*FRAY, *[c.format(id=alpha) for c in command]],
        cwd=fray.workdir,
        env=fray.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before fray writes anything: every write fails with EPIPE
    err = proc.stderr.read()
    assert proc.wait(60) == 0, err
    assert err == ""


PLANTED = """
import pathlib, pickle, sys

class Planted:
    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(sys.argv[2]),))

with open(sys.argv[1], "wb") as f:
    pickle.dump([Planted()], f)
"""


def test_list_and_status_never_unpickle_results(fray: Fray) -> None:
    r = fray("launch", "--wait", "jobs_mod:add", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = launched_id(r.stdout)
    marker = fray.workdir / "planted-code-ran"
    subprocess.run([sys.executable, "-c", PLANTED, str(fray.jobs_dir / job_id / "result.pkl"), str(marker)], check=True)
    for command in (["list"], ["list", "--json"], ["status", job_id], ["status", job_id, "--json"]):
        assert fray(*command).returncode == 0
        assert not marker.exists(), f"fray {' '.join(command)} unpickled the job's result"
    fray("status", job_id, "--result")  # asked for: loads it (whatever the store then says about its owner)


def test_status_and_list_show_pending_reason_and_goodput(tmp_path: Path) -> None:
    """A waiting job says why in ``fray status``/``fray list`` (and --json); an ended one shows its goodput."""
    from fray_core.records import JobStore, owner_info
    from fray_core.types import Attempt, AttemptOutcome, Goodput, JobInfo

    fray = Fray(tmp_path)
    store = JobStore(str(fray.jobs_dir))
    reason = "queued: 2nd for 4 x v4-16; fleet: 1 free, 3 held by train-a, train-b"
    store.write(
        JobInfo(job_id="waiting-1", name="waiting", status=JobStatus.PENDING, pending_reason=reason), owner=owner_info()
    )  # this process supervises it: alive, so PENDING stays PENDING
    done = JobInfo(
        job_id="done-1",
        name="done",
        status=JobStatus.FAILED,
        error="x",
        attempts=[Attempt(index=0, slices=["v4-16-0"], started_at=1.0, ended_at=9.0, outcome=AttemptOutcome.FAILED)],
        goodput=Goodput(pending_s=2.0, productive_s=0.0, lost_s=8.0),
    )
    store.write(done, owner=owner_info())
    st = fray("status", "waiting-1")
    assert st.returncode == 0 and f"pending    {reason}" in st.stdout, st.stdout + st.stderr
    assert reason in fray("list").stdout
    listing = {j["job_id"]: j for j in json.loads(fray("list", "--json").stdout)}
    assert listing["waiting-1"]["pending_reason"] == reason and listing["waiting-1"]["goodput"] is None
    assert listing["done-1"]["goodput"]["lost_s"] == 8.0 and listing["done-1"]["pending_reason"] is None
    assert re.search(
        r"^goodput +0% \(productive 0.0s, pending 2.0s, lost 8.0s\)$", fray("status", "done-1").stdout, re.M
    )


def test_a_record_with_a_date_out_of_range_breaks_neither_its_status_nor_the_listing(tmp_path: Path) -> None:
    """A record whose times are numbers a record may hold (below 1e15) but no date (year 28521834): ``fray
    status`` and ``fray list --wide`` show the number, not ``error: year ... is out of range`` for the job or,
    worse, for the whole listing."""
    from fray_core.records import JobStore, owner_info
    from fray_core.types import JobInfo

    fray = Fray(tmp_path)
    store = JobStore(str(fray.jobs_dir))
    for job_id, at in (("far-1", 9e14), ("past-1", -1e14), ("fine-1", 1.7e9)):
        info = JobInfo(job_id=job_id, name=job_id, status=JobStatus.FAILED, error="x", submitted_at=at)
        store.write(info, owner=owner_info())
    for args in (("status", "far-1"), ("status", "past-1"), ("list", "--wide")):
        out = fray(*args)
        assert out.returncode == 0 and "out of range" not in out.stdout + out.stderr, (args, out.stdout, out.stderr)
    wide = fray("list", "--wide").stdout
    assert all(j in wide for j in ("far-1", "past-1", "fine-1")) and "900000000000000 (not a date)" in wide, wide
