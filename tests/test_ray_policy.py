"""Scheduling policy on Ray (the session's emulated cluster, conftest.py: 2 x v4-16): one fair queue for
every job of the cluster, whichever client launched it (``fray_ray.scheduler``, the policy of
``fray_core.scheduling``), bad-host quarantine keyed by the host's node (not by a reusable slice name),
and a job that ends leaving the queue at once. Jobs that hold slices wait for a gate file the test creates."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import wait_for

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig  # noqa: E402
from fray_core.errors import Unschedulable  # noqa: E402
from fray_core.types import AttemptOutcome  # noqa: E402
from fray_ray import RayCluster  # noqa: E402
from fray_ray.scheduler import SCHEDULER_NAME  # noqa: E402
from fray_ray.testing import FAST_RAY_POLICY  # noqa: E402

TPU = "v4-16"
WAIT = 180.0


def hold(gate: str) -> str:
    """Hold the slice until the test creates ``gate``."""
    while not os.path.exists(gate):
        time.sleep(0.05)
    return os.environ["TPU_NAME"]


def slice_name() -> str:
    return os.environ["TPU_NAME"]


def request(name: str, fn: Any = slice_name, slices: int = 1, budget: int = 0, **kw: Any) -> JobRequest:
    return JobRequest(
        name=name,
        entrypoint=Entrypoint(callable=fn, function_args=kw),
        resources=ResourceConfig.with_tpu(TPU, slice_count=slices),
        max_retries_preemption=budget,
    )


def client(fake: Any, **kw: Any) -> RayCluster:
    return RayCluster(
        address=fake.address, retry_policy=kw.pop("retry_policy", FAST_RAY_POLICY), warm_supervisor=False, **kw
    )


def reason_of(cluster: RayCluster, job_id: str, pattern: str, fresh: bool = True) -> str:
    """Wait until the job's pending reason matches ``pattern``; meanwhile it must not end, nor (``fresh``)
    record any attempt."""

    seen: list[str | None] = []  # every distinct reason, for the message when none matches

    def check() -> str | None:
        info = cluster.poll(job_id)
        assert not info.status.is_terminal() and not (fresh and info.attempts), (info.status, info.attempts, info.error)
        r = info.pending_reason
        if not seen or seen[-1] != r:
            seen.append(r)
        return r if r and re.fullmatch(pattern, r) else None

    try:
        return wait_for(check, timeout=WAIT, what=f"{job_id}'s pending reason to match {pattern!r}", interval=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}; its reasons meanwhile: {seen}") from None


def running(cluster: RayCluster, job_id: str) -> list[str]:
    """Wait until the job runs; the slices it runs on."""
    info = wait_for(
        lambda: (i := cluster.poll(job_id)).status is JobStatus.RUNNING and i, timeout=WAIT, what=f"{job_id} to run"
    )
    return info.attempts[-1].slices


def blockers(fake: Any, tmp_path: Path, n: int = 2) -> list[tuple[str, Path]]:
    """``n`` one-slice jobs holding slices until their gate is created."""
    out = []
    for i in range(n):
        gate = tmp_path / f"gate-{i}"
        job = fake.cluster.launch(request(f"block-{'ab'[i]}", hold, gate=str(gate)))
        out.append((job, gate))
    for job, _ in out:
        running(fake.cluster, job)
    return out


def test_a_big_job_is_served_before_younger_small_ones_from_another_client_and_waiting_spends_no_budget(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    (b1, gate1), (b2, gate2) = blockers(fake, tmp_path)
    # a schedule_timeout of 0: one acquire round that counted as missing capacity would make an
    # UNSCHEDULABLE attempt, and with no preemption budget fail the job
    first = client(fake, retry_policy=attrs.evolve(FAST_RAY_POLICY, schedule_timeout=0.0))
    second = client(fake)
    # the second client's clock is an hour behind: the line follows when jobs reached the cluster (its own
    # clock), not the clients' clocks (which would put the younger jobs first)
    second.wall = lambda: time.time() - 3600
    big_gate = tmp_path / "big"
    big = first.launch(request("big", hold, slices=2, budget=0, gate=str(big_gate)))
    reason_of(first, big, r"queued: 1st for 2 x v4-16; cluster: 0 free, 2 held by (block-a, block-b|block-b, block-a)")
    small = [second.launch(request(f"small-{i}")) for i in range(2)]
    reason_of(second, small[0], r"queued: 2nd for 1 x v4-16; cluster: 0 free, 2 held by .*")
    reason_of(second, small[1], r"queued: 3rd for 1 x v4-16; cluster: 0 free, 2 held by .*")

    gate1.touch()
    assert fake.cluster.wait(b1, timeout=WAIT).status is JobStatus.SUCCEEDED
    # the freed slice is kept for the older 2-slice job: the younger 1-slice jobs do not take it
    reason_of(first, big, r"queued: 1st for 2 x v4-16; cluster: 1 free, 1 held by block-b")
    reason_of(second, small[0], r"queued: 2nd for 1 x v4-16; cluster: 1 free, 1 held by block-b")

    gate2.touch()
    assert len(running(first, big)) == 2  # both slices: neither small job got one before it
    for job in small:
        assert second.poll(job).status is JobStatus.PENDING
    big_gate.touch()
    info = first.wait(big, timeout=WAIT)
    assert info.status is JobStatus.SUCCEEDED, info.error
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.SUCCEEDED] and info.preemptions == 0
    for job in small:
        done = second.wait(job, timeout=WAIT)
        assert done.status is JobStatus.SUCCEEDED, done.error
        assert done.attempts[0].acquired_at > info.attempts[0].acquired_at
    assert fake.cluster.wait(b2, timeout=WAIT).status is JobStatus.SUCCEEDED


def test_a_terminated_queued_job_leaves_the_queue_at_once(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    # entries live an hour without renewal: only leaving at job end lets the next job through
    patient = client(fake, queue_ttl=3600.0)
    (b1, gate1), (b2, gate2) = blockers(fake, tmp_path)
    big = patient.launch(request("big", slices=2))
    reason_of(patient, big, r"queued: 1st for 2 x v4-16; .*")
    small = patient.launch(request("small"))
    reason_of(patient, small, r"queued: 2nd for 1 x v4-16; .*")
    patient.terminate(big)
    assert patient.poll(big).status is JobStatus.STOPPED
    gate1.touch()  # one slice free: the small job, now first in line, takes it
    info = patient.wait(small, timeout=WAIT)
    assert info.status is JobStatus.SUCCEEDED, info.error
    gate2.touch()
    for job in (b1, b2):
        assert fake.cluster.wait(job, timeout=WAIT).status is JobStatus.SUCCEEDED


SLOW_MOD = """
import os, time
if os.environ.get("FRAY_TEST_CLIENT") != "1":  # on the cluster (its supervisor): a module as slow as jax to import
    time.sleep(4)
