"""marin's ``fray.cluster.ray.tpu.config``: ``TPUConfig``, ``TPU_CONFIGS`` and ``get_tpu_config``, read from
Fray's TPU catalog (:mod:`fray_core.tpu`) so the two never disagree on a slice's chips or hosts.

>>> get_tpu_config("v4-16")
TPUConfig(name='v4-16', chip_count=8, host_count=2, vm_count=2, chips_per_vm=4)
"""

from __future__ import annotations

from dataclasses import dataclass

from fray_core.tpu import get_tpu_spec, tpu_types

__all__ = ["TPU_CONFIGS", "TPUConfig", "get_tpu_config"]


@dataclass(frozen=True)
class TPUConfig:
    """One TPU pod type, with marin's field names: ``chip_count`` chips on ``vm_count`` VMs of
    ``chips_per_vm`` chips each.

    ``host_count`` is ``vm_count``: a VM is what runs one process (Fray's and Ray's "host"). marin's own table
    counted two VMs per physical host for ``v5litepod-16`` and larger, so its ``host_count`` there is half.

    >>> TPUConfig("v4-8", 4, 1, 1, 4).chip_count
    4
    """

    name: str
    chip_count: int
    host_count: int
    vm_count: int
    chips_per_vm: int


def _from_catalog(name: str) -> TPUConfig:
    spec = get_tpu_spec(name)
    return TPUConfig(spec.name, spec.chips, spec.hosts, spec.hosts, spec.chips_per_host)


#: every pod type Fray knows, in the catalog's order (marin listed v4, v5litepod, v5p and v6e)
TPU_CONFIGS: list[TPUConfig] = [_from_catalog(t) for t in tpu_types()]


def get_tpu_config(tpu_type: str) -> TPUConfig:
    """The :class:`TPUConfig` of ``tpu_type``; an unknown type raises ``ValueError`` naming the nearest ones.

    >>> get_tpu_config("v5p-8").chips_per_vm
    4
    """
    return _from_catalog(tpu_type)
