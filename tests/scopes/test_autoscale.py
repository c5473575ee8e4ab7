"""Auto-scaling decisions (app/scopes/autoscale.py) on made-up rates, and the rates over a window."""

from __future__ import annotations

import json

from app.scopes import autoscale, records

State = records.StreamState
COOLDOWN_S = 60


def _stream(ranges: list[tuple[float, float]], policy: records.ScalingPolicy, born: float = 0.0) -> State:
    config = records.StreamConfig(1, policy)
    first = json.loads(records.created_line(config, 1, born))
    first["segments"] = [{"id": i, "lo": lo, "hi": hi} for i, (lo, hi) in enumerate(ranges)]
    state = records.first_state("sc", "st", first)
    return records.fold(state, [json.loads(records.line("epoch", epoch=0, time=born))])


EVENTS = records.ScalingPolicy("events_per_s", target=100, factor=3, min_segments=2)
THIRDS_OF_FIRST_HALF = [(0.0, 1 / 6), (1 / 6, 2 / 6), (2 / 6, 0.5)]


def test_a_hot_segment_splits_into_rate_over_target_parts_at_most_factor() -> None:
    state = _stream([(0.0, 0.5), (0.5, 1.0)], EVENTS)
    assert autoscale.decide(state, {0: 250.0, 1: 60.0}, 100, COOLDOWN_S) == ([0], THIRDS_OF_FIRST_HALF)
    assert autoscale.decide(state, {0: 900.0, 1: 60.0}, 100, COOLDOWN_S)[1][-1] == (2 / 6, 0.5)  # capped at 3
    assert autoscale.decide(state, {0: 120.0, 1: 160.0}, 100, COOLDOWN_S) == ([1], [(0.5, 0.75), (0.75, 1.0)])


def test_nothing_moves_during_the_cooldown_or_without_a_full_window() -> None:
    state = _stream([(0.0, 0.5), (0.5, 1.0)], EVENTS, born=50)
    assert autoscale.decide(state, {0: 900.0, 1: 900.0}, 100, COOLDOWN_S) is None
    assert autoscale.decide(state, {0: 900.0, 1: None}, 200, COOLDOWN_S) == ([0], THIRDS_OF_FIRST_HALF)
    assert autoscale.decide(_stream([(0.0, 1.0)], records.ScalingPolicy()), {0: 1e9}, 200, COOLDOWN_S) is None


def test_cold_neighbours_merge_but_never_below_min_segments() -> None:
    state = _stream([(0.0, 0.25), (0.25, 0.5), (0.5, 1.0)], EVENTS)
    assert autoscale.decide(state, {0: 70.0, 1: 10.0, 2: 5.0}, 100, COOLDOWN_S) == ([1, 2], [(0.25, 1.0)])
    assert autoscale.decide(state, {0: 70.0, 1: 10.0, 2: 60.0}, 100, COOLDOWN_S) is None  # 60 is not cold
    two = _stream([(0.0, 0.5), (0.5, 1.0)], EVENTS)
    assert autoscale.decide(two, {0: 0.0, 1: 0.0}, 100, COOLDOWN_S) is None  # min_segments 2


def test_rates_need_samples_spanning_the_window() -> None:
    rates = autoscale.Rates(window_s=10)
    rates.add("s", autoscale.Sample(0.0, 0, 0))
    rates.add("s", autoscale.Sample(5.0, 5 * 1024, 50))
    assert rates.rate("s", "events_per_s") is None
    for t in range(6, 31):
        rates.add("s", autoscale.Sample(float(t), t * 1024 * 3, t * 20))
    assert rates.rate("s", "events_per_s") == 20.0 and rates.rate("s", "kbytes_per_s") == 3.0
    rates.retain([])
    assert rates.rate("s", "events_per_s") is None
