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
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fray_core.errors import WaitTimeoutError
from fray_core.limits import check_number, check_seconds

__all__ = ["ActorHandle", "JobContext", "LocalJobContext"]


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
    def __init__(self, handle: ActorHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> cf.Future:
        return self._handle._call(self._name, args, kwargs)

    __call__ = remote


class ActorHandle:
    """A local actor: one instance, its calls serialised on one thread (as Ray runs actor calls)."""

    def __init__(self, instance: Any, name: str | None) -> None:
        self._instance = instance
        self._name = name
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fray-actor-{name or 'anon'}")

    def _call(self, method: str, args: tuple, kwargs: dict) -> cf.Future:
        fn = getattr(self._instance, method)
        return self._executor.submit(fn, *args, **kwargs)

    def __getattr__(self, item: str) -> _ActorMethod:
        if item.startswith("_"):
            raise AttributeError(item)
        if not callable(getattr(self._instance, item, None)):
            raise AttributeError(f"actor of {type(self._instance).__name__} has no method {item!r}")
        return _ActorMethod(self, item)

    def __repr__(self) -> str:
        return f"ActorHandle({type(self._instance).__name__}, name={self._name!r})"


class LocalJobContext(JobContext):
    """Threads in this process: tasks are small and share the job's process."""

    _shared: LocalJobContext | None = None
    _shared_lock = threading.Lock()

    def __init__(self, max_workers: int | None = None) -> None:
        self._pool = cf.ThreadPoolExecutor(
            max_workers=max_workers or max(4, (os.cpu_count() or 1) * 4), thread_name_prefix="fray-task"
        )
        self._actors: dict[str, ActorHandle] = {}
        self._lock = threading.Lock()

    @classmethod
    def shared(cls) -> LocalJobContext:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = LocalJobContext()
            return cls._shared

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future:
        if not callable(fn):
            raise TypeError(f"run: expected a callable, got {fn!r}")
        args = tuple(self._resolve(a) for a in args)
        kwargs = {k: self._resolve(v) for k, v in kwargs.items()}
        return self._pool.submit(fn, *args, **kwargs)

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
    ) -> ActorHandle:
        with self._lock:
            if name is not None and name in self._actors:
                if get_if_exists:
                    return self._actors[name]
                raise ValueError(f"create_actor: an actor named {name!r} exists; pass get_if_exists=True to reuse it")
            handle = ActorHandle(cls(*args, **kwargs), name)
            if name is not None:
                self._actors[name] = handle
            return handle

