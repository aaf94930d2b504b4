"""``fray``: marin's import paths on Fray, so a marin call site changes nothing but its install line.

marin's original Fray (``lib/fray`` in marin-community/marin) was imported as ``fray``, ``fray.cluster``,
``fray.job`` and later ``fray.v1``; this package maps those names onto fray_core, fray_local and fray_ray
(no code of its own beyond that mapping)::

    from fray import JobRequest, Entrypoint, ResourceConfig, current_cluster, fray_job_ctx
    from fray.cluster import LocalCluster, create_environment       # fray.v1.cluster is the same
    from fray.job import create_job_ctx, SyncContext                 # fray.v1.job is the same

    cluster = current_cluster()
    job_id = cluster.launch(JobRequest(name="hello", entrypoint=Entrypoint.from_callable(print, args=["hi"])))
    assert cluster.wait(job_id).status == "succeeded"

The classes are Fray's own (``fray.JobRequest is fray_core.JobRequest``); docs/migration.md lists every
marin and levanter name, its Fray equivalent and what differs. ``import fray`` never imports ray.

Not the ``fray`` distribution on PyPI (an unrelated web-security toolkit that also installs a top-level
``fray`` package and a ``fray`` command): the two cannot share an environment; see the README.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray._names import CLUSTER, JOB, TOP
from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_core import *  # noqa: F403
    from fray_local import LocalCluster, LocalClusterConfig  # noqa: F401

__all__ = sorted(TOP)

__getattr__, __dir__ = lazy_exports(__name__, {**CLUSTER, **JOB, **TOP}, __all__)
