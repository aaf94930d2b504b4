"""The error hierarchy: every error Fray raises on purpose is a :class:`FrayError`."""

from __future__ import annotations

import sys
from typing import Any, TypeVar

_E = TypeVar("_E", bound=BaseException)


class FrayError(Exception):
    """Base class of every error Fray raises on purpose."""


class JobNotFoundError(FrayError, KeyError):
    """An unknown job id was given to ``poll``/``terminate``/``logs``/``wait``.

    It is also a ``KeyError`` so ``except KeyError`` call sites keep working.
    """

    def __str__(self) -> str:  # KeyError quotes its argument; keep the plain message
        return str(self.args[0]) if self.args else ""


class UnknownBackendError(FrayError, ValueError):
    """A cluster spec names a backend or an option that does not exist."""


class Unschedulable(FrayError):
    """The requested slices could not be acquired.

    ``permanent`` is True when the request can never fit (e.g. more slices than the fleet has at all),
    in which case the job fails at once instead of retrying.

    ``held`` is True when the capacity exists but other jobs hold it (or it is reserved for an older
    job): the runner then keeps the job PENDING, with no attempt and no budget spent, for as long as it
    takes. False (the default, for a provider that cannot tell) means capacity is missing: after
    ``schedule_timeout`` the attempt ends UNSCHEDULABLE. ``reason`` is a short text for
    ``JobInfo.pending_reason`` (the message when not given).

    >>> e = Unschedulable("asked: 2 x v4-16; fleet has: 0 free, 2 busy, 0 preempted", held=True,
    ...                   reason="queued: 1st for 2 x v4-16; fleet: 0 free, 2 held by job-a")
    >>> e.held, e.permanent, e.reason.split(";")[0]
    (True, False, 'queued: 1st for 2 x v4-16')
    """

    def __init__(self, message: str, *, permanent: bool = False, held: bool = False, reason: str | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.held = held
        self.reason = reason


class JobFailedError(FrayError, RuntimeError):
    """Raised by ``Cluster.wait(..., raise_on_failure=True)`` when a job did not succeed (a ``RuntimeError``, as
    marin's Fray raised)."""

    def __init__(self, message: str, info: object | None = None) -> None:
        super().__init__(message)
        self.info = info


class HostPreempted(FrayError):
    """Raise it from a job's code to say the host was preempted (lost to the infrastructure, not the code's
    fault): the attempt ends PREEMPTED and is retried within ``max_retries_preemption``, on every backend.
    The levanter compat layer raises it for what levanter counted as a preemption (a ``TimeoutError``).

    >>> raise HostPreempted("the TPU runtime timed out")  # doctest: +SKIP
    """


class WaitTimeoutError(FrayError, TimeoutError):
    """A blocking wait reached its deadline."""


class RecordError(FrayError, ValueError):
    """A job's record cannot be read (not JSON, not an object, a field of the wrong type, a directory, a
    symbolic link). Only that job is affected: ``list_jobs()`` lists it as UNKNOWN with this message."""


class ResultUnavailableError(FrayError):
    """A SUCCEEDED job's results cannot be loaded: never stored (``JobInfo.result_error`` says why), damaged,
    of a class that cannot be imported here, or in a job store that is not safe to unpickle from."""


class UnsafeJobsDirError(ResultUnavailableError, PermissionError):
    """Results are not loaded from a jobs dir or job dir that another user owns or could write: unpickling
    a file runs code, as whoever reads it. The message says which dir, why, and how to fix it."""


def loaded_exception_class(module: str, qualname: str) -> type[Exception] | None:
    """The exception class ``module.qualname`` if this process has that module loaded; never imports.

    Used to re-raise a remote error as the user's own type without unpickling anything.
    """
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else None


def as_user_exception(base: type[_E], user_cls: type[BaseException] | None, *args: Any) -> _E:
    """``base(*args)``, made also an instance of ``user_cls`` (so ``except UserError`` catches it) when
    that is possible; plain ``base(*args)`` when there is no such class or the two cannot be combined.

    >>> class Oops(ValueError): ...
    >>> e = as_user_exception(FrayError, Oops, "failed remotely")
    >>> isinstance(e, FrayError) and isinstance(e, Oops), str(e)
    (True, 'failed remotely')
    """
    if user_cls is not None and not issubclass(user_cls, base):
        try:
            combined = type(f"{base.__name__}({user_cls.__name__})", (base, user_cls), {"__module__": base.__module__})
            return combined(*args)
        except Exception:  # layout conflicts, or an __init__ that wants other arguments
            pass
    return base(*args)
