"""marin's ``fray.cluster.ray``: ``RayCluster`` is Fray's (``fray_ray.RayCluster``); it imports ray when used.

>>> from fray.cluster.ray import RayCluster  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_ray.cluster import RayCluster

__all__ = ["RayCluster"]

__getattr__, __dir__ = lazy_exports(__name__, {"RayCluster": "fray_ray.cluster"}, __all__)
