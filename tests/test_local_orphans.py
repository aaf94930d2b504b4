"""No process outlives its job on the local backend, even when the host's guardian cannot clean up.

The guardian (``fray_local._host``) kills its subtree when its host ends; it cannot when it is itself
SIGKILLed (the OOM killer) or stopped. A grandchild that called ``setsid`` is outside the guardian's process
group, so only the supervisor's sweep of the host run's mark (``fray_local._proc.sweep_run``) reaches it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray_core import Entrypoint, JobRequest, JobStatus
from fray_core._procfs import start_ticks, stat_fields
from fray_local import LocalCluster, _proc

import helpers

pytestmark = pytest.mark.skipif(not _proc.LINUX, reason="the sweep reads /proc (Linux)")


# ------------------------------------------------------------------------------- the job (runs in the worker)


def setsid_grandchild(pid_file: str) -> None:
    """Double-fork a ``sleep 300`` that called ``setsid`` (outside the guardian's process group, reparented to
    init) and write its pid to ``pid_file``."""
    from fray_core.testing.conformance import write_whole

    middle = os.fork()
    if middle == 0:
        os.setsid()
        child = os.fork()
        if child == 0:
            os.execvp("sleep", ["sleep", "300"])
        write_whole(pid_file, str(child))
        os._exit(0)
    os.waitpid(middle, 0)


def orphaning_job(pid_dir: str, stop_guardian: bool, hold: float = 300.0) -> str:
    """Double-fork a ``setsid`` grandchild (``sleep``), write its pid and the guardian's, then wait ``hold``
    seconds and return; with ``stop_guardian``, SIGSTOP the guardian (our parent) first."""
    from fray_core.testing.conformance import write_whole

    guardian = os.getppid()
    setsid_grandchild(os.path.join(pid_dir, "orphan"))
    if stop_guardian:
        os.kill(guardian, signal.SIGSTOP)
    write_whole(os.path.join(pid_dir, "guardian"), str(guardian))
    time.sleep(hold)
    return "done"


def lifecycle_job(pid_dir: str, hold: float) -> str:
    """A short host: a ``setsid`` grandchild (its pid in ``orphan-a<attempt>``), ``hold`` seconds of work, a
    result."""
    setsid_grandchild(os.path.join(pid_dir, f"orphan-a{os.environ['FRAY_ATTEMPT']}"))
    time.sleep(hold)
    return "done"


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


def _run_tokens(cluster: LocalCluster, job_id: str) -> list[str]:
    """The run marks (``FRAY_SUPERVISOR_RUN``) of every host the job started so far."""
    provider = cluster._jobs[job_id].provider
    return [host.run_token for host in list(provider._hosts.values())]  # type: ignore[attr-defined]


def _marked(tokens: list[str]) -> list[int]:
    """Every live process that carries one of the run marks ``tokens``."""
    marks = [t.encode() for t in tokens]
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit() and int(name) != os.getpid() and any(_proc._carries(int(name), m) for m in marks)
    ]


@contextlib.contextmanager
def _launched(
    cluster: LocalCluster, pid_dir: Path, stop_guardian: bool, hold: float = 300.0
) -> Iterator[tuple[str, dict[str, tuple[int, int | None]]]]:
    """Launch the job and wait until it wrote both pids: yields the job id and ``{name: (pid, start ticks)}``;
    afterwards kills whichever of them is left (a stopped guardian is continued first)."""
    request = JobRequest(
        name="orphans",
        entrypoint=Entrypoint(
            callable=orphaning_job,
            function_args={"pid_dir": str(pid_dir), "stop_guardian": stop_guardian, "hold": hold},
        ),
    )
    pids: dict[str, tuple[int, int | None]] = {}
    try:
        job_id = cluster.launch(request)
        helpers.wait_for(lambda: (pid_dir / "guardian").exists(), 60, "the job to start its grandchild", interval=0.02)
        for name in ("orphan", "guardian"):
            pid = int((pid_dir / name).read_text())
            pids[name] = (pid, start_ticks(pid))
        yield job_id, pids
    finally:
        if "guardian" in pids:
            _kill(*pids["guardian"], signal.SIGCONT, signal.SIGKILL)
        if "orphan" in pids:
            _kill(*pids["orphan"], signal.SIGKILL)


# -------------------------------------------------------------------------------------------------- tests


def test_a_setsid_grandchild_dies_when_the_guardian_is_sigkilled(cluster: LocalCluster, tmp_path: Path) -> None:
    with _launched(cluster, tmp_path, stop_guardian=False) as (job_id, pids):
        orphan, guardian = pids["orphan"], pids["guardian"]
        session = {pid: (stat_fields(pid) or ["", "", "", ""])[3] for pid in (orphan[0], guardian[0])}
        assert _alive(*orphan) and session[orphan[0]] != session[guardian[0]]  # outside the guardian's group
        assert b"fray_local._host" in Path(f"/proc/{guardian[0]}/cmdline").read_bytes()
        os.kill(guardian[0], signal.SIGKILL)  # as the OOM killer would: the guardian cannot clean up
        info = cluster.wait(job_id, timeout=60)
        assert info.status == JobStatus.FAILED and "SIGKILL" in (info.error or ""), info.error
        helpers.wait_for(lambda: not _alive(*orphan), 5, f"the orphaned grandchild {orphan[0]} to be killed")


def test_a_setsid_grandchild_dies_when_a_stopped_guardian_is_terminated(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_proc, "TEARDOWN_GRACE", 1.0)  # the stopped guardian's group is killed after 1 s
    with _launched(cluster, tmp_path, stop_guardian=True) as (job_id, pids):
        orphan, guardian = pids["orphan"], pids["guardian"]
        helpers.wait_for(lambda: (stat_fields(guardian[0]) or ["?"])[0] == "T", 10, "the guardian to be stopped")
        cluster.terminate(job_id)
        info = cluster.wait(job_id, timeout=60)
        assert info.status == JobStatus.STOPPED, info
        helpers.wait_for(lambda: not _alive(*orphan), 5, f"the orphaned grandchild {orphan[0]} to be killed")


def test_a_worker_that_returns_while_its_guardian_is_stopped_ends_the_job_with_the_reason(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stops its guardian and returns: no guardian reaps it or reports the host's end. The supervisor
    hears no beat from the guardian for ``GUARDIAN_SILENCE`` seconds, kills the host and sweeps its run: the job
    ends FAILED saying so (not RUNNING until someone terminates it), on the failure budget, nothing left."""
    monkeypatch.setattr(_proc, "GUARDIAN_SILENCE", 2.0)
    with _launched(cluster, tmp_path, stop_guardian=True, hold=0.0) as (job_id, pids):
        orphan, guardian = pids["orphan"], pids["guardian"]
        tokens = _run_tokens(cluster, job_id)
        info = cluster.wait(job_id, timeout=_proc.GUARDIAN_SILENCE + 30)  # was: RUNNING for ever
        assert info.status is JobStatus.FAILED, info
        assert info.preemptions == 0 and info.failures == 1, info
        error = info.error or ""
        assert "GuardianUnresponsive" in error and f"guardian process (pid {guardian[0]}) did not answer" in error
        assert "stopped by a stop signal" in error, error
        # killed, the setsid grandchild too (the sweep); SIGKILL is sent, the exit may take a moment
        helpers.wait_for(lambda: not _alive(*guardian) and not _alive(*orphan), 5, "the host's processes to die")
        helpers.wait_for(lambda: not _marked(tokens), 5, "no process to carry the run's mark")
        log = Path(cluster.store.log_path(job_id)).read_text()
        assert "[fray] GuardianUnresponsive" in log, log


