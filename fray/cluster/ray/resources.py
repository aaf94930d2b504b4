"""marin's ``fray.cluster.ray.resources``: ``as_remote_kwargs`` and ``accelerator_descriptor`` for code that
still decorates its own Ray tasks from a Fray ``ResourceConfig``.

>>> from fray_core import ResourceConfig
>>> as_remote_kwargs(ResourceConfig.with_gpu("H100", count=2), env_vars={"A": "1"})
{'num_gpus': 2, 'accelerator_type': 'H100', 'runtime_env': {'env_vars': {'A': '1'}}}
"""

from __future__ import annotations

from typing import Any

from fray_core.types import GpuConfig, ResourceConfig, TpuConfig

__all__ = ["accelerator_descriptor", "as_remote_kwargs"]


def as_remote_kwargs(config: ResourceConfig, env_vars: dict[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``ray.remote(...)`` as marin computed them: a TPU config gives the
    coordinating task 8 CPUs (the slice itself is ``run_on_pod``'s), a GPU config its GPUs (and
    ``accelerator_type`` unless ``"auto"``), anything else 1 CPU; ``env_vars`` become the ``runtime_env``.

    >>> as_remote_kwargs(ResourceConfig())
    {'num_cpus': 1}
    """
    if not isinstance(config, ResourceConfig):
        raise TypeError(f"as_remote_kwargs: config must be a ResourceConfig, got {config!r}")
    device = config.device
    if isinstance(device, TpuConfig):
        out: dict[str, Any] = {"num_cpus": 8}
    elif isinstance(device, GpuConfig):
        out = {"num_gpus": device.count}
        if device.type != "auto":
            out["accelerator_type"] = device.type
    else:
        out = {"num_cpus": 1}
    if env_vars:
        out["runtime_env"] = {"env_vars": dict(env_vars)}
    return out


def accelerator_descriptor(config: ResourceConfig) -> str | None:
    """The accelerator's type (``"v4-8"``, ``"H100"``) for logs and tracking; ``None`` for CPU.

    >>> accelerator_descriptor(ResourceConfig.with_tpu("v4-8"))
    'v4-8'
    """
    device = config.device
    return device.type if isinstance(device, TpuConfig | GpuConfig) else None
