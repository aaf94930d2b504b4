"""fray_local: the local backend. Jobs run in real subprocesses; TPU slices come from a simulated fleet.

    from fray_local import LocalCluster, TpuFleet, FaultPlan, PreemptSlice

    fleet = TpuFleet({"v4-16": 2}, fault_plan=FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=1.0)]))
    cluster = LocalCluster(fleet=fleet)

This package never imports ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_core.fleet import DirtyHost, DropCapacity, FailHost, Fault, FaultPlan, HostHealth, PreemptSlice
    from fray_local.cluster import DEFAULT_LOCAL_POLICY, LocalCluster, LocalClusterConfig
    from fray_local.fleet import TpuFleet, parse_fleet

__all__ = [
    "DEFAULT_LOCAL_POLICY",
    "DirtyHost",
    "DropCapacity",
    "FailHost",
    "Fault",
    "FaultPlan",
    "HostHealth",
    "LocalCluster",
    "LocalClusterConfig",
    "PreemptSlice",
    "TpuFleet",
    "parse_fleet",
]

# Loaded on first use (PEP 562): `import fray_local` stays cheap and never imports ray.
_LAZY = {name: "fray_local.cluster" for name in ("DEFAULT_LOCAL_POLICY", "LocalCluster", "LocalClusterConfig")}
_LAZY.update({name: "fray_local.fleet" for name in ("TpuFleet", "parse_fleet")})
_LAZY.update({name: "fray_core.fleet" for name in __all__ if name not in _LAZY})  # the one fault vocabulary


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