def hold(gate):
    while not os.path.exists(gate):
        time.sleep(0.05)
    return os.environ["TPU_NAME"]
"""
FAST_MOD = """
import os
def slice_name():
    return os.environ["TPU_NAME"]
"""


def test_jobs_launched_back_to_back_take_their_places_in_line_in_launch_order_though_the_first_starts_slowly(
    ray_tpu_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs one client launched one after the other, for the same slices: the first one's module takes
    seconds to import in their supervisor, the second's none, so the second was ready to ask the scheduler
    first, found the slices free and took them (first come, first served lost: ArrivalOrder). It waits its
    turn, saying so, and queues behind the first."""
    import importlib
    import uuid

    fake = ray_tpu_cluster
    fake.wait_settled()
    tag = uuid.uuid4().hex[:8]  # modules of their own: a supervisor of an earlier run imported its own already
    code = tmp_path / "proj"
    code.mkdir()
    (code / f"slow_{tag}.py").write_text(SLOW_MOD)
    (code / f"fast_{tag}.py").write_text(FAST_MOD)
    monkeypatch.setenv("FRAY_TEST_CLIENT", "1")
    monkeypatch.syspath_prepend(str(code))
    slow, fast = importlib.import_module(f"slow_{tag}"), importlib.import_module(f"fast_{tag}")
    launcher = client(fake)
    gate = tmp_path / "gate"
    first = launcher.launch(request("slow-first", slow.hold, slices=2, gate=str(gate)))
    second = launcher.launch(request("quick-second", fast.slice_name, slices=2))
    assert launcher.store.read(first)["owner"] == launcher.store.read(second)["owner"]  # one supervisor process
    reason_of(launcher, second, rf"waiting for job {first} launched before it to take a place in the cluster's .*")
    reason_of(launcher, second, r"queued: 1st for 2 x v4-16; cluster: 0 free, 2 held by slow-first")
    assert len(running(launcher, first)) == 2
    gate.touch()
    done = {job: launcher.wait(job, timeout=WAIT) for job in (first, second)}
    assert all(i.status is JobStatus.SUCCEEDED for i in done.values()), {j: i.error for j, i in done.items()}
    assert done[second].attempts[0].acquired_at > done[first].attempts[0].acquired_at


