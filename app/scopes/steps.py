"""What a stream's record leaves pending, finished step by step by whoever touches the stream next.

Every change that spans segments is recorded first and carried out after
(docs/design.md "Streams (seed 004; the `scopes` surface, the role of Pravega's
Controller)"), so a crash at any step leaves a record that says what is
left to do. ``finish`` does it, in this order, each step idempotent:

1. commits (``committing``): each transaction segment sealed and merged
   into its data segment in one composite, then ``committed``;
2. aborts (``aborting``, and open transactions past their deadline or of a
   stream being sealed): transaction segments deleted, then ``aborted``;
3. the creation or a scale: successors created (each marked with the
   stream's incarnation, so a resumed step knows its own segment from a
   stranger's), predecessors sealed, then the ``epoch`` line. A scale waits
   while an open or committing transaction holds a segment it seals (a
   transaction may still merge into it). A stranger holding a successor's
   name cancels a scale (``cancelled``; nothing was sealed yet) and a
   creation (the record is deleted: the stream never was);
4. a truncation: segments wholly before the cut deleted, the others
   truncated at it, then ``truncated``;
5. a seal: every current segment sealed, then ``sealed``;
6. a delete: every data segment and transaction segment deleted, then the
   record.

No append reaches a successor before all its predecessors are sealed:
writers learn successors from the ``epoch`` line, written after the seals.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from app.scopes import records
from app.scopes.errors import StreamNotFound
from app.scopes.names import segment_name
from app.scopes.record_log import now
from engine import (
    AttributeUpdate,
    AttributeUpdateType,
    CreateStep,
    DeleteStep,
    MergeStep,
    SealStep,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    TruncateStep,
    UpdateAttributesStep,
)

if TYPE_CHECKING:
    from app.scopes.controller import Controller

log = logging.getLogger(__name__)

# The attribute that names the stream incarnation a data segment belongs to.
INCARNATION_KEY = uuid.uuid5(uuid.NAMESPACE_URL, "urn:segstore:scopes:incarnation")


class Stranger(SegmentExists):
    """A segment the stream needs is held by something else (a native create)."""


def has_work(state: records.StreamState, at: float) -> bool:
    """Whether ``finish`` has anything to do (cheap: the hot path asks on every event)."""
    if state.pending is not None or state.truncating is not None or state.deleting:
        return True
    if state.sealing and not state.sealed:
        return True
    return any(t.state != records.OPEN or t.deadline <= at for t in state.unfinished_transactions())


def blocked(state: records.StreamState) -> bool:
    """Whether the pending scale waits for a transaction that holds a segment it seals."""
    pending = state.scaling
    return pending is not None and any(t.holds(pending.seal) for t in state.unfinished_transactions())


def finish(ctl: Controller, loaded: records.LoadedStream) -> records.LoadedStream | None:
    """Carry out what ``loaded``'s record leaves pending, as far as it can go; None once it is deleted.

    A line another writer appended first is not an error: the state is
    loaded again and judged again. A creation that meets a stranger deletes
    what it made and the record, and raises ``Stranger``.
    """
    while True:
        state = loaded.state
        if state.deleting:
            _delete_all(ctl, loaded)
            return None
        try:
            line = _next_line(ctl, state)
        except Stranger:
            _delete_own(ctl, state, (s.id for s in state.segments.values()))
            _delete_record(ctl, loaded)
            raise
        if line is None:
            return loaded
        kind, fields = line
        loaded = ctl.append_or_reload(loaded, kind, **fields)


def _next_line(ctl: Controller, state: records.StreamState) -> tuple[str, dict] | None:
    """Do the next step's work, and return the line that records it (None: nothing left to do)."""
    at = now()
    for txn in state.unfinished_transactions():
        if txn.state == records.COMMITTING:
            _merge(ctl, state, txn)
            return records.COMMITTED, {"id": txn.id}
        if txn.state == records.ABORTING:
            _delete_segments(ctl, (name for _, name in txn.segments))
            return records.ABORTED, {"id": txn.id}
        if state.sealing or state.deleting:
            return records.ABORTING, {"id": txn.id, "reason": "sealed"}
        if txn.deadline <= at:
            return records.ABORTING, {"id": txn.id, "reason": "timeout"}
    pending = state.pending
    if pending is not None and not blocked(state):
        try:
            _create(ctl, state, pending.new)
        except Stranger as stranger:
            if pending.epoch == 0:
                raise
            log.warning("stream %s/%s: scale to epoch %d cancelled: %s",
                        state.scope, state.stream, pending.epoch, stranger.detail)
            _delete_own(ctl, state, (s.id for s in pending.new))
            return "cancelled", {"epoch": pending.epoch, "reason": stranger.detail}
        _seal(ctl, (_own(state, sid) for sid in pending.seal))
        return "epoch", {"epoch": pending.epoch, "time": at}
    if state.truncating is not None:
        _truncate(ctl, state, state.truncating)
        return "truncated", {}
    if state.sealing and not state.sealed and pending is None:
        _seal(ctl, (_own(state, s.id) for s in state.current))
        return "sealed", {"time": at}
    return None


