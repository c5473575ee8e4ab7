"""Auto-scaling by a stream's policy (seed 004; Pravega's ``AutoScaleProcessor``, with one window).

``Rates`` keeps samples of each segment's length and event count (taken by
the keeper every ``stream_scale_sample_s``) and gives its event or KiB rate
over ``stream_scale_window_s``, once its samples span the window. ``decide``
judges the current epoch: a segment above the target splits into
``max(2, ceil(rate / target))`` equal parts, at most ``max(2, factor)``;
otherwise two neighbouring segments both below half the target merge,
never below ``min_segments``. A segment younger than
``stream_scale_cooldown_s`` is left alone, so is a stream with a scale
pending. One scale per stream per round; the hottest segment first.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from app.scopes import ranges, records

KIB = 1024


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # monotonic seconds
    length: int
    events: int


class Rates:
    """Samples per segment name, and rates over ``window_s`` (None until the samples span it)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[Sample]] = {}

    def add(self, name: str, sample: Sample) -> None:
        samples = self._samples.setdefault(name, deque())
        samples.append(sample)
        while len(samples) > 2 and samples[1].at <= sample.at - self.window_s:
            samples.popleft()  # keep one sample at or before the window's start

    def retain(self, names: Iterable[str]) -> None:
        """Forget the segments not in ``names`` (sealed, deleted, or no longer served here)."""
        keep = set(names)
        for name in [n for n in self._samples if n not in keep]:
            del self._samples[name]

    def rate(self, name: str, policy: str) -> float | None:
        """Events/s (``events_per_s``) or KiB/s (``kbytes_per_s``) over the window, or None."""
        samples = self._samples.get(name)
        if not samples or len(samples) < 2:
            return None
        first, last = samples[0], samples[-1]
        if first.at > last.at - self.window_s:
            return None
        span = last.at - first.at
        if policy == "events_per_s":
            return (last.events - first.events) / span
        return (last.length - first.length) / KIB / span


def decide(
    state: records.StreamState, rates: dict[int, float | None], wall_now: float, cooldown_s: float
) -> tuple[list[int], list[ranges.Range]] | None:
    """The scale the policy asks for now, as (segments to seal, new ranges), or None."""
    policy = state.config.scaling
    if policy.type == "fixed" or state.pending is not None or state.sealing:
        return None
    current = state.current
    cooled = wall_now - cooldown_s
    # The rates of the segments old enough to judge, whose samples span the window.
    known = {
        s.id: rate
        for s in current
        if (rate := rates.get(s.id)) is not None and state.epochs[s.epoch].time <= cooled
    }
    hot = [s for s in current if known.get(s.id, 0.0) > policy.target]
    if hot:
        hottest = max(hot, key=lambda s: known[s.id])
        parts = min(max(2, math.ceil(known[hottest.id] / policy.target)), max(2, policy.factor))
        return [hottest.id], ranges.split(hottest.lo, hottest.hi, parts)
    if len(current) <= policy.min_segments:
        return None
    for a, b in itertools.pairwise(current):
        cold = all(s.id in known and known[s.id] < policy.target / 2 for s in (a, b))
        if cold and a.hi == b.lo:
            return [a.id, b.id], [(a.lo, b.hi)]
    return None