def test_a_host_with_a_busy_device_twice_is_quarantined_and_the_job_finishes_on_the_healthy_slice(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    fake = ray_tpu_cluster
    fake.wait_settled()
    namespace = "fray-test-quarantine"  # its own scheduler (and quarantine), removed at the end
    try:
        [(blocker, gate)] = blockers(fake, tmp_path, n=1)
        [healthy] = fake.cluster.poll(blocker).attempts[0].slices
        [bad] = [s for s in fake.slices()[TPU] if s != healthy]
        quarantining = client(fake, namespace=namespace)
        with open(fake.lockfile(bad, 1), "w"):  # this process holds host 1's device: busy
            job = quarantining.launch(request("on-bad", budget=5))
            reason = reason_of(
                quarantining,
                job,
                rf"queued: 1st for 1 x v4-16; cluster: 0 free, 1 held by block-a; quarantined: {bad} "
                rf"\(device busy twice in \d+ s\)",
                fresh=False,
            )
            scheduler = ray.get_actor(SCHEDULER_NAME, namespace=namespace)
            assert ray.get(scheduler.state.remote())["quarantined"] == {bad: reason.split("; ")[-1]}
        gate.touch()
        info = quarantining.wait(job, timeout=WAIT)
        assert info.status is JobStatus.SUCCEEDED, info.error
        assert info.result == [healthy, healthy]
        lost = info.attempts[:-1]
        assert [a.outcome for a in lost] == [AttemptOutcome.PREEMPTED] * 2 and all(a.slices == [bad] for a in lost)
        assert all(f"TpuBusyError: TPU device busy on {bad} host 1" in a.cause for a in lost), [a.cause for a in lost]
        assert info.attempts[-1].slices == [healthy]
        assert fake.cluster.wait(blocker, timeout=WAIT).status is JobStatus.SUCCEEDED
        # KubeRay restarts a pod with the same TPU_NAME: the name comes back on new hardware, which is not
        # quarantined (the quarantine follows the nodes that failed)
        fake.preempt(bad, restore_after=None)
        fake.add_slice(TPU, name=bad, tries=3)
        fake.wait_settled()
        again = quarantining.wait(quarantining.launch(request("on-new-hardware", slices=2)), timeout=WAIT)  # needs both
        assert again.status is JobStatus.SUCCEEDED and sorted(again.result) == sorted([bad, bad, healthy, healthy]), (
            again.error,
            again.result,
        )
    finally:
        try:
            ray.kill(ray.get_actor(SCHEDULER_NAME, namespace=namespace))
        except ValueError:
            pass  # never created


def test_a_queued_job_goes_on_when_the_scheduler_actor_dies(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    """The actor's state is lost with it; its users create a fresh one and no job fails."""
    fake = ray_tpu_cluster
    fake.wait_settled()
    (b1, gate1), (b2, gate2) = blockers(fake, tmp_path)
    waiting = fake.cluster.launch(request("waiting"))
    reason_of(fake.cluster, waiting, r"queued: 1st for 1 x v4-16; .*")
    old = ray.get_actor(SCHEDULER_NAME, namespace=fake.cluster.namespace)
    ray.kill(old, no_restart=True)
    gate1.touch()
    info = fake.cluster.wait(waiting, timeout=WAIT)
    assert info.status is JobStatus.SUCCEEDED and [a.outcome for a in info.attempts] == [AttemptOutcome.SUCCEEDED], (
        info.error
    )
    new = ray.get_actor(SCHEDULER_NAME, namespace=fake.cluster.namespace)
    assert new._actor_id != old._actor_id
    gate2.touch()
    for job in (b1, b2):
        assert fake.cluster.wait(job, timeout=WAIT).status is JobStatus.SUCCEEDED


def test_a_slice_with_a_host_down_is_no_capacity(ray_tpu_cluster: Any) -> None:
    """A slice whose worker 0 is up but another host died is not a slice: a 1-slice job runs on the whole
    one, and a 2-slice job waits for capacity (not in line behind nobody), which its schedule_timeout
    bounds, instead of claiming the broken slice's head round after round."""
    fake = ray_tpu_cluster
    fake.wait_settled()
    broken, whole = fake.slices()[TPU]
    try:
        dead = fake.kill_host(broken, 1)
        wait_for(
            lambda: not any(n["NodeID"] == dead and n["Alive"] for n in ray.nodes()),
            timeout=WAIT,
            what="Ray to see the host dead",
        )
        one = fake.cluster.wait(fake.cluster.launch(request("one")), timeout=WAIT)
        assert one.status is JobStatus.SUCCEEDED and one.result == [whole, whole], (one.error, one.result)
        impatient = client(fake, retry_policy=attrs.evolve(FAST_RAY_POLICY, schedule_timeout=8.0))
        two = impatient.launch(request("two", slices=2))
        reason_of(impatient, two, rf"waiting for capacity: 1 of 2 x v4-16 exist \(1 with a host down: {broken}\)")
        info = impatient.wait(two, timeout=WAIT)
        assert info.status is JobStatus.FAILED and [a.outcome for a in info.attempts] == [
            AttemptOutcome.UNSCHEDULABLE
        ], info.error
        assert info.finished_at - info.submitted_at < 8.0 + 15.0  # the timeout, plus a round and the record
    finally:
        fake.wait_settled()  # replaces the broken slice
    assert len(fake.slices()[TPU]) == 2 and broken not in fake.slices()[TPU]


def test_cleanup_stops_what_a_test_left_behind_and_says_so(ray_tpu_cluster: Any, tmp_path: Path) -> None:
    """What the per-test fixture relies on: a job left holding a slice is stopped, its groups are gone, and
    the leftover is named (the fixture fails the test that left it); a clean cluster reports nothing."""
    fake = ray_tpu_cluster
    fake.wait_settled()
    job = fake.cluster.launch(request("left-behind", hold, gate=str(tmp_path / "never")))
    running(fake.cluster, job)
    assert fake.cleanup() == [f"job {job} was still RUNNING: terminated"]
    assert fake.cluster.poll(job).status is JobStatus.STOPPED
    assert fake.cleanup() == []


def test_the_scheduler_orders_jobs_by_submission_not_by_whose_supervisor_asks_first() -> None:
    """Each job's supervisor starts on its own, so a job submitted later can reach the queue first; its
    place in line still follows submission (the actor's body, called directly)."""
    import asyncio

    from fray_ray.scheduler import Scheduler

    scheduler = Scheduler()

    def ask(job: str, submitted: float) -> str:
        held = {"s0": "block-a", "s1": "block-b"}  # both slices held: everyone waits
        return asyncio.run(scheduler.acquire(job, TPU, TPU, [1], ["s0", "s1"], [], held, 30.0, (), submitted))["reason"]

    assert ask("younger", 2.0).startswith("queued: 1st ")
    assert ask("older", 1.0).startswith("queued: 1st ")  # asked second, submitted first
    assert ask("younger", 2.0).startswith("queued: 2nd ")


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(6)), st.permutations(range(6)))
def test_the_jobs_of_a_supervisor_ask_in_the_order_they_came_whatever_order_they_get_ready_in(
    came: list[int], ready: list[int]
) -> None:
    """``came``: each job's place in the process's line; ``ready``: the order their threads reach their first
    question. Each asks in its turn: the order it came."""
    import threading

    from fray_ray.scheduler import ArrivalOrder

    order = ArrivalOrder()
    for job in range(6):
        order.arrived(f"j{job}", float(came[job]))
    asked: list[int] = []

    def ask(job: int) -> None:
        assert order.wait_turn(f"j{job}", timeout=30.0) == []  # never waited out: every job asks
        asked.append(came[job])
        order.passed(f"j{job}")

    threads = [threading.Thread(target=ask, args=(job,)) for job in ready]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert asked == sorted(came)


