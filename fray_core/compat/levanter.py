"""levanter's ``run_on_pod`` family on Fray: same signatures, defaults and return shape, any backend.

A call site changes only its import::

    # from levanter.infra.ray_tpu import run_on_pod
    from fray_core.compat.levanter import run_on_pod

    results = run_on_pod(train_fn, "v4-16", num_slices=2, max_retries_failure=2)
    # one entry per host, in (slice, host) order: [s0/h0, s0/h1, s1/h0, s1/h1]

Each call is one Fray job (``JobRequest`` with ``TpuConfig(tpu_type)`` and ``replicas=num_slices``)
launched on ``current_cluster()`` (or, with ``$RAY_ADDRESS`` set and no cluster chosen, that Ray cluster,
as levanter's ``ray.get`` connected there) and waited for; the shared gang runner does levanter's loop: whole
slices all-or-nothing, one process per host, ``MEGASCALE_*`` set for multislice, every host of every
slice restarted on any failure or preemption, separate budgets (``max_retries_failure=N``: at most N+1
failed attempts; ``max_retries_preemption=N``: at most N+1 preempted ones, as in levanter).

levanter's semantics are kept where a call site can see them:

- a host whose code raises ``TimeoutError`` (or an error that says "timed out", or a ``RayTaskError`` whose
  cause is a ``TimeoutError``) counts as preempted, not failed, as levanter's ``_handle_ray_error`` did: it
  spends the preemption budget (the host's code is wrapped to raise :class:`fray_core.errors.HostPreempted`);
- on Ray (the current cluster is a Ray cluster), a failed run raises ``ray.exceptions.RayTaskError`` made
  also an instance of the user's exception class, with that exception as ``.cause`` (rebuilt from its
  class and message: the remote object itself is not shipped back), as levanter's ``ray.get`` did; it
  carries ``.info`` (the final ``JobInfo``) too. Elsewhere (no Ray) the error is :class:`PodJobError`;
- "preempted too many times" raises a ``RuntimeError`` (:class:`PodJobError`) whose message says
  "TPU job was preempted too many times", as levanter's did.

Differences from levanter, on purpose:

- ``remote_fn`` may be a plain function or a ``@ray.remote`` function; the latter is unwrapped to its
  Python function (``RemoteFunction._function``) without importing ray. Its ``runtime_env`` env_vars/pip
  carry over; ``num_cpus``/``memory``/``resources``/``max_calls`` do not (levanter overrode them for host
  tasks too; every Fray host is a fresh process, which is what ``max_calls=1`` was for).
- Without Ray, failures raise :class:`PodJobError` (a ``RuntimeError`` and a ``fray_core.JobFailedError``,
  with ``.info``). When the user's code failed, the error is also an instance of the user's exception class
  when that class can be found (like Ray's ``RayTaskError(ValueError)``), so ``except ValueError`` keeps
  working; the remote traceback is in the message and in ``.cause``.
- ``run_on_pod_multislice`` returns values (a flat list), not ``ObjectRef``s.
- Interrupting the wait (Ctrl-C) terminates the job, so slices are not held by an orphan.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fray_core import cluster as _cluster_mod
from fray_core.cluster import Cluster, cluster_from_spec, current_cluster
from fray_core.compat.ray_resources import environment_from_runtime_env
from fray_core.errors import HostPreempted, JobFailedError, as_user_exception, loaded_exception_class
from fray_core.request import Entrypoint, JobRequest, ResourceConfig, TpuConfig
from fray_core.status import JobInfo, JobStatus

__all__ = [
    "PodJobError",
    "is_levanter_preemption",
    "run_on_pod",
    "run_on_pod_multislice",
    "run_on_pod_multislice_resumable",
    "run_on_pod_resumable",
    "unwrap_remote_function",
]


class PodJobError(JobFailedError, RuntimeError):
    """A ``run_on_pod*`` job did not succeed. ``.info`` is the final ``JobInfo``; ``.cause`` the last
    attempt's error text (exception and remote traceback of the first host that failed)."""

    #: the preemption budget ran out (levanter: "TPU job was preempted too many times")
    preempted: bool = False

    def __init__(self, message: str, info: JobInfo | None = None, cause: str | None = None) -> None:
        JobFailedError.__init__(self, message, info)
        self.cause = cause

    def __str__(self) -> str:  # not the user's __str__ when this is also an instance of their class
        return str(self.args[0]) if self.args else ""


