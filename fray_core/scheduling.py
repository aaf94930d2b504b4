"""The scheduling policy every backend shares: a fair queue per pool of slices, bad-host quarantine, and
the pending-reason text a waiting job shows.

Backend-neutral and clock-driven: nothing here reads a clock or knows of processes, Ray or the fleet
model; callers pass ``now`` (any monotonic seconds). Two drivers use it:

- :class:`fray_core.fleet.Fleet` (the simulated fleet: in-memory provider, ``fray_local.TpuFleet``);
- ``fray_ray``'s scheduler actor, one per Ray namespace, asked by every job's supervisor before it claims
  slices.

>>> q = FairQueue(ttl=5.0)
>>> q.admit("a", [1], free=2, now=0.0)          # nobody waits: take what is free
1
>>> q.admit("big", [2], free=1, now=0.0) is None  # waits in line, reserving 2
True
>>> q.admit("small", [1], free=1, now=0.0) is None  # the free slice is held for "big"
True
>>> q.members(0.0), q.place("small", 0.0)
(['big', 'small'], 2)
>>> quarantine = Quarantine(after=2)
>>> quarantine.failed("v4-16-3", 1, now=0.0, what="device busy") is None
True
>>> quarantine.failed("v4-16-3", 1, now=600.0, what="device busy")   # quarantined until then
2400.0
>>> quarantine.reason("v4-16-3")
'quarantined: v4-16-3 (device busy twice in 10 min)'
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

from fray_core.limits import MAX_SECONDS, is_finite, show_number

__all__ = ["FairQueue", "Quarantine", "held_by", "ordinal", "pending_reason", "span"]


# ------------------------------------------------------------------------------------------ fair queue


class FairQueue:
    """The holders waiting for slices of one pool (one TPU type), oldest first: first come, first served,
    with reservation and backfill.

    A holder that cannot get slices waits in line (:meth:`admit` returned ``None``) for as long as it keeps
    asking: an entry not renewed for ``ttl`` seconds is dropped (a job that stopped asking, e.g. killed).
    Free slices are reserved for the holders ahead in line (their largest count each: what each takes when
    it fits), so a holder may take ``c`` slices only if ``c <= free - reserved_ahead(holder)``: a younger
    holder gets slices only out of what is left after every older one is served (backfill that delays no
    older waiter). A newcomer costs O(1), a waiter O(its place in line).

    Order is arrival in line, unless a holder says when it came (``since``, e.g. its job's submission
    time): a newcomer with ``since`` goes ahead of the waiters at the back of the line that came later by
    their own ``since`` (never past one without, nor past one admitted with ``keep``: it is claiming what
    it was given, and two holders admitted to the same slices would race for them). So two jobs whose
    requests reach the queue in the other order than they were submitted (on Ray, each job's supervisor
    starts on its own) keep their order.

    >>> q = FairQueue(ttl=5.0)
    >>> q.admit("big", [4], free=1, now=0.0) is None
    True
    >>> q.reserved_ahead("small", now=1.0), q.reserved_ahead("big", now=1.0)
    (4, 0)
    >>> q.members(now=6.0)                          # "big" stopped asking 5 s ago
    []
    """

    __slots__ = ("ttl", "_waiters", "_total", "_next_expiry")

    def __init__(self, ttl: float = 5.0) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ValueError(f"FairQueue: ttl must be seconds > 0, got {ttl!r}")
        self.ttl = float(ttl)
        self._waiters: dict[str, _Waiter] = {}
        self._total = 0  # slices reserved by every waiter
        # a lower bound of every entry's expiry (renewals only move them later): no scan before then
        self._next_expiry = math.inf

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def __len__(self) -> int:
        return len(self._waiters)

    def join(self, holder: str, need: int, now: float, since: float | None = None, admitted: bool = False) -> None:
        """Wait in line for ``need`` slices (or renew the entry: same place, new ``need``) until
        ``now + ttl``; ``since``: when the holder came (see the class doc); ``admitted``: it was given
        ``need`` slices and keeps its place while it claims them (no newcomer passes it)."""
        expires = now + self.ttl
        w = self._waiters.get(holder)
        if w is None:
            passed = self._came_later(since)
            self._waiters[holder] = _Waiter(need, expires, since, admitted)
            self._total += need
            if passed:  # rare (requests reaching the queue out of order): rebuild the line, O(its length)
                items = list(self._waiters.items())
                items.insert(len(items) - 1 - len(passed), items.pop())
                self._waiters = dict(items)
        else:
            self._total += need - w.need
            w.need, w.expires, w.admitted = need, expires, admitted
        self._next_expiry = min(self._next_expiry, expires)

    def _came_later(self, since: float | None) -> list[_Waiter]:
        """The waiters at the back of the line that a newcomer which came at ``since`` goes ahead of."""
        out: list[_Waiter] = []
        if since is not None:
            for w in reversed(self._waiters.values()):
                if w.since is None or w.since <= since or w.admitted:
                    break
                out.append(w)
        return out

    def leave(self, holder: str) -> None:
        """Stop waiting (got slices, or the job ended); a no-op for a holder not in line."""
        w = self._waiters.pop(holder, None)
        if w is not None:
            self._total -= w.need

    def _purge(self, now: float) -> None:
        if now <= self._next_expiry:
            return
        for h in [h for h, w in self._waiters.items() if w.expires < now]:
            self.leave(h)
        self._next_expiry = min((w.expires for w in self._waiters.values()), default=math.inf)

    def reserved_ahead(self, holder: str, now: float) -> int:
        """Slices reserved for the waiters ahead of ``holder`` (all of them when it is not in line)."""
        self._purge(now)
        if holder not in self._waiters:
            return self._total
        reserved = 0
        for h, w in self._waiters.items():
            if h == holder:
                break
            reserved += w.need
        return reserved

    def admit(
        self,
        holder: str,
        counts: Sequence[int],
        free: int,
        now: float,
        *,
        keep: bool = False,
        since: float | None = None,
    ) -> int | None:
        """The largest of ``counts`` (largest first) that ``holder`` may take now out of ``free`` usable
        free slices (``c <= free - reserved_ahead(holder)``), or ``None``: then it waits in line (joins or
        renews) for its largest count (``since``: when it came, see the class doc).

        An admitted holder leaves the line; with ``keep`` it stays, at its place, reserving the count it
        was admitted for (for ``ttl`` s or until :meth:`leave`): a driver that claims the slices after
        this answer (Ray) keeps them from younger holders until its claim is done.
        """
        if not self._waiters:
            avail = free
        elif holder in self._waiters:
            avail = free - self.reserved_ahead(holder, now)
        else:  # a newcomer: behind every waiter but those it came before
            avail = free - self.reserved_ahead(holder, now) + sum(w.need for w in self._came_later(since))
        for c in counts:
            if avail >= c:
                if keep:
                    self.join(holder, c, now, since, admitted=True)
                else:
                    self.leave(holder)
                return c
        self.join(holder, counts[0], now, since)
        return None

    def members(self, now: float) -> list[str]:
        """The holders in line, oldest first."""
        self._purge(now)
        return list(self._waiters)

    def place(self, holder: str, now: float) -> int | None:
        """``holder``'s place in line (1 = first), ``None`` when not in line."""
        self._purge(now)
        for i, h in enumerate(self._waiters, 1):
            if h == holder:
                return i
        return None