def test_a_job_stuck_before_its_first_question_holds_up_the_jobs_behind_it_once() -> None:
    from fray_ray.scheduler import ArrivalOrder

    order = ArrivalOrder()
    for i, job in enumerate(["stuck", "a", "b"]):
        order.arrived(job, float(i))
    assert order.wait_turn("a", timeout=0.05) == ["stuck"] and order.wait_turn("b", timeout=0.0) == ["stuck", "a"]
    assert order.skip_ahead("a") == ["stuck"]  # "a" waited long enough: "stuck" lost its turn
    order.passed("a")
    assert order.ahead("b") == [] and order.wait_turn("b", timeout=0.0) == []  # not waited for again
    order.passed("stuck")  # it asks at last: nothing to undo
    order.arrived("c", 0.5)  # a job that came before the rest but reached the process late still goes first
    order.arrived("d", 9.0)
    assert order.ahead("d") == ["c", "b"]


def worker_identity() -> dict[str, str]:
    return {k: os.environ.get(k, "") for k in ("TPU_NAME", "TPU_WORKER_ID", "FRAY_HOST_ID", "TPU_TOPOLOGY")}


def test_a_slice_without_tpu_labels_is_found_from_its_resources_and_runs_the_job(ray_tpu_cluster: Any) -> None:
    """A TPU host as KubeRay without its webhook (or an older Ray) shows it: ``TPU``, ``accelerator_type``,
    the slice-name resource and ``TPU-<type>-head`` on worker 0, no ``ray.io/tpu-*`` label. The job runs on
    the whole slice, host 0 on worker 0, and each host keeps its node's own worker id."""
    fake = ray_tpu_cluster
    fake.wait_settled()
    bare = fake.add_slice("v5p-16", labels=False, tries=3)
    try:
        ours = [n for n in ray.nodes() if n["Alive"] and bare in n["Resources"]]
        assert len(ours) == 2 and all(not any(k.startswith("ray.io/tpu") for k in n.get("Labels") or {}) for n in ours)
        job = fake.cluster.launch(
            JobRequest(
                name="bare",
                entrypoint=Entrypoint(callable=worker_identity),
                resources=ResourceConfig.with_tpu("v5p-16"),
            )
        )
        info = fake.cluster.wait(job, timeout=WAIT)
        assert info.status is JobStatus.SUCCEEDED, info.error
        assert info.attempts[0].slices == [bare]
        assert [(r["TPU_NAME"], r["TPU_WORKER_ID"], r["FRAY_HOST_ID"]) for r in info.result] == [
            (bare, "0", "0"),
            (bare, "1", "1"),
        ]
    finally:
        fake.preempt(bare, restore_after=None)
        fake.wait_settled()


