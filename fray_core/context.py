"""The job context: small tasks and actors from inside a job (or anywhere), on the current backend.

``fray_job_ctx()`` (in ``fray_core.cluster``: it asks the current cluster) returns the backend's context;
this module holds the contract and the local, thread-based implementation, and imports no other part of
fray_core but its errors.

Example::

    from fray_core import fray_job_ctx

    ctx = fray_job_ctx()
    fut = ctx.run(pow, 3, 2)
    assert ctx.get(fut) == 9
    counter = ctx.create_actor(Counter, name="counter", get_if_exists=True)
    ctx.get(counter.incr.remote())

marin's kinds of context are here too (``create_job_ctx("sync" | "threadpool" | "ray" | "auto")`` and
``fray_job_ctx(context_type)``, in ``fray_core.cluster``, make them; ``SyncContext`` runs everything in the
calling thread, as tests want)::

    ctx = create_job_ctx("sync")
    assert ctx.get(ctx.run(pow, 3, 2)) == 9     # ran before run() returned
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from fray_core.errors import WaitTimeoutError
from fray_core.limits import check_number, check_seconds

__all__ = [
    "CONTEXT_TYPES",
    "ActorHandle",
    "JobContext",
    "LocalJobContext",
    "SyncActorHandle",
    "SyncContext",
    "ThreadContext",
    "apply_default_jax_platforms",
    "default_job_ctx",
    "fray_default_job_ctx",
]

#: the kinds ``create_job_ctx`` makes (marin's names)
CONTEXT_TYPES = ("sync", "threadpool", "ray", "auto")


class JobContext(abc.ABC):
    """Run small tasks and actors. ``run`` returns a future; ``get`` resolves futures (or lists of them)."""

    @abc.abstractmethod
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as a task; returns a future for ``get``/``wait``."""

    @abc.abstractmethod
    def get(self, futures: Any, timeout: float | None = None) -> Any:
        """The value of a future, or a list of values for a list of futures."""

    @abc.abstractmethod
    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        """``(ready, not_ready)`` once ``num_returns`` futures are done or ``timeout`` passed."""

    @abc.abstractmethod
    def put(self, obj: Any) -> Any:
        """Store ``obj`` once; returns a reference that ``get`` resolves and tasks can take as an argument."""

    @abc.abstractmethod
    def create_actor(
        self,
        cls: type,
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        preemptible: bool = True,
        **kwargs: Any,
    ) -> Any:
        """An actor: an instance of ``cls`` whose method calls ``handle.method.remote(...)`` return futures
        and run one at a time. ``name`` + ``get_if_exists`` returns the existing actor of that name."""


class _ActorMethod:
    def __init__(self, handle: _Actor, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> cf.Future:
        return self._handle._call(self._name, args, kwargs)

    __call__ = remote


class _Actor:
    """An actor in this process: ``handle.method.remote(...)`` returns a future; ``_call`` says how it runs."""

    def __init__(self, instance: Any, name: str | None) -> None:
        self._instance = instance
        self._name = name

    def _call(self, method: str, args: tuple, kwargs: dict) -> cf.Future:
        raise NotImplementedError

    def __getattr__(self, item: str) -> _ActorMethod:
        if item.startswith("_"):
            raise AttributeError(item)
        if not callable(getattr(self._instance, item, None)):
            raise AttributeError(f"actor of {type(self._instance).__name__} has no method {item!r}")
        return _ActorMethod(self, item)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self._instance).__name__}, name={self._name!r})"


class ActorHandle(_Actor):
    """A local actor: one instance, its calls serialised on one thread (as Ray runs actor calls)."""

    def __init__(self, instance: Any, name: str | None) -> None:
        super().__init__(instance, name)
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fray-actor-{name or 'anon'}")

    def _call(self, method: str, args: tuple, kwargs: dict) -> cf.Future:
        fn = getattr(self._instance, method)
        return self._executor.submit(fn, *args, **kwargs)


