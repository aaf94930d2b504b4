"""Compatibility layers for code moving to Fray from Ray and from levanter's TPU helpers.

- :mod:`fray_core.compat.levanter`: ``run_on_pod``, ``run_on_pod_resumable``, ``run_on_pod_multislice``,
  ``run_on_pod_multislice_resumable`` with levanter's signatures, built on ``JobRequest`` and
  ``current_cluster()``, so a call site changes only its import.
- :mod:`fray_core.compat.ray_resources`: ``resources_from_ray_options(...)`` turns Ray task options
  (``num_cpus``, ``num_gpus``, ``memory``, ``resources={"TPU": 4, "TPU-v4-8-head": 1}``, ...) into a
  ``ResourceConfig``, and ``environment_from_runtime_env(...)`` turns a ``runtime_env`` into an
  ``EnvironmentConfig``.

Example::

    from fray_core.compat import run_on_pod, resources_from_ray_options

    results = run_on_pod(train, "v4-16", num_slices=2)   # one result per host, (slice, host) order
    resources_from_ray_options(resources={"TPU": 4, "TPU-v4-8-head": 1}).device   # TpuConfig("v4-8")

Nothing here imports ray: a ``@ray.remote`` function is recognised by duck typing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_core.compat.levanter import (
        PodJobError,
        is_levanter_preemption,
        run_on_pod,
        run_on_pod_multislice,
        run_on_pod_multislice_resumable,
        run_on_pod_resumable,
        unwrap_remote_function,
    )
    from fray_core.compat.ray_resources import environment_from_runtime_env, resources_from_ray_options

__all__ = [
    "PodJobError",
    "environment_from_runtime_env",
    "is_levanter_preemption",
    "resources_from_ray_options",
    "run_on_pod",
    "run_on_pod_multislice",
    "run_on_pod_multislice_resumable",
    "run_on_pod_resumable",
    "unwrap_remote_function",
]

_LAZY = {
    name: "fray_core.compat.ray_resources" for name in ("environment_from_runtime_env", "resources_from_ray_options")
}
_LAZY.update({name: "fray_core.compat.levanter" for name in __all__ if name not in _LAZY})


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
