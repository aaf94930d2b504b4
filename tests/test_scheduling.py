"""The shared scheduling policy (``fray_core.scheduling``) on a fake clock: the fair queue's admission
rule, order and expiry, and bad-host quarantine, against plain reference models; and the pending-reason
texts. The fleet model (tests/test_policy.py) and the Ray scheduler actor (tests/test_ray_policy.py) use
these classes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray_core.scheduling import FairQueue, Quarantine, pending_reason

HOLDERS = ["a", "b", "c", "d", "e"]
COUNTS = [(1,), (2,), (4,), (2, 1), (4, 2, 1)]

queue_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("admit"),
            st.sampled_from(HOLDERS),
            st.sampled_from(COUNTS),
            st.integers(0, 6),
            st.booleans(),
            st.one_of(st.none(), st.integers(0, 5)),
        ),
        st.tuples(st.just("leave"), st.sampled_from(HOLDERS)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 2.0, 5.0, 6.0])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=queue_ops, ttl=st.sampled_from([1.0, 5.0]))
def test_the_fair_queue_admits_by_the_rule_in_arrival_order_and_forgets_who_stopped_asking(
    ops: list[tuple], ttl: float
) -> None:
    """Against a plain model (a list of live entries): a holder may take c slices iff c <= free - the
    needs of every live entry ahead of it (all entries, for a newcomer); it takes its largest such count;
    otherwise it waits at its place (at the back when new) for its largest count; an entry not renewed
    for ttl seconds is gone; leave removes at once. A newcomer that says when it came (``since``) goes
    ahead of the entries at the back that came later by theirs (never past one that did not say, nor past
    one admitted with keep and not waiting since)."""
    q = FairQueue(ttl)
    model: list[list] = []  # [holder, need, expires, since, admitted], oldest first
    now = 0.0
    for op in ops:
        if op[0] == "wait":
            now += op[1]
            continue
        model[:] = [e for e in model if e[2] >= now]
        if op[0] == "leave":
            q.leave(op[1])
            model[:] = [e for e in model if e[0] != op[1]]
            continue
        _, holder, counts, free, keep, since = op
        names = [e[0] for e in model]
        at = len(model)  # where a newcomer goes
        while (
            since is not None
            and at > 0
            and model[at - 1][3] is not None
            and model[at - 1][3] > since
            and not model[at - 1][4]
        ):
            at -= 1
        ahead = model[: names.index(holder)] if holder in names else model[:at]
        avail = free - sum(e[1] for e in ahead)
        want = next((c for c in counts if c <= avail), None)
        got = q.admit(holder, counts, free, now, keep=keep, since=since)
        assert got == want, (op, model, now)
        if want is None or keep:
            need = counts[0] if want is None else want
            for e in model:
                if e[0] == holder:
                    e[1:3] = [need, now + ttl]  # renewed: same place, same since
                    e[4] = want is not None
                    break
            else:
                model.insert(at, [holder, need, now + ttl, since, want is not None])
        else:
            model[:] = [e for e in model if e[0] != holder]
        assert q.members(now) == [e[0] for e in model]
        for h in HOLDERS:
            names = [e[0] for e in model]
            assert q.reserved_ahead(h, now) == sum(e[1] for e in (model[: names.index(h)] if h in names else model))
            assert q.place(h, now) == (names.index(h) + 1 if h in names else None)


def test_a_holder_that_came_earlier_but_asked_later_does_not_pass_one_already_admitted() -> None:
    """Admitted with keep, a holder is claiming the slices it was given: one that asks later, though it
    came earlier by its ``since``, queues behind it rather than being given the same slices (a race for
    them that one would lose after waiting for its claim)."""
    q = FairQueue(ttl=30.0)
    assert q.admit("second", [1], free=1, now=0.0, keep=True, since=2.0) == 1
    assert q.admit("first", [1], free=1, now=0.1, keep=True, since=1.0) is None
    assert q.members(0.1) == ["second", "first"]
    # a waiter that was not admitted is passed, as before
    assert q.admit("third", [1], free=0, now=0.2, keep=True, since=3.0) is None
    assert q.admit("early", [1], free=0, now=0.3, keep=True, since=2.5) is None
    assert q.members(0.3) == ["second", "first", "early", "third"]


def test_a_younger_holder_backfills_only_what_no_older_waiter_needs() -> None:
    q = FairQueue(ttl=5.0)
    assert q.admit("big", [4], free=3, now=0.0) is None  # reserves 4 of the 3 free: nothing left
    assert q.admit("small", [1], free=3, now=0.0) is None
    assert q.admit("small", [1], free=5, now=1.0) == 1  # 5 free - 4 for "big" = 1
    assert q.members(1.0) == ["big"]
    assert q.admit("big", [4], free=4, now=1.0, keep=True) == 4  # admitted, keeps its place until it claimed
    assert q.reserved_ahead("late", 1.0) == 4
    q.leave("big")
    assert q.members(1.0) == [] and q.reserved_ahead("late", 1.0) == 0


failure_ops = st.lists(
    st.one_of(
        st.tuples(st.just("fail"), st.sampled_from(["s0", "s1"]), st.integers(0, 1)),
        st.tuples(st.just("repair"), st.sampled_from(["s0", "s1"]), st.integers(0, 1)),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 30.0, 60.0, 100.0])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=failure_ops,
    after=st.integers(1, 3),
    window=st.sampled_from([0.0, 50.0, 120.0]),
    duration=st.sampled_from([0.0, 40.0, 90.0]),
)
def test_a_slice_is_quarantined_exactly_after_enough_failures_of_one_host_within_the_window_until_its_time_is_up(
    ops: list[tuple], after: int, window: float, duration: float
) -> None:
    """Against a model that keeps every failure: a failure puts its slice in quarantine iff the slice is
    not in quarantine now and its host failed at least ``after`` times within ``window`` (counting this
    one, since it was last repaired); the quarantine lasts ``duration`` from then, or until a repair of
    any of the slice's hosts."""
    q = Quarantine(after, window, duration)
    failures: dict[tuple[str, int], list[float]] = {}
    until: dict[str, float] = {}
    now = 0.0
    for op in ops:
        if op[0] == "wait":
            now += op[1]
        elif op[0] == "repair":
            _, key, host = op
            failures.pop((key, host), None)
            until.pop(key, None)
            q.repaired(key, host)
            assert q.suspect(key) == any(k[0] == key for k in failures)
        else:
            _, key, host = op
            times = failures.setdefault((key, host), [])
            times.append(now)
            inside = [t for t in times if t >= now - window]
            quarantined_now = key in until and until[key] > now
            expect = now + duration if not quarantined_now and len(inside) >= after else None
            if expect is not None:
                until[key] = expect
            assert q.failed(key, host, now, "device busy") == expect, (op, now, times, until)
            assert q.suspect(key)
        for key in ("s0", "s1"):
            inside = key in until and until[key] > now
            assert q.is_quarantined(key, now) == inside, (key, now, until)
        assert sorted(q.active(now)) == sorted(k for k, u in until.items() if u > now)


