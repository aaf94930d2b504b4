"""Fray's limits on sizes and names, and the checks every public number goes through.

The limits are far above what a real job asks for (the largest multislice runs are a few hundred slices);
they exist so that a typo (``replicas=10**18``, a fleet spec ``v4-16:99999999``, a 20-million-character
name) fails at once, in the caller, with one line that names the field, the value and the limit, instead
of exhausting memory or hanging somewhere inside. ``docs/troubleshooting.md`` lists them.

>>> MAX_REPLICAS, MAX_HOSTS_PER_JOB, MAX_FLEET_SLICES, MAX_NAME_LENGTH, MAX_FAULTS
(10000, 100000, 10000, 1024, 100000)
>>> check_seconds("wait: timeout", 5)
5.0
>>> check_seconds("wait: timeout", float("nan"))
Traceback (most recent call last):
...
ValueError: wait: timeout: expected a finite number of seconds >= 0 (at most 1e+09) or None, got nan
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "MAX_CPUS",
    "MAX_FAULTS",
    "MAX_FLEET_SLICES",
    "MAX_GPUS",
    "MAX_HOSTS_PER_JOB",
    "MAX_NAME_LENGTH",
    "MAX_REPLICAS",
    "MAX_RETRIES",
    "MAX_SECONDS",
    "MIN_POLL_INTERVAL",
    "check_flag",
    "check_name",
    "check_number",
    "check_path",
    "check_seconds",
    "is_finite",
    "sequence_converter",
    "show_number",
    "show_text",
]

#: slices of one TPU job (``ResourceConfig.replicas``), or processes of one CPU/GPU job
MAX_REPLICAS = 10_000
#: host processes of one job: slices times hosts per slice (1,000 x v4-128 is 16,000)
MAX_HOSTS_PER_JOB = 100_000
#: slices of one TPU type in a simulated fleet (``TpuFleet``, ``local?tpu=v4-16:N``)
MAX_FLEET_SLICES = 10_000
#: characters of a job or session name (``JobRequest.name``, ``hold(name=...)``)
MAX_NAME_LENGTH = 1024
#: any duration or timeout, in seconds (~31 years): above it, a typo; it also keeps deadlines representable
MAX_SECONDS = 1e9
#: the shortest ``RetryPolicy.poll_interval``: shorter only spins a core
MIN_POLL_INTERVAL = 0.01
#: a retry budget (``JobRequest.max_retries_failure``/``max_retries_preemption``): a million attempts is no
#: real job's; above it, a typo (and a record holds it as a number: records.MAX_INT_DIGITS)
MAX_RETRIES = 1_000_000
#: CPUs of one process (``ResourceConfig.cpu``): the largest machines have a few thousand hardware threads, and a
#: process (a Ray bundle) is on one machine; above it, a typo that no backend could place
MAX_CPUS = 100_000
#: GPUs of one process (``GpuConfig.count``): the largest machines have 16 (DGX-2, HGX-2), a process is on one
#: machine; above it, a typo (the local backend would ask for that many devices, Ray for a bundle none can hold)
MAX_GPUS = 1024
#: faults of one ``FaultPlan``, and the draws of ``FaultPlan.chaos`` (``attempts x max_slices``, each a possible
#: preemption): chaos on 1,000 slices over 100 attempts is 100,000 (~2 s to build at rate 1), more than any test
#: lives through (a fault ends an attempt). Above it, a typo: 100,000 x 10,000 draws took 90 s, and
#: ``fray sim --preemptions 1000000`` built and listed a million faults before its first attempt
MAX_FAULTS = 100_000


def is_finite(value: int | float) -> bool:
    """``math.isfinite`` that never raises: an int too large for a float (``10**400``) is out of range, so
    not finite here, instead of an ``OverflowError: int too large to convert to float``.

    >>> is_finite(10**400), is_finite(float("nan")), is_finite(3)
    (False, False, True)
    """
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def show_number(value: Any) -> str:
    """``repr(value)`` for an error message, except that an int of 30 digits or more is shown by its number
    of digits (``repr`` of a 5,000-digit int raises, and a 400-digit one hides the rest of the message).

    >>> show_number(1.5), show_number(10**400)
    ('1.5', 'an int of 401 digits')
    """
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) < 10**30:
        return repr(value)
    try:
        digits = len(str(abs(value)))
    except ValueError:  # above sys.get_int_max_str_digits(): str() refuses, log10 does not
        return f"an int of about {int(math.log10(abs(value))) + 1:,} digits"
    return f"an int of {digits:,} digits"


def show_text(value: str, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut when longer than ``limit``: a message names the value, it does
    not repeat 5,000 characters.

    >>> show_text("v4-16"), show_text("x" * 100)
    ("'v4-16'", "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (100 characters)")
    """
    return repr(value) if len(value) <= limit else f"{value[:40]!r}... ({len(value):,} characters)"


def _bound(limit: float) -> str:
    # an int bound exactly (a step's 9999999999999999999 is not "1e+19"); small ones as ever
    return f"{limit:,}" if isinstance(limit, int) and abs(limit) >= 10**6 else f"{limit:g}"