_FORK_PROBE: dict[str, Any] = {"fd": None}


def _note_fork_child() -> None:
    fd = _FORK_PROBE["fd"]
    if fd is not None:
        os.write(fd, b"x")


def test_a_new_slice_starts_its_processes_without_python_in_the_forked_child(ray_tpu_cluster: Any) -> None:
    """This process has many threads, so Python run between fork and exec (at-fork hooks, a ``preexec_fn``)
    can crash the child before its raylet starts (a07d3eb's CI: filelock's after-fork hook segfaulted one);
    fray's emulation spawns without any, and the slice still comes up."""
    fake = ray_tpu_cluster
    fake.wait_settled()
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.register_at_fork(after_in_child=_note_fork_child)  # for good: the probe is off outside this test
    _FORK_PROBE["fd"] = write
    try:
        name = fake.add_slice("v4-8", tries=3)
    finally:
        _FORK_PROBE["fd"] = None
    try:
        try:
            ran = os.read(read, 4096)
        except BlockingIOError:
            ran = b""
        assert ran == b"", f"{len(ran)} forked children ran Python at-fork hooks"
    finally:
        os.close(read)
        os.close(write)
        fake.preempt(name, restore_after=None)
        fake.wait_settled()


def test_a_queued_job_whose_scheduler_is_behind_says_so_and_takes_no_free_slice() -> None:
    """Free slices and a scheduler that has not answered yet: the job waits, held (no budget spent), with the
    reason in its pending_reason; it never falls back to capacity-only admission (first come, first served
    would be lost without a word)."""
    from fray_ray._host import HostConfig
    from fray_ray.provider import RaySliceProvider
    from fray_ray.scheduler import SchedulerBehind, SchedulerClient

    class Behind(SchedulerClient):
        def ask(self, method: str, *args: Any, timeout: float, **kw: Any) -> Any:
            return SchedulerBehind(42.0)

        def call(self, method: str, *args: Any, timeout: float = 0.0) -> Any:
            return None  # what a scheduler that does not answer looks like to the plain call

    provider = RaySliceProvider("queued-1", HostConfig((), "/", supervisor=None), scheduler=Behind("fray"))
    got = provider._admit(TPU, TPU, [1], {}, time.monotonic() + 0.1)
    assert isinstance(got, Unschedulable), f"admitted on capacity alone: {got}"
    assert got.held and "no answer to this job's request for 42 s (it is behind)" in (got.reason or ""), got.reason


