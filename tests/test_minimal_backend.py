"""The example backend (examples/minimal_backend.py, one provider and one cluster in under 300 lines) passes
the conformance kit: what docs/backends.md ("Writing a backend") promises a new backend needs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fray_core.provider import SliceProvider
from fray_core.testing.conformance import ClusterConformance, ClusterUnderTest, ProviderConformance

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "minimal_backend.py"
sys.path.insert(0, str(EXAMPLE.parent))

from minimal_backend import MinimalCluster, SlicePool, SubprocessProvider  # noqa: E402


def test_the_example_is_minimal() -> None:
    assert len(EXAMPLE.read_text().splitlines()) < 300


class TestMinimalProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, tmp_path: Path) -> Iterator[SliceProvider]:
        (tmp_path / "job").mkdir()
        p = SubprocessProvider(SlicePool({"v4-16": 2}), str(tmp_path / "job"))
        yield p
        p.close()

    @pytest.fixture
    def fail_start(self, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
        """The ``n``-th host process of the next start cannot be created (as a fork failing with EAGAIN)."""
        import errno

        import minimal_backend

        def arm(provider: SliceProvider, n: int, before: Callable[[], None]) -> None:
            real, calls = minimal_backend.subprocess.Popen, [0]

            def popen(*args, **kw):  # type: ignore[no-untyped-def]
                if calls[0] == n:
                    before()
                    raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
                calls[0] += 1
                return real(*args, **kw)

            monkeypatch.setattr(minimal_backend.subprocess, "Popen", popen)

        return arm


class TestMinimalCluster(ClusterConformance):
    @pytest.fixture
    def backend(self) -> Iterator[ClusterUnderTest]:
        cluster = MinimalCluster({"v4-16": 2})
        yield ClusterUnderTest(
            cluster, preempt=cluster.pool.preempt, all_free=lambda: len(cluster.pool.free["v4-16"]) == 2
        )
        cluster.close()