def unwrap_remote_function(remote_fn: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``(python_function, ray_options)`` for a ``@ray.remote`` function, ``(fn, {})`` for a plain callable.

    Duck-typed on Ray's ``RemoteFunction`` (``_function`` and ``_default_options``), so ray is never
    imported. ``f.bind()`` nodes, ``f.options(...)`` wrappers and actor classes are rejected with a hint.

    >>> unwrap_remote_function(len)
    (<built-in function len>, {})
    """
    kind = type(remote_fn).__name__
    if kind in ("FunctionNode", "ClassNode", "ClassMethodNode"):
        raise ValueError(
            "remote_fn: expected a Ray remote function or a plain function, not a FunctionNode. Don't use bind."
        )
    inner = getattr(remote_fn, "_function", None)
    options = getattr(remote_fn, "_default_options", None)
    if inner is not None and callable(inner) and isinstance(options, dict):
        return inner, dict(options)
    if kind.startswith("ActorClass"):
        raise TypeError(f"remote_fn: expected a function, got the actor class {remote_fn!r}")
    if kind == "FuncWrapper" or (hasattr(remote_fn, "remote") and not callable(remote_fn)):
        raise TypeError(
            "remote_fn: got the result of f.options(...), whose function Ray hides; pass the @ray.remote "
            "function itself (or the plain function)"
        )
    if not callable(remote_fn):
        raise TypeError(f"remote_fn: expected a callable or a @ray.remote function, got {remote_fn!r}")
    return remote_fn, {}


def _validate_num_slices(num_slices: Any) -> int | tuple[int, ...]:
    ok_int = isinstance(num_slices, int) and not isinstance(num_slices, bool) and num_slices > 0
    ok_seq = (
        isinstance(num_slices, (list, tuple))
        and len(num_slices) > 0
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in num_slices)
    )
    if not (ok_int or ok_seq):
        raise ValueError(
            "num_slices must be a positive integer or non-empty list of positive integers, "
            f"but instead it was {num_slices!r}"
        )
    return num_slices if ok_int else tuple(num_slices)


def _budget(name: str, value: Any) -> int:
    # levanter's older defaults were floats (1e6); JobRequest wants ints
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    return value


def _job_name(fn: Callable[..., Any], tpu_type: str) -> str:
    base = getattr(fn, "__name__", None) or type(fn).__name__
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"run-on-pod-{base}-{tpu_type}").strip("-")


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def _user_exception_class(cause: str | None) -> type[BaseException] | None:
    """The class of the user's exception named in an ``Attempt.cause``, if this process has it loaded.

    The last unindented ``Name: message`` line of the traceback names it (module-qualified unless it is a
    builtin or from ``__main__``). Modules are looked up, never imported.
    """
    if not cause:
        return None
    for line in reversed(cause.splitlines()):
        if not line or line[0].isspace():
            continue
        m = _EXC_LINE.match(line)
        if not m:
            continue
        name = m.group(1)
        module, _, qual = name.rpartition(".")
        for mod in [module] if module else ["builtins", "__main__"]:
            cls = loaded_exception_class(mod, qual or name)
            if cls is not None:
                return cls
    return None


def is_levanter_preemption(exc: BaseException) -> bool:
    """levanter's rule: a ``TimeoutError`` (itself, or as a ``RayTaskError``'s cause) or an error whose text
    says "timed out" means the host was preempted.

    >>> is_levanter_preemption(TimeoutError("x")), is_levanter_preemption(ValueError("rpc timed out"))
    (True, True)
    >>> is_levanter_preemption(ValueError("bad input"))
    False
    """
    cause = getattr(exc, "cause", None)
    return isinstance(exc, TimeoutError) or isinstance(cause, TimeoutError) or "timed out" in str(exc)


def _levanter_host(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """What each host runs: ``fn``, with levanter's preemption rule applied to what it raises."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        if is_levanter_preemption(e):
            raise HostPreempted(f"levanter counts this as a preemption: {type(e).__name__}: {e}") from e
        raise