def test_the_quarantine_note_says_what_failed_how_often_and_over_how_long() -> None:
    q = Quarantine(after=3, window=3600.0, duration=1800.0)
    assert q.failed("v4-16-3", 0, 0.0, "device busy") is None
    assert q.failed("v4-16-3", 0, 300.0, "device busy") is None
    assert q.failed("v4-16-3", 0, 600.0, "device busy") == 2400.0
    assert q.reason("v4-16-3") == "quarantined: v4-16-3 (device busy 3 times in 10 min)"
    assert q.active(2399.0) == ["v4-16-3"] and q.active(2400.0) == []
    with pytest.raises(ValueError, match="RayCluster: quarantine_after must be an int >= 1, got 0"):
        Quarantine(0, name="RayCluster")
    with pytest.raises(ValueError, match="X: quarantine_for must be seconds >= 0, got -1"):
        Quarantine(2, 10.0, -1, name="X")


def test_pending_reasons_tell_waiting_its_turn_from_missing_capacity_and_quarantine() -> None:
    assert pending_reason("v4-16", 2, up=2, free=0, busy=2, holders=["a", "b", "a"], place=1, where="cluster") == (
        True,
        "queued: 1st for 2 x v4-16; cluster: 0 free, 2 held by a, b",
    )
    assert pending_reason("v4-16", 1, up=5, free=0, busy=5, holders=list("abcde")) == (
        True,
        "queued for 1 x v4-16; fleet: 0 free, 5 held by a, b, c and 2 more",
    )
    assert pending_reason("v4-16", 2, up=1, free=0, busy=1, missing=["1 lost, restoring"], where="cluster") == (
        False,
        "waiting for capacity: 1 of 2 x v4-16 exist (1 lost, restoring)",
    )
    q = "quarantined: v4-16-1 (device busy twice in 4 s)"
    assert pending_reason("v4-16", 2, up=1, free=0, busy=1, quarantined=[q]) == (False, f"{q}; 1 of 2 x v4-16 usable")
    assert pending_reason("v4-16", 1, up=1, free=0, busy=1, holders=["a"], place=1, quarantined=[q]) == (
        True,
        f"queued: 1st for 1 x v4-16; fleet: 0 free, 1 held by a; {q}",
    )
