"""Shared fixtures. ``fray_local.testing`` (tpu_fleet, local_cluster) is loaded as a pytest plugin."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Never write job records into the developer's real cache from tests."""
    os.environ["FRAY_JOBS_DIR"] = str(tmp_path_factory.mktemp("fray-jobs"))


@pytest.fixture(scope="session")
def _ray_tpu_session(_isolated_jobs_dir: None):  # type: ignore[no-untyped-def]
    """One emulated Ray TPU cluster (head + 2 x v4-16 = 4 emulated hosts) for the whole session."""
    pytest.importorskip("ray")
    from fray_ray.testing import fake_tpu_cluster

    with fake_tpu_cluster({"v4-16": 2}, health_check_period=1.0) as fake:
        yield fake


@pytest.fixture
def ray_tpu_cluster(_ray_tpu_session):  # type: ignore[no-untyped-def]
    """The session's emulated Ray TPU cluster, handed to each test as a fresh one: afterwards every job the
    test left running is stopped, every placement group must be gone and every slice whole again. A test
    that left something behind fails (nothing may outlive its job), and the next test starts clean instead
    of waiting behind it."""
    yield _ray_tpu_session
    leftovers = _ray_tpu_session.cleanup()
    if leftovers:
        pytest.fail("the test left work on the emulated Ray cluster:\n" + "\n".join(leftovers), pytrace=False)
