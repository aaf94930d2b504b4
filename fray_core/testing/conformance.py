"""A conformance kit for backends: pytest mixins that check a provider and a cluster against the contract.

Like fsspec's ``fsspec.tests.abstract``: a backend's test module subclasses the mixins and provides the
fixtures they name; every ``test_*`` method of the mixin then runs against that backend.

- :class:`ProviderConformance` checks a :class:`~fray_core.provider.SliceProvider` directly: all-or-nothing
  acquisition, every run reported once, how runs end, cancel ends runs CANCELLED, ``release`` idempotent,
  ``start`` all or nothing.
- :class:`ClusterConformance` checks a :class:`~fray_core.cluster.Cluster` end to end with real TPU-shaped
  jobs: single slice and multislice runs, the per-host env, the two retry budgets (preemption vs failure),
  flexible slice counts, terminate, bad input, CPU replicas and binaries, and the job records (``poll`` and
  ``list_jobs`` after launch, from another process).

Example (a backend's tests/test_mybackend.py)::

    from fray_core.testing.conformance import ClusterConformance, ClusterUnderTest, ProviderConformance

    class TestMyProvider(ProviderConformance):
        @pytest.fixture
        def provider(self):
            p = MyProvider(slices={"v4-16": 2})
            yield p
            p.close()

    class TestMyCluster(ClusterConformance):
        @pytest.fixture
        def backend(self, tmp_path):
            cluster = MyCluster(slices={"v4-16": 2})
            yield ClusterUnderTest(cluster, preempt=cluster.provider_preempt)
            cluster.close()

The host functions below (:func:`host_info`, :func:`hang`, ...) are what the kit's jobs run; they live in
this module so that a host process can import them by name. Needs pytest (imported here, not by
``fray_core.testing``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from fray_core.cluster import Cluster
from fray_core.errors import Unschedulable
from fray_core.provider import HostOutcomeKind, HostRun, Outcome, SliceLease, SliceProvider
from fray_core.records import pid_alive
from fray_core.request import Entrypoint, JobRequest, ResourceConfig, TpuConfig, create_environment
from fray_core.runner import MEGASCALE_DEFAULT_PORT, slice_hosts
from fray_core.status import JobInfo, JobStatus
from fray_core.tpu import get_tpu_spec

__all__ = [
    "ClusterConformance",
    "ClusterUnderTest",
    "ProviderConformance",
    "always_fail",
    "always_fail_on_slice1",
    "check_hosts",
    "fail_on_host0",
    "fail_on_slice0_first_attempt",
    "hang",
    "host_info",
    "run_until_released",
    "wait_for",
    "write_whole",
]


# ------------------------------------------------------------------------------ what the hosts run


def host_info(marker_dir: str = "") -> dict[str, str]:
    """The host's fray env (``FRAY_*``, ``TPU_*``, ``MEGASCALE_*``) and its ``pid``."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("FRAY_", "TPU_", "MEGASCALE_"))}
    env["pid"] = str(os.getpid())
    return env


