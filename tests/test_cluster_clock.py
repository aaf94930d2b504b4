"""The clock a Ray client stamps a job's place in the cluster's line with (``fray_ray.cluster.ClusterClock``):
the cluster's clock read once and carried forward, on a fake monotonic clock. What users rely on: one client's
jobs keep the order it launched them in, and jobs of clients whose clocks disagree by hours are ordered by the
cluster's one clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ray")

from fray_ray.cluster import ClusterClock  # noqa: E402


class World:
    """This machine's monotonic clock, and a cluster whose wall clock is ``skew`` ahead of it; a reading
    takes ``rtt`` seconds and fails while ``down``."""

    def __init__(self, skew: float) -> None:
        self.t = 0.0
        self.skew = skew
        self.rtt = 0.0
        self.down = False
        self.reads = 0

    def mono(self) -> float:
        return self.t

    def read(self) -> float | None:
        self.reads += 1
        self.t += self.rtt / 2
        answer = None if self.down else self.t + self.skew
        self.t += self.rtt / 2
        return answer


@settings(max_examples=300, deadline=None)
@given(
    skew=st.floats(-1e7, 1e7),
    steps=st.lists(st.tuples(st.floats(0.0, 900.0), st.floats(0.0, 2.0), st.booleans()), min_size=1, max_size=40),
)
def test_launch_stamps_follow_the_cluster_clock_and_never_go_back(
    skew: float, steps: list[tuple[float, float, bool]]
) -> None:
    world = World(skew)
    clock = ClusterClock(world.read, resync=600.0, retry=30.0, mono=world.mono)
    stamps: list[float] = []
    ever_read = False
    for gap, rtt, down in steps:
        world.t += gap
        world.rtt, world.down = rtt, down
        reads_before = world.reads
        t = clock.now()
        ever_read = ever_read or (world.reads > reads_before and not down)
        if not ever_read:
            assert t is None  # never a guess: the supervisor stamps the job on arrival instead
            continue
        assert t is not None
        # within half the slowest reading's round trip of the cluster's clock (plus the bump that keeps
        # stamps increasing)
        assert abs(t - (world.t + skew)) <= 1.0 + 1e-6 * max(1.0, abs(skew)) + len(stamps) * 2e-6
        assert not stamps or t > stamps[-1]  # one client's jobs keep the order it launched them in
        stamps.append(t)


def test_a_launch_costs_no_round_trip_between_readings_and_a_failed_reading_is_retried_later() -> None:
    world = World(skew=-3600.0)
    clock = ClusterClock(world.read, resync=600.0, retry=30.0, mono=world.mono)
    world.down = True
    assert clock.now() is None and world.reads == 1
    world.t += 10.0
    assert clock.now() is None and world.reads == 1  # not again before the retry delay
    world.t += 25.0
    world.down = False
    assert clock.now() == pytest.approx(world.t - 3600.0) and world.reads == 2
    for _ in range(100):
        world.t += 1.0
        assert clock.now() == pytest.approx(world.t - 3600.0)
    assert world.reads == 2
    world.t += 600.0
    clock.now()
    assert world.reads == 3  # read again after ``resync`` seconds (drift between the machines' clocks)
