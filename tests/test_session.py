"""Held sessions on the local backend: persistent host workers, fresh processes, preemption between and during
calls, exact budgets, failure propagation, close/GC/terminate releasing the slices."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from fray_core import (
    AttemptOutcome,
    Entrypoint,
    JobFailedError,
    JobRequest,
    JobStatus,
    RemoteCallError,
    ResourceConfig,
    job,
    worker_state,
)
from fray_core.records import pid_alive
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY

import helpers

V4 = ResourceConfig.with_tpu("v4-16", slice_count=2)


def make_cluster(tmp_path: Path, capacity: dict[str, int] | None) -> LocalCluster:
    fleet = TpuFleet(capacity, state_dir=str(tmp_path / "fleet")) if capacity is not None else None
    return LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)


@pytest.fixture
def cluster(tmp_path: Path):
    c = make_cluster(tmp_path, {"v4-16": 3})
    yield c
    c.close()


# ------------------------------------------------------------------------------- functions run on hosts


def remember() -> dict:
    state = worker_state()
    state["calls"] = state.get("calls", 0) + 1
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "calls": state["calls"],
        **{k: v for k, v in os.environ.items() if k.startswith(("FRAY_", "TPU_", "MEGASCALE_"))},
    }


def tpu_name() -> str:
    return os.environ["TPU_NAME"]


def boom(msg: str) -> None:
    raise ValueError(f"boom: {msg}")


def mark_then_block(marker_dir: str) -> tuple[str, str]:
    """Attempt 0: say we are running, then block until killed. Later attempts: return where we run."""
    attempt = os.environ["FRAY_ATTEMPT"]
    if attempt == "0":
        Path(marker_dir, f"{os.environ['FRAY_SLICE_ID']}-{os.environ['TPU_WORKER_ID']}").write_text(str(os.getpid()))
        import threading

        threading.Event().wait(120)  # the preemption kills this process long before
        raise AssertionError("not preempted")
    return attempt, os.environ["TPU_NAME"]


def session_pids(results: list[dict]) -> set[int]:
    return {r["pid"] for r in results}


# ---------------------------------------------------------------------------------------------- tests


def test_calls_reuse_the_same_host_processes_and_their_state(cluster: LocalCluster) -> None:
    with cluster.hold(V4, name="rollouts") as session:
        assert session.slices == ["v4-16-0", "v4-16-1"]
        first = session.run(remember)
        second = session.run(remember)
        helpers.check_hosts(first, n_slices=2)  # (slice, host) order, env, MEGASCALE for 2 slices
        assert [r["pid"] for r in first] == [r["pid"] for r in second]
        assert [r["calls"] for r in first] == [1, 1, 1, 1] and [r["calls"] for r in second] == [2, 2, 2, 2]
        assert os.getpid() not in session_pids(first)
        info = session.info
        assert info.status is JobStatus.RUNNING and info.request_summary["kind"] == "session"
        assert [i.job_id for i in cluster.list_jobs()] == [session.job_id]
    info = cluster.poll(session.job_id)
    assert info.status is JobStatus.SUCCEEDED and info.name == "rollouts"
    assert not any(pid_alive(p) for p in session_pids(first))
    log = "\n".join(cluster.logs(session.job_id))
    assert "session call 0: test_session:remember" in log and "session call 1:" in log


@job(tpu="v4-16", slices=2)
def decorated() -> str:
    return os.environ["TPU_NAME"]


def test_a_job_function_sent_to_a_session_runs_on_its_hosts(cluster: LocalCluster) -> None:
    with cluster.hold(V4) as session:
        assert session.run(decorated) == ["v4-16-0", "v4-16-0", "v4-16-1", "v4-16-1"]
    assert [i.job_id for i in cluster.list_jobs()] == [session.job_id]  # no job of its own


def test_cpu_gang_session_without_a_fleet(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, None)
    try:
        with c.hold(ResourceConfig(replicas=3)) as session:
            a, b = session.run(remember), session.submit(remember).result(timeout=60)
        assert [r["FRAY_REPLICA_ID"] for r in a] == ["0", "1", "2"]
        assert [r["pid"] for r in a] == [r["pid"] for r in b] and [r["calls"] for r in b] == [2, 2, 2]
    finally:
        c.close()


def test_fresh_process_runs_every_call_in_a_new_process(cluster: LocalCluster) -> None:
    with cluster.hold(V4, fresh_process=True) as session:
        first, second = session.run(remember), session.run(remember)
    assert session_pids(first).isdisjoint(session_pids(second))
    assert [r["calls"] for r in first + second] == [1] * 8  # no state carried over
    assert [r["ppid"] for r in first] == [r["ppid"] for r in second]  # children of the same host workers
    assert [r["TPU_NAME"] for r in second] == ["v4-16-0", "v4-16-0", "v4-16-1", "v4-16-1"]


def test_preemption_between_calls_restarts_the_workers_on_new_slices(cluster: LocalCluster) -> None:
    with cluster.hold(V4, max_retries_preemption=1) as session:
        before = session.run(remember)
        cluster.fleet.model.preempt("v4-16-0", restore_after=None)  # gone for good: the session moves to v4-16-2
        after = session.run(remember)
        assert session.slices == ["v4-16-1", "v4-16-2"]
    assert [r["TPU_NAME"] for r in after] == ["v4-16-1", "v4-16-1", "v4-16-2", "v4-16-2"]
    assert {r["FRAY_ATTEMPT"] for r in after} == {"1"} and [r["calls"] for r in after] == [1] * 4
    assert session_pids(before).isdisjoint(session_pids(after))
    info = cluster.poll(session.job_id)
    assert info.preemptions == 1 and [a.outcome for a in info.attempts] == [
        AttemptOutcome.PREEMPTED,
        AttemptOutcome.SUCCEEDED,
    ]


@pytest.mark.parametrize("fresh_process", [False, True])
def test_preemption_during_a_call_retries_the_call(cluster: LocalCluster, tmp_path: Path, fresh_process: bool) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    with cluster.hold(V4, fresh_process=fresh_process) as session:
        fut = session.submit(mark_then_block, str(markers))
        helpers.wait_for(lambda: len(list(markers.iterdir())) == 4, 60, "the call to run on every host")
        cluster.fleet.model.preempt("v4-16-1", restore_after=None)
        out = fut.result(timeout=120)
    assert out == [("1", "v4-16-0"), ("1", "v4-16-0"), ("1", "v4-16-2"), ("1", "v4-16-2")]
    assert cluster.poll(session.job_id).preemptions == 1


def test_preemption_budget_is_exact(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, {"v4-16": 1})
    try:
        with c.hold(ResourceConfig.with_tpu("v4-16"), max_retries_preemption=2) as session:
            for expected_attempt in (0, 1, 2):  # two preemptions are within the budget
                assert {r["FRAY_ATTEMPT"] for r in session.run(remember)} == {str(expected_attempt)}
                c.fleet.model.preempt("v4-16-0", restore_after=0.0)
            with pytest.raises(JobFailedError) as e:  # the third is not
                session.run(remember)
            with pytest.raises(JobFailedError):  # a session that ended stays ended
                session.run(remember)
        info = e.value.info
        assert info.status is JobStatus.FAILED and info.preemptions == 3
        assert [a.outcome for a in info.attempts] == [AttemptOutcome.PREEMPTED] * 3
        assert "max_retries_preemption=2" in str(e.value)
    finally:
        c.close()


@pytest.mark.parametrize("fresh_process", [False, True])
def test_failing_call_raises_the_host_exception_and_spends_the_failure_budget(
    cluster: LocalCluster, fresh_process: bool
) -> None:
    with cluster.hold(V4, max_retries_failure=1, fresh_process=fresh_process) as session:
        before = session.run(remember)
        with pytest.raises(ValueError, match="boom: one") as e:
            session.run(boom, "one")
        assert isinstance(e.value, RemoteCallError) and e.value.host in {(0, 0), (0, 1), (1, 0), (1, 1)}
        assert "in boom" in e.value.cause and 'raise ValueError(f"boom: {msg}")' in e.value.cause  # remote traceback
        after = session.run(remember)  # within the budget: new workers (the failed ones ended)
        assert session_pids(before).isdisjoint(session_pids(after))
        assert session.info.failures == 1
        with pytest.raises(ValueError, match="boom: two"):
            session.run(boom, "two")
        with pytest.raises(JobFailedError) as ended:  # the budget is spent: the session ended FAILED
            session.run(remember)
    info = ended.value.info
    assert info.status is JobStatus.FAILED and info.failures == 2
    assert "max_retries_failure=1" in (info.error or "")


def test_unknown_exception_classes_still_raise_remote_call_error(cluster: LocalCluster) -> None:
    def local_boom() -> None:
        class Private(Exception):
            pass

        raise Private("nobody here knows this class")

    with cluster.hold(ResourceConfig.with_tpu("v4-16"), max_retries_failure=0) as session:
        with pytest.raises(RemoteCallError, match="Private: nobody here knows this class"):
            session.run(local_boom)


def test_close_releases_the_slices_for_the_next_job(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, {"v4-16": 1})
    try:
        session = c.hold(ResourceConfig.with_tpu("v4-16"))
        pids = session_pids(session.run(remember))
        session.close()
        session.close()  # idempotent
        assert c.poll(session.job_id).status is JobStatus.SUCCEEDED
        assert not any(pid_alive(p) for p in pids)
        job = c.launch(
            JobRequest(
                name="next", entrypoint=Entrypoint(callable=tpu_name), resources=ResourceConfig.with_tpu("v4-16")
            )
        )
        assert c.wait(job, timeout=60).result == ["v4-16-0", "v4-16-0"]
        with pytest.raises(Exception, match="closed"):
            session.run(remember)
    finally:
        c.close()


def test_close_during_a_call_kills_the_workers(cluster: LocalCluster, tmp_path: Path) -> None:
    markers = tmp_path / "m"
    markers.mkdir()
    session = cluster.hold(V4)
    fut = session.submit(mark_then_block, str(markers))
    helpers.wait_for(  # every host wrote its pid (a marker may exist a moment before its content)
        lambda: len([p for p in markers.iterdir() if p.read_text()]) == 4, 60, "the call to run on every host"
    )
    pids = {int(p.read_text()) for p in markers.iterdir()}
    session.close()
    assert cluster.poll(session.job_id).status is JobStatus.STOPPED
    assert not any(pid_alive(p) for p in pids)
    with pytest.raises(JobFailedError):
        fut.result(timeout=60)
    assert cluster.fleet.model.describe("v4-16").startswith("3 free")


def test_garbage_collection_closes_the_session(cluster: LocalCluster) -> None:
    session = cluster.hold(V4)
    job_id = session.job_id
    pids = session_pids(session.run(remember))
    del session
    gc.collect()
    assert cluster.poll(job_id).status is JobStatus.SUCCEEDED
    assert not any(pid_alive(p) for p in pids)
    assert cluster.fleet.model.describe("v4-16").startswith("3 free")


def test_terminate_by_id_ends_the_session(cluster: LocalCluster) -> None:
    with cluster.hold(V4) as session:
        pids = session_pids(session.run(remember))
        cluster.terminate(session.job_id)
        with pytest.raises(JobFailedError, match="STOPPED") as e:
            session.run(remember)
        assert session.slices == []
    assert e.value.info.status is JobStatus.STOPPED
    assert not any(pid_alive(p) for p in pids)
    (listed,) = cluster.list_jobs()
    assert listed.status is JobStatus.STOPPED and listed.request_summary["kind"] == "session"


def test_bad_arguments_fail_in_the_caller(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="max_retries_failure"):
        cluster.hold(V4, max_retries_failure=-1)
    with pytest.raises(TypeError, match="fresh_process"):
        cluster.hold(V4, fresh_process="yes")  # type: ignore[arg-type]
    with cluster.hold(ResourceConfig.with_tpu("v4-16")) as session:
        with pytest.raises(TypeError, match="cannot be pickled"):
            session.submit(remember, __import__("threading").Lock())
        assert [r["calls"] for r in session.run(remember)] == [1, 1]  # the bad call never reached the hosts
    assert [i.status for i in cluster.list_jobs()] == [JobStatus.SUCCEEDED]


def test_hold_returns_with_the_slices_held_or_raises(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, {"v4-16": 1})
    try:
        with pytest.raises(JobFailedError, match="unschedulable") as e:
            c.hold(V4)  # two slices of a fleet of one: can never fit
        assert e.value.info.status is JobStatus.FAILED
        with c.hold(ResourceConfig.with_tpu("v4-16")) as session:
            assert session.slices == ["v4-16-0"]  # held as soon as hold() returns
        assert c.poll(session.job_id).status is JobStatus.SUCCEEDED  # closed idle: the workers exited cleanly
        assert c.fleet.model.describe("v4-16").startswith("1 free")
    finally:
        c.close()


def test_process_exit_closes_the_session(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys
    import textwrap

    jobs = tmp_path / "jobs"
    script = textwrap.dedent(f"""
        import json, os
        from fray_core import ResourceConfig
        from fray_local import LocalCluster, TpuFleet
        from fray_local.testing import TEST_POLICY

        c = LocalCluster(fleet=TpuFleet({{"v4-16": 1}}), jobs_dir={str(jobs)!r}, retry_policy=TEST_POLICY)
        s = c.hold(ResourceConfig.with_tpu("v4-16"))
        print(json.dumps({{"job": s.job_id, "pids": s.run(os.getpid)}}), flush=True)
        # no close(): the interpreter's exit closes the session
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert LocalCluster(jobs_dir=str(jobs)).poll(out["job"]).status is JobStatus.SUCCEEDED
    assert not any(pid_alive(p) for p in out["pids"])


