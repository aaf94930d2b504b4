"""fray_ray: the Ray backend.

    from fray_ray import RayCluster
    cluster = RayCluster(address="auto")        # or FRAY_CLUSTER_SPEC=ray and current_cluster()

``fray_ray.testing.fake_tpu_cluster({"v4-16": 2})`` starts an emulated multi-node TPU cluster on one machine.
Submodules load on first use, so ``import fray_ray`` does not import ray by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_ray.cluster import DEFAULT_RAY_POLICY, RayCluster
    from fray_ray.context import RayJobContext
    from fray_ray.provider import RaySliceProvider

__all__ = ["DEFAULT_RAY_POLICY", "RayCluster", "RayJobContext", "RaySliceProvider"]

_LAZY = {
    "DEFAULT_RAY_POLICY": "fray_ray.cluster",
    "RayCluster": "fray_ray.cluster",
    "RayJobContext": "fray_ray.context",
    "RaySliceProvider": "fray_ray.provider",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