def check_number(
    field: str,
    value: Any,
    *,
    minimum: float = 0.0,
    exclusive: bool = False,
    maximum: float | None = None,
    integer: bool = False,
    unit: str = "",
    allow_none: bool = False,
) -> Any:
    """``value`` if it is a number (an int when ``integer``; never a bool or a str), finite and within
    ``[minimum, maximum]`` (``(minimum, maximum]`` when ``exclusive``); else a TypeError (wrong type) or a
    ValueError (NaN, infinite, out of range) that names ``field``, the value and what is allowed.

    >>> check_number("RetryPolicy.backoff_multiplier", 2, minimum=1)
    2
    >>> check_number("JobRequest.max_retries_failure", True, integer=True)
    Traceback (most recent call last):
    ...
    TypeError: JobRequest.max_retries_failure: expected an int >= 0, got True
    """
    kind = "an int" if integer else f"a finite number{' of ' + unit if unit else ''}"
    allowed = f"{kind} {'>' if exclusive else '>='} {minimum:g}"
    if maximum is not None:
        allowed += f" (at most {_bound(maximum)})"
    if allow_none:
        allowed += " or None"
    if value is None and allow_none:
        return None
    types: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, types):
        raise TypeError(f"{field}: expected {allowed}, got {value!r}")
    if (
        not is_finite(value)
        or (value <= minimum if exclusive else value < minimum)
        or (maximum is not None and value > maximum)
    ):
        raise ValueError(f"{field}: expected {allowed}, got {show_number(value)}")
    return value


def check_seconds(field: str, value: Any, *, positive: bool = False, allow_none: bool = True) -> float | None:
    """A timeout or a duration: a finite number of seconds >= 0 (> 0 when ``positive``), at most
    :data:`MAX_SECONDS`; ``None`` (no limit) when ``allow_none``. Returned as a float.

    >>> check_seconds("hold: timeout", None), check_seconds("hold: timeout", 0.5, positive=True)
    (None, 0.5)
    """
    checked = check_number(
        field, value, minimum=0.0, exclusive=positive, maximum=MAX_SECONDS, unit="seconds", allow_none=allow_none
    )
    return None if checked is None else float(checked)


def check_flag(field: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``; else a TypeError naming ``field``: a truthy string such as
    ``"no"`` would otherwise turn a setting on.

    >>> check_flag("FailHost.crash", "yes")
    Traceback (most recent call last):
    ...
    TypeError: FailHost.crash: expected True or False, got 'yes'
    """
    if not isinstance(value, bool):
        raise TypeError(f"{field}: expected True or False, got {value!r}")
    return value


def check_path(field: str, value: Any, what: str = "a directory path") -> str | None:
    """A path given as a str or an ``os.PathLike`` (returned as a str), or ``None``; else a TypeError naming
    ``field`` (an int reached ``str.rstrip`` or ``os.path.join`` deep inside, far from the caller), or a
    ValueError for an empty one or one with a NUL byte (no file name holds one).

    >>> check_path("LocalCluster.jobs_dir", 5)
    Traceback (most recent call last):
    ...
    TypeError: LocalCluster.jobs_dir: expected a directory path (str) or None, got 5
    """
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{field}: expected {what} (str) or None, got {value!r}")
    if not value or "\0" in value:
        raise ValueError(
            f"{field}: expected {what} (a non-empty str without NUL bytes) or None, got {show_text(value)}"
        )
    return value


def sequence_converter(
    field: str, what: str, example: str, limit: int | None = None
) -> Callable[[Any], tuple[Any, ...]]:
    """A converter to a tuple that refuses a lone string (``tuple("hello")`` would split it into letters) and
    what is not a sequence, naming ``field``; ``None`` is ``()``. With ``limit``, more than ``limit`` items is
    a ValueError, found after reading ``limit + 1`` of them (an endless generator is not read to its end).

    >>> sequence_converter("FaultPlan.faults", "faults", "[PreemptSlice(attempt=0)]", limit=2)(range(10**9))
    Traceback (most recent call last):
    ...
    ValueError: FaultPlan.faults: at most 2 faults allowed, got 1,000,000,000
    """

    def convert(value: Any) -> tuple[Any, ...]:
        if value is None:
            return ()
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{field}: expected a list of {what}, got the string {value!r} (write {example})")
        if isinstance(value, Mapping) or not isinstance(value, Iterable):
            raise TypeError(f"{field}: expected a list of {what}, got {value!r}")
        if limit is None:
            return tuple(value)
        items = tuple(itertools.islice(value, limit + 1))
        if len(items) > limit:
            try:
                got = f"{len(value):,}"
            except (TypeError, OverflowError):  # a generator has no length; range(10**30) one len() refuses
                got = "more"
            raise ValueError(f"{field}: at most {limit:,} {what} allowed, got {got}")
        return items

    return convert


def check_name(field: str, value: Any) -> str:
    """A job or session name: a non-empty str of at most :data:`MAX_NAME_LENGTH` characters, without NUL
    bytes (other control characters are kept, and shown escaped by the CLI).

    >>> check_name("JobRequest.name", "train")
    'train'
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field}: expected a non-empty str, got {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{field}: at most {MAX_NAME_LENGTH} characters allowed, got {len(value):,} ({value[:40]!r}...)"
        )
    if "\0" in value:  # as a command, an env var or a workspace: no file name or C string holds one
        raise ValueError(f"{field}: a name with a NUL byte is not allowed, got {value!r}")
    return value