def test_tcp_transport(cluster: LocalCluster) -> None:
    """The transport for hosts on other machines (Ray), exercised with local hosts."""
    cluster.session_transport = "tcp"
    with cluster.hold(V4) as session:
        assert session._core.family == "AF_INET"
        first, second = session.run(remember), session.run(remember)
    assert [r["pid"] for r in first] == [r["pid"] for r in second] and [r["calls"] for r in second] == [2] * 4
    assert cluster.poll(session.job_id).status is JobStatus.SUCCEEDED


def test_strangers_on_the_socket_do_not_disturb_the_session(cluster: LocalCluster) -> None:
    """Over TCP anyone can connect: a peer without the key is refused, a silent one holds up only itself."""
    import socket
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    cluster.session_transport = "tcp"
    with cluster.hold(V4, max_retries_preemption=1) as session:
        address = session._core.address
        silent = socket.create_connection(address)  # connects, never authenticates
        with pytest.raises((AuthenticationError, EOFError, ConnectionError)):
            Client(address, family="AF_INET", authkey=b"not the session's key")
        cluster.fleet.model.preempt("v4-16-0", restore_after=None)  # the new workers must get through meanwhile
        out = session.run(remember)
        silent.close()
    assert {r["FRAY_ATTEMPT"] for r in out} == {"1"}
    assert [r["TPU_NAME"] for r in out] == ["v4-16-1", "v4-16-1", "v4-16-2", "v4-16-2"]


