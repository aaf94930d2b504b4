"""marin's ``fray.cluster.base``: the same names as :mod:`fray.cluster`."""

from __future__ import annotations

from fray._names import CLUSTER
from fray_core._lazy import lazy_exports

__all__ = sorted(CLUSTER)

__getattr__, __dir__ = lazy_exports(__name__, CLUSTER, __all__)
