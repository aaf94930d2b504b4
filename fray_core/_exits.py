"""How a process ended, in words: ``exited with code 1`` or ``killed by SIGKILL``.

Every place that reports a host's or a command's end uses :func:`describe_exit`, so a host the OOM killer
took reads the same everywhere (a negative return code is how :mod:`subprocess` says "killed by a signal").
"""

from __future__ import annotations

import signal

__all__ = ["describe_exit", "exit_code_text", "signal_name"]


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number the platform does not name.

    >>> signal_name(9), signal_name(15)
    ('SIGKILL', 'SIGTERM')
    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int | None) -> str:
    """A :mod:`subprocess` return code in words.

    >>> describe_exit(1), describe_exit(-9), describe_exit(None)
    ('exited with code 1', 'killed by SIGKILL', 'ended with no exit status')
    """
    if returncode is None:
        return "ended with no exit status"
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exited with code {returncode}"


def exit_code_text(returncode: int) -> str:
    """A command's end for ``CommandFailed``: ``exit code 4``, or ``killed by SIGKILL``.

    >>> exit_code_text(4), exit_code_text(-9)
    ('exit code 4', 'killed by SIGKILL')
    """
    return describe_exit(returncode) if returncode < 0 else f"exit code {returncode}"
