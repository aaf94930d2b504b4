"""marin's ``fray.v1``: the same modules as ``fray`` (``fray.v1.cluster`` is ``fray.cluster``'s code,
``fray.v1.job`` is ``fray.job``'s), so marin code written against ``fray.v1`` imports unchanged.

>>> from fray.v1.cluster import JobRequest  # doctest: +SKIP
"""

from __future__ import annotations

import os

from fray._names import TOP
from fray_core._lazy import lazy_exports

# fray.v1.X loads fray/X (its own module object; every class in it is Fray's, so identity is shared)
__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

__all__ = sorted(TOP)

__getattr__, __dir__ = lazy_exports(__name__, TOP, __all__)
