"""``@job``: a function that runs as a Fray job on ``current_cluster()`` when called.

::

    from fray_core import job

    @job(tpu="v4-16", slices=2, max_retries_preemption=10, max_retries_failure=1)
    def train(steps: int) -> float: ...

    train(100)            # a job on current_cluster(); blocks; the per-host results in (slice, host) order
    train.launch(100)     # the JobId, at once
    train.local(100)      # the plain function, in this process

Every argument is checked when the function is decorated (the ``ResourceConfig`` and ``JobRequest`` are built
then), so a typo fails at import time, not at the first call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

import attrs

from fray_core.request import Entrypoint, EnvironmentConfig, JobRequest, ResourceConfig, TpuConfig
from fray_core.status import JobId

__all__ = ["JobFunction", "job"]

R = TypeVar("R")

_DEFAULT_PREEMPTION = attrs.fields(JobRequest).max_retries_preemption.default
_DEFAULT_FAILURE = attrs.fields(JobRequest).max_retries_failure.default


def _called_with_arguments() -> None:
    """The entrypoint of a job function's request template, replaced by every call."""


_TEMPLATE_ENTRYPOINT = Entrypoint(callable=_called_with_arguments)


class JobFunction(Generic[R]):
    """A function decorated with :func:`job`. Calling it runs it as a job; ``launch`` starts one;
    ``local`` calls the plain function. ``request`` is the validated template of every job it launches
    (each call puts the function and its arguments in its ``entrypoint``, and fails in the caller when the
    function cannot take them).

    >>> @job(tpu="v4-16", slices=2)
    ... def hello() -> str:
    ...     return "hi"
    >>> hello.request.resources.replicas, hello.local()
    (2, 'hi')
    """

    def __init__(self, fn: Callable[..., R], request: JobRequest) -> None:
        self._fn = fn
        self.request = request
        functools.update_wrapper(self, fn)

    def _request(self, args: Sequence[Any], kwargs: dict[str, Any]) -> JobRequest:
        # The plain function is shipped (cloudpickle pickles it by value: its module attribute is this wrapper,
        # so the job's processes never launch a job of their own when they call it).
        return attrs.evolve(self.request, entrypoint=Entrypoint.from_callable(self._fn, args=args, kwargs=kwargs))

    def launch(self, *args: Any, **kwargs: Any) -> JobId:
        """Start ``fn(*args, **kwargs)`` as a job on ``current_cluster()``; returns its id at once.

        >>> job_id = train.launch(100)  # doctest: +SKIP
        """
        from fray_core.cluster import current_cluster

        return current_cluster().launch(self._request(args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> list[R]:
        """Run ``fn(*args, **kwargs)`` as a job on ``current_cluster()`` and wait for it: one result per
        process, in (slice, host) order. Raises :class:`~fray_core.errors.JobFailedError` when the job ends
        FAILED or STOPPED (its ``info`` has the attempts and the first failed host's traceback)."""
        from fray_core.cluster import current_cluster

        cluster = current_cluster()
        job_id = cluster.launch(self._request(args, kwargs))
        cluster.wait(job_id, raise_on_failure=True)
        return cluster.result(job_id)

    def local(self, *args: Any, **kwargs: Any) -> R:
        """The plain function, called in this process (no job, no cluster)."""
        return self._fn(*args, **kwargs)

    @property
    def __fray_host_callable__(self) -> Callable[..., R]:
        """What runs on a host when this is sent to a held session: the plain function, not a job of its own."""
        return self._fn

    def __repr__(self) -> str:
        return f"<fray job {getattr(self._fn, '__module__', '?')}.{getattr(self._fn, '__qualname__', '?')}>"


def _resources(tpu: str | None, slices: int | Sequence[int] | None, resources: ResourceConfig | None) -> ResourceConfig:
    if resources is not None:
        if tpu is not None or slices is not None:
            raise ValueError(
                f"job: give either tpu=/slices= or resources=, not both (got tpu={tpu!r}, slices={slices!r}, "
                f"resources={resources!r})"
            )
        if not isinstance(resources, ResourceConfig):
            raise TypeError(f"job: resources: expected a ResourceConfig, got {resources!r}")
        return resources
    if tpu is None:
        if slices is not None:
            raise ValueError(
                f"job: slices={slices!r} needs tpu=... (for CPU/GPU processes use resources=ResourceConfig(replicas=N))"
            )
        return ResourceConfig()
    if not isinstance(tpu, str):
        raise TypeError(f"job: tpu: expected a TPU type like 'v4-16', got {tpu!r}")
    if isinstance(slices, (list, tuple)):
        slices = tuple(slices)
    return ResourceConfig(device=TpuConfig(type=tpu), replicas=1 if slices is None else slices)


@overload
def job(fn: Callable[..., R], /) -> JobFunction[R]: ...


@overload
def job(
    *,
    tpu: str | None = ...,
    slices: int | Sequence[int] | None = ...,
    resources: ResourceConfig | None = ...,
    name: str | None = ...,
    environment: EnvironmentConfig | None = ...,
    max_retries_preemption: int = ...,
    max_retries_failure: int = ...,
) -> Callable[[Callable[..., R]], JobFunction[R]]: ...


def job(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    tpu: str | None = None,
    slices: int | Sequence[int] | None = None,
    resources: ResourceConfig | None = None,
    name: str | None = None,
    environment: EnvironmentConfig | None = None,
    max_retries_preemption: int = _DEFAULT_PREEMPTION,
    max_retries_failure: int = _DEFAULT_FAILURE,
) -> Any:
    """Make ``fn`` a Fray job: ``fn(...)`` runs it on every host of its resources and returns the results.

    - ``tpu="v4-16", slices=2`` (an int, or a list of acceptable counts such as ``[1, 2]``), or
      ``resources=ResourceConfig(...)`` for anything else (CPU/GPU gangs); neither: one CPU process.
    - ``name`` (default: the function's name), ``environment``, ``max_retries_preemption``,
      ``max_retries_failure``: the :class:`~fray_core.types.JobRequest` fields.

    Bad arguments raise here, naming the field, the value and what is allowed.

    >>> @job(tpu="v4-16", slices=2, max_retries_preemption=10, max_retries_failure=1)
    ... def train(steps: int) -> int:
    ...     return steps
    >>> train.local(3)
    3
    """

    res = _resources(tpu, slices, resources)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"job: name: expected a str, got {name!r}")

    def decorate(f: Callable[..., Any]) -> JobFunction[Any]:
        if isinstance(f, JobFunction):
            raise TypeError(f"job: {f!r} is already a job function; decorate the plain function once")
        if not callable(f):
            raise TypeError(f"job: expected a function to decorate, got {f!r}")
        request = JobRequest(
            name=name if name is not None else getattr(f, "__name__", "job"),
            entrypoint=_TEMPLATE_ENTRYPOINT,  # each call fills in the function and its arguments
            resources=res,
            environment=environment,
            max_retries_preemption=max_retries_preemption,
            max_retries_failure=max_retries_failure,
        )
        return JobFunction(f, request)

    # Validate the request fields now, even before a function is given (``job(max_retries_failure=-1)``).
    JobRequest(
        name=name if name is not None else "job",
        entrypoint=_TEMPLATE_ENTRYPOINT,
        resources=res,
        environment=environment,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
    )
    if fn is not None:
        return decorate(fn)
    return decorate
