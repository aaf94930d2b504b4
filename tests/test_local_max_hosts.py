"""The local backend bounds the host processes its jobs run at once (``LocalCluster(max_hosts=...)``).

A cluster-sized request run on a laptop, ``v4-2048`` x 4 (1,024 hosts) or ``fray sim --slices 10000``
(20,000), forked real processes until memory or pids ran out. Now it is refused at ``launch``, in the caller,
naming the request's shape, the bound and how to raise it; an elastic job grows only as far as the bound;
jobs that fit on their own but not together wait in line for host processes, first come, first served.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_core.cluster import cluster_from_spec
from fray_core.errors import Unschedulable
from fray_local import LocalCluster, LocalClusterConfig, TpuFleet
from fray_local.cluster import HOST_MEMORY, default_max_hosts
from fray_local.provider import HostBudget
from tests.helpers import wait_for


def _job(resources: ResourceConfig, name: str = "many") -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint(callable=os.getpid), resources=resources)


def wait_for_file(path: str) -> int:
    """A job body: run until ``path`` exists (the test says when), then return this host's pid."""
    import time as _time

    end = _time.monotonic() + 120
    while not os.path.exists(path) and _time.monotonic() < end:
        _time.sleep(0.02)
    return os.getpid()


def _held(name: str, go: Path, resources: ResourceConfig) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint(callable=wait_for_file, args=(str(go),)), resources=resources)


def test_a_job_with_more_hosts_than_the_bound_is_refused_at_launch_and_nothing_is_recorded(tmp_path: Path) -> None:
    cluster = LocalCluster(jobs_dir=str(tmp_path / "jobs"), max_hosts=3)
    try:
        with pytest.raises(ValueError) as e:
            cluster.launch(_job(ResourceConfig(cpu=1, replicas=4)))
        assert str(e.value) == (
            "launch: ResourceConfig.replicas: 4 replicas is 4 host processes at once; the local backend runs at "
            "most 3 at once on this machine; ask for fewer replicas, or raise the bound with "
            "LocalCluster(max_hosts=...)"
        )
        with pytest.raises(ValueError, match=r"2 x v4-16 \(2 hosts a slice\) is 4 host processes at once"):
            cluster.launch(_job(ResourceConfig.with_tpu("v4-16", slice_count=2)))
        with pytest.raises(ValueError, match="is 4 host processes at once"):
            cluster.launch_detached(_job(ResourceConfig(cpu=1, replicas=4)))  # in the caller, too
        assert not (tmp_path / "jobs").exists() or not os.listdir(tmp_path / "jobs")
        info = cluster.wait(cluster.launch(_job(ResourceConfig(cpu=1, replicas=3))), timeout=120)
        assert info.status is JobStatus.SUCCEEDED and len(set(info.result)) == 3
    finally:
        cluster.close()


def test_an_elastic_job_grows_only_as_far_as_the_bound(tmp_path: Path) -> None:
    """Four free v4-16 slices (8 hosts) and a bound of 5 hosts: a job that takes 1, 2 or 4 slices gets 2,
    not 4; its fewest (1 slice) is what launch checks."""
    fleet = TpuFleet({"v4-16": 4})
    cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), max_hosts=5)
    try:
        info = cluster.wait(cluster.launch(_job(ResourceConfig.with_tpu("v4-16", slice_count=[1, 2, 4]))), timeout=120)
        assert info.status is JobStatus.SUCCEEDED, info.attempts
        assert len(info.result) == 4  # 2 slices x 2 hosts
        with pytest.raises(ValueError, match=r"at least 3 x v4-16 \(2 hosts a slice\) is 6 host processes"):
            cluster.launch(_job(ResourceConfig.with_tpu("v4-16", slice_count=[3, 4])))
    finally:
        cluster.close()
        fleet.close()


def test_the_bound_is_set_by_argument_config_or_spec_and_checked(tmp_path: Path) -> None:
    assert LocalCluster(jobs_dir=str(tmp_path), max_hosts=7).max_hosts == 7
    assert LocalCluster(LocalClusterConfig(jobs_dir=str(tmp_path), max_hosts=9)).max_hosts == 9
    spec = cluster_from_spec(f"local?max_hosts=11&jobs_dir={tmp_path}")
    assert isinstance(spec, LocalCluster) and spec.max_hosts == 11
    # a detached supervisor rebuilds the cluster from its spec: it gets the bound this object was given
    assert LocalCluster(jobs_dir=str(tmp_path), max_hosts=7)._detached_spec() == "local?max_hosts=7"
    assert LocalCluster(jobs_dir=str(tmp_path))._detached_spec() == "local"
    assert LocalCluster(jobs_dir=str(tmp_path)).max_hosts == default_max_hosts()
    with pytest.raises(ValueError, match=r"^LocalCluster.max_hosts: expected an int >= 1, got 0$"):
        LocalCluster(jobs_dir=str(tmp_path), max_hosts=0)
    with pytest.raises(TypeError, match=r"^LocalClusterConfig.max_hosts: expected an int >= 1, got .8.$"):
        LocalClusterConfig(max_hosts="8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^cluster spec for 'local': max_hosts: expected an int >= 1, got '-1'$"):
        cluster_from_spec("local?max_hosts=-1")


