"""What host code (the job's entrypoint, on every host) calls to talk to the runner: progress and notices.

- :func:`heartbeat`: "this host is making progress" (with the training step, if any). The runner shows the
  last step in ``JobInfo``/``fray status`` and, with ``JobRequest(stall_timeout=...)`` /
  ``startup_timeout=...``, restarts an attempt whose hosts stopped making progress (or never started to).
- :func:`preemption_notice`: the deadline of a pending preemption of this host's slice (epoch seconds), or
  ``None``. At a notice every host of the job also gets SIGTERM; a handler checkpoints before the deadline.

Both are harmless no-ops outside a job (no environment from fray): library code may call them freely.

How they reach the runner is the backend's business: a backend's host runner may install its own
channel with :func:`set_channel`; by default both go through files the backend names in the host's
environment (``FRAY_HEARTBEAT_FILE``: the host writes ``"<epoch seconds> <step>"`` into it;
``FRAY_NOTICE_FILE``: the backend writes the deadline into it), as the local backend does.

Example (in a training loop)::

    import signal, fray_core

    signal.signal(signal.SIGTERM, lambda *_: checkpoint_and_exit())
    for step in range(start, steps):
        train_step()
        fray_core.heartbeat(step)
        if (deadline := fray_core.preemption_notice()) is not None:
            checkpoint_and_exit()            # before `deadline`
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from fray_core.limits import check_number

__all__ = ["heartbeat", "preemption_notice", "set_channel"]

#: the largest training step :func:`heartbeat` takes: the largest int a job's record holds (``10 **
#: records.MAX_INT_DIGITS - 1``, not imported: a host imports none of the supervisor's machinery)
MAX_STEP = 10**19 - 1
#: heartbeats closer together than this are coalesced: the first is written at once, the latest of the others
#: when this much has passed since (so the last step before a hang is the one reported, a second late at most)
MIN_INTERVAL = 1.0

_lock = threading.Lock()
_last_write = 0.0
_pending: tuple[float, int | None] | None = None  # the latest beat held back by MIN_INTERVAL
_flusher: threading.Timer | None = None  # writes it when MIN_INTERVAL has passed
_seq = 0  # beats handed to _write, in call order: an older one never overwrites a newer one
_written = 0
_write_lock = threading.Lock()
_beat_sink: Callable[[float, int | None], None] | None = None
_notice_source: Callable[[], float | None] | None = None


def _after_fork_in_child() -> None:
    """A child forked while the flusher held a lock (its write can take a KV round trip) would block in its
    first heartbeat for good: it starts with fresh locks and nothing held back (its parent writes that)."""
    global _lock, _write_lock, _flusher, _pending
    _lock, _write_lock, _flusher, _pending = threading.Lock(), threading.Lock(), None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def set_channel(
    beat: Callable[[float, int | None], None] | None = None, notice: Callable[[], float | None] | None = None
) -> None:
    """Install a backend's own channel (called by its host runner before the entrypoint runs):
    ``beat(epoch_seconds, step)`` carries a heartbeat, ``notice()`` returns a pending deadline or ``None``.

    >>> set_channel(beat=lambda t, step: None, notice=lambda: None); preemption_notice() is None
    True
    >>> set_channel()          # back to the environment's files
    """
    global _beat_sink, _notice_source, _last_write, _pending, _flusher
    with _lock:
        _beat_sink, _notice_source, _last_write, _pending = beat, notice, 0.0, None
        flusher, _flusher = _flusher, None
    if flusher is not None:
        flusher.cancel()  # a beat held back for the old channel goes nowhere


def heartbeat(step: int | None = None) -> None:
    """Tell the runner this host is making progress (at training step ``step``, if given). Cheap enough
    for every step: writes at most about one heartbeat a second; the latest step is always written, within
    a second. A no-op outside a job.

    >>> heartbeat(1)           # outside a job: nothing happens
    """
    global _last_write, _pending, _flusher, _seq
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"heartbeat(step): expected an int or None, got {step!r}")
    # a record holds ints below 10**19 (records.MAX_INT_DIGITS): a larger step would make the job's record
    # unreadable, so it fails here, in the host's code, like a negative one
    check_number("heartbeat(step)", step, integer=True, maximum=MAX_STEP, allow_none=True)
    if _beat_sink is None and not os.environ.get("FRAY_HEARTBEAT_FILE"):
        return  # outside a job
    now = time.time()
    with _lock:
        if now - _last_write < MIN_INTERVAL:
            _pending = (now, step)  # the latest wins; written by the flusher unless a later beat goes first
            if _flusher is None:
                _flusher = threading.Timer(max(0.0, _last_write + MIN_INTERVAL - now), _flush)
                _flusher.daemon = True
                _flusher.start()
            return
        _last_write, _pending = now, None
        _seq += 1
        seq, sink = _seq, _beat_sink
    _write(seq, sink, now, step)


def _flush() -> None:
    """The flusher's run: write the beat held back, if one still is."""
    global _last_write, _pending, _flusher, _seq
    with _lock:
        _flusher = None
        beat, _pending = _pending, None
        if beat is None:
            return
        _last_write = time.time()
        _seq += 1
        seq, sink = _seq, _beat_sink
    _write(seq, sink, *beat)


def _write(seq: int, sink: Callable[[float, int | None], None] | None, t: float, step: int | None) -> None:
    global _written
    with _write_lock:  # the caller's thread and the flusher: in the order they took their turn
        if seq <= _written:
            return
        _written = seq
        if sink is not None:
            sink(t, step)
            return
        path = os.environ.get("FRAY_HEARTBEAT_FILE")
        if not path:
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(f"{t!r} {'' if step is None else step}")
            os.replace(tmp, path)  # the runner never reads a half-written beat
        except OSError:
            pass  # progress reporting must never fail the job


def preemption_notice() -> float | None:
    """The deadline (epoch seconds) of a pending preemption of this host's slice, else ``None``. Once
    noticed, ``FRAY_PREEMPTION_DEADLINE`` is set in this process's environment too (for its children).

    >>> set_channel(notice=lambda: None)   # as a host runner does; outside a job the environment is read
    >>> preemption_notice() is None          # no notice pending
    True
    >>> set_channel()
    """
    source = _notice_source
    if source is not None:
        deadline = source()
    else:
        deadline = _read_deadline(os.environ.get("FRAY_NOTICE_FILE"))
        if deadline is None:
            deadline = _parse(os.environ.get("FRAY_PREEMPTION_DEADLINE"))
    if deadline is not None:
        os.environ["FRAY_PREEMPTION_DEADLINE"] = repr(deadline)
    return deadline


def read_heartbeat(path: str) -> tuple[float, int | None] | None:
    """For a backend: the ``(epoch seconds, step)`` of the heartbeat file ``path``, ``None`` if none yet."""
    try:
        with open(path) as f:
            t, _, step = f.read().partition(" ")
        return float(t), int(step) if step.strip() else None
    except (OSError, ValueError):
        return None


def write_notice(path: str, deadline: float) -> None:
    """For a backend: deliver a preemption deadline (epoch seconds) to the hosts reading ``path``."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(repr(float(deadline)))
    os.replace(tmp, path)


def _read_deadline(path: str | None) -> float | None:
    if not path:
        return None
    try:
        with open(path) as f:
            return _parse(f.read())
    except OSError:
        return None


def _parse(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
