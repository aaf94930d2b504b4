"""marin's ``fray.cluster.ray.tpu`` (and ``fray.v1.cluster.ray.tpu``): levanter's ``run_on_pod`` family on
Fray, with levanter's errors and preemption rules, and every other name marin exports there, so marin's
``levanter.infra.ray_tpu`` (which re-exports this module) and scripts importing from either path run
unchanged. See :mod:`fray.cluster.ray.tpu.execution` for what each name is on Fray.

>>> from fray.cluster.ray.tpu import TPU_CONFIGS, run_on_pod_resumable
>>> [c.vm_count for c in TPU_CONFIGS if c.name == "v4-32"]
[4]
"""

from __future__ import annotations

from typing import Any

from fray.cluster.ray.tpu.config import TPU_CONFIGS, TPUConfig, get_tpu_config
from fray.cluster.ray.tpu.execution import (
    HEALTH_CHECK_TIMEOUT,
    START_ACTOR_TIMEOUT,
    MultisliceInfo,
    ResourcePoolManager,
    SliceActor,
    SliceInfo,
    SlicePoolManager,
    TpuCancelled,
    TpuFailed,
    TPUHostActor,
    TPUHostInfo,
    TpuPreempted,
    TpuRunError,
    TpuSuccess,
    get_current_tpu_is_preempted,
    run_on_pod,
    run_on_pod_multislice,
    run_on_pod_multislice_resumable,
    run_on_pod_resumable,
)

__all__ = [
    "HEALTH_CHECK_TIMEOUT",
    "START_ACTOR_TIMEOUT",
    "TPU_CONFIGS",
    "MultisliceInfo",
    "ResourcePoolManager",
    "SliceActor",
    "SliceInfo",
    "SlicePoolManager",
    "TPUConfig",
    "TPUHostActor",
    "TPUHostInfo",
    "TpuCancelled",
    "TpuFailed",
    "TpuPreempted",
    "TpuRunError",
    "TpuSuccess",
    "get_current_tpu_is_preempted",
    "get_tpu_config",
    "run_on_pod",
    "run_on_pod_multislice",
    "run_on_pod_multislice_resumable",
    "run_on_pod_ray",  # noqa: F822 - built on first use (module __getattr__)
    "run_on_pod_resumable",
]


def __getattr__(name: str) -> Any:
    # run_on_pod_ray needs ray: built on first use (``import fray.cluster.ray.tpu`` stays ray-free)
    if name == "run_on_pod_ray":
        from fray.cluster.ray.tpu import execution

        value = execution.run_on_pod_ray
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
