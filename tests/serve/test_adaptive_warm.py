"""The adaptive warm pool's sizing (serve/agents/adaptive.py): pure logic, no processes."""

from __future__ import annotations

import pytest

from serve.agents import adaptive
from serve.agents.adaptive import WarmSizer, wanted_slots


@pytest.mark.parametrize(
    ("rate", "spawn_s", "minimum", "maximum", "expected"),
    [
        (0.0, 1.5, 1, 4, 1),  # no arrivals: the minimum
        (1 / 1.5, 1.5, 1, 4, 2),  # one arrival per spawn time: one refill in flight
        (1 / 1.5, 2.5, 1, 4, 3),  # slower spawns: more in flight
        (8.0, 2.0, 1, 4, 4),  # a burst: capped at the maximum
        (8.0, 2.0, 2, 1, 2),  # a maximum below the minimum counts as the minimum
        (0.5, 1.0, 0, 4, 1),  # --warm-agents 0 still absorbs a steady stream
        (0.5, 0.0, 1, 4, 1),  # no spawn time: nothing in flight
    ],
)
def test_wanted_slots_is_minimum_plus_refills_in_flight(
    rate: float, spawn_s: float, minimum: int, maximum: int, expected: int
) -> None:
    assert wanted_slots(rate, spawn_s, minimum, maximum) == expected


def test_steady_arrivals_keep_a_spare_per_refill_in_flight_and_decay_to_the_minimum() -> None:
    sizer = WarmSizer(1, 4)
    for _ in range(4):
        sizer.spawned(2.0)
    t = 0.0
    for _ in range(20):  # 1.5 s apart, as bench_density's iso mode
        sizer.arrival(t)
        last = t
        t += 1.5
    rate = sizer.rate(last)
    assert 0.6 < rate < 0.8
    assert sizer.wanted(last) == 3  # 1 + ceil(0.7 x 2 s)
    assert not sizer.quiet(last + 1.0)
    assert sizer.quiet(last + adaptive.QUIET_S)
    # Arrivals stopped: the rate decays and, past the window, the pool is back at 1.
    assert sizer.rate(last + 20.0) < rate
    assert sizer.wanted(last + adaptive.WINDOW_S + 0.1) == 1
    assert sizer.settled(last + adaptive.WINDOW_S + 0.1)
    assert not sizer.settled(last + 1.0)


def test_a_burst_reads_as_a_high_rate_at_once() -> None:
    sizer = WarmSizer(1, 6)
    sizer.spawned(1.5)
    for i in range(8):
        sizer.arrival(100.0 + i * 0.01)
    assert sizer.rate(100.1) == pytest.approx(8 / adaptive.MIN_SPAN_S)
    assert sizer.wanted(100.1) == 6


def test_one_arrival_is_not_a_rate() -> None:
    sizer = WarmSizer(1, 4)
    sizer.arrival(5.0)
    assert sizer.rate(5.0) == 0.0 and sizer.wanted(5.0) == 1


def test_a_fixed_pool_never_adapts() -> None:
    sizer = WarmSizer(2, 2)
    assert not sizer.adaptive
    for i in range(10):
        sizer.arrival(i * 0.1)
    assert sizer.wanted(1.0) == 2


def test_spawn_time_is_the_median_of_the_recent_spawns() -> None:
    sizer = WarmSizer(1, 4)
    assert sizer.spawn_s() == adaptive.DEFAULT_SPAWN_S
    for seconds in (9.0, 1.0, 2.0, 3.0):
        sizer.spawned(seconds)
    assert sizer.spawn_s() == 2.5
    for _ in range(adaptive.MAX_SPAWN_SAMPLES):
        sizer.spawned(1.0)
    assert sizer.spawn_s() == 1.0  # the old samples left the bound


def test_arrivals_are_bounded_and_age_out() -> None:
    sizer = WarmSizer(1, 4)
    for i in range(10 * adaptive.MAX_ARRIVALS):
        sizer.arrival(i * 0.001)
    assert len(sizer._arrivals) <= adaptive.MAX_ARRIVALS
    sizer.arrival(1000.0)  # much later: the old ones are dropped
    assert list(sizer._arrivals) == [1000.0]
