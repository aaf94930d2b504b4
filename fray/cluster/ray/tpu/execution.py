"""marin's ``fray.cluster.ray.tpu.execution`` (levanter's ``ray_tpu``, moved into marin) on Fray.

The ``run_on_pod`` family is :mod:`fray_core.compat.levanter`: one Fray job per call, with levanter's
signatures, budgets, errors and preemption rules. ``run_on_pod_ray`` is a Ray remote function that runs
:func:`run_on_pod` in a Ray task, so ``ray.get(run_on_pod_ray.remote(fn, "v4-8"))`` works as in marin.
The result types (``TpuSuccess``...), the slice descriptions (``SliceInfo``...), the timeouts and
``get_current_tpu_is_preempted`` are marin's. The Ray actors that levanter's own loop used to hold slices
(``SliceActor``, ``TPUHostActor``, ``SlicePoolManager``, ``ResourcePoolManager``) are Fray's runner and
providers now: the names import, so a module that re-exports them (marin's ``levanter.infra.ray_tpu``)
loads unchanged, and using one raises ``NotImplementedError`` that says what replaces it.

Importing this module never imports ray; ``run_on_pod_ray`` does, on first use.

>>> from fray.cluster.ray.tpu.execution import run_on_pod_resumable
>>> run_on_pod_resumable(train, "v4-8")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from fray_core.compat.levanter import (
    run_on_pod,
    run_on_pod_multislice,
    run_on_pod_multislice_resumable,
    run_on_pod_resumable,
)

__all__ = [
    "HEALTH_CHECK_TIMEOUT",
    "START_ACTOR_TIMEOUT",
    "MultisliceInfo",
    "ResourcePoolManager",
    "SliceActor",
    "SliceInfo",
    "SlicePoolManager",
    "TPUHostActor",
    "TPUHostInfo",
    "TpuCancelled",
    "TpuFailed",
    "TpuPreempted",
    "TpuRunError",
    "TpuSuccess",
    "get_current_tpu_is_preempted",
    "run_on_pod",
    "run_on_pod_multislice",
    "run_on_pod_multislice_resumable",
    "run_on_pod_ray",  # noqa: F822 - built on first use (module __getattr__)
    "run_on_pod_resumable",
]

# marin's values, kept for code that reads them; Fray's own deadlines are the job's (start_timeout,
# stall_timeout...) and its providers'
HEALTH_CHECK_TIMEOUT = 60
START_ACTOR_TIMEOUT = 7 * 24 * 60 * 60


@dataclass
class SliceInfo:
    """A TPU slice as marin described it to its host tasks. Fray's hosts read ``TPU_NAME``,
    ``FRAY_SLICE_ID`` and ``TPU_WORKER_ID`` instead."""

    slice_name: str
    num_vms: int
    ip_address: str
    num_tpus_per_vm: int


@dataclass
class MultisliceInfo:
    """A slice's place in a multislice run; Fray sets the same ``MEGASCALE_*`` variables from it."""

    coordinator_ip: str
    slice_id: int
    num_slices: int
    port: int = 8081


@dataclass(frozen=True)
class TPUHostInfo:
    """One host of a slice, as marin's host actors reported it."""

    slice_name: str
    worker_index: int
    node_id: str
    num_tpus: int


@dataclass
class _TpuRunResult:
    """What one host's run came to, in marin's vocabulary (Fray's is ``Attempt.outcome``)."""


@dataclass
class TpuSuccess(_TpuRunResult):
    result: object


@dataclass
class TpuPreempted(_TpuRunResult):
    error: Exception


@dataclass
class TpuFailed(_TpuRunResult):
    error: Exception


@dataclass
class TpuRunError(_TpuRunResult):
    error: Exception


@dataclass
class TpuCancelled(_TpuRunResult):
    error: Exception


def get_current_tpu_is_preempted() -> bool:
    """Whether GCE's metadata server says this VM is being preempted (``False`` off GCE), as in marin.

    >>> isinstance(get_current_tpu_is_preempted(), bool)  # doctest: +SKIP
    True
    """
    from fray_ray._host import gce_preempted

    return gce_preempted(timeout=5.0)  # marin's timeout


class _ReplacedByFray:
    """A name of levanter's Ray-actor machinery: it imports, and using it says what Fray does instead."""

    _instead = "Fray's runner holds the slices of a job and restarts every host on a failure"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._refuse()

    @classmethod
    def _refuse(cls) -> NoReturn:
        raise NotImplementedError(
            f"{cls.__name__} is levanter's Ray actor machinery, which Fray replaces: {cls._instead}. "
            "Use run_on_pod* or a JobRequest with ResourceConfig(device=TpuConfig(...), replicas=n) "
            "(docs/migration.md, section 11)"
        )

    @classmethod
    def remote(cls, *args: Any, **kwargs: Any) -> NoReturn:
        cls._refuse()

    @classmethod
    def options(cls, *args: Any, **kwargs: Any) -> NoReturn:
        cls._refuse()


class SliceActor(_ReplacedByFray):
    """levanter's actor holding one slice: Fray's provider reserves the slice (a placement group on Ray)."""

    _instead = "the provider reserves each slice for the job (on Ray, a placement group on its hosts)"


class TPUHostActor(_ReplacedByFray):
    """levanter's actor on one host of a slice: Fray runs one fresh process per host."""

    _instead = "one fresh process per host of the slice, started by the provider"


class ResourcePoolManager(_ReplacedByFray):
    """levanter's base class of actor pools: Fray's runner and providers."""


class SlicePoolManager(ResourcePoolManager):
    """levanter's pool of slice actors (scaling multislice up and down): Fray's runner, which takes the
    largest slice count of ``replicas=[...]`` that fits."""


def _run_on_pod_task(
    remote_fn: Any,
    tpu_type: str,
    num_slices: int | Sequence[int] = 1,
    max_retries_preemption: int = 10000,
    max_retries_failure: int = 10,
    runtime_env: dict[str, Any] | None = None,
) -> list[Any]:
    # inside a Ray task current_cluster() is the Ray cluster the task runs on
    return run_on_pod(
        remote_fn,
        tpu_type,
        num_slices=num_slices,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
        runtime_env=runtime_env,
    )


def _make_run_on_pod_ray() -> Any:
    import ray

    # max_retries=0 (marin: -1): a retried task would launch a second Fray job beside the first, which keeps
    # running without its caller; Fray's job already retries the slices within its budgets
    return ray.remote(num_cpus=0.1, max_retries=0)(_run_on_pod_task)


def __getattr__(name: str) -> Any:
    # run_on_pod_ray is a Ray remote function, so it needs ray: built on first use, not at import
    if name == "run_on_pod_ray":
        value = _make_run_on_pod_ray()
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
