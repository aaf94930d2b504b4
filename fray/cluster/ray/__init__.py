"""marin's ``fray.cluster.ray``: ``RayCluster`` is Fray's (``fray_ray.RayCluster``; it imports ray when used),
``as_remote_kwargs`` is :mod:`fray.cluster.ray.resources`'s, and ``fray.cluster.ray.tpu`` holds the
``run_on_pod`` family.

>>> from fray.cluster.ray import RayCluster, as_remote_kwargs  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray.cluster.ray.resources import accelerator_descriptor, as_remote_kwargs
    from fray_ray.cluster import RayCluster

__all__ = ["RayCluster", "accelerator_descriptor", "as_remote_kwargs"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "RayCluster": "fray_ray.cluster",
        "accelerator_descriptor": "fray.cluster.ray.resources",
        "as_remote_kwargs": "fray.cluster.ray.resources",
    },
    __all__,
)
