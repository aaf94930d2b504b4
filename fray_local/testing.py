"""Pytest fixtures for testing TPU code without TPUs (registered as a pytest plugin by the package).

    def test_train_survives_preemption(local_cluster, tpu_fleet):
        job_id = local_cluster.launch(request)
        tpu_fleet.model.preempt("v4-16-0")
        assert local_cluster.wait(job_id, timeout=60).status == JobStatus.SUCCEEDED

Fixtures:
- ``tpu_fleet``: a fresh ``TpuFleet({"v4-16": 2, "v5litepod-4": 2})`` (override ``fray_fleet_capacity``
  to change it).
- ``local_cluster``: a ``LocalCluster`` on that fleet with its own jobs dir and a short retry backoff,
  installed as ``current_cluster()`` for the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fray_core.cluster import using_cluster
from fray_core.runner import RetryPolicy
from fray_local.cluster import LocalCluster
from fray_local.fleet import TpuFleet

#: a retry policy for tests: quick backoff, quick capacity deadline
TEST_POLICY = RetryPolicy(
    backoff_initial=0.05, backoff_max=0.2, schedule_timeout=30.0, poll_interval=0.1, cancel_grace=5.0
)


@pytest.fixture
def fray_fleet_capacity() -> dict[str, int]:
    """The capacity of ``tpu_fleet``; override this fixture in a test module to change it."""
    return {"v4-16": 2, "v5litepod-4": 2}


@pytest.fixture
def tpu_fleet(fray_fleet_capacity: dict[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TpuFleet]:
    fleet = TpuFleet(fray_fleet_capacity, state_dir=str(tmp_path_factory.mktemp("fleet")))
    yield fleet
    fleet.close()


@pytest.fixture
def local_cluster(tpu_fleet: TpuFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(fleet=tpu_fleet, jobs_dir=str(tmp_path_factory.mktemp("jobs")), retry_policy=TEST_POLICY)
    with using_cluster(cluster):
        yield cluster
    cluster.close()