class _Waiter:
    """A holder in line: the slices reserved for it, until when its entry is kept, when it came, and
    whether it was admitted (kept while it claims)."""

    __slots__ = ("need", "expires", "since", "admitted")

    def __init__(self, need: int, expires: float, since: float | None = None, admitted: bool = False) -> None:
        self.need = need
        self.expires = expires
        self.since = since
        self.admitted = admitted


# ------------------------------------------------------------------------------------------ quarantine


class Quarantine:
    """Bad-host quarantine, keyed by slice (any hashable key: a slice name on Ray, a fleet slice).

    :meth:`failed` records that a process on ``host`` of a slice could not use its device; after
    ``after`` failures of one host within ``window`` seconds, the slice is quarantined (handed to no job)
    for ``duration`` seconds, or until :meth:`repaired`. A slice with a failure on record is a *suspect*
    (handed out last). Expiry is lazy (:meth:`active`, :meth:`is_quarantined` lift what is due), or the
    caller lifts at the instant with :meth:`lift` (a timer).

    >>> q = Quarantine(after=2, window=3600.0, duration=1800.0)
    >>> q.failed("s", 0, now=0.0), q.suspect("s"), q.is_quarantined("s", now=0.0)
    (None, True, False)
    >>> q.failed("s", 0, now=1.0)
    1801.0
    >>> q.active(now=10.0), q.active(now=1801.0)
    (['s'], [])
    """

    __slots__ = ("after", "window", "duration", "_records", "_active")

    def __init__(
        self, after: int = 2, window: float = 3600.0, duration: float = 1800.0, *, name: str = "Quarantine"
    ) -> None:
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise ValueError(f"{name}: quarantine_after must be an int >= 1, got {after!r}")
        for field, value in (("quarantine_window", window), ("quarantine_for", duration)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not is_finite(value)  # also an int too large for a float: out of range, not an OverflowError
                or not 0 <= value <= MAX_SECONDS
            ):
                raise ValueError(f"{name}: {field} must be seconds >= 0, got {show_number(value)}")
        self.after = after
        self.window = float(window)
        self.duration = float(duration)
        self._records: dict[Hashable, _Record] = {}
        self._active: dict[Hashable, None] = {}  # in quarantine now, in the order they were put there

    def __bool__(self) -> bool:
        """Some slice is in quarantine (or due to be lifted)."""
        return bool(self._active)

    def failed(self, key: Hashable, host: int, now: float, what: str = "device error") -> float | None:
        """A process on ``host`` of slice ``key`` could not use its device (``what``: ``"device error"``,
        ``"device busy"``). Returns until when the slice is quarantined if this put it there, else ``None``."""
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = _Record()
        if rec.until is not None and rec.until <= now:
            self.lift(key)  # its time was up (a caller that lifts lazily has not looked since)
        if rec.failures is None:
            rec.failures = {}
        times = [t for t in rec.failures.get(host, ()) if t >= now - self.window] + [now]
        rec.failures[host] = times
        if len(times) < self.after or rec.until is not None:
            return None
        n = len(times)
        count = {1: "once", 2: "twice"}.get(n, f"{n} times")
        rec.note = f"{what} {count} in {span(now - times[0])}"
        rec.until = now + self.duration
        self._active[key] = None
        return rec.until

    def repaired(self, key: Hashable, host: int) -> bool:
        """``host`` of ``key`` works again: its failures are forgotten and the slice leaves quarantine.
        True when the slice has no failure on record any more (it is no longer a suspect)."""
        rec = self._records.get(key)
        if rec is None:
            return False
        cleared = False
        if rec.failures and rec.failures.pop(host, None) is not None and not rec.failures:
            rec.failures = None
            cleared = True
        if rec.until is not None:
            self.lift(key)
        return cleared

    def lift(self, key: Hashable, until: float | None = None) -> bool:
        """End ``key``'s quarantine now (only the one ending at ``until``, when given). True if it was in."""
        rec = self._records.get(key)
        if rec is None or rec.until is None or (until is not None and rec.until != until):
            return False
        rec.until = None
        self._active.pop(key, None)
        return True

    def due(self, now: float) -> list[Hashable]:
        """The keys whose quarantine has ended by ``now`` (not lifted yet)."""
        return [k for k in self._active if self._records[k].until <= now]  # type: ignore[operator]

    def active(self, now: float) -> list[Hashable]:
        """The slices in quarantine now (lifting those whose time is up), oldest quarantine first."""
        if self._active:
            for k in self.due(now):
                self.lift(k)
        return list(self._active)

    def is_quarantined(self, key: Hashable, now: float) -> bool:
        rec = self._records.get(key)
        if rec is None or rec.until is None:
            return False
        if rec.until <= now:
            self.lift(key)
            return False
        return True

    def until(self, key: Hashable) -> float | None:
        """When ``key``'s quarantine ends (``None``: not in quarantine, or lifted)."""
        rec = self._records.get(key)
        return rec.until if rec is not None else None

    def failures(self, key: Hashable) -> dict[int, list[float]] | None:
        """Per host, when its device failed (within the window at the last failure); ``None`` if none."""
        rec = self._records.get(key)
        return rec.failures if rec is not None else None

    def suspect(self, key: Hashable) -> bool:
        """A device failure of the slice is on record (until repaired)."""
        rec = self._records.get(key)
        return rec is not None and rec.failures is not None

    def note(self, key: Hashable) -> str:
        """Why it was last quarantined, e.g. ``"device busy twice in 10 min"``."""
        rec = self._records.get(key)
        return rec.note if rec is not None else ""

    def reason(self, key: Hashable, name: str | None = None) -> str:
        """``"quarantined: v4-16-3 (device busy twice in 10 min)"``."""
        return f"quarantined: {name if name is not None else key} ({self.note(key)})"