def _rebuild_user_exception(cause: str | None) -> BaseException:
    """The user's exception from an attempt's cause text: its class (when loaded here) with its message."""
    cls = _user_exception_class(cause)
    message = ""
    for line in reversed((cause or "").splitlines()):
        if line and not line[0].isspace() and _EXC_LINE.match(line):
            message = line.partition(": ")[2]
            break
    if cls is not None:
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - an __init__ that wants other arguments
            pass
    return RuntimeError(message or (cause or "the job failed").strip().splitlines()[0])


def _ray_task_error(info: JobInfo, cause: str | None, name: str) -> BaseException | None:
    """levanter's error on Ray: ``RayTaskError(UserError)`` with the user's exception as ``.cause``."""
    rex = sys.modules.get("ray.exceptions")
    if rex is None:
        return None
    user = _rebuild_user_exception(cause)
    err = rex.RayTaskError(name, cause or "", user).as_instanceof_cause()
    err.info = info
    return err


def _uses_ray(cluster: Any) -> bool:
    return type(cluster).__module__.startswith("fray_ray") and "ray" in sys.modules


def _error_for(info: JobInfo) -> PodJobError:
    """The exception a failed job raises, modelled on what levanter raised."""
    last = info.attempts[-1] if info.attempts else None
    cause = last.cause if last else None
    if info.status is JobStatus.STOPPED:
        return PodJobError(f"TPU job {info.job_id} was terminated before it finished", info, cause)
    if last is not None and last.outcome is not None and last.outcome.value == "FAILED":
        # levanter re-raised the remote error itself; keep its type where we can
        message = f"TPU job {info.job_id} failed: {info.error}\n{cause or ''}".rstrip()
        return as_user_exception(PodJobError, _user_exception_class(cause), message, info, cause)
    if info.preemptions and "preempted" in (info.error or ""):
        error = PodJobError(f"TPU job was preempted too many times: {info.error}", info, cause)
        error.preempted = True
        return error
    return PodJobError(f"TPU job {info.job_id} ended {info.status.value}: {info.error or 'no error text'}", info, cause)


_RAY_ADDRESS_CLUSTERS: dict[str, Cluster] = {}
_RAY_ADDRESS_LOCK = threading.Lock()