def _own(state: records.StreamState, segment_id: int) -> str:
    return segment_name(state.scope, state.stream, segment_id)


def _create(ctl: Controller, state: records.StreamState, new: Iterable[records.Segment]) -> None:
    """Create each segment marked with the incarnation; one already there must be the stream's own."""
    mark = AttributeUpdate(INCARNATION_KEY, AttributeUpdateType.REPLACE, state.incarnation)
    for segment in new:
        name = _own(state, segment.id)
        try:
            ctl.store.composite([CreateStep(name), UpdateAttributesStep(name, [mark])], anywhere=True)
        except SegmentExists:
            if ctl.owned_id(state, name) is None:
                raise Stranger(f"segment {name!r} exists and is not this stream's") from None


def _seal(ctl: Controller, names: Iterable[str]) -> None:
    for name in names:
        try:
            ctl.store.composite([SealStep(name)], anywhere=True)
        except SegmentNotFound:
            log.warning("stream segment %s is gone: nothing to seal", name)


def _merge(ctl: Controller, state: records.StreamState, txn: records.Transaction) -> None:
    """Each transaction segment sealed and merged at the end of its data segment, one composite each.

    A transaction segment already gone was merged by an earlier try (a
    transaction's segments exist from its open to its commit or abort).
    """
    for segment_id, txn_segment in txn.segments:
        parent = _own(state, segment_id)
        try:
            ctl.store.composite([SealStep(txn_segment), MergeStep(parent, txn_segment)], anywhere=True)
        except SegmentNotFound as err:
            if err.step == 1:
                log.error("transaction %s: data segment %s is gone; its events are lost", txn.id, parent)
        except SegmentSealed as err:
            if err.step == 1:  # only a native seal of a stream's segment gets here
                log.error("transaction %s: data segment %s was sealed outside the stream", txn.id, parent)


def _delete_segments(ctl: Controller, names: Iterable[str]) -> None:
    """Delete the segments ``names`` (transaction segments: only the stream layer makes such names)."""
    for name in names:
        with contextlib.suppress(SegmentNotFound):
            ctl.store.composite([DeleteStep(name)], anywhere=True)


def _delete_own(ctl: Controller, state: records.StreamState, segment_ids: Iterable[int]) -> None:
    """Delete the stream's data segments ``segment_ids``; a stranger holding one of the names stays."""
    for segment_id in segment_ids:
        name = _own(state, segment_id)
        found = ctl.owned_id(state, name)
        if found is not None:
            with contextlib.suppress(SegmentNotFound):
                ctl.store.composite([DeleteStep(name, found)], anywhere=True)


def _truncate(ctl: Controller, state: records.StreamState, cut: records.Cut) -> None:
    """Delete the segments wholly before ``cut``, truncate the others at it."""
    _delete_own(ctl, state, (segment.id for segment in before(state, cut)))
    for segment_id, offset in cut.positions:
        with contextlib.suppress(SegmentNotFound):
            ctl.store.composite([TruncateStep(_own(state, segment_id), offset)], anywhere=True)


def before(state: records.StreamState, cut: records.Cut) -> list[records.Segment]:
    """The segments whose every event lies before ``cut``: sealed by the time each cut segment they
    overlap was created."""
    at = {sid for sid, _ in cut.positions}
    cut_segments = [state.segments[sid] for sid in at]
    found = []
    for segment in state.segments.values():
        if segment.id in at or segment.sealed_in is None:
            continue
        overlapping = [c for c in cut_segments if c.lo < segment.hi and segment.lo < c.hi]
        if overlapping and all(segment.sealed_in <= c.epoch for c in overlapping):
            found.append(segment)
    return found


def _delete_all(ctl: Controller, loaded: records.LoadedStream) -> None:
    """A stream's delete: its data and transaction segments, then its record."""
    state = loaded.state
    _delete_own(ctl, state, state.segments)
    for txn in state.unfinished_transactions():
        _delete_segments(ctl, (name for _, name in txn.segments))
    _delete_record(ctl, loaded)


def _delete_record(ctl: Controller, loaded: records.LoadedStream) -> None:
    """The stream's record, the last of a stream, if it is still the one loaded (one gone is fine)."""
    with contextlib.suppress(StreamNotFound):
        ctl.log.delete(loaded.scope, loaded.name, loaded.segment_id)
