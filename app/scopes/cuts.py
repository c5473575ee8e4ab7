"""Stream cuts (seed 004): an offset per segment, the segments covering [0, 1), at event boundaries.

The tail cut is the current epoch's segments at their lengths (every append
of a stream writer is whole frames); the head cut is the last truncation's
cut, or epoch 0's segments at 0. Truncating at a cut records it
(``truncating``), then ``steps.finish`` deletes the segments wholly before
it and truncates the others at it (their Tier 2 chunks are freed), and
records ``truncated``: the cut is the new head. A cut's ``epoch`` is the
newest epoch among its segments' (the current one for the tail).
"""

from __future__ import annotations

from collections.abc import Mapping

from app.scopes import ranges, records
from app.scopes.controller import Controller
from app.scopes.errors import StreamNotFound
from app.scopes.names import segment_name
from app.scopes.record_log import now
from engine import BadOffset, InvalidArgument, SegmentNotFound, SegmentTruncated


def epoch_of(state: records.StreamState, cut: records.Cut) -> int:
    return max(state.segments[sid].epoch for sid, _ in cut.positions)


def head(state: records.StreamState) -> records.Cut:
    if state.head is not None:
        return state.head
    return records.Cut(tuple((s.id, 0) for s in state.of_epoch(0)))


def tail(ctl: Controller, state: records.StreamState) -> records.Cut:
    positions = []
    for segment in state.current:
        info = ctl.store.info(segment_name(state.scope, state.stream, segment.id), anywhere=True)
        positions.append((segment.id, info.length))
    return records.Cut(tuple(sorted(positions)))


def parse(state: records.StreamState, positions: Mapping[str, object]) -> records.Cut:
    """A cut given as ``{segment id: offset}`` (ids as strings, JSON's keys), checked against the stream."""
    found = []
    for key, offset in positions.items():
        if not key.isdigit() or int(key) not in state.segments:
            raise StreamNotFound(f"stream {state.scope}/{state.stream} has no segment {key!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgument(f"the offset of segment {key} must be an integer >= 0, got {offset!r}")
        found.append((int(key), offset))
    ranges.check_partition([state.segments[sid].range for sid, _ in found], "a stream cut")
    return records.Cut(tuple(sorted(found)))


def truncate(ctl: Controller, scope: str, stream: str, positions: Mapping[str, object]) -> records.Cut:
    """Truncate the stream at a cut; returns the new head. 410 for a cut before the head."""

    def judge(loaded: records.LoadedStream) -> tuple[str, dict] | None:
        cut = _reachable(ctl, loaded.state, parse(loaded.state, positions))
        return "truncating", {"cut": cut.to_json(), "time": now()}

    return head(ctl.change(scope, stream, judge).state)


def _reachable(ctl: Controller, state: records.StreamState, cut: records.Cut) -> records.Cut:
    """``cut`` with each offset raised to its segment's start offset; refused past a length."""
    raised = []
    for sid, offset in cut.positions:
        name = segment_name(state.scope, state.stream, sid)
        try:
            info = ctl.store.info(name, anywhere=True)
        except SegmentNotFound:
            raise SegmentTruncated(f"segment {name} is gone: the cut lies before the stream's head") from None
        if offset > info.length:
            raise BadOffset(f"segment {name} is {info.length} bytes; the cut names offset {offset}")
        raised.append((sid, max(offset, info.start_offset)))
    return records.Cut(tuple(raised))