def _done(fn: Callable[..., Any], args: tuple, kwargs: dict) -> cf.Future:
    """A future already resolved with ``fn(*args, **kwargs)`` (or its exception), run in this thread."""
    fut: cf.Future = cf.Future()
    try:
        fut.set_result(fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - re-raised by get(), as a thread or a Ray task would
        if not isinstance(e, Exception):
            raise
        fut.set_exception(e)
    return fut


class SyncActorHandle(_Actor):
    """An actor of :class:`SyncContext`: ``handle.method.remote(...)`` runs the method before it returns."""

    def _call(self, method: str, args: tuple, kwargs: dict) -> cf.Future:
        return _done(getattr(self._instance, method), args, kwargs)


class _InProcessContext(JobContext):
    """Tasks and actors in this process, as ``concurrent.futures`` futures: ``run``/``get``/``wait``/``put``
    and the actor registry, written once; a subclass says how a task runs (:meth:`_submit`) and what an
    actor is (``_actor_class``)."""

    _actor_class: type[_Actor]

    def __init__(self) -> None:
        self._actors: dict[str, _Actor] = {}
        self._lock = threading.Lock()

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> cf.Future:
        raise NotImplementedError

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future:
        if not callable(fn):
            raise TypeError(f"run: expected a callable, got {fn!r}")
        args = tuple(self._resolve(a) for a in args)
        kwargs = {k: self._resolve(v) for k, v in kwargs.items()}
        return self._submit(fn, args, kwargs)

    @staticmethod
    def _resolve(value: Any) -> Any:
        # Like Ray, a future passed as a top-level argument is resolved before the task runs.
        return value.result() if isinstance(value, cf.Future) else value

    def get(self, futures: Any, timeout: float | None = None) -> Any:
        timeout = check_seconds("get: timeout", timeout)
        if isinstance(futures, (list, tuple)):
            deadline = None if timeout is None else time.monotonic() + timeout
            out = []
            for f in futures:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                out.append(self.get(f, left))
            return out
        if not isinstance(futures, cf.Future):
            return futures
        try:
            return futures.result(timeout=timeout)
        except cf.TimeoutError:
            raise WaitTimeoutError(f"get: not ready after {timeout}s") from None

    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        futures = list(futures)
        timeout = check_seconds("wait: timeout", timeout)
        check_number("wait: num_returns", num_returns, integer=True)
        if not 0 <= num_returns <= len(futures):
            raise ValueError(f"wait: num_returns must be between 0 and {len(futures)}, got {num_returns}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = [f for f in futures if f.done()]
            if len(done) >= num_returns:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            cf.wait([f for f in futures if not f.done()], timeout=left, return_when=cf.FIRST_COMPLETED)
        ready = done[:num_returns] if num_returns else []
        return ready, [f for f in futures if f not in ready]

    def put(self, obj: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        fut.set_result(obj)
        return fut

    def create_actor(
        self,
        cls: type,
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        preemptible: bool = True,
        **kwargs: Any,
    ) -> Any:
        for marin_only in ("lifetime", "num_cpus"):  # accepted for marin's call sites; nothing to place here
            kwargs.pop(marin_only, None)
        with self._lock:
            if name is not None and name in self._actors:
                if get_if_exists:
                    return self._actors[name]
                raise ValueError(f"create_actor: an actor named {name!r} exists; pass get_if_exists=True to reuse it")
            handle = self._actor_class(cls(*args, **kwargs), name)
            if name is not None:
                self._actors[name] = handle
            return handle


class LocalJobContext(_InProcessContext):
    """Threads in this process: tasks are small and share the job's process."""

    _actor_class = ActorHandle
    _shared: LocalJobContext | None = None
    _shared_lock = threading.Lock()

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__()
        self._pool = cf.ThreadPoolExecutor(
            max_workers=max_workers or max(4, (os.cpu_count() or 1) * 4), thread_name_prefix="fray-task"
        )

    @classmethod
    def shared(cls) -> LocalJobContext:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = LocalJobContext()
            return cls._shared

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> cf.Future:
        return self._pool.submit(fn, *args, **kwargs)


#: ``ThreadContext`` is marin's name for the thread-pool context
ThreadContext = LocalJobContext


class SyncContext(_InProcessContext):
    """Everything in the calling thread, at once: ``run`` calls the function before it returns (a failure
    is raised by ``get``, as with the other contexts), ``wait`` never waits. Deterministic: what tests want.

    >>> ctx = SyncContext()
    >>> fut = ctx.run(pow, 2, 10)
    >>> fut.done(), ctx.get(fut)
    (True, 1024)
    """

    _actor_class = SyncActorHandle

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> cf.Future:
        return _done(fn, args, kwargs)


def _requests_accelerator(options: Mapping[str, Any]) -> bool:
    """Ray task options that ask for a GPU or a TPU (then JAX must see it)."""
    gpus = options.get("num_gpus")
    if isinstance(gpus, (int, float)) and gpus > 0 or options.get("accelerator_type"):
        return True
    resources = options.get("resources") or {}
    return any(
        isinstance(n, (int, float)) and n > 0 and str(k).upper().startswith(("TPU", "GPU"))
        for k, n in resources.items()
    )


def apply_default_jax_platforms(options: Mapping[str, Any]) -> dict[str, Any]:
    """Ray task options with ``JAX_PLATFORMS=cpu`` added to ``runtime_env.env_vars`` unless they ask for a
    GPU/TPU or set ``JAX_PLATFORMS`` themselves. A CPU task that lands on a TPU host must not initialise
    the TPU: it would take the device lock from the training job there.

    >>> apply_default_jax_platforms({})["runtime_env"]["env_vars"]
    {'JAX_PLATFORMS': 'cpu'}
    >>> "runtime_env" in apply_default_jax_platforms({"resources": {"TPU": 4}})
    False
    """
    out = dict(options)
    if _requests_accelerator(out):
        return out
    runtime_env = out.get("runtime_env")
    if runtime_env is not None and not isinstance(runtime_env, Mapping):
        return out  # a RuntimeEnv object or similar: leave it alone
    runtime_env = dict(runtime_env or {})
    env_vars = runtime_env.get("env_vars")
    if env_vars is not None and not isinstance(env_vars, Mapping):
        return out
    env_vars = dict(env_vars or {})
    env_vars.setdefault("JAX_PLATFORMS", "cpu")
    runtime_env["env_vars"] = env_vars
    out["runtime_env"] = runtime_env
    return out


_DEFAULT: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("fray_default_job_ctx", default=None)


def default_job_ctx() -> JobContext | None:
    """The context set by :func:`fray_default_job_ctx` here, else ``None``."""
    return _DEFAULT.get()


@contextlib.contextmanager
def fray_default_job_ctx(ctx: JobContext) -> Iterator[JobContext]:
    """Make ``ctx`` what ``fray_job_ctx()`` returns inside the block (marin's name).

    >>> with fray_default_job_ctx(SyncContext()) as ctx:
    ...     default_job_ctx() is ctx
    True
    """
    if not isinstance(ctx, JobContext):
        raise TypeError(f"fray_default_job_ctx: expected a JobContext, got {ctx!r}")
    token = _DEFAULT.set(ctx)
    try:
        yield ctx
    finally:
        _DEFAULT.reset(token)