def test_a_backend_without_sessions_says_so(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, {"v4-16": 1})
    c.session_transport = None
    with pytest.raises(NotImplementedError, match="LocalCluster does not support held sessions"):
        c.hold(V4)
    c.close()


def step(i: int) -> tuple[int, str, str]:
    import time

    time.sleep(0.02)  # simulated work, so the plan's faults land during calls as well as between them
    return i, os.environ["FRAY_ATTEMPT"], os.environ["TPU_NAME"]


@pytest.mark.parametrize("seed", [int(os.environ.get("FRAY_TEST_SEED", "0")) or s for s in (11, 29, 4242)])
def test_session_calls_survive_seeded_random_preemptions(tmp_path: Path, seed: int) -> None:
    print(f"chaos seed={seed} (rerun with FRAY_TEST_SEED={seed})")
    c = make_cluster(tmp_path, {"v4-16": 2})
    plan = c.fleet.model.chaos(seed=seed, rate=0.5, attempts=3, max_slices=2, horizon=1.0)
    budget = 3  # only attempts 0-2 have faults: the session must never run out
    try:
        with c.hold(V4, max_retries_preemption=budget) as session:
            for i in range(30):
                out = session.run(step, i)
                assert [o[0] for o in out] == [i] * 4
                assert len({o[1] for o in out}) == 1  # every host answered from the same attempt
                names = [o[2] for o in out]
                assert names[0] == names[1] and names[2] == names[3] and names[0] != names[2]
        info = c.poll(session.job_id)
        print(f"preemptions: {info.preemptions}; plan: {plan}")
        assert info.status is JobStatus.SUCCEEDED and info.preemptions <= budget, (plan, info)
        assert all(a.outcome is AttemptOutcome.PREEMPTED for a in info.attempts[:-1])
    finally:
        c.close()