class _Record:
    __slots__ = ("failures", "until", "note")

    def __init__(self) -> None:
        self.failures: dict[int, list[float]] | None = None
        self.until: float | None = None
        self.note = ""


# ------------------------------------------------------------------------------------- pending reasons


def held_by(free: int, busy: int, holders: Iterable[str], *, where: str = "fleet", limit: int = 3) -> str:
    """``"fleet: 1 free, 3 held by train-a, train-b"``: the usable free slices, and who holds the busy ones.

    >>> held_by(0, 2, [], where="cluster")
    'cluster: 0 free, 2 held by other jobs'
    """
    names = list(dict.fromkeys(holders))
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    who = ", ".join(names[:limit]) + more if names else "other jobs"
    return f"{where}: {free} free" + (f", {busy} held by {who}" if busy else "")


def pending_reason(
    tpu_type: str,
    need: int,
    *,
    up: int,
    free: int,
    busy: int,
    holders: Iterable[str] = (),
    place: int | None = None,
    quarantined: Sequence[str] = (),
    missing: Sequence[str] = (),
    where: str = "fleet",
) -> tuple[bool, str]:
    """Why a job that needs ``need`` slices of ``tpu_type`` waits: ``(held, reason)``.

    ``up``: slices that exist and are usable (free or busy, not free in quarantine); ``free``: the usable
    free ones; ``busy``: held by jobs (``holders``, their names); ``place``: the job's place in line;
    ``quarantined``: :meth:`Quarantine.reason` texts; ``missing``: what is not there (``"1 preempted,
    restoring"``). ``held`` is True when the capacity exists but others hold it (the job waits its turn,
    as long as it takes), False when capacity is missing.

    >>> pending_reason("v4-16", 4, up=4, free=1, busy=3, holders=["train-a", "train-b"], place=2)
    (True, 'queued: 2nd for 4 x v4-16; fleet: 1 free, 3 held by train-a, train-b')
    >>> pending_reason("v4-16", 4, up=2, free=0, busy=2, missing=["2 preempted, restoring"])
    (False, 'waiting for capacity: 2 of 4 x v4-16 exist (2 preempted, restoring)')
    """
    note = "; ".join(quarantined)
    if up < need and note:  # what keeps the job out is a quarantine: say that first
        return False, f"{note}; {up} of {need} x {tpu_type} usable"
    if up >= need:
        at = f": {ordinal(place)}" if place else ""
        reason = f"queued{at} for {need} x {tpu_type}; {held_by(free, busy, holders, where=where)}"
        return True, f"{reason}; {note}" if note else reason
    detail = f" ({', '.join(missing)})" if missing else ""
    return False, f"waiting for capacity: {up} of {need} x {tpu_type} exist{detail}"


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def span(seconds: float) -> str:
    """``"40 s"``, ``"10 min"``, ``"2.5 h"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
