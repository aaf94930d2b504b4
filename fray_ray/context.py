"""The job context on Ray: ``run`` is a Ray task, ``create_actor`` a Ray actor.

Example (inside a job, or any process connected to Ray)::

    ctx = fray_job_ctx()                  # a RayJobContext when the current cluster is Ray
    ctx.get(ctx.run(pow, 3, 2))           # 9, computed in a Ray task
    counter = ctx.create_actor(Counter, name="counter", get_if_exists=True)
    ctx.get(counter.incr.remote())
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import ray

from fray_core.context import JobContext, apply_default_jax_platforms
from fray_core.errors import WaitTimeoutError
from fray_core.limits import check_number, check_seconds

__all__ = ["RayJobContext"]


def _as_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``ray.remote`` takes Python functions only: wrap builtins, partials and callable objects."""
    if inspect.isfunction(fn):
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(fn, "__name__", type(fn).__name__)
    return call


def code_paths() -> list[str]:
    """This process's own code directories on ``sys.path``: everything but the interpreter's stdlib and
    site-packages. A test module, a script's folder, the driver's sys.path that a host task put in place."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out: list[str] = []
    for entry in sys.path:
        path = os.path.abspath(entry or os.getcwd())
        real = os.path.realpath(path)
        if path in out or not os.path.isdir(path) or any(real == p or real.startswith(p + os.sep) for p in prefixes):
            continue
        out.append(path)
    return out


def _ship_by_value(obj: Any) -> None:
    """Let Ray pickle ``obj`` by value when its module is the client's own code (a test module, a script's
    directory, a package not installed on the cluster): Ray pickles functions and classes of importable modules
    by reference, and no client path is put on a worker's ``sys.path`` (on another machine it does not exist).
    Inside a Fray job the job's runtime_env already carries that code; by value is then merely redundant."""
    from fray_ray.code import code_root

    module = getattr(obj, "__module__", None) or ""
    top = sys.modules.get(module.split(".")[0])
    if top is None or code_root(module) is None:
        return
    try:
        ray.cloudpickle.register_pickle_by_value(top)
    except (ValueError, AttributeError):  # not a registrable module: Ray pickles it as it always did
        pass


class RayJobContext(JobContext):
    """Tasks and actors on the connected Ray cluster. Actor handles are Ray's own
    (``handle.method.remote(...)`` returns an ``ObjectRef``)."""

    def __init__(
        self,
        namespace: str = "fray",
        non_preemptible_resource: str = "node:__internal_head__",
        ray_options: dict[str, Any] | None = None,
    ) -> None:
        """``ray_options``: Ray options for every task (``num_cpus``, ``memory``, ``runtime_env``...), as
        marin's ``create_job_ctx("ray", **ray_options)``. Tasks that ask for no GPU/TPU get ``JAX_PLATFORMS=cpu``
        unless their ``runtime_env`` sets it."""
        self.namespace = namespace
        self.non_preemptible_resource = non_preemptible_resource
        self._remote_fns: dict[Any, Any] = {}
        self._lock = threading.Lock()
        # No client path on the workers' sys.path (on another machine it does not exist): inside a job, the
        # tasks and actors started here inherit the job's runtime_env, which carries its code (fray_ray.code).
        self._options: dict[str, Any] = {}
        self._task_options = self._merged(ray_options or {})

    def _merged(self, ray_options: dict[str, Any]) -> dict[str, Any]:
        """Task options: the user's, with JAX_PLATFORMS=cpu for CPU-only tasks (a CPU task on a TPU host must
        not take the TPU from the job there)."""
        return apply_default_jax_platforms(dict(ray_options))

    def _remote(self, fn: Callable[..., Any]) -> Any:
        _ship_by_value(fn)
        with self._lock:
            try:
                return self._remote_fns[fn]
            except KeyError:
                remote = self._remote_fns[fn] = ray.remote(_as_function(fn)).options(**self._task_options)
                return remote
            except TypeError:  # unhashable callable
                return ray.remote(_as_function(fn)).options(**self._task_options)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ray.ObjectRef:
        if not callable(fn):
            raise TypeError(f"run: expected a callable, got {fn!r}")
        return self._remote(fn).remote(*args, **kwargs)

    def get(self, futures: Any, timeout: float | None = None) -> Any:
        timeout = check_seconds("get: timeout", timeout)
        is_ref = isinstance(futures, ray.ObjectRef) or (
            isinstance(futures, (list, tuple)) and all(isinstance(f, ray.ObjectRef) for f in futures)
        )
        if not is_ref:
            if isinstance(futures, (list, tuple)):
                return [self.get(f, timeout) for f in futures]
            return futures
        try:
            return ray.get(list(futures) if isinstance(futures, tuple) else futures, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WaitTimeoutError(f"get: not ready after {timeout}s") from None

    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        futures = list(futures)
        timeout = check_seconds("wait: timeout", timeout)
        check_number("wait: num_returns", num_returns, integer=True)
        if not 0 <= num_returns <= len(futures):
            raise ValueError(f"wait: num_returns must be between 0 and {len(futures)}, got {num_returns}")
        if not futures or num_returns == 0:
            return [], futures
        ready, not_ready = ray.wait(futures, num_returns=num_returns, timeout=timeout)
        return list(ready), list(not_ready)

    def put(self, obj: Any) -> ray.ObjectRef:
        return ray.put(obj)

    def create_actor(
        self,
        cls: type,
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        preemptible: bool = True,
        **kwargs: Any,
    ) -> Any:
        opts: dict[str, Any] = {"num_cpus": kwargs.pop("num_cpus", None) or 0, **self._options}
        lifetime = kwargs.pop("lifetime", None)  # marin's option: "detached" outlives this job
        if lifetime is not None:
            opts["lifetime"] = lifetime
        if name is not None:
            opts.update(name=name, namespace=self.namespace, get_if_exists=get_if_exists)
            if not get_if_exists:
                try:
                    ray.get_actor(name, namespace=self.namespace)
                except ValueError:
                    pass
                else:
                    raise ValueError(
                        f"create_actor: an actor named {name!r} exists; pass get_if_exists=True to reuse it"
                    )
        if not preemptible:
            opts["resources"] = {self.non_preemptible_resource: 0.001}
        _ship_by_value(cls)
        return ray.remote(cls).options(**opts).remote(*args, **kwargs)
