"""A fake clock: time that moves only when told to, with timers, for tests and simulations.

:class:`FakeClock` drives :class:`~fray_core.runner.GangRunner` (its ``clock``/``wall``/``sleep``), the
fleet model (:class:`~fray_core.fleet.Fleet`) and the in-memory provider of :mod:`fray_core.testing`
without any real waiting. Re-exported by :mod:`fray_core.testing`.

>>> clock = FakeClock()
>>> fired = []
>>> _ = clock.call_later(2.0, fired.append, "timer")
>>> clock.sleep(5.0)
>>> fired, clock.now()
(['timer'], 5.0)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["FakeClock", "HorizonExceeded", "Timer"]


class HorizonExceeded(RuntimeError):
    """The fake clock was asked to move past its ``horizon``: a simulated job never finished."""


class Timer:
    """A callback scheduled on a :class:`FakeClock`; ``cancel()`` stops it from firing."""

    __slots__ = ("_entry",)

    def __init__(self, entry: list[Any]) -> None:
        self._entry = entry

    @property
    def when(self) -> float:
        return float(self._entry[0])

    @property
    def active(self) -> bool:
        return self._entry[2] is not None

    def cancel(self) -> None:
        self._entry[2] = None


class FakeClock:
    """Simulated time: a monotonic clock (``now()`` or calling it) plus a wall clock (``wall()``).

    Time moves only when someone calls :meth:`sleep`, :meth:`advance` or :meth:`advance_to`; callbacks
    scheduled with :meth:`call_at`/:meth:`call_later` run, in time order, as time passes them (the clock
    reads their due time while each one runs). Pass it to ``GangRunner(clock=clock, wall=clock.wall,
    sleep=clock.sleep)``. Not thread-safe: drive it from one thread (the runner's).

    ``horizon``: moving past this time raises :class:`HorizonExceeded` (a guard against a simulated job
    that never ends).

    >>> clock = FakeClock()
    >>> fired = []
    >>> _ = clock.call_later(5.0, fired.append, "restore")
    >>> clock.sleep(2.0); clock()
    2.0
    >>> clock.advance(10.0); fired, clock.now()
    (['restore'], 12.0)
    >>> clock.wall() - clock.now() == FakeClock.WALL_EPOCH
    True
    """

    WALL_EPOCH = 1_700_000_000.0  # what wall() reads at monotonic time 0

    def __init__(self, start: float = 0.0, *, horizon: float | None = None) -> None:
        self._now = float(start)
        self._heap: list[list[Any]] = []  # [time, seq, fn | None, args]
        self._seq = itertools.count()
        self.horizon = horizon

    def now(self) -> float:
        """Monotonic seconds."""
        return self._now

    def __call__(self) -> float:
        return self._now

    def wall(self) -> float:
        """Seconds since the epoch, as ``time.time()`` would read."""
        return self.WALL_EPOCH + self._now

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` at once (running the callbacks due meanwhile)."""
        if seconds < 0:
            raise ValueError(f"FakeClock.sleep: seconds must be >= 0, got {seconds!r}")
        self.advance_to(self._now + seconds)

    def advance(self, seconds: float) -> None:
        """Same as :meth:`sleep`."""
        self.sleep(seconds)

    def advance_to(self, when: float) -> None:
        """Move to ``when`` (never backwards), running every callback due at or before it, in order."""
        heap = self._heap
        while heap and heap[0][0] <= when:
            t, _seq, fn, args = heapq.heappop(heap)
            if fn is None:
                continue
            if t > self._now:
                self._set(t)
            fn(*args)
        if when > self._now:
            self._set(when)

    def _set(self, t: float) -> None:
        if self.horizon is not None and t > self.horizon:
            raise HorizonExceeded(
                f"FakeClock: asked to move to t={t:g}s, past horizon={self.horizon:g}s; the simulated job "
                f"never finished (a host that hangs with nothing to end it, or capacity that never returns?)"
            )
        self._now = t

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run ``fn(*args)`` when time reaches ``when`` (at the next advance if that is already past)."""
        entry = [float(when), next(self._seq), fn, args]
        heapq.heappush(self._heap, entry)
        return Timer(entry)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run ``fn(*args)`` ``delay`` seconds from now."""
        if delay < 0:
            raise ValueError(f"FakeClock.call_later: delay must be >= 0, got {delay!r}")
        return self.call_at(self._now + delay, fn, *args)

    def _push(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        heapq.heappush(self._heap, [when, next(self._seq), fn, args])

    def next_due(self) -> float | None:
        """When the next pending callback is due, or ``None``."""
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