def test_the_default_bound_follows_the_machines_memory_and_process_limits() -> None:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    bound = default_max_hosts()
    assert 1 <= bound <= min(memory // HOST_MEMORY, pid_max // 4)
    assert bound == min(memory // HOST_MEMORY, pid_max // 4) or bound < 4096  # else RLIMIT_NPROC set it


def test_jobs_launched_together_wait_in_line_for_host_processes_first_come_first_served(tmp_path: Path) -> None:
    """A bound of 3 host processes for every job of the cluster: ``a`` runs 2; ``b`` (2) waits, PENDING,
    saying for what and behind whom; ``c`` (1) came later and waits too, though 1 is free (it is ``b``'s, who
    came first); when ``a`` ends, ``b`` and ``c`` run together. No attempt is spent waiting."""
    cluster = LocalCluster(jobs_dir=str(tmp_path / "jobs"), max_hosts=3)
    go_a, go_rest = tmp_path / "go-a", tmp_path / "go-rest"
    try:
        a = cluster.launch(_held("a", go_a, ResourceConfig(cpu=1, replicas=2)))
        wait_for(lambda: cluster.poll(a).status is JobStatus.RUNNING, 60, "a to run")
        b = cluster.launch(_held("b", go_rest, ResourceConfig(cpu=1, replicas=2)))
        wait_for(lambda: "queued" in (cluster.poll(b).pending_reason or ""), 60, "b to queue")
        c = cluster.launch(_held("c", go_rest, ResourceConfig(cpu=1, replicas=1)))
        wait_for(lambda: "queued" in (cluster.poll(c).pending_reason or ""), 60, "c to queue")
        assert cluster.poll(b).pending_reason == (
            "queued: 1st for 2 host processes (LocalCluster.max_hosts 3); host processes: 1 free, 2 held by " + a
        )
        assert cluster.poll(c).pending_reason.startswith("queued: 2nd for 1 host processes")  # type: ignore[union-attr]
        assert cluster.poll(b).status is JobStatus.PENDING and cluster.poll(c).status is JobStatus.PENDING
        go_a.touch()
        assert cluster.wait(a, timeout=60).status is JobStatus.SUCCEEDED
        wait_for(
            lambda: cluster.poll(b).status is JobStatus.RUNNING and cluster.poll(c).status is JobStatus.RUNNING,
            60,
            "b and c to run together",
        )
        go_rest.touch()
        for job in (b, c):
            info = cluster.wait(job, timeout=60)
            assert info.status is JobStatus.SUCCEEDED and len(info.attempts) == 1, info.attempts
        assert cluster._budget.used == 0  # every host given back
    finally:
        go_a.touch()
        go_rest.touch()
        cluster.close()


def test_a_tpu_job_waits_for_host_processes_too(tmp_path: Path) -> None:
    """Slices made on demand (no fleet bound), 4 host processes: a 2 x v4-16 job (4 hosts) runs; a 1 x v4-16
    job waits for hosts, not for slices; a job that is terminated while it waits leaves the line."""
    cluster = LocalCluster(jobs_dir=str(tmp_path / "jobs"), max_hosts=4)
    go = tmp_path / "go"
    try:
        big = cluster.launch(_held("big", go, ResourceConfig.with_tpu("v4-16", slice_count=2)))
        wait_for(lambda: cluster.poll(big).status is JobStatus.RUNNING, 60, "big to run")
        small = cluster.launch(_held("small", go, ResourceConfig.with_tpu("v4-16")))
        gone = cluster.launch(_held("gone", go, ResourceConfig.with_tpu("v4-16")))
        wait_for(lambda: "queued: 2nd for 2 host processes" in (cluster.poll(gone).pending_reason or ""), 60, "gone")
        cluster.terminate(gone)
        assert cluster.wait(gone, timeout=60).status is JobStatus.STOPPED
        assert cluster.poll(small).pending_reason.startswith("queued: 1st for 2 host processes")  # type: ignore[union-attr]
        go.touch()
        assert cluster.wait(big, timeout=60).status is JobStatus.SUCCEEDED
        info = cluster.wait(small, timeout=60)
        assert info.status is JobStatus.SUCCEEDED and len(info.result) == 2
        assert cluster._budget.used == 0
    finally:
        go.touch()
        cluster.close()


@settings(max_examples=200, deadline=None)
@given(
    max_hosts=st.integers(1, 16),
    ops=st.lists(st.tuples(st.sampled_from("abcd"), st.lists(st.integers(1, 20), min_size=1, max_size=3)), max_size=30),
)
def test_the_budget_never_runs_more_hosts_than_its_bound_and_gets_every_host_back(
    max_hosts: int, ops: list[tuple[str, list[int]]]
) -> None:
    """Takes that fit or wait (deadline now), each holder giving back all it holds at random points: the hosts
    held never exceed the bound, a holder alone in an empty line gets the largest count that fits, and all
    come back."""
    budget = HostBudget(max_hosts)
    held: dict[str, int] = {}
    for i, (holder, counts) in enumerate(ops):
        counts = sorted(set(counts), reverse=True)
        alone = not budget._queue and budget.used == 0
        try:
            got = budget.take(holder, counts, deadline=0.0)
        except Unschedulable as e:
            if min(counts) > max_hosts:  # can never fit: said at once, never waited for
                assert e.permanent and not e.held
                continue
            assert e.held and e.reason and "host processes" in e.reason
            assert not alone
        else:
            assert got in counts and got <= max_hosts
            if alone:
                assert got == max(c for c in counts if c <= max_hosts)
            held[holder] = held.get(holder, 0) + got
        assert budget.used == sum(held.values()) <= max_hosts
        if i % 3 == 2 and held:  # the oldest holder's job ends
            first = next(iter(held))
            budget.give_back(first, held.pop(first))
            budget.leave(first)
    for holder, n in held.items():
        budget.give_back(holder, n)
    assert budget.used == 0
