"""PEP 562 lazy exports, shared by the packages so that ``import fray_core`` (and fray_local, fray_ray,
fray_core.compat) costs almost nothing: each public name is imported from its submodule on first use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose name ``n`` lives in module ``exports[n]``.

    >>> __getattr__, __dir__ = lazy_exports(  # doctest: +SKIP
    ...     __name__, {"LocalCluster": "fray_local.cluster"}, ["LocalCluster"]
    ... )
    """
    namespace = sys.modules[package].__dict__
    names = sorted(public)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