def test_a_job_asks_the_scheduler_only_after_the_jobs_its_supervisor_took_before_it_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The provider's side of ArrivalOrder: until the job that came first asked, the next one waits, held,
    saying for whom; a job that makes it wait ARRIVAL_WAIT in all loses its turn."""
    import fray_ray.provider as provider_mod
    from fray_ray._host import HostConfig
    from fray_ray.provider import RaySliceProvider
    from fray_ray.scheduler import ArrivalOrder, SchedulerClient

    asked: list[str] = []

    class Recording(SchedulerClient):
        def ask(self, method: str, *args: Any, timeout: float, **kw: Any) -> Any:
            asked.append(args[0])
            return {"held": True, "reason": "queued: 1st", "total": 1, "free": 0, "busy": 1, "transit": []}

    order = ArrivalOrder()
    for i, job in enumerate(["first", "second", "stuck", "late"]):
        order.arrived(job, float(i))

    def provider(job: str) -> RaySliceProvider:
        return RaySliceProvider(job, HostConfig((), "/", supervisor=None), scheduler=Recording("fray"), arrivals=order)

    second = provider("second")
    got = second._admit(TPU, TPU, [1], {}, time.monotonic() + 0.05)
    assert isinstance(got, Unschedulable) and got.held and asked == [], got
    assert (got.reason or "").startswith("waiting for job first launched before it to take a place in the cluster's"), (
        got
    )
    provider("first")._admit(TPU, TPU, [1], {}, time.monotonic() + 0.05)
    assert second._admit(TPU, TPU, [1], {}, time.monotonic() + 0.05)["reason"] == "queued: 1st"  # its turn now
    assert asked == ["first", "second"]
    monkeypatch.setattr(provider_mod, "ARRIVAL_WAIT", 0.2)
    late = provider("late")
    got = late._admit(TPU, TPU, [1], {}, time.monotonic() + 0.05)
    assert isinstance(got, Unschedulable) and "waiting for job stuck launched" in (got.reason or ""), got
    assert "held" in late._admit(TPU, TPU, [1], {}, time.monotonic() + 1.0)  # waited 0.2 s in all: "stuck" skipped
    assert asked[-1] == "late" and order.ahead("late") == []


def test_the_cluster_view_is_read_once_for_every_job_of_the_process() -> None:
    """Many jobs of one process asking at once cost the GCS one read per REFRESH_S, not one each."""
    import threading

    from fray_ray.view import REFRESH_S, _Cached

    reads = []
    cached = _Cached(lambda: reads.append(1) or {"n": {}}, {})
    threads = [threading.Thread(target=cached.get, args=(REFRESH_S,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(reads) == 1 and cached.get(REFRESH_S) == {"n": {}} and len(reads) == 1


def test_the_schedulers_node_feed_follows_nodes_that_join_and_leave(ray_tpu_cluster: Any) -> None:
    """The scheduler keeps the node table from Ray's node-change channel (one full read, then what changed;
    issue 29): a slice that joins shows in it with its resources and labels, one that is lost leaves it,
    with no full read in between."""
    import asyncio

    from fray_ray.view import NodeFeed

    fake = ray_tpu_cluster
    fake.wait_settled()

    async def until(feed: NodeFeed, ok: Any, what: str) -> None:
        end = time.monotonic() + 60
        while not ok(feed.table):
            assert time.monotonic() < end, f"the feed never showed {what}: {sorted(feed.table)}"
            await asyncio.sleep(0.1)

    async def scenario() -> None:
        feed = NodeFeed(ray.get_runtime_context().gcs_address)
        await feed.start()
        try:
            assert set(feed.table) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            name = await asyncio.to_thread(fake.add_slice, "v5p-16", True, 3)
            ours = {n["NodeID"] for n in ray.nodes() if n["Alive"] and name in n["Resources"]}
            await until(feed, lambda t: ours <= set(t), f"{name}'s nodes")
            assert all(feed.table[n]["Labels"].get("ray.io/tpu-slice-name") == name for n in ours)
            await asyncio.to_thread(fake.preempt, name, None)
            await until(feed, lambda t: not ours & set(t), f"{name}'s nodes gone")
            assert feed.full_reads == 1 and feed.healthy, (feed.full_reads, feed.error)
        finally:
            feed.close()
            fake.wait_settled()

    asyncio.run(scenario())
