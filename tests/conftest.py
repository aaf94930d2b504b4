"""Shared fixtures. ``fray_local.testing`` (tpu_fleet, local_cluster) is loaded as a pytest plugin."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Never write job records into the developer's real cache from tests."""
    os.environ["FRAY_JOBS_DIR"] = str(tmp_path_factory.mktemp("fray-jobs"))
