"""Scaling a stream (seed 004): seal some segments, create successors whose ranges cover the same keys.

A scale is judged against the stream's current epoch, recorded as one
``scaling`` line, and carried out by ``steps.finish`` (successors created,
predecessors sealed, then the ``epoch`` line). One at a time: a different
scale while one is pending is ``ScaleConflict``; the same scale sent again
answers as that scale, pending or completed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.scopes import ranges, records
from app.scopes.controller import Controller
from app.scopes.errors import ScaleConflict, StreamSealed
from app.scopes.names import segment_name
from app.scopes.record_log import now
from engine import InvalidArgument, SegmentExists

# How long a scale request waits for its scale to complete (it waits for transactions holding
# the segments it seals) before it answers 202: the scale goes on without it.
WAIT_S = 5.0
_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class ScaleAnswer:
    """The epoch a scale makes, its new segments, and whether the epoch is reached yet."""

    epoch: int
    segments: tuple[records.Segment, ...]
    done: bool


def scale(
    ctl: Controller, scope: str, stream: str, seal: Sequence[int], new: Sequence[ranges.Range]
) -> ScaleAnswer:
    """Scale and wait (up to ``WAIT_S``) until it is done; see the module."""
    answer = start(ctl, scope, stream, seal, new)
    deadline = time.monotonic() + WAIT_S
    while not answer.done and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        answer = _answer_of(ctl.touch(scope, stream).state, answer.epoch, answer.segments)
    return answer


def start(
    ctl: Controller, scope: str, stream: str, seal: Sequence[int], new: Sequence[ranges.Range]
) -> ScaleAnswer:
    """Record the scale (or find it recorded) and carry it out as far as it goes now."""
    if not seal:
        raise InvalidArgument("a scale seals at least one segment")
    if len(set(seal)) != len(seal):
        raise InvalidArgument("a scale names each segment it seals once")
    found: list[ScaleAnswer] = []

    def judge(loaded: records.LoadedStream) -> tuple[str, dict] | None:
        state = loaded.state
        if state.sealing:
            raise StreamSealed(f"stream {scope}/{stream} is sealed")
        done = state.completed_scale(seal, new)
        if done is not None:
            found.append(ScaleAnswer(done.epoch, tuple(state.segments[i] for i in done.created), True))
            return None
        pending = state.scaling
        if pending is not None:
            same = set(pending.seal) == set(seal) and sorted(s.range for s in pending.new) == sorted(new)
            if not same:
                raise ScaleConflict(f"a scale to epoch {pending.epoch} is in progress; one at a time")
            found.append(ScaleAnswer(pending.epoch, pending.new, False))
            return None
        current = {s.id: s for s in state.current}
        stale = sorted(set(seal) - set(current))
        if stale:
            raise ScaleConflict(f"segments {stale} are not in the current epoch {state.epoch}")
        ranges.check_replacement([current[i].range for i in seal], new)
        epoch, first = state.epoch + 1, state.next_id
        made = [records.Segment(first + i, lo, hi, epoch) for i, (lo, hi) in enumerate(sorted(new))]
        found.append(ScaleAnswer(epoch, tuple(made), False))
        made_json = records.segments_json(made)
        return "scaling", {"epoch": epoch, "seal": sorted(seal), "segments": made_json, "time": now()}

    loaded = ctl.change(scope, stream, judge)
    answer = found[-1]
    return _answer_of(loaded.state, answer.epoch, answer.segments) if not answer.done else answer


def _answer_of(state: records.StreamState, epoch: int, made: tuple[records.Segment, ...]) -> ScaleAnswer:
    """Where the scale to ``epoch`` stands; SegmentExists if it was cancelled (a stranger took a name)."""
    if state.epoch < epoch and (state.pending is None or state.pending.epoch != epoch):
        names = ", ".join(segment_name(state.scope, state.stream, s.id) for s in made)
        raise SegmentExists(f"the scale to epoch {epoch} was cancelled: a name it needed ({names}) is taken")
    return ScaleAnswer(epoch, made, state.epoch >= epoch)
