"""Threads that are kept for the next piece of work instead of being started for each one.

A supervisor process runs hundreds of jobs, each with a thread of its own and short-lived helpers (a record
written behind the runner). Under a busy GIL a ``Thread.start`` waits until the new thread has run (it
signals an event): measured at 1,600 of 31,000 wall samples of a supervisor taking 200 jobs in a burst
(bench/NOTES.md, issue 29). A :class:`ThreadPool` hands work to a thread that finished its last piece and
waits for more (``keep`` seconds), and starts one only when none is free: never fewer threads than one per
piece of work in flight, so a piece that blocks (a store that hangs) holds up no other.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import traceback
from collections.abc import Callable

__all__ = ["ThreadPool", "shared"]


class ThreadPool:
    """Runs each submitted callable in a thread of its own at once, reusing threads that are idle.

    Unlike ``concurrent.futures.ThreadPoolExecutor`` it has no maximum (work never queues behind other
    work) and its threads are daemons that exit after ``keep`` idle seconds.

    >>> done = threading.Event()
    >>> ThreadPool("example").submit(done.set, name="example-1")
    >>> done.wait(5)
    True
    """

    def __init__(self, name: str, keep: float = 5.0, max_idle: int = 64) -> None:
        self.name = name
        self.keep = keep  # seconds an idle thread waits for work before it exits
        self.max_idle = max_idle  # idle threads kept at most (the rest exit at once)
        self._cv = threading.Condition(threading.Lock())
        self._work: collections.deque[tuple[Callable[[], object], str | None]] = collections.deque()
        self._idle = 0  # threads waiting for work, less the work handed to them and not yet taken
        if hasattr(os, "register_at_fork"):  # a forked child has none of the threads: it starts afresh
            os.register_at_fork(after_in_child=self._forget_threads)

    def _forget_threads(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._work = collections.deque()
        self._idle = 0

    def submit(self, fn: Callable[[], object], name: str | None = None) -> None:
        """Run ``fn()`` in a pool thread (named ``name`` while it runs); what it raises is printed and
        dropped, as a plain thread's would be. Raises ``RuntimeError`` when no thread can be started."""
        with self._cv:
            if self._idle > 0:
                self._idle -= 1
                self._work.append((fn, name))
                self._cv.notify()
                return
        threading.Thread(target=self._main, args=(fn, name), daemon=True, name=name or self.name).start()

    def _main(self, fn: Callable[[], object], name: str | None) -> None:
        me = threading.current_thread()
        while True:
            if name is not None:
                me.name = name
            try:
                fn()
            except BaseException:  # noqa: BLE001 - printed and dropped, as a plain thread's would be
                traceback.print_exc()
            fn = None  # type: ignore[assignment]  # let go of the work (and what it holds) while idle
            me.name = self.name
            with self._cv:
                if self._idle >= self.max_idle:
                    return
                self._idle += 1
                deadline = time.monotonic() + self.keep
                while not self._work:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._idle -= 1
                        return
                    self._cv.wait(left)
                fn, name = self._work.popleft()  # the submitter counted it against the idle threads


_SHARED: ThreadPool | None = None
_SHARED_LOCK = threading.Lock()
SHARED_KEEP = 60.0  # seconds an idle thread of the shared pool waits for work (a supervisor between bursts)


def shared() -> ThreadPool:
    """The process's one pool, for every kind of short or long work (a job's thread, a record written behind,
    an entrypoint pickled): an idle thread takes whatever comes next, so the process keeps one set of idle
    threads, not one per kind.

    >>> shared() is shared()
    True
    """
    global _SHARED
    if _SHARED is None:
        with _SHARED_LOCK:
            if _SHARED is None:
                _SHARED = ThreadPool("fray-idle", keep=SHARED_KEEP)
    return _SHARED
