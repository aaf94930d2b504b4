"""What users of ``ray job``, ``sky jobs`` and kubectl reach for in ``fray`` (issue 33), and the small
defects found by trying the CLI as a new user. In-process (``main([...])``) where nothing has to run;
a subprocess where a real job or the console script matters (the ``Fray`` runner of test_cli.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_cli import JOBS_MOD, Fray

from fray_core.cli import main
from fray_core.cli.launch import build_request, default_name
from fray_core.cli.live import status_line
from fray_core.cli.output import describe_error
from fray_core.records import JobStore, owner_info
from fray_core.types import Attempt, AttemptOutcome, Goodput, JobInfo, JobStatus
from fray_local import LocalCluster


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    """An in-process ``fray`` with its own jobs dir (and no config file or cluster from the environment)."""
    monkeypatch.setenv("FRAY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS", "FRAY_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs_mod.py").write_text(JOBS_MOD)
    return JobStore(str(tmp_path / "jobs"))


@pytest.fixture
def fray(tmp_path: Path) -> Fray:
    (tmp_path / "jobs_mod.py").write_text(JOBS_MOD)
    return Fray(tmp_path)


def _attempt(
    index: int, outcome: AttemptOutcome | None, cause: str | None = None, start: float = 1.0, end: float | None = 2.0
) -> Attempt:
    return Attempt(index=index, slices=["local"], started_at=start, ended_at=end, outcome=outcome, cause=cause)


# ------------------------------------------------------------------------------------ small defects


def test_launch_without_arguments_names_only_target(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fray launch: error: the following arguments are required: TARGET"), err
    assert "ARGS" not in err and err.count("\n") == 1


def test_unknown_option_blames_the_subcommand(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--jsn"]) == 2
    assert capsys.readouterr().err.startswith("fray list: error: unrecognized arguments: --jsn")


def test_logs_tail_before_the_id(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    """``fray logs --tail 5 x``: 5 is the count, x the job (not ``--tail x``); a bad count is named as given."""
    assert main(["logs", "--tail", "5", "x"]) == 2
    assert "unknown job id 'x'" in capsys.readouterr().err
    assert main(["logs", "--tail", "five", "x"]) == 2
    assert "argument -n/--tail: expected an int >= 0, got 'five'" in capsys.readouterr().err


def test_debug_keeps_exit_code_2(fray: Fray) -> None:
    fray.env["FRAY_DEBUG"] = "1"
    r = fray("status", "no-such-job")
    assert r.returncode == 2, r.stderr
    assert "Traceback" in r.stderr and r.stderr.rstrip().endswith(
        "unknown job id 'no-such-job' (no record under " + str(fray.jobs_dir) + ")"
    )


def test_live_line_says_one_host() -> None:
    info = JobInfo(
        job_id="j",
        name="j",
        status=JobStatus.RUNNING,
        attempts=[Attempt(0, ["r0"])],
        progress="attempt 0: running",
        request_summary={"replicas": 1},
    )
    assert status_line(info, 1.0).endswith("attempt 0: running (1 host)")
    info = JobInfo(
        job_id="j",
        name="j",
        status=JobStatus.RUNNING,
        attempts=[Attempt(0, ["r0"])],
        progress="attempt 0: running",
        request_summary={"replicas": 3},
    )
    assert status_line(info, 1.0).endswith("(3 hosts)")


def test_default_names_tell_modules_apart() -> None:
    names = {default_name("train:main", []), default_name("evaluate:main", []), default_name("pkg.sweep:main", [])}
    assert names == {"train-main", "evaluate-main", "sweep-main"}
    assert default_name("python", ["train.py", "--lr", "3"]) != default_name("python", ["eval.py"])
    assert default_name("bash", ["run.sh"]) == "bash-run"


def test_status_goodput_is_said_once(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    jobs.write(
        JobInfo(
            job_id="done-1",
            name="done",
            status=JobStatus.SUCCEEDED,
            submitted_at=1.0,
            finished_at=11.0,
            attempts=[_attempt(0, AttemptOutcome.SUCCEEDED)],
            goodput=Goodput(1.0, 7.1, 1.9),
        ),
        owner=owner_info(),
    )
    assert main(["status", "done-1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^goodput +71% \(productive 7.1s, pending 1.0s, lost 1.9s\)$", out, re.MULTILINE), out
    assert "goodput goodput" not in out


def test_stopped_job_is_not_an_error_with_zero_goodput(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    jobs.write(
        JobInfo(
            job_id="stopped-1",
            name="s",
            status=JobStatus.STOPPED,
            error="terminated",
            submitted_at=1.0,
            finished_at=11.0,
            attempts=[_attempt(0, AttemptOutcome.CANCELLED, "terminated")],
            goodput=Goodput(2.0, 0.0, 8.0),
        ),
        owner=owner_info(),
    )
    assert main(["status", "stopped-1"]) == 0
    out = capsys.readouterr().out
    assert "error" not in out and "0%" not in out, out
    assert re.search(r"^stopped +on request", out, re.MULTILINE), out
    assert re.search(r"^goodput +- \(stopped before it finished: ran 8.0s, pending 2.0s\)$", out, re.MULTILINE), out


def test_timeline_shows_the_wait_for_slices_inside_an_attempt() -> None:
    """An attempt is recorded from when it began to wait for its slices: ``fray status``'s timeline draws that
    wait as ``.`` (it was drawn as the attempt's outcome, as if the job had run while it waited)."""
    from fray_core.cli.output import timeline

    attempt = Attempt(0, ["v4-16-0"], 100.0, 110.0, AttemptOutcome.SUCCEEDED)
    attempt.acquired_at = 104.0
    info = JobInfo(job_id="j", name="j", status=JobStatus.SUCCEEDED, submitted_at=100.0, finished_at=110.0)
    info.attempts = [attempt]
    row, _, legend = timeline(info, width=11)
    assert row == "v4-16-0 |0...=======|", row
    assert ". waiting for slices" in legend and "= succeeded" in legend


def test_timeline_draws_hosts_in_the_backends_queue_as_waiting() -> None:
    """A one-replica Ray job's attempt holds nothing while its task waits in Ray's queue (no ``acquired_at``,
    the job's ``pending_reason`` says so): drawn as waiting, not as running; once placed, as running."""
    from fray_core.cli.output import timeline

    attempt = Attempt(0, ["ray"], 100.0)
    info = JobInfo(job_id="j", name="j", status=JobStatus.PENDING, submitted_at=100.0)
    info.attempts = [attempt]
    info.pending_reason = "waiting in Ray's queue for 1 x {CPU: 1}: the cluster has room for 4 in all, held by ..."
    row, *_ = timeline(info, width=11, now=110.0)
    assert row == "ray |0..........|", row
    attempt.acquired_at, info.pending_reason, info.status = 105.0, None, JobStatus.RUNNING
    row, *_ = timeline(info, width=11, now=110.0)
    assert row == "ray |0....>>>>>>|", row


def test_failure_message_carries_the_last_output() -> None:
    cause = "failed on replica 0: CommandFailed: exit code 3 on local host 0; last output:\nstep 1\nout of memory\n"
    info = JobInfo(
        job_id="j",
        name="j",
        status=JobStatus.FAILED,
        attempts=[_attempt(0, AttemptOutcome.FAILED, cause)],
        error="failed 1 time(s), max_retries_failure=0; last error: failed on replica 0: CommandFailed: exit "
        "code 3 on local host 0; last output:",
    )
    assert describe_error(info).endswith("; last output: out of memory")


def test_failed_launch_wait_shows_the_output_and_escapes_the_message(fray: Fray) -> None:
    """``fray launch --wait`` of a job whose exception message holds terminal escapes (title, clear screen)."""
    (fray.workdir / "hostile.py").write_text("def boom():\n    raise RuntimeError('\\x1b]0;pwned\\x07\\x1b[2Jgone')\n")
    r = fray("launch", "--wait", "hostile:boom")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\x1b" not in r.stderr
    assert "\\x1b]0;pwned\\x07\\x1b[2Jgone" in r.stdout
    r = fray("launch", "--wait", "bash", "-c", "echo first; echo last words; exit 3")
    assert r.returncode == 1
    final = [line for line in r.stdout.splitlines() if "FAILED |" in line]
    assert final and final[-1].endswith("last output: last words"), r.stdout
    # the record's own error (--json, the dashboard, JobInfo.error in Python) says it too, not only the CLI
    from test_cli import launched_id

    error = fray.status(launched_id(r.stdout))["error"]
    assert error.startswith("failed 1 time(s)") and error.endswith("; last output: last words"), error


def test_no_color_is_honoured(fray: Fray) -> None:
    """``NO_COLOR`` (documented in docs/configuration.md): no colour on a terminal; bold and dim stay."""
    from test_cli import _run_in_terminal

    fray.env["NO_COLOR"] = "1"
    code, out = _run_in_terminal(fray, "sim", "--preemptions", "1", "--seed", "3", "--steps", "2", "--step-time", "0.1")
    assert code == 0 and "PREEMPTED" in out, out[-3000:]
    colours = re.findall(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|9[0-7]|4[0-8]|10[0-7])(?:;[0-9;]*)?m", out)
    assert not colours, colours


def test_every_help_fits_80_columns(
    jobs: JobStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fray COMMAND --help`` on an 80-column terminal: descriptions and epilogs wrap (a 360-character
    description line was cut mid-word by the terminal), examples keep their lines."""
    from fray_core.cli import build_parser

    monkeypatch.setenv("COLUMNS", "80")
    commands = ["", *build_parser().parse_args(["list"])._subparsers]
    for command in commands:
        assert main([*command.split(), "--help"]) == 0
        out = capsys.readouterr().out
        long = [line for line in out.splitlines() if len(line) > 80]
        assert not long, f"fray {command} --help: {long}"
        examples = out.partition("examples:\n")[2].partition("\n\n")[0].splitlines()
        for line, after in zip(examples, examples[1:]):  # a wrapped example could not be copied
            assert line.endswith("\\") or not after.startswith("    "), f"fray {command} --help: {line} / {after}"
    main(["logs", "--help"])
    assert "\n  fray logs ID --tail 50\n" in capsys.readouterr().out  # an example stays one line


def test_version(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fray ") and out.split()[1][0].isdigit()


# ------------------------------------------------------------------------------------ launch options


def _launch_args(*argv: str) -> argparse.Namespace:
    from fray_core.cli import build_parser

    return build_parser().parse_args(["launch", *argv])


def test_launch_gpu_env_pip(jobs: JobStore) -> None:
    req = build_request(
        _launch_args("--gpu", "A100:8", "--replicas", "2", "--env", "A=1", "--pip", "optax>=0.1", "jobs_mod:add", "1"),
        on_this_machine=True,
    )
    assert (
        req.resources.device.kind == "gpu" and req.resources.device.type == "A100" and req.resources.device.count == 8
    )
    assert req.resources.replicas == 2
    assert req.environment is not None and dict(req.environment.env_vars) == {"A": "1"}
    assert list(req.environment.pip_packages) == ["optax>=0.1"]
    assert build_request(_launch_args("--gpu", "H100", "jobs_mod:add", "1"), True).resources.device.count == 1


def test_launch_gpu_beyond_this_machine_is_one_line_exit_2(
    jobs: JobStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # this machine, as the local backend sees it: 2 GPUs
    assert main(["launch", "--gpu", "A100:3", "jobs_mod:add", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need 3 GPU(s); this machine has 2" in err, err
    assert not os.path.isdir(jobs.root) or not os.listdir(jobs.root)  # nothing launched


def test_launch_pip_on_the_local_backend_warns_when_missing(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    """``--pip PKG``: the Ray backend installs it; the local backend does not, and says so for one that is not
    installed here (one ``fray: warning:`` line; the job is launched)."""
    assert main(["launch", "--pip", "attrs>=1", "--pip", "no-such-pkg-fray-33", "jobs_mod:add", "1", "2"]) == 0
    captured = capsys.readouterr()
    job_id = captured.out.strip()
    warnings = [line for line in captured.err.splitlines() if line.startswith("fray: warning:")]
    assert len(warnings) == 1 and "'no-such-pkg-fray-33' not installed" in warnings[0], captured.err
    assert "the local backend does not install packages" in warnings[0]
    assert LocalCluster(jobs_dir=jobs.root).wait(job_id, timeout=60).result == [3]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "A100:0", "jobs_mod:add"], "argument --gpu: expected TYPE or TYPE:N"),
        (["--gpu", ":2", "jobs_mod:add"], "argument --gpu: expected TYPE or TYPE:N"),
        (["--gpu", "A100", "--tpu", "v4-8", "jobs_mod:add"], "--gpu and --tpu cannot be combined"),
    ],
)
def test_launch_gpu_bad_input(
    jobs: JobStore, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["launch", *argv]) == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- logs and lists you can cut


def _plant_log(store: JobStore, job_id: str, lines: list[str], attempts: int = 0, **summary: Any) -> None:
    info = JobInfo(job_id=job_id, name="logged", status=JobStatus.SUCCEEDED, submitted_at=1.0, finished_at=2.0)
    info.attempts = [Attempt(index=i) for i in range(attempts)]
    info.request_summary = summary
    store.write(info, owner=owner_info())
    Path(store.log_path(job_id)).write_text("".join(f"{line}\n" for line in lines))


def test_logs_tail_host_attempt(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [f"[a{a} s{s}/h{h}] step {i}" for i in range(30) for a in (0, 1) for s in (0, 1) for h in (0, 1)]
    _plant_log(jobs, "tpu-1", lines, attempts=2, device={"kind": "tpu", "hosts": 2}, replicas=2)
    with open(jobs.log_path("tpu-1"), "a") as f:
        f.write("[a1 s0/h0] a partial line with no newline yet")

    def logs(*argv: str) -> list[str]:
        assert main(["logs", "tpu-1", *argv]) == 0
        return capsys.readouterr().out.splitlines()

    assert logs() == lines  # a line still being written is not shown
    assert logs("--tail", "3") == lines[-3:]
    assert logs("-n", "0") == []
    assert logs("--tail", "1000") == lines
    assert logs("--host", "1/0") == [x for x in lines if "s1/h0]" in x]
    assert logs("--attempt", "1", "--host", "0/1", "--tail", "2") == ["[a1 s0/h1] step 28", "[a1 s0/h1] step 29"]
    _plant_log(
        jobs, "cpu-1", ["[a0 r0] x", "[a0 r1] y", "[fray] note", "[a1 r1] z"], 2, device={"kind": "cpu"}, replicas=2
    )
    assert main(["logs", "cpu-1", "--host", "r1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["[a0 r1] y", "[a1 r1] z"]
    assert main(["logs", "cpu-1", "--host", "x/y"]) == 2
    assert "argument --host: expected SLICE/HOST" in capsys.readouterr().err
    # a host or attempt the job does not have: one line, exit 2 (not an empty log that says nothing)
    for job, argv, message in [
        ("tpu-1", ["--attempt", "7"], "--attempt 7: job tpu-1 ended with attempts 0-1"),
        ("tpu-1", ["--host", "2/0"], "--host 2/0: job tpu-1 has slices 0-1 of 2 hosts each (0/0 to 1/1)"),
        ("tpu-1", ["--host", "0/2"], "has slices 0-1 of 2 hosts each"),
        ("tpu-1", ["--host", "r0"], "--host r0: job tpu-1 is a TPU job; give SLICE/HOST (e.g. 0/0)"),
        ("cpu-1", ["--host", "r2"], "--host r2: job cpu-1 has replicas r0 to r1"),
        ("cpu-1", ["--host", "0/0"], "--host 0/0: job cpu-1 runs replicas, not TPU slices; give a replica (r0 to r1)"),
    ]:
        assert main(["logs", job, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_logs_follow_from_the_tail(fray: Fray) -> None:
    """``fray logs ID -f --tail 2 --host r1``: the last two lines of that host, then its new ones as they come,
    until the job ends (exit code: the job's)."""
    store = JobStore(str(fray.jobs_dir))
    _ran(store, "follow-1", JobStatus.RUNNING)  # its owner is this process: alive
    with open(store.log_path("follow-1"), "w") as f:
        f.write("".join(f"[a0 r{i % 2}] old {i}\n" for i in range(10)))
    proc = _watch(fray, "logs", "follow-1", "-f", "--tail", "2", "--host", "r1")
    try:
        seen = _read_until(proc, "old 9\n")
        assert seen == "[a0 r1] old 7\n[a0 r1] old 9\n", seen
        with open(store.log_path("follow-1"), "a") as f:
            f.write("[a0 r0] new 0\n[a0 r1] new 1\n")
        assert _read_until(proc, "new 1\n") == "[a0 r1] new 1\n"
        _ran(store, "follow-1", JobStatus.FAILED, error="x", finished_at=time.time())
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()


def test_logs_of_a_big_log_in_constant_memory(jobs: JobStore, tmp_path: Path) -> None:
    """A 100 MB log (one 'line' of it 20 MB with no newline, as progress bars write): ``--tail`` reads a few
    blocks from the end, a filter scans the whole log in ~1 MiB pieces. Loading it whole costs 300+ MiB."""
    _plant_log(jobs, "big-1", [], 2, device={"kind": "cpu"}, replicas=2)
    block = "".join(f"[a0 r{i % 2}] {'x' * 90} {i}\n" for i in range(10_000)).encode()  # ~1 MB
    with open(jobs.log_path("big-1"), "wb") as f:
        f.writelines(block for _ in range(80))
        f.write(b"[a0 r0] " + b"\r" * (20 << 20) + b"\n")
        f.write(block)
        f.write(b"[a1 r1] the last line\n")
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
        "assert r.returncode == 0, r.stderr\n"
        "print(len(r.stdout.splitlines()), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(*argv: str) -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, "-c", probe, sys.executable, "-m", "fray_core.cli", "logs", "big-1", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        n, rss = map(int, out.stdout.split())
        return n, rss

    n, rss = run("--tail", "5")
    assert n == 5 and rss < 120, f"--tail 5 of a 100 MB log: {rss} MiB"
    n, rss = run("--host", "r1", "--tail", "3")
    assert n == 3 and rss < 120, rss
    n, rss = run("--attempt", "1")  # every line read, one printed
    assert n == 1 and rss < 120, f"a 100 MB log scanned with {rss} MiB"


def _ran(store: JobStore, job_id: str, status: JobStatus, **kw: object) -> None:
    store.write(
        JobInfo(job_id=job_id, name=job_id.split("-")[0], status=status, submitted_at=time.time() - 90, **kw),
        owner=owner_info(),
    )


def test_list_at_80_columns_keeps_every_column(fray: Fray) -> None:
    """On an 80-column terminal nothing is dropped (AGE was): the STATUS column wraps; --wide adds columns."""
    from test_cli import _run_in_terminal

    store = JobStore(str(fray.jobs_dir))
    _ran(
        store,
        "waiting-20250101-120000-abcdef",
        JobStatus.PENDING,
        pending_reason="queued: 2nd for 4 x v4-16; fleet: 1 free, 3 held by train-a, train-b",
    )
    code, out = _run_in_terminal(fray, "list", columns=80)
    assert code == 0, out
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.replace("\r", ""))
    assert "AGE" in text and "1m" in text and "PREEMPT/FAIL" in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    code, out = _run_in_terminal(fray, "list", "--wide", columns=80)
    assert code == 0 and "GOODPUT" in out and "SUBMITTED" in out, out
    code, out = _run_in_terminal(fray, "list", "-o", "wide", columns=80)  # kubectl's spelling
    assert code == 0 and "GOODPUT" in out and "KIND" in out, out
    r = fray("list", "-o", "json")
    assert r.returncode == 2 and "argument --wide/-o: expected wide, got 'json'" in r.stderr, r.stderr


def _watch(fray: Fray, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*__import__("test_cli").FRAY, *argv],
        cwd=fray.workdir,
        env={**fray.env, "PYTHONUNBUFFERED": "1"},  # each refresh reaches the pipe as printed
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(proc: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    import selectors

    seen = ""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    # os.read, not readline: a buffered reader keeps what it read past the first line, and select() does not
    # see it (the needle would wait for the next redraw, which a job whose state no longer changes never makes)
    while needle not in seen:
        assert time.monotonic() < end, f"no {needle!r} in {seen[-2000:]!r}"
        if sel.select(timeout=1):
            chunk = os.read(proc.stdout.fileno(), 65536).decode()
            assert chunk, f"exited before {needle!r}: {seen[-2000:]!r}"
            seen += chunk
    return seen


def test_list_and_status_watch_show_a_state_change(fray: Fray) -> None:
    store = JobStore(str(fray.jobs_dir))
    _ran(store, "watched-1", JobStatus.PENDING, pending_reason="queued: 1st for 1 x v4-16")
    lister = _watch(fray, "list", "-w", "--interval", "0.2")
    status = _watch(fray, "status", "watched-1", "-w", "--interval", "0.2")
    try:
        _read_until(lister, "PENDING (queued: 1st for 1 x v4-16)")
        _read_until(status, "pending")
        _ran(store, "watched-1", JobStatus.FAILED, error="boom", finished_at=time.time())
        _read_until(lister, "FAILED")
        assert status.wait(60) == 1  # status -w ends with the job, with its exit code
        assert "boom" in status.stdout.read()  # type: ignore[union-attr]
        lister.send_signal(2)  # Ctrl-C
        assert lister.wait(60) == 130
    finally:
        for p in (lister, status):
            if p.poll() is None:
                p.kill()


def test_status_watch_of_an_ended_job_on_a_terminal(fray: Fray) -> None:
    """``fray status ID -w`` on a terminal, for a job that has ended: the status once, then the job's exit code;
    the last frame does not say to press Ctrl-C (it said so after the command had already returned)."""
    from test_cli import _run_in_terminal

    _ran(JobStore(str(fray.jobs_dir)), "ended-1", JobStatus.STOPPED, finished_at=time.time())
    code, out = _run_in_terminal(fray, "status", "ended-1", "-w", columns=80)
    assert code == 3 and "STOPPED" in out, out
    assert "Ctrl-C" not in out, out


# ------------------------------------------------------------------------------------ housekeeping


def test_stop_several_and_all_with_filters(fray: Fray) -> None:
    from helpers import wait_for

    ids = {}
    for name in ("other-0", "sweep-1", "sweep-2"):
        marker = fray.workdir / f"started-{name}"
        r = fray("launch", "--name", name, "jobs_mod:block", f"marker={marker}")
        assert r.returncode == 0, r.stderr
        ids[name] = r.stdout.strip()
        wait_for(marker.exists, what="the job to start")

    def states() -> dict[str, str]:
        return {name: fray.status(job_id)["status"] for name, job_id in ids.items()}

    r = fray("stop", "--all", "--name", "sweep-*")  # not a terminal, no -y: refused, nothing stopped
    assert r.returncode == 2 and "without -y" in r.stderr, r.stderr
    r = fray("stop", "--all", "--name", "nomatch-*", "-y")
    assert r.returncode == 0 and "no running or pending job matches" in r.stderr, r.stderr
    assert set(states().values()) == {"RUNNING"}
    r = fray("stop", "--all", "--name", "sweep-*", "-y")  # the filter picks two of the three
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"{ids['sweep-1']}: STOPPED", f"{ids['sweep-2']}: STOPPED"]
    assert states() == {"other-0": "RUNNING", "sweep-1": "STOPPED", "sweep-2": "STOPPED"}
    r = fray("stop", ids["sweep-1"], ids["other-0"])  # several ids, one of them already ended
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{ids['sweep-1']}: already ended STOPPED", f"{ids['other-0']}: STOPPED"]
    r = fray("stop", "--all", "-y")
    assert r.returncode == 0 and "no running or pending job matches" in r.stderr


def _answer_in_terminal(fray: Fray, answer: str, *argv: str) -> tuple[int, str]:
    """``fray ARGV`` on a pseudo-terminal (stdin too), typing ``answer`` once it asks; (exit code, output)."""
    import pty
    import select

    from test_cli import FRAY

    master, slave = pty.openpty()
    proc = subprocess.Popen([*FRAY, *argv], cwd=fray.workdir, env=fray.env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if select.select([master], [], [], 1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the command ended
                    break
                if not chunk:
                    break
                out += chunk
                if out.rstrip().endswith(b"[y/N]") and answer:
                    os.write(master, answer.encode() + b"\n")
                    answer = ""
        return proc.wait(60), out.decode(errors="replace").replace("\r", "")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def test_all_asks_on_a_terminal(fray: Fray) -> None:
    """``stop --all`` / ``rm --all`` without ``-y`` name the jobs and ask; only a yes acts."""
    store = JobStore(str(fray.jobs_dir))
    _ran(store, "live-1", JobStatus.RUNNING)  # its owner is this process: alive
    _ran(store, "done-1", JobStatus.SUCCEEDED, finished_at=time.time())
    code, out = _answer_in_terminal(fray, "n", "stop", "--all")
    assert code == 0 and "stop 1 job(s): live-1? [y/N]" in out and "nothing stopped" in out, out
    assert fray.status("live-1")["status"] == "RUNNING"
    code, out = _answer_in_terminal(fray, "y", "rm", "--all")
    assert code == 0 and "remove 1 job(s): done-1? [y/N]" in out and "removed done-1" in out, out
    assert not store.exists("done-1") and store.exists("live-1")


def test_stop_a_frozen_supervisor_times_out_with_exit_4(fray: Fray) -> None:
    import signal

    from helpers import wait_for

    marker = fray.workdir / "started"
    job_id = fray("launch", "jobs_mod:block", f"marker={marker}").stdout.strip()
    wait_for(marker.exists, what="the job to start")
    pid = fray.owner_pid(job_id)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = fray("stop", "--timeout", "1", job_id)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"job {job_id} did not stop within 1 s" in r.stderr and r.stderr.count("\n") == 1
    wait_for(lambda: fray.status(job_id)["status"] == "STOPPED", what="the job to stop once its supervisor resumes")


def test_rm_and_prune_never_a_running_job(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    old = time.time() - 10 * 86400
    jobs.write(
        JobInfo(job_id="old-done", name="old", status=JobStatus.SUCCEEDED, submitted_at=old, finished_at=old + 5),
        owner=owner_info(),
    )
    jobs.write(
        JobInfo(
            job_id="old-failed", name="old", status=JobStatus.FAILED, error="x", submitted_at=old, finished_at=old + 5
        ),
        owner=owner_info(),
    )
    jobs.write(
        JobInfo(job_id="old-running", name="old", status=JobStatus.RUNNING, submitted_at=old), owner=owner_info()
    )
    jobs.write(
        JobInfo(
            job_id="new-done", name="new", status=JobStatus.SUCCEEDED, submitted_at=time.time(), finished_at=time.time()
        ),
        owner=owner_info(),
    )
    assert main(["prune", "--older-than", "7d", "--dry-run"]) == 0
    assert "would remove old-done" in capsys.readouterr().out and jobs.exists("old-done")
    assert main(["prune", "--older-than", "7d", "--status", "failed"]) == 0
    assert capsys.readouterr().out.splitlines() == ["removed old-failed (FAILED, ended 9d ago)"]
    assert main(["prune", "--older-than", "7d"]) == 0
    assert not jobs.exists("old-done") and jobs.exists("old-running") and jobs.exists("new-done")
    capsys.readouterr()
    assert main(["rm", "old-running"]) == 2
    assert "job old-running is RUNNING: only a job that ended can be removed" in capsys.readouterr().err
    assert main(["rm", "new-done"]) == 0 and not jobs.exists("new-done")
    assert main(["rm", "new-done"]) == 2 and "unknown job id 'new-done'" in capsys.readouterr().err
    assert main(["rm", "--all", "-y"]) == 0  # only ended jobs: the running one stays
    assert jobs.exists("old-running")
    assert main(["prune", "--older-than", "soon"]) == 2


def test_config_file_env_and_flags_precedence(
    jobs: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fray_core.cli.config import resolve_spec

    assert resolve_spec(None, None) == ("local", "default")
    conf = tmp_path / "config" / "fray" / "config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text('cluster = "local?tpu=v4-16:2"\njobs_dir = "%s"\n' % (tmp_path / "conf-jobs"))
    monkeypatch.delenv("FRAY_JOBS_DIR")
    assert resolve_spec(None, None) == ("local?tpu=v4-16:2", f"config file {conf}")
    assert os.environ["FRAY_JOBS_DIR"] == str(tmp_path / "conf-jobs")  # the config's jobs dir, for what fray starts
    monkeypatch.setenv("FRAY_JOBS_DIR", str(tmp_path / "env-jobs"))
    resolve_spec(None, None)
    assert os.environ["FRAY_JOBS_DIR"] == str(tmp_path / "env-jobs")  # the env var wins over the file
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert resolve_spec(None, None) == ("ray?address=10.1.2.3%3A6379", "RAY_ADDRESS")
    monkeypatch.setenv("FRAY_CLUSTER_SPEC", "local")
    assert resolve_spec(None, None) == ("local", "FRAY_CLUSTER_SPEC")
    assert resolve_spec(None, "127.0.0.1:1234") == ("ray?address=127.0.0.1%3A1234", "--address")
    assert resolve_spec("local?tpu=v4-8:1", None)[0] == "local?tpu=v4-8:1"
    assert main(["--address", "a:1", "--cluster", "local", "list"]) == 2
    assert "--cluster and --address both name a cluster" in capsys.readouterr().err
    conf.write_text('clustr = "local"\n')
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert f"config file {conf}: unknown key 'clustr'; allowed: cluster, jobs_dir" in err and err.count("\n") == 1
    conf.write_text("cluster = [\n")
    assert main(["list"]) == 2 and "not valid TOML" in capsys.readouterr().err


def test_completion_and_doctor(jobs: JobStore, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for shell in ("bash", "zsh"):
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        assert "complete -F _fray fray" in script and "--tail" in script and "prune" in script
    (tmp_path / "c.sh").write_text(script.split("bashcompinit\n", 1)[1])
    complete = (
        f"source {tmp_path / 'c.sh'}; COMP_WORDS=(fray lo); COMP_CWORD=1; _fray; echo ${{COMPREPLY[@]}}; "
        "COMP_WORDS=(fray logs --ta); COMP_CWORD=2; _fray; echo ${COMPREPLY[@]}"
    )
    r = subprocess.run(["bash", "-c", complete], capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.split("\n")[:2] == ["logs", "--tail"], r.stdout + r.stderr
    assert main(["doctor", "--cluster", "local?tpu=v4-16:2"]) == 0
    out = capsys.readouterr().out
    assert "cluster      local?tpu=v4-16:2 (from --cluster)" in out and "simulated: 2 x v4-16" in out
    assert "writable" in out and "no problems found" in out
    (Path(jobs.root) / "stray").write_text("")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "!!  records" in out and "fix: fray rm stray" in out
    assert main(["rm", "stray"]) == 0 and not (Path(jobs.root) / "stray").exists()
    assert main(["doctor"]) == 0


def test_doctor_checks_a_remote_store_is_writable(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    """A jobs dir given as an fsspec URL (``gs://...``; ``memory://`` here) is written to, not only listed."""
    import fsspec

    assert main(["doctor", "--cluster", "local?jobs_dir=memory://fray-doctor/jobs"]) == 0
    out = capsys.readouterr().out
    assert "memory://fray-doctor/jobs: writable" in out, out
    assert not [p for p in fsspec.filesystem("memory").find("/fray-doctor") if "doctor" in p.rsplit("/", 1)[-1]]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion_in_a_bare_zsh(jobs: JobStore, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``fray completion zsh`` sourced by a zsh without compinit loaded (``zsh -f``, a fresh ~/.zshrc):
    it registered nothing (``compdef: command not found``). Skipped without zsh (CI does not install it)."""
    assert main(["completion", "zsh"]) == 0
    (tmp_path / "c.zsh").write_text(capsys.readouterr().out)
    script = (
        f"source {tmp_path / 'c.zsh'} || exit 3; print -r -- ${{_comps[fray]}}; "
        "COMP_WORDS=(fray logs --ta); COMP_CWORD=2; compgen -F _fray -- --ta"
    )
    r = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and not r.stderr, r.stdout + r.stderr
    registered, *completions = r.stdout.splitlines()
    # bashcompinit's compgen leaves matching the word to zsh: the candidates are fray logs' options
    assert "_fray" in registered and "--tail" in completions and "--json" not in completions, r.stdout


def test_store_log_reader_cuts_a_runaway_line(jobs: JobStore) -> None:
    """``cluster.logs`` / ``JobStore.iter_log`` (what ``launch --wait`` follows): a 'line' of 3.5 MiB with no
    newline (a progress bar) comes out in pieces of ``MAX_LOG_LINE``, not as one string held whole."""
    from fray_core.records import MAX_LOG_LINE

    _plant_log(jobs, "bar-1", [])
    with open(jobs.log_path("bar-1"), "wb") as f:
        f.write(b"[a0 r0] start\n[a0 r0] " + b"#\r" * (7 << 19) + b"\n[a0 r0] end\n[a0 r0] partial")
    lines = list(jobs.iter_log("bar-1", follow=False, is_done=None))
    assert lines[0] == "[a0 r0] start" and lines[-1] == "[a0 r0] end"
    assert max(len(x) for x in lines) <= MAX_LOG_LINE
    assert sum(len(x) for x in lines[1:-1]) == 8 + (7 << 20)


# ------------------------------------------------------------------------- the record names the job's cluster


def test_commands_about_a_job_reach_the_cluster_its_record_names(
    jobs: JobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fray status/logs/stop ID`` with no flags, from the machine that launched the job: the default store
    holds the record, whose ``owner.cluster`` says where the job runs (issue 28: after Ctrl-C of ``fray launch
    --address HEAD --wait``, the hint ``fray stop ID`` must work as printed). ``--cluster`` still wins."""
    from fray_core.cluster import register_backend
    from fray_core.supervisor import RecordCluster

    made: list[dict[str, str]] = []

    class Remote(RecordCluster):
        """A backend whose jobs run elsewhere: it can be reached only through its spec."""

        def __init__(self, params: dict[str, str]) -> None:
            made.append(params)
            self.store = JobStore(params["jobs_dir"])

        def launch(self, request):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def terminate(self, job_id):  # type: ignore[no-untyped-def]
            info, _ = self.store.read_info(str(job_id))
            info.status = JobStatus.STOPPED
            self.store.write(info)

    register_backend("remote", Remote)
    info = JobInfo(job_id="remote-1", name="far", status=JobStatus.RUNNING, backend="remote", submitted_at=1.0)
    jobs.write(info, owner={"cluster": "remote?where=head%3A6379"})
    with open(jobs.log_path("remote-1"), "ab") as f:
        f.write(b"[a0 r0] hello from far away\n")

    assert main(["status", "remote-1", "--json"]) == 0
    assert '"status": "RUNNING"' in capsys.readouterr().out
    assert made == [{"where": "head:6379", "jobs_dir": jobs.root}]  # the store the record was found in
    assert main(["logs", "remote-1"]) == 0
    assert "hello from far away" in capsys.readouterr().out
    assert main(["--cluster", "local", "stop", "remote-1"]) == 2  # named on the command line: used as given
    assert "runs on the 'remote' backend" in capsys.readouterr().err
    assert main(["stop", "remote-1"]) == 0
    assert capsys.readouterr().out.strip() == "remote-1: STOPPED"
    assert len(made) == 3


def test_launch_working_dir_is_the_jobs_code(
    tmp_path: Path, jobs: JobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fray launch --working-dir DIR``: TARGET's module is imported from DIR (not only the current
    directory) and DIR is the job's code and working directory (on Ray, shipped with the job); a DIR that
    is not a directory is one line, exit 2, before anything is launched."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "wd_mod.py").write_text("import os\n\ndef here():\n    return os.getcwd()\n")
    (tmp_path / "elsewhere").mkdir()
    os.chdir(tmp_path / "elsewhere")  # the fixture's monkeypatch.chdir restores the test's directory
    assert main(["launch", "--working-dir", "../proj", "wd_mod:here"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert LocalCluster(jobs_dir=jobs.root).wait(job_id, timeout=60).result == [str(proj)]
    for bad, why in ((tmp_path / "missing", "no such directory"), (proj / "wd_mod.py", "not a directory")):
        assert main(["launch", "--working-dir", str(bad), "wd_mod:here"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument --working-dir: expected a directory, got '{bad}' ({why})" in err
    assert os.listdir(jobs.root) == [job_id]


# ------------------------------------------------------------------------- a target that exits at import


@pytest.mark.parametrize(
    "source, said",
    [
        ("import sys\nsys.exit('\\x1b[31mbye')\n", r"SystemExit\('\\x1b\[31mbye'\)\)"),
        (
            "import argparse\nargparse.ArgumentParser().parse_args()\n",
            r"SystemExit\(2\)\); its last line on stderr: '.*error: unrecognized arguments",
        ),
    ],
    ids=["sys.exit", "argparse"],
)
def test_a_target_that_exits_at_import_is_one_line_exit_2(
    jobs: JobStore, capsys: pytest.CaptureFixture[str], tmp_path: Path, source: str, said: str
) -> None:
    """A module calling sys.exit() (or argparse reading fray's own argv) at import made ``fray launch`` exit 1
    with raw ESC bytes, or print argparse's usage lines as if they were fray's."""
    name = f"exits_{len(source)}"
    (tmp_path / f"{name}.py").write_text(source + "def fn():\n    return 1\n")
    argv = sys.argv
    sys.argv = ["fray", "launch", f"{name}:fn"]  # what argparse in the module reads
    try:
        assert main(["launch", f"{name}:fn"]) == 2
    finally:
        sys.argv = argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "usage:" not in err, err
    assert re.match(rf"fray launch: error: cannot import module '{name}': it exited at import \({said}", err), err


def test_a_retry_budget_above_the_limit_is_one_line_exit_2(jobs: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--max-retries-failure", "1" + "0" * 30, "jobs_mod:where"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fray launch: error: JobRequest.max_retries_failure: at most 1,000,000 retries allowed, got")
    assert err.count("\n") == 1, err


# ------------------------------------------------------------------------- fray sim: numbers refused up front


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # 1e10 s per step: accepted, then every host failed (a sleep past what the clock holds)
        (["--preemptions", "0", "--step-time", "1e10"], "argument --step-time: expected a number >= 0 (at most 1e+09)"),
        (["--step-time", "1e10"], "argument --step-time: expected a number >= 0 (at most 1e+09), got '1e10'"),
        # a fault and an attempt each: a million of them were built (and listed) before the first attempt
        (["--preemptions", "1000000"], "argument --preemptions: expected an int >= 0 (at most 100,000), got '1000000'"),
        (["--failures", "100000000"], "argument --failures: expected an int >= 0 (at most 100,000), got '100000000'"),
        (
            ["--preemptions", "60000", "--failures", "60000"],
            "--preemptions + --failures: at most 100,000 faults allowed (an attempt each), got 120,000",
        ),
        (
            ["--steps", "100000", "--step-time", "1e5"],
            "--steps x --step-time: 100000 x 100000 s is more than 1e+09 s per attempt, the most allowed",
        ),
        (
            ["--steps", "9" * 500],  # an int of 500 digits times a float raised OverflowError
            "--steps x --step-time: an int of 500 digits x 0.3 s is more than 1e+09 s per attempt, the most allowed",
        ),
        (["--slices", "20000"], "argument --slices: expected an int >= 1 (at most 10,000), got '20000'"),
        (
            ["--max-retries-preemption", "2000000"],
            "argument --max-retries-preemption: expected an int >= 0 (at most 1,000,000), got '2000000'",
        ),
        (
            ["--slices", "10000"],  # 20,000 real host processes: refused before the fleet is made
            "launch: ResourceConfig.replicas (slices): 10,000 x v4-16 (2 hosts a slice) is 20,000 host processes at "
            "once; the local backend runs at most",
        ),
        (
            ["--slices", "8", "--cluster", "local?max_hosts=15"],
            "is 16 host processes at once; the local backend runs at most 15 at once on this machine; ask for fewer "
            "slices or a smaller TPU type, or raise the bound with --cluster 'local?max_hosts=N'",
        ),
        (
            ["--cluster", "local?max_hosts=0"],
            "cluster spec for 'local': max_hosts: expected an int >= 1, got '0'",
        ),
        (
            ["--slices", "10000", "--tpu", "v4-4096"],  # refused before 10,000 slices are made
            "ResourceConfig.replicas: 10,000 x v4-4096 is 5,120,000 host processes; at most 100,000 per job",
        ),
    ],
)
def test_sim_numbers_out_of_range_are_one_line_exit_2(
    jobs: JobStore, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    start = time.monotonic()
    assert main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fray sim: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert time.monotonic() - start < 10
    assert not os.path.isdir(jobs.root) or not os.listdir(jobs.root)  # nothing launched
