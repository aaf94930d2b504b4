"""Ray task options -> Fray ``ResourceConfig`` / ``EnvironmentConfig``, for call sites moving off Ray.

Every Ray option either has a Fray equivalent or raises ``ValueError`` naming the option, the value given
and what is allowed, so a migration never silently drops a requirement::

    >>> resources_from_ray_options(resources={"TPU": 4, "TPU-v4-8-head": 1}).device
    TpuConfig(type='v4-8', topology=None, kind='tpu')
    >>> resources_from_ray_options(num_cpus=0.1, resources={"node:__internal_head__": 0.001}).preemptible
    False
    >>> resources_from_ray_options(num_gpus=2, accelerator_type="A100").device
    GpuConfig(type='A100', count=2, kind='gpu')

| Ray | Fray |
|---|---|
| ``num_cpus=n`` | ``cpu=n`` (default 1, as Ray's) |
| ``memory=bytes`` | ``ram`` (exact bytes; default ``ResourceConfig``'s 4g) |
| ``num_gpus=n`` (+ ``accelerator_type="A100"``) | ``GpuConfig(type, count=n)``; whole GPUs only |
| ``resources={"TPU-v4-8-head": 1}`` (+ ``"TPU": 4``) | ``TpuConfig("v4-8")`` |
| ``resources={"TPU": 4}`` + ``accelerator_type="TPU-V4"`` | the single-host slice with 4 chips: ``TpuConfig("v4-8")`` |
| ``resources={"node:__internal_head__": x}`` / ``{"head_node": 1}`` | ``preemptible=False`` |
| ``max_calls`` | dropped: every Fray host/replica is a fresh process |
| ``runtime_env`` | not a resource: :func:`environment_from_runtime_env` -> ``JobRequest.environment`` |

This module never imports ray.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from typing import Any

from fray_core.request import (
    CpuConfig,
    DeviceConfig,
    EnvironmentConfig,
    GpuConfig,
    ResourceConfig,
    TpuConfig,
    create_environment,
    format_size,
    parse_size,
)
from fray_core.tpu import TPU_CATALOG, TPU_GENERATIONS, TpuSpec, get_tpu_spec, normalize_tpu_type

__all__ = ["HEAD_NODE_RESOURCES", "environment_from_runtime_env", "resources_from_ray_options"]

#: Custom resources that Ray code requests to pin a task to the (non-preemptible) head node.
HEAD_NODE_RESOURCES: frozenset[str] = frozenset({"node:__internal_head__", "head_node", "head"})

_ALLOWED_OPTIONS = "num_cpus, num_gpus, memory, resources, accelerator_type, scheduling_strategy='DEFAULT', max_calls"
_IGNORED_OPTIONS = frozenset({"max_calls"})  # every Fray process is fresh: max_calls=1 is what Fray does anyway
_OPTION_HINTS = {
    "runtime_env": "it is not a resource: pass environment_from_runtime_env(runtime_env) as JobRequest.environment",
    "max_retries": "retries belong to the job: JobRequest(max_retries_failure=..., max_retries_preemption=...)",
    "retry_exceptions": "retries belong to the job: JobRequest(max_retries_failure=...)",
    "placement_group": "gang placement is what TPU slices / ResourceConfig.replicas give; request those instead",
    "label_selector": "Fray places processes by ResourceConfig only; express the need as a device or preemptible=False",
}
_HEAD_KEYS_TEXT = "'node:__internal_head__', 'head_node'"
_ALLOWED_KEYS = (
    f"'TPU', 'TPU-<pod type>-head' (e.g. 'TPU-v4-8-head'), 'accelerator_type:TPU-V4', and head-node pins "
    f"({_HEAD_KEYS_TEXT})"
)


def _number(option: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"ray option {option}={value!r}: expected a number >= {minimum:g}")
    return float(value)


def _tpu_generation(option: str, value: str) -> str:
    """``"TPU-V4"`` -> ``"v4"`` (also ``TPU-V5LITEPOD``, ``TPU-V6E``, ``TPU-V5E``)."""
    raw = value.strip()
    if not raw.upper().startswith("TPU-"):
        raise ValueError(f"ray option {option}={value!r}: not a TPU accelerator type")
    gen = normalize_tpu_type(raw[4:] + "-1").partition("-")[0]
    if gen not in TPU_GENERATIONS:
        allowed = ", ".join(f"TPU-{g.upper()}" for g in TPU_GENERATIONS)
        raise ValueError(f"ray option {option}={value!r}: unknown TPU generation {gen!r}; allowed: {allowed}")
    return gen


def _single_host_slice(generation: str, chips: int, option: str) -> TpuSpec:
    """The one single-host slice of ``generation`` with ``chips`` chips (``v4``, 4 -> ``v4-8``)."""
    fits = [s for s in TPU_CATALOG.values() if s.generation == generation and s.hosts == 1 and s.chips == chips]
    if len(fits) == 1:
        return fits[0]
    singles = [
        f"{s.name} ({s.chips} chips)" for s in TPU_CATALOG.values() if s.generation == generation and s.hosts == 1
    ]
    raise ValueError(
        f"ray option {option}: no single-host {generation} slice has {chips} chips, so the slice type cannot be "
        f"inferred; single-host {generation} slices: {', '.join(singles) or 'none'}. For a host of a multi-host "
        f"slice, add the slice's head resource, e.g. resources={{'TPU-{generation}-16-head': 1}}, or use "
        f"TpuConfig directly"
    )


def _ram(memory: Any) -> str | None:
    if memory is None:
        return None
    nbytes = int(_number("memory", memory))
    pretty = format_size(nbytes)
    return pretty if parse_size(pretty) == nbytes else f"{nbytes}b"


def _check_scheduling_strategy(strategy: Any) -> None:
    if strategy is None or (isinstance(strategy, str) and strategy.upper() == "DEFAULT"):
        return
    kind = strategy if isinstance(strategy, str) else type(strategy).__name__
    if kind == "NodeAffinitySchedulingStrategy":
        hint = (
            "Fray does not pin work to a node; if this pins to the head node so it is not preempted, use "
            "preemptible=False (resources={'node:__internal_head__': 0.001} maps to it)"
        )
    elif kind == "PlacementGroupSchedulingStrategy":
        hint = "gang placement is what TPU slices / ResourceConfig.replicas give; request those instead"
    else:
        hint = "Fray places processes itself; drop the option"
    raise ValueError(
        f"ray option scheduling_strategy={strategy!r}: no Fray equivalent; {hint}. Allowed: None or 'DEFAULT'"
    )


def resources_from_ray_options(
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: float | None = None,
    resources: Mapping[str, float] | None = None,
    accelerator_type: str | None = None,
    *,
    scheduling_strategy: Any = None,
    head_node_resources: Collection[str] = HEAD_NODE_RESOURCES,
    **other_options: Any,
) -> ResourceConfig:
    """The ``ResourceConfig`` that asks for what these Ray task options ask for.

    Takes the keywords of ``@ray.remote(...)`` / ``.options(...)``, so ``resources_from_ray_options(**opts)``
    works on a call site's options dict. ``head_node_resources`` lists the custom resources your cluster
    uses to pin work to the head node (they become ``preemptible=False``). Options without an
    equivalent (custom resources, fractional GPUs, node affinity, ``runtime_env``, ...) raise
    ``ValueError`` naming the option, the value and what is allowed.

    >>> resources_from_ray_options(num_cpus=8, memory=16 * 1024**3)
    ResourceConfig(cpu=8.0, ram='16g', disk='16g', device=CpuConfig(kind='cpu'), replicas=1, preemptible=True, regions=None)
    >>> resources_from_ray_options(resources={"TPU": 4}, accelerator_type="TPU-V5LITEPOD").device.type
    'v5litepod-4'
    """  # noqa: E501 - a doctest output line (ResourceConfig repr) cannot be wrapped
    for key, value in other_options.items():
        if key in _IGNORED_OPTIONS:
            continue
        hint = _OPTION_HINTS.get(key, "it has no Fray ResourceConfig equivalent")
        raise ValueError(f"ray option {key}={value!r}: {hint}. Allowed options: {_ALLOWED_OPTIONS}")
    _check_scheduling_strategy(scheduling_strategy)

    cpu = 1.0 if num_cpus is None else _number("num_cpus", num_cpus)
    ram = _ram(memory)
    if resources is not None and not isinstance(resources, Mapping):
        raise ValueError(f"ray option resources={resources!r}: expected a dict of resource name -> amount")
    res = dict(resources or {})

    # head-node pins -> non-preemptible capacity
    preemptible = True
    for key in [k for k in res if k in head_node_resources]:
        amount = _number(f"resources[{key!r}]", res.pop(key))
        if amount > 0:
            preemptible = False

    # the accelerator, from accelerator_type and/or resources={"accelerator_type:TPU-V4": ...}
    for key in [k for k in res if k.startswith("accelerator_type:")]:
        res.pop(key)
        value = key.partition(":")[2]
        if accelerator_type is not None and accelerator_type.upper() != value.upper():
            raise ValueError(
                f"ray option resources[{key!r}] disagrees with accelerator_type={accelerator_type!r}; give one of them"
            )
        accelerator_type = value
    if accelerator_type is not None and (not isinstance(accelerator_type, str) or not accelerator_type.strip()):
        raise ValueError(f"ray option accelerator_type={accelerator_type!r}: expected e.g. 'TPU-V4' or 'A100'")
    is_tpu_type = accelerator_type is not None and accelerator_type.strip().upper().startswith("TPU")

    tpu_chips = res.pop("TPU", None)
    heads = [k for k in res if re.fullmatch(r"TPU-(.+)-head", k)]
    device: DeviceConfig = CpuConfig()

    if tpu_chips is not None or heads:
        if num_gpus:
            raise ValueError(f"ray options num_gpus={num_gpus!r} and TPU resources together: a job has one device kind")
        if len(heads) > 1:
            raise ValueError(f"ray option resources: {heads} name more than one slice head; give one 'TPU-<type>-head'")
        spec: TpuSpec
        if heads:
            head = heads[0]
            amount = _number(f"resources[{head!r}]", res.pop(head))
            if not 0 < amount <= 1:
                raise ValueError(
                    f"ray option resources[{head!r}]={amount!r}: a slice has one head; allowed: 0 < amount <= 1 "
                    "(for several slices use ResourceConfig(replicas=n))"
                )
            pod_type = re.fullmatch(r"TPU-(.+)-head", head).group(1)  # type: ignore[union-attr]
            try:
                spec = get_tpu_spec(pod_type)
            except ValueError as e:
                raise ValueError(f"ray option resources[{head!r}]: {e}") from None
            if tpu_chips is not None and _number("resources['TPU']", tpu_chips) != spec.chips_per_host:
                raise ValueError(
                    f"ray option resources['TPU']={tpu_chips!r}: a {spec.name} host has {spec.chips_per_host} chips; "
                    f"allowed: {spec.chips_per_host} (or leave 'TPU' out)"
                )
            if is_tpu_type and _tpu_generation("accelerator_type", accelerator_type) != spec.generation:  # type: ignore[arg-type]
                raise ValueError(
                    f"ray option accelerator_type={accelerator_type!r} disagrees with resources[{head!r}] "
                    f"({spec.generation})"
                )
        else:
            chips = _number("resources['TPU']", tpu_chips, minimum=1)
            if chips != int(chips):
                raise ValueError(f"ray option resources['TPU']={tpu_chips!r}: expected a whole number of chips")
            if not is_tpu_type:
                raise ValueError(
                    f"ray option resources['TPU']={tpu_chips!r} alone does not say which TPU: add "
                    "accelerator_type='TPU-V4' (or another generation) or a 'TPU-<type>-head' resource, "
                    "e.g. resources={'TPU': 4, 'TPU-v4-8-head': 1}"
                )
            spec = _single_host_slice(
                _tpu_generation("accelerator_type", accelerator_type), int(chips), f"resources['TPU']={tpu_chips!r}"
            )  # type: ignore[arg-type]
        device = TpuConfig(type=spec.name)
    elif is_tpu_type:
        raise ValueError(
            f"ray option accelerator_type={accelerator_type!r} without resources={{'TPU': n}}: say how many chips, "
            "or use TpuConfig(type=...) directly"
        )
    elif num_gpus:
        count = _number("num_gpus", num_gpus)
        if count != int(count):
            raise ValueError(
                f"ray option num_gpus={num_gpus!r}: Fray allocates whole GPUs; allowed: an int >= 1 (or 0)"
            )
        device = GpuConfig(type=accelerator_type or "auto", count=int(count))
    elif accelerator_type is not None:
        raise ValueError(
            f"ray option accelerator_type={accelerator_type!r} without num_gpus: Fray has no 'on a node with this "
            "GPU but using none' request; allowed: num_gpus >= 1 with it, or drop it"
        )
    elif num_gpus is not None:
        _number("num_gpus", num_gpus)  # 0 is fine: no GPU

    for key, value in res.items():  # anything left has no equivalent
        if key in ("CPU", "GPU", "memory"):
            hint = f"use num_cpus/num_gpus/memory instead of resources[{key!r}]"
        else:
            hint = "Fray has no custom resources"
        raise ValueError(f"ray option resources[{key!r}]={value!r}: {hint}; allowed keys: {_ALLOWED_KEYS}")

    kwargs: dict[str, Any] = {"cpu": cpu, "device": device, "preemptible": preemptible}
    if ram is not None:
        kwargs["ram"] = ram
    return ResourceConfig(**kwargs)


def _packages(key: str, value: Any) -> list[str]:
    if isinstance(value, Mapping):
        value = value.get("packages", [])
    if isinstance(value, str):  # a requirements file
        if not os.path.isfile(value):
            raise ValueError(
                f"runtime_env[{key!r}]={value!r}: expected a list of packages or a requirements file that exists"
            )
        with open(value) as f:
            return [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith(("#", "-"))]
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"runtime_env[{key!r}]={value!r}: expected a list of package specs like ['optax>=0.2']")
    return list(value)


def environment_from_runtime_env(runtime_env: Mapping[str, Any] | None) -> EnvironmentConfig | None:
    """The ``EnvironmentConfig`` for a Ray ``runtime_env`` (``None`` for an empty one).

    ``env_vars`` -> env_vars, ``pip``/``uv`` (a list, ``{"packages": [...]}`` or a requirements file) ->
    pip_packages, ``working_dir`` (a local directory) -> workspace. Ray's private keys (``_ray_commit``)
    are ignored; anything else (``conda``, ``container``, ``py_modules``, remote ``working_dir`` URIs, ...)
    raises ``ValueError``.

    >>> environment_from_runtime_env({"env_vars": {"WANDB_MODE": "offline"}, "pip": ["optax"]})
    EnvironmentConfig(pip_packages=('optax',), env_vars={'WANDB_MODE': 'offline'}, extras=(), workspace=None)
    """
    if not runtime_env:
        return None
    if not isinstance(runtime_env, Mapping):
        raise ValueError(f"runtime_env={runtime_env!r}: expected a dict")
    pip: list[str] = []
    env_vars: dict[str, str] = {}
    workspace: str | None = None
    for key, value in runtime_env.items():
        if key.startswith("_"):
            continue
        if key == "env_vars":
            env_vars.update(dict(value or {}))
        elif key in ("pip", "uv"):
            pip.extend(_packages(key, value))
        elif key == "working_dir":
            if not isinstance(value, str) or "://" in value or not os.path.isdir(value):
                raise ValueError(
                    f"runtime_env['working_dir']={value!r}: only a local directory maps to "
                    "EnvironmentConfig.workspace; allowed: an existing local path"
                )
            workspace = os.path.abspath(value)
        else:
            raise ValueError(
                f"runtime_env[{key!r}]={value!r}: no Fray equivalent; allowed keys: env_vars, pip, uv, working_dir "
                "(install what the job needs in the image, or list the packages in pip_packages)"
            )
    if not (pip or env_vars or workspace):
        return None
    return create_environment(pip_packages=pip, env_vars=env_vars, workspace=workspace)
