"""The few marin names that are not one of Fray's own under another import path."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

from fray_core.cluster import Cluster, cluster_from_spec
from fray_core.context import _DEFAULT, JobContext
from fray_core.tpu import get_tpu_spec, tpu_types

__all__ = [
    "TPU_TOPOLOGIES",
    "DeviceKind",
    "GpuType",
    "RayContext",
    "SimpleActor",
    "TpuTopologyInfo",
    "TpuType",
    "create_cluster",
    "get_tpu_topology",
    "set_job_ctx",
]

#: marin's device kinds (``ResourceConfig.device.kind``)
DeviceKind = Literal["cpu", "gpu", "tpu"]
#: every TPU type Fray's catalog knows (marin listed v4, v5litepod, v5p and v6e by hand)
TpuType = Literal[tuple(tpu_types())]  # type: ignore[valid-type]
#: the GPU types marin named; Fray's GpuConfig takes any type string
GpuType = Literal["A10", "A100-40G", "A100-80G", "A10G", "B100", "H100", "H200", "L4", "RTX3090", "T4", "V100", "auto"]


@dataclass(frozen=True)
class TpuTopologyInfo:
    """marin's description of a TPU type: ``chip_count`` chips on ``vm_count`` VMs of ``chips_per_vm``.
    From Fray's catalog; ``host_count`` is ``vm_count`` (marin counted 2 VMs per host for v5litepod-16+).

    >>> get_tpu_topology("v4-32")
    TpuTopologyInfo(name='v4-32', chip_count=16, host_count=4, vm_count=4, chips_per_vm=4)
    """

    name: str
    chip_count: int
    host_count: int
    vm_count: int
    chips_per_vm: int


def get_tpu_topology(tpu_type: str) -> TpuTopologyInfo:
    """marin's ``get_tpu_topology``: the topology of ``tpu_type``; ``ValueError`` (naming the nearest types)
    when it is unknown."""
    spec = get_tpu_spec(tpu_type)
    return TpuTopologyInfo(spec.name, spec.chips, spec.hosts, spec.hosts, spec.chips_per_host)


#: every TPU type's topology, in the catalog's order
TPU_TOPOLOGIES: list[TpuTopologyInfo] = [get_tpu_topology(t) for t in tpu_types()]


def create_cluster(cluster_spec: str) -> Cluster:
    """marin's ``create_cluster("local" | "ray?namespace=x")``: :func:`fray_core.cluster_from_spec`, also
    accepting marin's ``local?use_isolated_env=false`` (``true`` is refused: the local backend installs nothing).

    >>> create_cluster("local?use_isolated_env=false").spec  # doctest: +SKIP
    'local'
    """
    if not isinstance(cluster_spec, str):
        raise TypeError(f"create_cluster: expected a spec string ('local', 'ray?namespace=x'), got {cluster_spec!r}")
    scheme, _, query = cluster_spec.partition("?")
    params = urllib.parse.parse_qsl(query, keep_blank_values=True)
    isolated = [v for k, v in params if k == "use_isolated_env"]
    if isolated:
        if scheme != "local" or any(v.lower() not in ("false", "0", "") for v in isolated):
            raise ValueError(
                f"create_cluster: use_isolated_env={isolated[-1]!r} in {cluster_spec!r} is not supported: the local "
                "backend runs jobs with this Python and installs nothing (the Ray backend installs pip_packages). "
                "Allowed: use_isolated_env=false on 'local'"
            )
        rest = urllib.parse.urlencode([(k, v) for k, v in params if k != "use_isolated_env"])
        cluster_spec = scheme + (f"?{rest}" if rest else "")
    return cluster_from_spec(cluster_spec)


def set_job_ctx(ctx: JobContext | None) -> None:
    """marin's ``set_job_ctx``: make ``ctx`` what ``fray_job_ctx()`` returns from now on in this context
    (``None`` clears it). Prefer the scoped ``with fray_default_job_ctx(ctx):``."""
    if ctx is not None and not isinstance(ctx, JobContext):
        raise TypeError(f"set_job_ctx: expected a JobContext or None, got {ctx!r}")
    _DEFAULT.set(ctx)


def RayContext(ray_options: dict[str, Any] | None = None) -> JobContext:  # noqa: N802 - marin's class name
    """marin's ``RayContext(ray_options)``: Fray's Ray job context (``fray_ray.context.RayJobContext``),
    with ``ray_options`` for every task. Imports ray."""
    from fray_core.cluster import create_job_ctx

    return create_job_ctx("ray", **(ray_options or {}))


class SimpleActor:
    """marin's test actor (kept importable from ``fray.job`` because Ray workers cannot import test modules).

    >>> a = SimpleActor(1); a.increment(2), a.get_value()
    (3, 3)
    """

    def __init__(self, value: int) -> None:
        self.value = value
        self.call_count = 0

    def increment(self, amount: int = 1) -> int:
        self.call_count += 1
        self.value += amount
        return self.value

    def get_value(self) -> int:
        return self.value
