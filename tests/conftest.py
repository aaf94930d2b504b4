"""Shared fixtures. ``fray_local.testing`` (tpu_fleet, local_cluster) is loaded as a pytest plugin."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import pytest


def _needs_ray(item: pytest.Item) -> bool:
    """Marked ``ray``, or using the session's emulated cluster (a test that forgot the mark must not start a
    second cluster on the other worker)."""
    return item.get_closest_marker("ray") is not None or "ray_tpu_cluster" in getattr(item, "fixturenames", ())


def _group(item: pytest.Item) -> str | None:
    """``"ray"``: the tests of the session's emulated cluster and the Ray bench scripts' smokes (each starts a
    cluster of its own in a subprocess); ``None``: the rest."""
    return "ray" if _needs_ray(item) else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that needs Ray runs in one pytest-xdist group, on one worker, first (the longest unit of work,
    ~30 min on 2 cores), the bench smokes before the session's cluster starts, while the other worker takes the
    rest of the suite (README's test command runs ``-n 2 --dist loadgroup``; without xdist the group only sets
    the order). One emulated Ray cluster at a time, though two can run together (each node takes fresh ports):
    with the smokes as a second group beside the session's cluster CI took 29 min instead of 34, but on 2
    cores the emulated nodes then missed their 1 s health checks and were declared dead mid-test (CI
    2026-11-27: an elastic test's supervisor lost with its node)."""
    for item in items:
        if _group(item) is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))

    def order(item: pytest.Item) -> int:
        if _group(item) is None:
            return 2
        return 0 if item.path.name == "test_bench_smoke.py" else 1

    items.sort(key=order)  # stable: collection order within each part


@pytest.fixture(autouse=True, scope="session")
def _isolated_jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Never write job records into the developer's real cache from tests."""
    os.environ["FRAY_JOBS_DIR"] = str(tmp_path_factory.mktemp("fray-jobs"))


@pytest.fixture(autouse=True)
def _no_stray_ray_driver(request: pytest.FixtureRequest) -> Any:
    """A test outside the Ray group that leaves this process connected to Ray fails, and is disconnected.

    ``ray.get_runtime_context()``, ``ray.get`` and ``.remote()`` run ``ray.init()`` when not connected, which joins
    whatever cluster ``/tmp/ray/ray_current_cluster`` names (the newest emulated cluster a bench smoke started on
    the other worker) or starts one. That process then exits with status 1 when that cluster goes (Ray: "Failed
    to connect to GCS within 60 seconds"), in the middle of an unrelated test, and pytest-xdist's loadgroup hung
    the run after replacing the worker (CI 2026-11-27: fray_ray.code's upload cache key asked Ray for its GCS
    address)."""
    import sys

    before = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    yield
    ray = sys.modules.get("ray")
    if _group(request.node) is None and not before and ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail("this test connected the test process to Ray (ray.init, or a Ray call that runs it)")


_RAY_SESSION = contextlib.ExitStack()  # this process's emulated Ray cluster, closed after its last Ray test
_RAY_FAKE: list[Any] = []


def _ray_fake(basetemp: str) -> Any:
    """One emulated Ray TPU cluster (head + 2 x v4-16 = 4 emulated hosts) for the session, started by the first
    test that asks for it and shut down after the last Ray test (pytest_runtest_teardown below), so the tests
    that run after the Ray tests in this process are not inside Ray.

    Isolated (issue 28): the head and every host are machines of their own as far as files go (a private
    /tmp, no working tree, no home, fray as installed), so the whole Ray suite runs as on a real cluster.
    Only ``basetemp`` stays shared: the tests' own gate and marker files (``tmp_path``), as a shared mount
    would carry them. Where mount namespaces are not permitted it runs unisolated and the summary says so
    (a warning; CI runs as root: there it is always isolated, and ``CI=true`` makes a missing isolation an
    error)."""
    pytest.importorskip("ray")
    from fray_ray.testing import IsolationUnavailable, fake_tpu_cluster

    if not _RAY_FAKE:
        try:
            cm = fake_tpu_cluster({"v4-16": 2}, health_check_period=1.0, isolated=True, shared=[basetemp])
            _RAY_FAKE.append(_RAY_SESSION.enter_context(cm))
        except IsolationUnavailable as e:
            if os.environ.get("CI") == "true":
                raise
            # a warning, so pytest's summary says it (from an xdist worker too)
            warnings.warn(f"the Ray tests run on an UNISOLATED emulated cluster: {e}", stacklevel=1)
            _RAY_FAKE.append(_RAY_SESSION.enter_context(fake_tpu_cluster({"v4-16": 2}, health_check_period=1.0)))
    return _RAY_FAKE[0]


def _close_ray_session() -> None:
    _RAY_FAKE.clear()
    _RAY_SESSION.close()


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down (ray_tpu_cluster's cleanup)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last Ray test of this process (they run first and together) the cluster goes; a session-scoped
    fixture would keep it, and this process connected to Ray, until the very end."""
    if _RAY_FAKE and _group(item) == "ray":
        if nextitem is None or _group(nextitem) != "ray":
            _close_ray_session()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _close_ray_session()


@pytest.fixture
def ray_tpu_cluster(_isolated_jobs_dir: None, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The session's emulated Ray TPU cluster, handed to each test as a fresh one: afterwards every job the
    test left running is stopped, every placement group must be gone and every slice whole again. A test
    that left something behind fails (nothing may outlive its job), and the next test starts clean instead
    of waiting behind it."""
    fake = _ray_fake(str(tmp_path_factory.getbasetemp()))
    yield fake
    leftovers = fake.cleanup()
    if leftovers:
        pytest.fail("the test left work on the emulated Ray cluster:\n" + "\n".join(leftovers), pytrace=False)


@pytest.fixture
def tmp_local_cluster(tmp_path: Any) -> Any:
    """A ``LocalCluster`` of its own (jobs under ``tmp_path``, the tests' fast retry policy), closed after."""
    from fray_local import LocalCluster
    from fray_local.testing import TEST_POLICY

    c = LocalCluster(jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    try:
        yield c
    finally:
        c.close()