def test_fray_list_status_and_stop_see_the_session(cluster: LocalCluster) -> None:
    import json
    import shutil
    import subprocess
    import sys

    script = Path(sys.executable).with_name("fray")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fray_core.cli"]
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLUSTER_SPEC"}
    env["FRAY_JOBS_DIR"] = str(cluster.store.root)

    def fray(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=120)

    assert shutil.which(command[0]) or Path(command[0]).exists()
    with cluster.hold(V4, name="held") as session:
        pids = session_pids(session.run(remember))
        session.run(remember)
        listed = fray("list")
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split()[:6] == ["ID", "NAME", "KIND", "STATUS", "ATTEMPTS", "CALLS"]
        assert row.split()[:6] == [session.job_id, "held", "session", "RUNNING", "1", "2"]
        status = fray("status", session.job_id, "--json")
        assert status.returncode == 0, status.stderr
        record = json.loads(status.stdout)
        assert record["status"] == "RUNNING" and record["request"]["kind"] == "session"
        assert record["kind"] == "session" and record["calls"] == 2 and len(record["attempts"]) == 1
        text = fray("status", session.job_id)
        assert "session (held slices), 2 call(s) so far" in text.stdout, text.stderr
        assert cluster.poll(session.job_id).calls == 2 and cluster.list_jobs()[0].kind == "session"
        stopped = fray("stop", session.job_id)  # another process: asks this one to stop through the store
        assert stopped.returncode == 0, stopped.stderr
        with pytest.raises(JobFailedError, match="STOPPED"):
            session.run(remember)
    assert not any(pid_alive(p) for p in pids)


