"""A slice lost at any instant of an attempt's lifecycle ends in a retried attempt on Ray, never a hang.

Runs on the session's emulated Ray cluster (conftest.py: head + 2 x v4-16). Every case draws its job
(1 or 2 slices, a short or long host function) and the instant of the slice removal from a seeded RNG;
the seed is printed (``FRAY_CHAOS_SEED=... pytest ...`` replays a failure). ``FRAY_CHAOS_CASES`` sets the
cases per phase (default 2; bench/ray_chaos_soak.py runs many more)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from helpers import wait_for, write_whole

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import Entrypoint, JobInfo, JobRequest, JobStatus, ResourceConfig  # noqa: E402
from fray_core.tpu import get_tpu_spec  # noqa: E402

TPU = "v4-16"
SEED = int(os.environ.get("FRAY_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
CASES = int(os.environ.get("FRAY_CHAOS_CASES") or 2)
JOB_BOUND = 150.0  # seconds: every job ends within this, whatever was removed when
CLEAN_BOUND = 30.0  # seconds for Ray to drop a finished job's placement groups and supervisor
SHORT, LONG = 0.3, 3.0
PHASES = ["reserving", "before_start", "starting", "running", "cancelling", "terminate"]


def chaos_host(seconds: float, fail_marker: str | None = None) -> str:
    """Sleeps ``seconds``; with ``fail_marker``, host 0 of slice 0 fails attempt 0 (the user's failure)."""
    first = (os.environ["FRAY_ATTEMPT"], os.environ["FRAY_SLICE_ID"], os.environ["FRAY_HOST_ID"]) == ("0", "0", "0")
    if fail_marker and first:
        time.sleep(0.5)
        write_whole(fail_marker, os.environ["TPU_NAME"])
        raise RuntimeError("the user's code failed")
    time.sleep(seconds)
    return os.environ["TPU_NAME"]


def chaos_request(slices: int, seconds: float, fail_marker: str | None = None) -> JobRequest:
    return JobRequest(
        name="chaos",
        entrypoint=Entrypoint(callable=chaos_host, function_args={"seconds": seconds, "fail_marker": fail_marker}),
        resources=ResourceConfig.with_tpu(TPU, slice_count=slices),
        max_retries_preemption=4,
        max_retries_failure=1 if fail_marker else 0,
    )


@attrs.define
class Case:
    phase: str
    index: int
    slices: int
    seconds: float
    delay: float

    def __str__(self) -> str:
        return (
            f"seed {SEED} phase {self.phase} case {self.index}: {self.slices} slice(s), host {self.seconds}s, "
            f"removal +{self.delay:.2f}s"
        )


def leftovers(job_id: str, record: dict[str, Any]) -> list[str]:
    """The job's placement groups not REMOVED (Ray's GCS state), and its supervisor if it still runs the job
    (a supervisor process is shared by a client's jobs: it stays for the next one, without this one)."""
    from ray.util import placement_group_table

    out = [
        f"placement group {pg['name']} {pg['state']}"
        for pg in placement_group_table().values()
        if pg["name"].startswith(f"fray-{job_id}-") and pg["state"] != "REMOVED"
    ]
    owner = record.get("owner") or {}
    try:
        actor = ray.get_actor(owner["ray_actor"], namespace=owner.get("namespace", "fray"))
    except (KeyError, ValueError):
        return out  # gone
    try:
        if job_id in ray.get(actor.ping.remote(), timeout=10):
            out.append(f"supervisor {owner['ray_actor']} still runs it")
    except ray.exceptions.RayActorError:
        pass  # it exited meanwhile
    except ray.exceptions.GetTimeoutError:
        out.append(f"supervisor {owner['ray_actor']} not answering")
    return out


def first_slices(cluster: Any, job_id: str) -> list[str]:
    def shown() -> list[str] | None:
        info = cluster.poll(job_id)
        if info.status.is_terminal():
            return ["<ended>"]
        return info.attempts[0].slices if info.attempts and info.attempts[0].slices else None

    return wait_for(shown, timeout=120, interval=0.01, what="the job's first slices")


def run_case(fake: Any, case: Case, rng: random.Random, tmp: Path) -> JobInfo:
    print(case, flush=True)
    fake.wait_settled()  # each case starts from two live slices that Ray counts right
    wait_for(lambda: len(fake.slices().get(TPU, [])) == 2, timeout=120, what="both slices")
    cluster = fake.cluster
    fail_marker = str(tmp / f"failed-{case.phase}-{case.index}") if case.phase == "cancelling" else None
    job_id = cluster.launch(chaos_request(case.slices, case.seconds, fail_marker))
    stopper: threading.Thread | None = None
    victim: str | None = None
    if case.phase == "reserving":
        time.sleep(case.delay)
        victim = rng.choice(fake.slices()[TPU])
    else:
        held = first_slices(cluster, job_id)
        if case.phase == "before_start":
            victim = rng.choice(held)
        elif case.phase == "starting":
            time.sleep(case.delay)
            victim = rng.choice(held)
        elif case.phase == "running":
            wait_for(
                lambda: (i := cluster.poll(job_id)).status.is_terminal() or i.attempts[0].hosts_started_at,
                timeout=120,
                interval=0.01,
                what="hosts up",
            )
            time.sleep(case.delay)
            victim = rng.choice(held)
        elif case.phase == "cancelling":  # slice 0 host 0 fails; remove the other slice while its hosts are cancelled
            wait_for(lambda: os.path.exists(fail_marker), timeout=120, interval=0.01, what="the failing host")  # type: ignore[arg-type]
            time.sleep(case.delay)
            victim = held[1]
        elif case.phase == "terminate":
            time.sleep(case.delay)
            stopper = threading.Thread(target=cluster.terminate, args=(job_id,))
            stopper.start()
            time.sleep(rng.uniform(0.0, 0.3))
            victim = rng.choice(held)
    if victim in fake.slices().get(TPU, []):
        print(f"  removing {victim}", flush=True)
        fake.preempt(victim, restore_after=0.0)
    info = cluster.wait(job_id, timeout=JOB_BOUND)
    if stopper is not None:
        stopper.join(60)
        assert not stopper.is_alive(), f"{case}: terminate did not return"
    print(
        f"  -> {info.status.value}, attempts {[(a.outcome.value if a.outcome else None) for a in info.attempts]}",
        flush=True,
    )
    record = cluster.store.read(job_id)
    wait_for(
        lambda: not leftovers(job_id, record),
        timeout=CLEAN_BOUND,
        what=f"{case}: no placement group or actor of the job left ({leftovers(job_id, record)})",
    )
    assert all(a.outcome is not None and a.ended_at is not None for a in info.attempts), f"{case}: {info.attempts}"
    return info


@pytest.mark.parametrize("phase", PHASES)
def test_a_slice_removed_at_a_random_instant_of_the_phase_costs_one_retry(
    ray_tpu_cluster: Any, tmp_path: Path, phase: str
) -> None:
    rng = random.Random(f"{SEED}-{phase}")
    print(f"chaos seed {SEED} (replay: FRAY_CHAOS_SEED={SEED})")
    for i in range(CASES):
        slices = 2 if phase == "cancelling" else rng.choice([1, 2])
        seconds = LONG if phase in ("cancelling", "terminate") else rng.choice([SHORT, LONG])
        delay = {
            "reserving": rng.uniform(0.0, 0.4),
            "before_start": 0.0,
            "starting": rng.uniform(0.0, 1.0),
            "running": rng.uniform(0.0, seconds),
            "cancelling": rng.uniform(0.0, 0.3),
            "terminate": rng.uniform(0.0, 1.5),
        }[phase]
        case = Case(phase, i, slices, seconds, delay)
        info = run_case(ray_tpu_cluster, case, rng, tmp_path)
        outcomes = [a.outcome.value for a in info.attempts if a.outcome]
        if phase == "terminate":
            assert info.status in (JobStatus.STOPPED, JobStatus.SUCCEEDED), f"{case}: {info.status} {info.error}"
            assert info.failures == 0, f"{case}: {outcomes} {info.attempts[0].cause}"
            continue
        assert info.status == JobStatus.SUCCEEDED, f"{case}: {info.status} {info.error} {outcomes}"
        assert outcomes[-1] == "SUCCEEDED" and info.preemptions + info.failures == len(outcomes) - 1, (
            f"{case}: {outcomes}"
        )
        if phase == "cancelling":  # the user's failure of attempt 0, or the loss during its cancel
            assert outcomes[0] in ("FAILED", "PREEMPTED") and info.failures <= 1, f"{case}: {outcomes}"
        else:
            assert info.failures == 0, (
                f"{case}: a lost slice was counted as a failure: {outcomes} {info.attempts[0].cause}"
            )
        assert len(info.result) == 2 * len(info.attempts[-1].slices)


def marked_host(marks: str, seconds: float) -> str:
    """Says its pid when it starts and again when it ends; sleeps ``seconds`` in between."""
    me = f"{os.environ['FRAY_JOB_ID']}-{os.environ.get('FRAY_SLICE_ID', 'r')}-{os.environ['FRAY_HOST_ID']}"
    write_whole(Path(marks, f"start-{me}"), str(os.getpid()))
    time.sleep(seconds)
    write_whole(Path(marks, f"end-{me}"), str(os.getpid()))
    return me


def _live_owner(cluster: Any, job_id: str) -> tuple[dict[str, str], Any] | None:
    owner = cluster.store.read(job_id)["owner"]
    try:
        return owner, ray.get_actor(owner["ray_actor"], namespace=owner["namespace"])
    except ValueError:
        return None  # gone (killed in an earlier case): the launch hands the job to a new one


def _pid_of(actor: Any, out: list[int]) -> None:
    try:
        out.append(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))
    except Exception:  # noqa: BLE001 - killed before it answered: the test kills it through Ray
        pass


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_supervisor_killed_at_a_random_instant_ends_its_job_with_the_truth_never_a_hang(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    """The supervisor process of a job (a warm standby the launch hands the job to) dies at an instant drawn
    over the job's whole life: the hand-over in flight, the slice being reserved or the task queued, the hosts
    starting, running or ending. Whatever the instant: the job ends within the bound, SUCCEEDED (its answer
    came, or a new supervisor took the job) or FAILED saying its supervisor is gone; never the user's failure;
    no host it started outlives it; the slices come back."""
    from fray_ray import RayCluster
    from fray_ray.testing import FAST_RAY_POLICY

    rng = random.Random(f"{SEED}-supervisor")
    print(f"chaos seed {SEED} (replay: FRAY_CHAOS_SEED={SEED})")
    ray_tpu_cluster.wait_settled()
    cluster = RayCluster(address=ray_tpu_cluster.address, retry_policy=FAST_RAY_POLICY)
    try:
        for i in range(CASES):
            wait_for(lambda: len(ray_tpu_cluster.slices().get(TPU, [])) == 2, timeout=120, what="both slices")
            tpu = rng.random() < 0.5
            seconds, delay = rng.choice([SHORT, LONG]), rng.uniform(0.0, 4.0)
            kind = "v4-16 slice" if tpu else "one CPU replica"
            print(f"seed {SEED} case {i}: {kind}, host {seconds}s, kill +{delay:.2f}s", flush=True)
            marks = tmp_path / f"case-{i}"
            marks.mkdir()
            entry = Entrypoint(callable=marked_host, function_args={"marks": str(marks), "seconds": seconds})
            resources = ResourceConfig.with_tpu(TPU) if tpu else ResourceConfig.with_cpu(cpu=1, ram="64m")
            t0 = time.monotonic()
            job_id = cluster.launch(
                JobRequest(name="sup-chaos", entrypoint=entry, resources=resources, max_retries_failure=0)
            )
            # the supervisor the record names (a standby killed in an earlier case is replaced by a new one,
            # which the record then names)
            owner, handle = wait_for(lambda j=job_id: _live_owner(cluster, j), timeout=60, what="its supervisor")
            pid: list[int] = []
            threading.Thread(target=_pid_of, args=(handle, pid), daemon=True).start()
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            if pid:
                print(f"  kill -9 {pid[0]} ({owner['ray_actor']})", flush=True)
                os.kill(pid[0], signal.SIGKILL)
            else:  # not up yet: killed through Ray (as its node's death would)
                print(f"  ray.kill({owner['ray_actor']}) before it answered", flush=True)
                ray.kill(handle, no_restart=True)
            info = cluster.wait(job_id, timeout=JOB_BOUND)
            outcomes = [a.outcome.value if a.outcome else None for a in info.attempts]
            print(f"  -> {info.status.value} {outcomes} {(info.error or '')[:160]!r}", flush=True)
            assert info.status in (JobStatus.SUCCEEDED, JobStatus.FAILED), (info.status, info.error)
            if info.status is JobStatus.FAILED:
                assert "supervisor" in (info.error or ""), info.error
            assert info.failures == 0 and "FAILED" not in outcomes, (outcomes, info.error)
            # every attempt ended, and the record on the cluster says so too (not RUNNING for good)
            assert all(a.outcome is not None and a.ended_at is not None for a in info.attempts), info.attempts
            assert cluster.store.read_info(job_id)[0].status is info.status
            for start in marks.glob("start-*"):  # a host that did not end by itself dies with its job
                if not (marks / start.name.replace("start-", "end-")).exists():
                    host = int(start.read_text())
                    wait_for(lambda p=host: not _pid_alive(p), timeout=60, what=f"host {start.name} ({host}) gone")
            record = cluster.store.read(job_id)
            wait_for(lambda j=job_id, r=record: not leftovers(j, r), timeout=CLEAN_BOUND, what="no group or actor left")
    finally:
        cluster.close()


def test_after_the_chaos_a_two_slice_job_runs_and_all_capacity_is_back(ray_tpu_cluster: Any) -> None:
    ray_tpu_cluster.wait_settled()
    wait_for(lambda: len(ray_tpu_cluster.slices().get(TPU, [])) == 2, timeout=120, what="both slices")
    cluster = ray_tpu_cluster.cluster
    info = cluster.wait(cluster.launch(chaos_request(2, SHORT)), timeout=JOB_BOUND)
    assert info.status == JobStatus.SUCCEEDED and len(info.attempts) == 1, (
        info.error,
        [a.cause for a in info.attempts],
    )
    head = get_tpu_spec(TPU).head_resource
    wait_for(lambda: ray.available_resources().get(head, 0) == 2, timeout=CLEAN_BOUND, what="both slices free again")


# ------------------------------------------------------------------ levanter scenarios, as a user writes them


def _preempt_when_shown(
    fake: Any, job_id: str, attempt: int, pick: Callable[[list[str]], str] = lambda s: s[0]
) -> None:
    """Remove a slice of ``attempt`` the moment ``poll()`` first names it (no waiting for hosts)."""
    cluster = fake.cluster
    slices = wait_for(
        lambda: (a := cluster.poll(job_id).attempts) and len(a) > attempt and a[attempt].slices,
        timeout=120,
        interval=0.01,
        what=f"attempt {attempt}'s slices",
    )
    victim = pick(slices)
    # a restored slice can be reserved a moment before the fake's restore thread has registered it
    wait_for(
        lambda: victim in fake.slices().get(TPU, []),
        timeout=60,
        interval=0.01,
        what=f"{victim} known to the fake cluster",
    )
    fake.preempt(victim, restore_after=0.0)


def test_a_slice_lost_as_soon_as_poll_shows_it_is_retried_not_a_hang(ray_tpu_cluster: Any) -> None:
    ray_tpu_cluster.wait_settled()
    cluster = ray_tpu_cluster.cluster
    job_id = cluster.launch(chaos_request(1, 6.0))
    _preempt_when_shown(ray_tpu_cluster, job_id, 0)
    info = cluster.wait(job_id, timeout=JOB_BOUND)
    assert info.status == JobStatus.SUCCEEDED, (info.error, info.progress)
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"] and info.failures == 0
    assert info.attempts[0].hosts_started_at is None and info.attempts[1].hosts_started_at is not None
    assert "SliceLost" in info.attempts[0].cause or "Died" in info.attempts[0].cause, info.attempts[0].cause


def test_multislice_preemption_is_retried_on_a_restored_slice_preempted_as_shown(ray_tpu_cluster: Any) -> None:
    ray_tpu_cluster.wait_settled()
    wait_for(lambda: len(ray_tpu_cluster.slices().get(TPU, [])) == 2, timeout=120, what="both slices")
    cluster = ray_tpu_cluster.cluster
    job_id = cluster.launch(chaos_request(2, LONG))
    _preempt_when_shown(ray_tpu_cluster, job_id, 0, pick=lambda s: s[1])
    info = cluster.wait(job_id, timeout=JOB_BOUND)
    assert info.status == JobStatus.SUCCEEDED, info.error
    assert info.preemptions >= 1 and info.failures == 0 and info.attempts[0].outcome.value == "PREEMPTED"
    assert len(info.result) == 4


def test_preemption_budget_exhausted_preempted_as_shown(ray_tpu_cluster: Any) -> None:
    ray_tpu_cluster.wait_settled()
    cluster = ray_tpu_cluster.cluster
    job_id = cluster.launch(attrs.evolve(chaos_request(1, LONG), max_retries_preemption=1))
    for attempt in range(2):
        _preempt_when_shown(ray_tpu_cluster, job_id, attempt)
    info = cluster.wait(job_id, timeout=JOB_BOUND)
    assert info.status == JobStatus.FAILED and info.preemptions == 2 and info.failures == 0
    assert "preempted 2 time(s), max_retries_preemption=1" in info.error
