"""marin's ``fray.cluster`` (and ``fray.v1.cluster``) on Fray: ``LocalCluster``, ``JobRequest``,
``create_environment``, ``current_cluster``... are Fray's own classes and functions.

>>> from fray.cluster import JobRequest, Entrypoint, create_environment  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray._names import CLUSTER
from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_core import *  # noqa: F403
    from fray_local import LocalCluster, LocalClusterConfig  # noqa: F401

__all__ = sorted(CLUSTER)

__getattr__, __dir__ = lazy_exports(__name__, CLUSTER, __all__)