def write_whole(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that a reader never sees it half-written: into a hidden file beside it, then
    renamed over it. For the markers a host writes and a test reads as soon as they exist (an empty read of one
    written in place was a CI flake, twice).

    >>> import tempfile
    >>> marker = Path(tempfile.mkdtemp(), "started")
    >>> write_whole(marker, "4242")
    >>> marker.read_text()
    '4242'
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # hidden: no glob of markers sees it
    tmp.write_text(text)
    os.replace(tmp, path)


def _mark(marker_dir: str) -> None:
    """Write ``a<attempt>-s<slice>-h<host>`` (the pid) into ``marker_dir``, whole."""
    name = f"a{os.environ['FRAY_ATTEMPT']}-s{os.environ['FRAY_SLICE_ID']}-h{os.environ['FRAY_HOST_ID']}"
    write_whole(Path(marker_dir, name), str(os.getpid()))


def run_until_released(marker_dir: str) -> dict[str, str]:
    """Marks that it started, then runs until the test drops a ``release-a<attempt>`` file (or 120 s)."""
    _mark(marker_dir)
    release = Path(marker_dir, f"release-a{os.environ['FRAY_ATTEMPT']}")
    end = time.monotonic() + 120
    while not release.exists() and time.monotonic() < end:
        time.sleep(0.05)
    return host_info()


def hang(marker_dir: str) -> None:
    """Marks that it started, then runs until stopped (300 s at most)."""
    _mark(marker_dir)
    time.sleep(300)


def fail_on_host0(marker_dir: str = "") -> dict[str, str]:
    """Host 0 of every slice raises ``RuntimeError``; the others succeed."""
    if os.environ["FRAY_HOST_ID"] == "0":
        raise RuntimeError(f"host 0 of slice {os.environ['FRAY_SLICE_ID']} failed")
    return host_info()


def fail_on_slice0_first_attempt(marker_dir: str) -> dict[str, str]:
    if os.environ["FRAY_ATTEMPT"] == "0" and os.environ["FRAY_SLICE_ID"] == "0" and os.environ["FRAY_HOST_ID"] == "0":
        raise RuntimeError("slice 0 host 0 failed in attempt 0")
    return host_info()


def always_fail_on_slice1(marker_dir: str) -> dict[str, str]:
    if os.environ["FRAY_SLICE_ID"] == "1":
        raise ValueError(f"slice 1 is broken (attempt {os.environ['FRAY_ATTEMPT']})")
    return host_info()


def always_fail(marker_dir: str) -> None:
    raise ValueError("this function always fails")


# ----------------------------------------------------------------------------------------- helpers


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.05
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def check_hosts(
    result: list[dict[str, str]],
    n_slices: int,
    attempt: int = 0,
    tpu: str = "v4-16",
    megascale_port: int = MEGASCALE_DEFAULT_PORT,
) -> None:
    """A TPU job's results (each host returned :func:`host_info`): one entry per host in (slice, host)
    order, one process each, the hosts of one slice on one slice, and the MEGASCALE env right (on the
    runner's ``megascale_port``)."""
    per = get_tpu_spec(tpu).hosts
    assert len(result) == n_slices * per  # one entry per host, in (slice, host) order
    assert [(r["FRAY_SLICE_ID"], r["TPU_WORKER_ID"]) for r in result] == [
        (str(s), str(h)) for s in range(n_slices) for h in range(per)
    ]
    assert {r["FRAY_ATTEMPT"] for r in result} == {str(attempt)}
    assert len({r["pid"] for r in result}) == len(result)  # one process per host
    for s in range(n_slices):
        assert len({r["TPU_NAME"] for r in result[per * s : per * (s + 1)]}) == 1
    assert len({r["TPU_NAME"] for r in result}) == n_slices
    if n_slices == 1:
        assert not any(k.startswith("MEGASCALE_") for r in result for k in r)
    else:
        assert len({r["MEGASCALE_COORDINATOR_ADDRESS"] for r in result}) == 1
        assert {r["MEGASCALE_NUM_SLICES"] for r in result} == {str(n_slices)}
        assert [r["MEGASCALE_SLICE_ID"] for r in result] == [str(s) for s in range(n_slices) for _ in range(per)]
        assert {r["MEGASCALE_PORT"] for r in result} == {str(megascale_port)}


_MARKER = re.compile(r"a\d+-s\d+-h\d+")


def _markers(marker_dir: Path, attempt: int | str) -> list[Path]:
    """The hosts of ``attempt`` (``"*"``: of any) that marked ``marker_dir`` (see :func:`_mark`)."""
    return sorted(m for m in marker_dir.glob(f"a{attempt}-s*-h*") if _MARKER.fullmatch(m.name))


def _no_marked_process_alive(marker_dir: Path, timeout: float = 10.0) -> None:
    """Every host that marked ``marker_dir`` is gone (within ``timeout``: a killed process is reaped)."""

    def dead() -> bool:
        return not any(pid_alive(int(m.read_text())) for m in _markers(marker_dir, "*"))

    wait_for(dead, timeout=timeout, what=f"every host process marked in {marker_dir} to be gone")


# ------------------------------------------------------------------------------------ the provider


class ProviderConformance:
    """Checks a :class:`~fray_core.provider.SliceProvider` against the contract.

    Fixtures the subclass provides:

    - ``provider`` (required): a fresh provider serving one job; close it after the test.
    - ``tpu`` (default ``"v4-16"``): the TPU type the provider serves; ``capacity`` (default 2): how many
      slices of it exist, ``None`` when slices are made on demand (acquisition limits are then skipped).
    - ``entry``: ``entry(fn, marker_dir)`` -> the :class:`Entrypoint` that makes this backend's hosts behave
      as the kit's host function ``fn`` (:func:`host_info`, :func:`fail_on_host0`, :func:`hang`); by default
      ``Entrypoint(callable=fn, ...)``, right for any backend that runs the callable.
    - ``monotonic`` (default ``time.monotonic``): the clock ``acquire``'s deadline is read on.
    - ``fail_start`` (default ``None``: the test is skipped): ``fail_start(provider, n, before)`` makes the
      next ``start`` fail on its ``n``-th host (e.g. a fork failing with EAGAIN), calling ``before()`` just
      before it fails (the kit waits there until the hosts started before it run the user's code).
    - ``processes`` (default True): hosts are processes whose pids :func:`hang` marks (False: in memory).
    """

    TIMEOUT = 60.0  # seconds any one host may take to end once it should

    @pytest.fixture
    def tpu(self) -> str:
        return "v4-16"

    @pytest.fixture
    def capacity(self) -> int | None:
        return 2

    @pytest.fixture
    def entry(self) -> Callable[[Callable[..., Any], str], Entrypoint]:
        return lambda fn, marker_dir: Entrypoint(callable=fn, function_args={"marker_dir": marker_dir})

    @pytest.fixture
    def monotonic(self) -> Callable[[], float]:
        return time.monotonic

    @pytest.fixture
    def fail_start(self) -> Callable[[SliceProvider, int, Callable[[], None]], None] | None:
        return None

    @pytest.fixture
    def processes(self) -> bool:
        return True

    # ---------------------------------------------------------------------------------- helpers

    def acquire(
        self, provider: SliceProvider, resources: ResourceConfig, counts: list[int], monotonic: Callable[[], float]
    ) -> list[SliceLease]:
        """``acquire`` as the runner calls it: in rounds (a provider may give up a round before its
        deadline), until ``TIMEOUT``; a permanent ``Unschedulable`` is raised at once."""
        end = time.monotonic() + self.TIMEOUT
        while True:
            try:
                return provider.acquire(resources, counts, monotonic() + 1.0)
            except Unschedulable as e:
                if e.permanent or time.monotonic() >= end:
                    raise

    def start_all(
        self, provider: SliceProvider, leases: Sequence[SliceLease], entrypoint: Entrypoint, attempt: int = 0
    ) -> list[HostRun]:
        """Start every host of every lease, as the runner does."""
        tpu = TpuConfig(leases[0].device_type) if leases[0].device_type not in ("cpu", "gpu") else None
        runs: list[HostRun] = []
        for lease, hosts in zip(leases, slice_hosts("conformance", attempt, leases, tpu)):
            got = provider.start(lease, hosts, entrypoint)
            assert [(r.slice_index, r.host_index) for r in got] == [(h.slice_index, h.host_index) for h in hosts]
            assert all(r.lease is lease for r in got)
            runs.extend(got)
        return runs

    def collect(self, provider: SliceProvider, runs: list[HostRun], timeout: float | None = None) -> list[Outcome]:
        """Every outcome of ``runs`` (asserting each run is reported once), within ``timeout``."""
        pending = set(runs)
        out: list[Outcome] = []
        end = time.monotonic() + (self.TIMEOUT if timeout is None else timeout)
        while pending and time.monotonic() < end:
            for o in provider.wait_any(list(runs), 0.5):
                assert o.run in pending, f"{o.run} reported twice, or not one of the runs waited for"
                pending.discard(o.run)
                out.append(o)
        assert not pending, f"{len(pending)} of {len(runs)} runs never reported an outcome"
        return out

    def start_one_slice(
        self, provider: SliceProvider, tpu: str, monotonic: Callable[[], float], entrypoint: Entrypoint
    ) -> tuple[list[SliceLease], list[HostRun]]:
        """Acquire one slice of ``tpu`` and start ``entrypoint`` on every host of it."""
        leases = self.acquire(provider, ResourceConfig.with_tpu(tpu), [1], monotonic)
        return leases, self.start_all(provider, leases, entrypoint)

    def stop(self, provider: SliceProvider, runs: list[HostRun], leases: list[SliceLease]) -> None:
        provider.cancel(runs)
        try:
            self.collect(provider, runs)
        finally:
            provider.release(leases)

    # ------------------------------------------------------------------------------------ tests

    def test_acquire_is_all_or_nothing(
        self, provider: SliceProvider, tpu: str, capacity: int | None, monotonic: Callable[[], float]
    ) -> None:
        if capacity is None:
            pytest.skip("slices are made on demand: nothing is ever short")
        too_many = ResourceConfig.with_tpu(tpu, slice_count=capacity + 1)
        with pytest.raises(Unschedulable):
            provider.acquire(too_many, [capacity + 1], monotonic() + 1.0)
        # the failed call held nothing: every slice can be taken at once
        res = ResourceConfig.with_tpu(tpu, slice_count=capacity)
        leases = self.acquire(provider, res, [capacity], monotonic)
        assert len(leases) == capacity and len({lease.name for lease in leases}) == capacity
        assert all(
            lease.hosts == get_tpu_spec(tpu).hosts and lease.device_type == get_tpu_spec(tpu).name for lease in leases
        )
        provider.release(leases)

    def test_acquire_takes_the_largest_count_that_fits(
        self, provider: SliceProvider, tpu: str, capacity: int | None, monotonic: Callable[[], float]
    ) -> None:
        if capacity is None:
            pytest.skip("slices are made on demand: every count fits")
        res = ResourceConfig.with_tpu(tpu, slice_count=[1, capacity + 1])
        leases = self.acquire(provider, res, [capacity + 1, 1], monotonic)
        assert len(leases) == 1
        provider.release(leases)

    def test_each_run_is_reported_once_with_how_it_ended(
        self,
        provider: SliceProvider,
        tpu: str,
        entry: Callable[..., Entrypoint],
        monotonic: Callable[[], float],
        tmp_path: Path,
    ) -> None:
        leases, runs = self.start_one_slice(provider, tpu, monotonic, entry(fail_on_host0, str(tmp_path)))
        assert len(runs) == get_tpu_spec(tpu).hosts
        outcomes = self.collect(provider, runs)
        kinds = {o.run.host_index: o.kind for o in outcomes}
        assert kinds[0] is HostOutcomeKind.FAILED and all(k is HostOutcomeKind.SUCCEEDED for h, k in kinds.items() if h)
        failed = next(o for o in outcomes if o.run.host_index == 0)
        assert failed.error and "host 0 of slice 0 failed" in failed.error
        assert list(provider.wait_any(runs, 0.1)) == []  # reported once, over all calls
        provider.release(leases)

    def test_wait_any_returns_empty_when_nothing_ended(
        self,
        provider: SliceProvider,
        tpu: str,
        entry: Callable[..., Entrypoint],
        monotonic: Callable[[], float],
        tmp_path: Path,
    ) -> None:
        leases, runs = self.start_one_slice(provider, tpu, monotonic, entry(hang, str(tmp_path)))
        assert list(provider.wait_any(runs, 0.2)) == []
        self.stop(provider, runs, leases)

    @pytest.mark.parametrize("grace", [None, 1.0])
    def test_cancel_ends_runs_cancelled(
        self,
        provider: SliceProvider,
        tpu: str,
        entry: Callable[..., Entrypoint],
        monotonic: Callable[[], float],
        tmp_path: Path,
        processes: bool,
        grace: float | None,
    ) -> None:
        leases, runs = self.start_one_slice(provider, tpu, monotonic, entry(hang, str(tmp_path)))
        if processes:
            wait_for(lambda: len(_markers(tmp_path, 0)) == len(runs), timeout=self.TIMEOUT, what="every host to run")
        provider.cancel(runs, grace=grace)
        outcomes = self.collect(provider, runs)
        assert [o.kind for o in outcomes] == [HostOutcomeKind.CANCELLED] * len(runs)
        provider.cancel(runs)  # cancelling what has ended is a no-op
        provider.release(leases)
        if processes:
            _no_marked_process_alive(tmp_path)

    def test_release_is_idempotent(
        self, provider: SliceProvider, tpu: str, capacity: int | None, monotonic: Callable[[], float]
    ) -> None:
        n = capacity or 1
        res = ResourceConfig.with_tpu(tpu, slice_count=n)
        leases = self.acquire(provider, res, [n], monotonic)
        provider.release(leases)
        provider.release(leases)
        provider.release(leases[:1])
        again = self.acquire(provider, res, [n], monotonic)  # released once, every slice free
        assert len(again) == n
        provider.release(again)

    def test_start_is_all_or_nothing(
        self,
        provider: SliceProvider,
        tpu: str,
        entry: Callable[..., Entrypoint],
        monotonic: Callable[[], float],
        fail_start: Callable[[SliceProvider, int, Callable[[], None]], None] | None,
        tmp_path: Path,
    ) -> None:
        if fail_start is None:
            pytest.skip("this backend's fixtures cannot make a host start fail")
        leases = self.acquire(provider, ResourceConfig.with_tpu(tpu), [1], monotonic)
        n = get_tpu_spec(tpu).hosts - 1  # the last host of the slice fails to start

        def before() -> None:  # the hosts started before the failure run the user's code: something to leak
            wait_for(lambda: len(_markers(tmp_path, 0)) == n, timeout=self.TIMEOUT, what=f"{n} host(s) to run")

        fail_start(provider, n, before)
        tpu_config = TpuConfig(tpu)
        hosts = next(slice_hosts("conformance", 0, leases, tpu_config))
        with pytest.raises(Exception):  # noqa: B017 - any provider error; the point is the cleanup
            provider.start(leases[0], hosts, entry(hang, str(tmp_path)))
        _no_marked_process_alive(tmp_path)  # the hosts started before the failure were stopped
        provider.release(leases)

    def test_close_is_safe_after_release(
        self, provider: SliceProvider, tpu: str, monotonic: Callable[[], float]
    ) -> None:
        leases = self.acquire(provider, ResourceConfig.with_tpu(tpu), [1], monotonic)
        provider.release(leases)
        provider.close()
        provider.close()


# ------------------------------------------------------------------------------------- the cluster


@attrs.define
class ClusterUnderTest:
    """What :class:`ClusterConformance` needs of a backend.

    - ``cluster``: the cluster; it has 2 slices of ``tpu`` (a type with 2 hosts per slice), or makes
      slices on demand (``fixed_capacity=False``).
    - ``preempt(slice_name, restore_after=0.0)``: preempt a slice now (``None``: preemption scenarios are
      skipped).
    - ``spec``: a cluster spec another process reaches the same jobs with (``None``: that check is skipped).
    - ``all_free()``: both slices exist and no job holds them (waited for before a capacity scenario).
    """

    cluster: Cluster
    preempt: Callable[..., None] | None = None
    fixed_capacity: bool = True
    spec: str | None = None
    all_free: Callable[[], bool] = lambda: True
    tpu: str = "v4-16"


class ClusterConformance:
    """Checks a :class:`~fray_core.cluster.Cluster` end to end (levanter's ``run_on_pod`` scenarios and
    more). The subclass provides the ``backend`` fixture (a :class:`ClusterUnderTest`)."""

    TIMEOUT = 120.0

    def tpu_job(
        self,
        backend: ClusterUnderTest,
        fn: Callable[..., object],
        marker_dir: Path,
        slices: int | list[int] = 1,
        **kw: Any,
    ) -> JobRequest:
        return JobRequest(
            name=fn.__name__.replace("_", "-"),
            entrypoint=Entrypoint(callable=fn, function_args={"marker_dir": str(marker_dir)}),
            resources=ResourceConfig.with_tpu(backend.tpu, slice_count=slices),
            **kw,
        )

    def run(self, backend: ClusterUnderTest, request: JobRequest, raise_on_failure: bool = False) -> JobInfo:
        """Launch ``request`` and wait for it to end."""
        job_id = backend.cluster.launch(request)
        return backend.cluster.wait(job_id, timeout=self.TIMEOUT, raise_on_failure=raise_on_failure)

    def succeeded(self, backend: ClusterUnderTest, info: JobInfo, n_slices: int, attempt: int = 0) -> None:
        """The job SUCCEEDED with the hosts of ``n_slices`` slices of its attempt ``attempt`` (:func:`check_hosts`)."""
        assert info.status == JobStatus.SUCCEEDED, info.error
        check_hosts(info.result, n_slices, attempt, backend.tpu)

    def wait_started(self, marker_dir: Path, n: int, attempt: int = 0, what: str = "the hosts to start") -> None:
        """Wait until ``n`` hosts of ``attempt`` run the user's code (they marked ``marker_dir``)."""
        wait_for(lambda: len(_markers(marker_dir, attempt)) == n, timeout=self.TIMEOUT, what=what)

    def wait_hosts_dead(self, marker_dir: Path, attempt: int = 0, whose: str = "") -> None:
        """Wait until every host of ``attempt`` that marked ``marker_dir`` is gone."""
        for m in _markers(marker_dir, attempt):
            pid = int(m.read_text())
            wait_for(lambda pid=pid: not pid_alive(pid), timeout=self.TIMEOUT, what=f"host {m.name}{whose} to die")

    def _preempt(self, backend: ClusterUnderTest) -> Callable[..., None]:
        if backend.preempt is None:
            pytest.skip("this backend cannot preempt a slice on demand")
        return backend.preempt

    def test_single_slice_simple_run(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        info = self.run(backend, self.tpu_job(backend, host_info, tmp_path), raise_on_failure=True)
        self.succeeded(backend, info, 1)
        assert [a.outcome.value for a in info.attempts] == ["SUCCEEDED"]

    def test_single_slice_run_twice(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        for _ in range(2):  # the slice is released after the first job
            self.succeeded(backend, self.run(backend, self.tpu_job(backend, host_info, tmp_path)), 1)

    def test_multislice_simple_run(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        info = self.run(backend, self.tpu_job(backend, host_info, tmp_path, slices=2))
        self.succeeded(backend, info, 2)
        assert len(info.attempts[0].slices) == 2

    def test_multislice_fail_once_recomputes_env(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        job = self.tpu_job(backend, fail_on_slice0_first_attempt, tmp_path, slices=2, max_retries_failure=1)
        info = self.run(backend, job)
        self.succeeded(backend, info, 2, attempt=1)
        assert [a.outcome.value for a in info.attempts] == ["FAILED", "SUCCEEDED"]
        assert "RuntimeError: slice 0 host 0 failed in attempt 0" in info.attempts[0].cause

    def test_multislice_one_slice_always_fails(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        info = self.run(
            backend, self.tpu_job(backend, always_fail_on_slice1, tmp_path, slices=2, max_retries_failure=2)
        )
        assert info.status == JobStatus.FAILED
        assert [a.outcome.value for a in info.attempts] == ["FAILED"] * 3 and info.failures == 3
        assert all("ValueError: slice 1 is broken" in a.cause for a in info.attempts)
        assert "failed 3 time(s), max_retries_failure=2" in info.error

    def test_single_slice_catches_failure(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        info = self.run(backend, self.tpu_job(backend, always_fail, tmp_path))
        assert info.status == JobStatus.FAILED and info.failures == 1 and info.preemptions == 0
        assert "ValueError: this function always fails" in info.attempts[0].cause
        assert "Traceback" in info.attempts[0].cause and "always_fail" in info.attempts[0].cause

    def test_preemption_is_retried_on_a_restored_slice(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        preempt = self._preempt(backend)
        job_id = backend.cluster.launch(
            self.tpu_job(backend, run_until_released, tmp_path, slices=2, max_retries_preemption=2)
        )
        n = 2 * get_tpu_spec(backend.tpu).hosts
        self.wait_started(tmp_path, n, 0, what=f"all {n} hosts of attempt 0 to start")
        victim = backend.cluster.poll(job_id).attempts[0].slices[1]
        preempt(victim, restore_after=0.0)
        self.wait_started(tmp_path, n, 1, what=f"all {n} hosts of attempt 1 to start")
        (tmp_path / "release-a1").touch()
        info = backend.cluster.wait(job_id, timeout=self.TIMEOUT)
        self.succeeded(backend, info, 2, attempt=1)
        assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"]
        assert info.preemptions == 1 and info.failures == 0
        # every host of the preempted attempt is gone, the surviving slice's included (all-or-nothing)
        self.wait_hosts_dead(tmp_path, 0, " of the preempted attempt")

    def test_preemption_budget_exhausted(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        preempt = self._preempt(backend)
        job_id = backend.cluster.launch(self.tpu_job(backend, run_until_released, tmp_path, max_retries_preemption=1))
        n = get_tpu_spec(backend.tpu).hosts
        for attempt in (0, 1):
            self.wait_started(tmp_path, n, attempt, what=f"attempt {attempt} to start")
            preempt(backend.cluster.poll(job_id).attempts[attempt].slices[0], restore_after=0.0)
        info = backend.cluster.wait(job_id, timeout=self.TIMEOUT)
        assert info.status == JobStatus.FAILED
        assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "PREEMPTED"]
        assert info.preemptions == 2 and info.failures == 0
        assert "preempted 2 time(s), max_retries_preemption=1" in info.error

    def test_variable_multislice_takes_the_largest_count_that_fits(
        self, backend: ClusterUnderTest, tmp_path: Path
    ) -> None:
        # "largest that fits" is judged at acquire time: start from a fleet whose 2 slices are both free
        # (an earlier test's preempted slice may still be coming back)
        wait_for(backend.all_free, timeout=self.TIMEOUT, what="both slices to be free")
        self.succeeded(backend, self.run(backend, self.tpu_job(backend, host_info, tmp_path, slices=[1, 2])), 2)
        if not backend.fixed_capacity:
            return
        # with one slice held by another job, [1, 2] runs on the one that is left
        blocker_dir = tmp_path / "blocker"
        blocker_dir.mkdir()
        blocker = backend.cluster.launch(self.tpu_job(backend, run_until_released, blocker_dir))
        self.wait_started(blocker_dir, get_tpu_spec(backend.tpu).hosts, what="the blocker to hold a slice")
        self.succeeded(backend, self.run(backend, self.tpu_job(backend, host_info, tmp_path, slices=[1, 2])), 1)
        (blocker_dir / "release-a0").touch()
        assert backend.cluster.wait(blocker, timeout=self.TIMEOUT).status == JobStatus.SUCCEEDED

    def test_terminate_stops_every_host_and_frees_capacity(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        job_id = backend.cluster.launch(self.tpu_job(backend, run_until_released, tmp_path, slices=2))
        self.wait_started(tmp_path, 2 * get_tpu_spec(backend.tpu).hosts, what="all hosts to start")
        backend.cluster.terminate(job_id)
        info = backend.cluster.wait(job_id, timeout=60)
        assert info.status == JobStatus.STOPPED and info.attempts[-1].outcome.value == "CANCELLED"
        self.wait_hosts_dead(tmp_path, 0)
        # both slices are free again: a 2-slice job runs at once
        assert self.run(backend, self.tpu_job(backend, host_info, tmp_path, slices=2)).status == JobStatus.SUCCEEDED

    def test_bad_input_fails_at_launch(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"TpuConfig.type: unknown TPU type 'v4-15'"):
            ResourceConfig.with_tpu("v4-15")
        with pytest.raises(TypeError, match="launch: expected a JobRequest"):
            backend.cluster.launch("not a request")  # type: ignore[arg-type]
        unpicklable = JobRequest(
            name="x", entrypoint=Entrypoint(callable=host_info, function_args={"marker_dir": threading.Lock()})
        )
        with pytest.raises(TypeError, match=r"Entrypoint.callable: .*host_info.* cannot be pickled"):
            backend.cluster.launch(unpicklable)
        with pytest.raises(KeyError, match="no-such-job"):
            backend.cluster.poll("no-such-job")

    def test_cpu_replicas_and_binaries(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        req = JobRequest(name="cpu", entrypoint=Entrypoint(callable=host_info), resources=ResourceConfig(replicas=3))
        info = self.run(backend, req)
        assert info.status == JobStatus.SUCCEEDED
        assert [r["FRAY_REPLICA_ID"] for r in info.result] == ["0", "1", "2"]
        assert not any(k.startswith(("TPU_", "MEGASCALE_")) for r in info.result for k in r)
        bad = JobRequest(name="bin", entrypoint=Entrypoint.from_binary("sh", ["-c", "echo to-stderr >&2; exit 4"]))
        info = self.run(backend, bad)
        assert info.status == JobStatus.FAILED and "exit code 4" in info.attempts[0].cause
        assert "to-stderr" in info.attempts[0].cause
        killed = JobRequest(name="killed", entrypoint=Entrypoint.from_binary("sh", ["-c", "kill -9 $$"]))
        info = self.run(backend, killed)
        assert info.status == JobStatus.FAILED and "killed by SIGKILL" in info.attempts[0].cause  # named, not a number

    def test_env_vars_reach_every_host(self, backend: ClusterUnderTest, tmp_path: Path) -> None:
        req = JobRequest(
            name="env",
            entrypoint=Entrypoint(callable=host_info),
            resources=ResourceConfig.with_tpu(backend.tpu),
            environment=create_environment(env_vars={"FRAY_TEST_FLAG": "on", "WANDB_MODE": "offline"}),
        )
        info = self.run(backend, req, raise_on_failure=True)
        assert [r.get("FRAY_TEST_FLAG") for r in info.result] == ["on"] * get_tpu_spec(backend.tpu).hosts
        assert all(r.get("FRAY_JOB_ID") == info.job_id for r in info.result)

    def test_a_job_is_recorded_and_pollable_from_a_second_process(
        self, backend: ClusterUnderTest, tmp_path: Path
    ) -> None:
        job_id = backend.cluster.launch(self.tpu_job(backend, run_until_released, tmp_path))
        assert job_id in [i.job_id for i in backend.cluster.list_jobs()]  # recorded at launch
        self.wait_started(tmp_path, get_tpu_spec(backend.tpu).hosts, what="the job's hosts to start")
        # RUNNING once every host reported in (on Ray the report reaches the runner a moment after the marker)
        wait_for(lambda: backend.cluster.poll(job_id).status == JobStatus.RUNNING, what="the job to be RUNNING")
        if backend.spec is not None:
            script = (
                "import json, sys\n"
                "from fray_core.cluster import cluster_from_spec\n"
                "c = cluster_from_spec(sys.argv[1])\n"
                "info = c.poll(sys.argv[2])\n"
                "slices = info.attempts[-1].slices if info.attempts else []\n"
                "print(json.dumps({'status': info.status.value, 'slices': slices}))\n"
            )
            out = subprocess.run(
                [sys.executable, "-c", script, backend.spec, job_id],
                capture_output=True,
                text=True,
                timeout=self.TIMEOUT,
                cwd=tmp_path,
            )
            assert out.returncode == 0, out.stderr
            seen = json.loads(out.stdout.strip().splitlines()[-1])
            assert seen == {"status": "RUNNING", "slices": backend.cluster.poll(job_id).attempts[-1].slices}
        (tmp_path / "release-a0").touch()
        self.succeeded(backend, backend.cluster.wait(job_id, timeout=self.TIMEOUT), 1)
        listed = {i.job_id: i for i in backend.cluster.list_jobs()}
        assert listed[job_id].status == JobStatus.SUCCEEDED and len(listed[job_id].attempts) == 1