def test_a_silent_guardian_that_is_not_stopped_is_slow_not_dead(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guardian that sends no beat but runs (a machine so loaded that a thousand hosts' interpreters start in
    turns) is left alone past ``GUARDIAN_SILENCE``: killing it would charge the failure budget for the load.
    The beat pipe goes by a name the guardian does not read, so it never beats (and is asleep, state S)."""
    monkeypatch.setattr(_proc, "GUARDIAN_SILENCE", 0.5)
    monkeypatch.setattr(_proc, "BEAT_ENV", "FRAY_TEST_BEAT_FD_UNREAD")
    job_id = cluster.launch(JobRequest(name="quiet", entrypoint=Entrypoint(callable=time.sleep, args=(2.5,))))
    info = cluster.wait(job_id, timeout=60)
    assert info.status is JobStatus.SUCCEEDED, info.error
    assert info.failures == 0 and "GuardianUnresponsive" not in Path(cluster.store.log_path(job_id)).read_text()


# ------------------------------------------------------------- kill -9 of the guardian at a random instant

#: the seed of the random instants (printed; FRAY_TEST_SEED=<seed> replays a run)
SEED = int(os.environ.get("FRAY_TEST_SEED") or random.SystemRandom().randrange(2**32))
CASES = 6  # each draws its instant in its sixth of the host's lifetime: start-up, running and ending all get one
HOLD = 0.5  # the job's own work, seconds


def _lifecycle_request(pid_dir: Path) -> JobRequest:
    # one retry on the failure budget, none on the preemption budget: a guardian killed is a host that crashed
    # (the failure budget); were it charged as a preemption the job would fail
    return JobRequest(
        name="lifecycle",
        entrypoint=Entrypoint(callable=lifecycle_job, function_args={"pid_dir": str(pid_dir), "hold": HOLD}),
        max_retries_failure=1,
        max_retries_preemption=0,
    )


@pytest.fixture(scope="module")
def lifetime(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Seconds from launch to the end of an undisturbed run of the job on this machine (its lifecycle)."""
    from fray_local.testing import TEST_POLICY

    root = tmp_path_factory.mktemp("lifetime")
    cluster = LocalCluster(jobs_dir=str(root / "jobs"), retry_policy=TEST_POLICY)
    try:
        began = time.monotonic()
        info = cluster.wait(cluster.launch(_lifecycle_request(root)), timeout=60)
        assert info.status is JobStatus.SUCCEEDED, info
        return time.monotonic() - began
    finally:
        cluster.close()


def _kill_guardian_at(cluster: LocalCluster, job_id: str, at: float) -> str:
    """At monotonic time ``at``, SIGKILL the guardian of attempt 0's host (once it exists, if it was not
    spawned yet); what the host was doing then."""
    threading.Event().wait(max(0.0, at - time.monotonic()))
    sup = cluster._jobs[job_id]
    provider = sup.provider
    while not sup.done.is_set():
        host = next((h for h in list(provider._hosts.values()) if h.tag.startswith("a0 ")), None)  # type: ignore[attr-defined]
        if host is not None and host.proc is not None:
            if host.proc.poll() is not None:
                return "after the guardian's exit"
            phase = (
                "after the result" if os.path.exists(host.result_path)
                else "worker running" if _proc.descendants(host.proc.pid)
                else "guardian starting"
            )  # fmt: skip
            host.proc.send_signal(signal.SIGKILL)  # our unreaped child: never a reused pid
            return phase
        threading.Event().wait(0.002)
    return "after the job's end"


@pytest.mark.parametrize("case", range(CASES))
def test_a_guardian_killed_9_at_a_random_instant_ends_the_job_and_leaves_nothing(
    cluster: LocalCluster, tmp_path: Path, lifetime: float, case: int
) -> None:
    """kill -9 of the guardian at an instant drawn over the host's whole life (launch, start-up, running,
    ending): the job ends within a bound, in a terminal state; nothing carrying the run's mark survives; a
    guardian killed before its worker's result is a crashed host, retried on the failure budget (the job then
    succeeds), never a preemption; one killed after it leaves the result standing."""
    rng = random.Random(f"{SEED}-{case}")
    delay = (case + rng.random()) * lifetime * 1.2 / CASES  # a little past the undisturbed end, too
    where = f"FRAY_TEST_SEED={SEED} case {case}: kill at {delay:.3f} s of a {lifetime:.2f} s lifecycle"
    print(where)
    began = time.monotonic()
    job_id = cluster.launch(_lifecycle_request(tmp_path))
    phase = _kill_guardian_at(cluster, job_id, began + delay)
    killed_at = time.monotonic()
    where += f" ({phase})"
    print(where)
    info = cluster.wait(job_id, timeout=60)
    assert time.monotonic() - killed_at < 30, where  # the bound: one crash, one retry (and its backoff)
    assert info.status is JobStatus.SUCCEEDED and info.result == ["done"], f"{where}: {info}"
    assert info.preemptions == 0, f"{where}: {info}"
    first = info.attempts[0]
    provider = cluster._jobs[job_id].provider
    host0 = next(h for h in list(provider._hosts.values()) if h.tag.startswith("a0 "))  # type: ignore[attr-defined]
    # the outcome follows what the worker had done when its guardian died, never the moment's luck
    assert (first.outcome.value == "SUCCEEDED") == os.path.exists(host0.result_path), f"{where}: {first}"
    if first.outcome.value == "FAILED":  # killed before the worker's result: a crashed host, retried
        assert info.failures == 1 and len(info.attempts) == 2, f"{where}: {info}"
        assert "killed by SIGKILL" in (first.cause or ""), f"{where}: {first.cause}"
    else:  # killed after the worker's result (or not at all: the job had ended): the result stands
        assert first.outcome.value == "SUCCEEDED" and info.failures == 0, f"{where}: {info}"
        assert len(info.attempts) == 1, f"{where}: {info}"
    tokens = _run_tokens(cluster, job_id)
    assert len(tokens) == len(info.attempts), f"{where}: {tokens}"
    # every process of every attempt carries its mark: the setsid grandchildren too (sweep_run's reach)
    assert list(tmp_path.glob("orphan-a*")), f"{where}: no attempt started its grandchild"
    helpers.wait_for(lambda: not _marked(tokens), 5, f"{where}: no process to carry the run's mark")


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