def test_hold_timeout_stops_a_session_that_cannot_start(tmp_path: Path) -> None:
    from fray_core import WaitTimeoutError

    c = make_cluster(tmp_path, {"v4-16": 1})
    try:
        with c.hold(ResourceConfig.with_tpu("v4-16")) as busy:  # the only slice is held
            with pytest.raises(WaitTimeoutError, match="not ready after 0.5s") as e:
                c.hold(ResourceConfig.with_tpu("v4-16"), timeout=0.5)
            assert "waiting for" in str(e.value)
            (waiting,) = [i for i in c.list_jobs() if i.job_id != busy.job_id]
            assert waiting.status is JobStatus.STOPPED
            assert busy.slices == ["v4-16-0"]
        with pytest.raises(ValueError, match="timeout"):
            c.hold(V4, timeout=0)
    finally:
        c.close()


def test_a_bad_call_count_file_affects_only_its_session(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, {"v4-16": 1})
    try:
        with c.hold(ResourceConfig.with_tpu("v4-16")) as session:
            session.run(tpu_name)
        job_id = c.wait(
            c.launch(
                JobRequest(
                    name="plain", entrypoint=Entrypoint(callable=tpu_name), resources=ResourceConfig.with_tpu("v4-16")
                )
            ),
            timeout=60,
        ).job_id
        assert LocalCluster(jobs_dir=str(c.store.root)).poll(session.job_id).calls == 1
        (Path(c.store.root) / session.job_id / "calls.json").write_text('{"calls": "many"}')
        with pytest.warns(UserWarning, match="calls.json is not a call count"):
            listed = {i.job_id: i for i in LocalCluster(jobs_dir=str(c.store.root)).list_jobs()}
        assert listed[session.job_id].status is JobStatus.UNKNOWN and listed[job_id].status is JobStatus.SUCCEEDED
    finally:
        c.close()
