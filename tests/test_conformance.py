"""Every backend runs the conformance kit (``fray_core.testing.conformance``), the way a new backend would:
by subclassing its mixins with fixtures.

- providers: the in-memory one (``fray_core.testing``), the local one (real processes on a ``TpuFleet``) and
  the Ray one (on the emulated multi-node Ray TPU cluster);
- clusters: ``LocalCluster()`` (slices made on demand), ``LocalCluster(fleet=TpuFleet({"v4-16": 2}))`` and
  ``RayCluster`` on the emulated Ray TPU cluster (one per test session, see tests/conftest.py).

The example backend (examples/minimal_backend.py) runs the same kit in tests/test_minimal_backend.py.
"""

from __future__ import annotations

import errno
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fray_core.provider import HostRun, HostSpec, SliceLease, SliceProvider
from fray_core.testing import FakeClock, HostScript, InMemorySliceProvider
from fray_core.testing import conformance as kit
from fray_core.testing.conformance import ClusterConformance, ClusterUnderTest, ProviderConformance
from fray_core.tpu import get_tpu_spec
from fray_core.types import Entrypoint
from fray_local import LocalCluster, TpuFleet
from fray_local.testing import TEST_POLICY

TPU = "v4-16"  # 2 hosts per slice; every backend below has 2 slices of it


# ------------------------------------------------------------------------------------------ providers


class _AsTheKitSays(InMemorySliceProvider):
    """The in-memory provider runs no code: its hosts end as the kit's host function would."""

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        fn = entrypoint.callable
        if fn is kit.hang:
            self.script = lambda a, s, h: None
        elif fn is kit.fail_on_host0:
            self.script = lambda a, s, h: (
                HostScript("FAILED", error=f"RuntimeError: host 0 of slice {s} failed") if h == 0 else "SUCCEEDED"
            )
        else:
            self.script = None
        return super().start(lease, hosts, entrypoint)


class TestInMemoryProvider(ProviderConformance):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def provider(self, clock: FakeClock) -> Iterator[SliceProvider]:
        p = _AsTheKitSays({TPU: 2}, clock)
        yield p
        p.close()

    @pytest.fixture
    def monotonic(self, clock: FakeClock) -> Callable[[], float]:
        return clock

    @pytest.fixture
    def processes(self) -> bool:
        return False


class TestLocalProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SliceProvider]:
        from fray_local._proc import LogSink
        from fray_local.provider import LocalSliceProvider

        root = tmp_path_factory.mktemp("local-provider")
        fleet = TpuFleet({TPU: 2}, state_dir=str(root / "fleet"))
        log = LogSink(str(root / "job.log"))
        p = LocalSliceProvider(fleet, "conformance", str(root), log)
        yield p
        p.close()
        log.close()
        fleet.close()

    @pytest.fixture
    def fail_start(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[SliceProvider, int, Callable[[], None]], None]:
        """The ``n``-th host fork of the next start fails with EAGAIN (as a fork at the process limit)."""
        import fray_local._proc as proc

        def arm(provider: SliceProvider, n: int, before: Callable[[], None]) -> None:
            real = proc.spawn
            forks = [0]

            def spawn(argv: list[str], **kw: Any) -> Any:
                if forks[0] == n:
                    before()
                    raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
                forks[0] += 1
                return real(argv, **kw)

            monkeypatch.setattr(proc, "spawn", spawn)

        return arm


@pytest.mark.ray
class TestRayProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, request: pytest.FixtureRequest) -> Iterator[SliceProvider]:
        try:
            fake = request.getfixturevalue("ray_tpu_cluster")
        except pytest.FixtureLookupError:
            pytest.skip("the emulated Ray cluster fixture is not available")
        from fray_ray._host import HostConfig
        from fray_ray.provider import RaySliceProvider

        fake.wait_settled()
        config = HostConfig(
            sys_path=tuple(p for p in sys.path if p), cwd=os.getcwd(), supervisor=None, preemption_probe=None
        )
        p = RaySliceProvider(f"conformance-{uuid.uuid4().hex[:8]}", config, namespace=fake.cluster.namespace)
        yield p
        p.close()

    @pytest.fixture
    def fail_start(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[SliceProvider, int, Callable[[], None]], None]:
        """The ``n``-th host task of the next start cannot be submitted."""
        import fray_ray.provider as rp

        def arm(provider: SliceProvider, n: int, before: Callable[[], None]) -> None:
            real, submitted = rp._host_task, [0]

            class Failing:
                def options(self, **kw: Any) -> Any:
                    task = real.options(**kw)

                    class Submit:
                        def remote(self, *args: Any) -> Any:
                            if submitted[0] == n:
                                before()
                                raise RuntimeError("cannot submit the host task")
                            submitted[0] += 1
                            return task.remote(*args)

                    return Submit()

            monkeypatch.setattr(rp, "_host_task", Failing())

        return arm


# ------------------------------------------------------------------------------------------- clusters


def _ray_all_free(fake: Any) -> Callable[[], bool]:
    def check() -> bool:
        import ray

        fake.wait_settled()
        live = len(fake.slices().get(TPU, []))
        return live == 2 and ray.available_resources().get(get_tpu_spec(TPU).head_resource, 0) >= 2

    return check


class TestLocalOnDemand(ClusterConformance):
    """``LocalCluster()``: TPU slices are made on demand, so capacity never runs short."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[ClusterUnderTest]:
        cluster = LocalCluster(jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
        yield ClusterUnderTest(
            cluster,
            preempt=cluster.fleet.model.preempt,
            fixed_capacity=False,
            spec=f"local?jobs_dir={tmp_path / 'jobs'}",
        )
        cluster.close()


class TestLocalFleet(ClusterConformance):
    """``LocalCluster(fleet=TpuFleet({"v4-16": 2}))``: a fixed simulated fleet."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[ClusterUnderTest]:
        fleet = TpuFleet({TPU: 2}, state_dir=str(tmp_path / "fleet"))
        cluster = LocalCluster(fleet=fleet, jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
        yield ClusterUnderTest(
            cluster,
            preempt=fleet.model.preempt,
            spec=f"local?jobs_dir={tmp_path / 'jobs'}",
            all_free=lambda: fleet.model.describe(TPU).startswith("2 free"),
        )
        cluster.close()


@pytest.mark.ray
class TestRayCluster(ClusterConformance):
    """``RayCluster`` on the emulated multi-node Ray TPU cluster."""

    @pytest.fixture
    def backend(self, request: pytest.FixtureRequest) -> ClusterUnderTest:
        try:
            fake = request.getfixturevalue("ray_tpu_cluster")
        except pytest.FixtureLookupError:
            pytest.skip("the emulated Ray cluster fixture is not available")
        return ClusterUnderTest(
            fake.cluster, preempt=fake.preempt, spec=f"ray?address={fake.address}", all_free=_ray_all_free(fake)
        )
