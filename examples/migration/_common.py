"""Shared by the TPU examples: the cluster to run on.

With ``FRAY_CLUSTER_SPEC`` set (``ray``, ``local?tpu=v4-16:2``, ...) that cluster is used; otherwise a local
cluster with a simulated fleet of two v4-16 slices, so the examples run on a laptop.
"""

from __future__ import annotations

import os

from fray_core import Cluster, current_cluster
from fray_local import FaultPlan, LocalCluster, TpuFleet


def example_cluster(fault_plan: FaultPlan | None = None) -> Cluster:
    """``current_cluster()`` when one is configured, else ``LocalCluster(fleet=TpuFleet({"v4-16": 2}))``."""
    if os.environ.get("FRAY_CLUSTER_SPEC"):
        return current_cluster()
    return LocalCluster(fleet=TpuFleet({"v4-16": 2}, fault_plan=fault_plan))