def _pod_cluster() -> Cluster:
    """``current_cluster()``, except that with ``$RAY_ADDRESS`` set and no cluster chosen (no
    ``using_cluster``/``set_current_cluster``, no ``$FRAY_CLUSTER_SPEC``, not inside Ray) it is that Ray
    cluster: levanter's ``run_on_pod`` called ``ray.get``, which connects there by itself, so a script
    submitted with ``ray job submit`` must not fall back to this machine's simulated slices."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    chosen = (
        _cluster_mod._CURRENT.get() is not None
        or bool(_cluster_mod._GLOBAL)
        or bool(os.environ.get("FRAY_CLUSTER_SPEC", "").strip())
        or _cluster_mod._inside_ray()
    )
    if chosen or not address:
        return current_cluster()
    with _RAY_ADDRESS_LOCK:
        cluster = _RAY_ADDRESS_CLUSTERS.get(address)
        if cluster is None:
            cluster = cluster_from_spec("ray")  # its address is "auto": $RAY_ADDRESS, as ray.init reads it
            _RAY_ADDRESS_CLUSTERS[address] = cluster
        return cluster


def run_on_pod(
    remote_fn: Callable[..., Any],
    tpu_type: str,
    *,
    num_slices: int | Sequence[int] = 1,
    max_retries_preemption: int = 10000,
    max_retries_failure: int = 10,
    runtime_env: dict[str, Any] | None = None,
) -> list[Any]:
    """Run ``remote_fn()`` on every host of ``num_slices`` slices of ``tpu_type`` until it succeeds;
    returns its results, one per host, in (slice, host) order.

    ``num_slices`` may be a list of acceptable counts (``[1, 2]``: the largest that fits wins).
    ``runtime_env`` (marin's later keyword) replaces the ``@ray.remote`` function's own ``runtime_env``;
    its ``env_vars``/``pip``/``uv``/local ``working_dir`` become the job's environment.
    Blocks until the job ends; raises :class:`PodJobError` when a budget is exhausted (on Ray, a failure
    raises ``RayTaskError(UserError)`` as levanter did; see the module docstring).

    >>> run_on_pod(lambda: 1, "v4-16", num_slices=2)  # doctest: +SKIP
    [1, 1, 1, 1]
    """
    counts = _validate_num_slices(num_slices)
    fn, options = unwrap_remote_function(remote_fn)
    if runtime_env is None:
        runtime_env = options.get("runtime_env")
    request = JobRequest(
        name=_job_name(fn, tpu_type),
        entrypoint=Entrypoint(callable=functools.partial(_levanter_host, fn)),
        resources=ResourceConfig(device=TpuConfig(type=tpu_type), replicas=counts),
        environment=environment_from_runtime_env(dict(runtime_env) if runtime_env else None),
        max_retries_preemption=_budget("max_retries_preemption", max_retries_preemption),
        max_retries_failure=_budget("max_retries_failure", max_retries_failure),
    )
    cluster = _pod_cluster()
    job_id = cluster.launch(request)
    try:
        info = cluster.wait(job_id, raise_on_failure=True)
    except JobFailedError as e:
        final = e.info if isinstance(e.info, JobInfo) else cluster.poll(job_id)
        error = _error_for(final)
        if _uses_ray(cluster) and not error.preempted and final.status is not JobStatus.STOPPED:
            ray_error = _ray_task_error(final, error.cause, getattr(fn, "__name__", "remote_fn"))
            if ray_error is not None:
                raise ray_error from None
        raise error from None
    except BaseException:  # Ctrl-C or a timeout around us: do not leave slices held by an orphan job
        with contextlib.suppress(Exception):
            cluster.terminate(job_id)
        raise
    return list(info.result or [])


def run_on_pod_resumable(
    remote_fn: Callable[..., Any],
    tpu_type: str,
    max_retries_preemption: int = 1_000_000,
    max_retries_failure: int = 10,
) -> list[Any]:
    """:func:`run_on_pod` on one slice with levanter's "resumable" defaults (a practically unlimited
    preemption budget). The whole run is retried; resuming from a checkpoint is the function's job.

    >>> run_on_pod_resumable(train, "v4-16", max_retries_failure=2)  # doctest: +SKIP
    """
    return run_on_pod(
        remote_fn,
        tpu_type,
        num_slices=1,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
    )


def run_on_pod_multislice(remote_fn: Callable[..., Any], tpu_type: str, num_slices: int | Sequence[int]) -> list[Any]:
    """One attempt on ``num_slices`` slices (no retries), as levanter's ``run_on_pod_multislice``; returns
    the values, one per host in (slice, host) order (levanter returned ``ObjectRef``s).

    >>> run_on_pod_multislice(train, "v4-16", 2)  # doctest: +SKIP
    """
    return run_on_pod(remote_fn, tpu_type, num_slices=num_slices, max_retries_failure=0, max_retries_preemption=0)


def run_on_pod_multislice_resumable(
    remote_fn: Callable[..., Any],
    tpu_type: str,
    num_slices: int | Sequence[int],
    max_retries_preemption: int = 1_000_000,
    max_retries_failure: int = 10,
) -> list[Any]:
    """:func:`run_on_pod` on ``num_slices`` slices with levanter's "resumable" defaults.

    >>> run_on_pod_multislice_resumable(train, "v4-16", [1, 2], max_retries_failure=1)  # doctest: +SKIP
    """
    return run_on_pod(
        remote_fn,
        tpu_type,
        num_slices=num_slices,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
    )
