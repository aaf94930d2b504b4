"""How a host runs a callable entrypoint, written once for every backend's host process.

``sys.exit()`` and ``sys.exit(0)`` in the user's function end the host successfully (its result is
``None``); ``sys.exit(3)`` is a failure with that exit code, ``sys.exit("message")`` one with exit code 1
and the message. A backend turns :class:`EntrypointExit` into its own failure (the local host writes it to
its result file, a Ray host raises it to the supervisor)::

    try:
        value = call_entrypoint(fn, args, kwargs)
    except EntrypointExit as e:
        fail(e.exit_code, f"{e} on {where}")

Standard library only: a host imports it before the user's code runs, on the critical path of every start.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["EntrypointExit", "call_entrypoint"]


class EntrypointExit(Exception):
    """The entrypoint called ``sys.exit()`` with a failing code: ``exit_code`` and, in ``traceback``, where.

    >>> str(EntrypointExit(3, "boom"))
    'the entrypoint called sys.exit() with exit code 3'
    """

    def __init__(self, code: object, tb: str = "") -> None:
        self.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else 1
        what = f"exit code {code}" if isinstance(code, int) and not isinstance(code, bool) else f"exit code 1: {code}"
        super().__init__(f"the entrypoint called sys.exit() with {what}")
        self.traceback = tb

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.exit_code, str(self), self.traceback))


def _rebuild(code: int, message: str, tb: str) -> EntrypointExit:
    e = EntrypointExit(code, tb)
    e.args = (message,)
    return e


def call_entrypoint(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Any:
    """``fn(*args, **kwargs)`` as a host runs it: its value, ``None`` after ``sys.exit()``/``sys.exit(0)``,
    :class:`EntrypointExit` after a failing ``sys.exit``; any other exception propagates as it is.

    >>> call_entrypoint(pow, (2, 5))
    32
    >>> import sys
    >>> call_entrypoint(sys.exit, (0,)) is None
    True
    >>> call_entrypoint(sys.exit, ("bad input",))
    Traceback (most recent call last):
    ...
    fray_core.hostrun.EntrypointExit: the entrypoint called sys.exit() with exit code 1: bad input
    """
    try:
        return fn(*args, **dict(kwargs or {}))
    except SystemExit as e:  # the user's function (or a SIGTERM handler) called sys.exit(): its code decides
        if e.code is None or e.code == 0:
            return None
        raise EntrypointExit(e.code, traceback.format_exc()) from e
