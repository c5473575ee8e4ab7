"""The operation processor's scratch view of one batch (seed 000 "Segment Container Metadata").

``MetadataUpdater`` validates requests against the committed
``ContainerMetadata`` plus the batch's earlier operations (and those of the
batches in flight before it), assigns offsets and sequence numbers, and is
thrown away if the Tier 1 write fails: that is the rollback.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import ChainMap
from dataclasses import dataclass

from engine.errors import (
    BadOffset,
    ConditionalCheckFailed,
    EventNumberMismatch,
    InvalidArgument,
    SegmentExists,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegstoreError,
)
from engine.metadata import operations as ops
from engine.metadata.attribute_updates import INT64_MAX, INT64_MIN, Preloaded, resolve
from engine.metadata.container_metadata import (
    ContainerMetadata,
    SegmentMetadata,
    check_fork,
    merge_into,
    new_segment,
)
from engine.types import SegmentInfo


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a processed request resolves to once its batch is durable.

    ``logged`` False: nothing was written (a duplicate, or a no-op such as
    sealing a sealed segment); the answer still waits for the batch so that it
    never reports state that a failed write would undo.
    """

    logged: bool
    duplicate_of: int | None = None
    parts: tuple[Outcome, ...] = ()  # a composite's, one per part


def _staged_attributes(seg: SegmentMetadata, committed: bool) -> ChainMap[str, int]:
    """A batch's attribute view of ``seg``, where its own changes go.

    Over committed values it costs O(1). Over the view of a batch in flight,
    that batch's changes (and those under them) are merged into one map, so
    the chain stays three maps long however many batches follow each other.
    """
    if committed:
        return ChainMap({}, seg.attributes)
    if not isinstance(seg.attributes, ChainMap):  # created by a batch in flight
        return ChainMap({}, dict(seg.attributes))
    merged: dict[str, int] = {}
    for layer in reversed(seg.attributes.maps[:-1]):
        merged.update(layer)
    return ChainMap({}, merged, seg.attributes.maps[-1])


class MetadataUpdater:
    """One batch's view of the metadata: validate, assign, and stage changes.

    With several Tier 1 writes in flight a batch is validated on top of the
    batches before it that are not committed yet: its ``parent`` (and the
    parent's parent), cut off once the parent's batch is committed.
    """

    def __init__(self, base: ContainerMetadata, parent: MetadataUpdater | None = None) -> None:
        self.base = base
        self.parent = parent
        self.seq: int = base.seq if parent is None else parent.seq
        self.next_segment_id: int = base.next_segment_id if parent is None else parent.next_segment_id
        self._segments: dict[int, SegmentMetadata] = {}
        self._names: dict[str, int | None] = {}

    def _staged_id(self, name: str) -> tuple[bool, int | None]:
        """(True, id or None for a released name) if this batch or one in flight before it named ``name``."""
        updater: MetadataUpdater | None = self
        while updater is not None:
            if name in updater._names:
                return True, updater._names[name]
            updater = updater.parent
        return False, None

    def _staged_segment(self, seg_id: int) -> tuple[SegmentMetadata, bool]:
        """The newest view of a segment, and whether it is the committed one (else a batch in flight's)."""
        updater = self.parent
        while updater is not None:
            if seg_id in updater._segments:
                return updater._segments[seg_id], False
            updater = updater.parent
        return self.base.segments[seg_id], True

    def _lookup(self, name: str) -> SegmentMetadata:
        staged, seg_id = self._staged_id(name)
        if not staged:
            seg_id = self.base.names.get(name)
        if seg_id is None:
            raise SegmentNotFound(f"segment {name!r} does not exist")
        if seg_id not in self._segments:
            newest, committed = self._staged_segment(seg_id)
            attributes = _staged_attributes(newest, committed)
            self._segments[seg_id] = dataclasses.replace(newest, attributes=attributes)
        return self._segments[seg_id]

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def pre_process(self, op: ops.Operation) -> Outcome:
        """Validate ``op`` and stage it; raise a SegstoreError if it must be refused."""
        with self.base.lock:
            if isinstance(op, ops.MetadataCheckpoint):
                op.seq = self.next_seq()
                return Outcome(True)
            if isinstance(op, ops.Composite):
                return self._composite(op)
            assert isinstance(op, ops.SegmentOperation)
            if isinstance(op, ops.CreateSegment):
                return self._create(op)
            seg = self._lookup(op.name)
            if op.segment_id not in (-1, seg.segment_id):
                raise SegmentNotFound(f"segment {op.name!r} (id {op.segment_id}) was deleted")
            op.segment_id = seg.segment_id
            if isinstance(op, ops.MergeSegment):
                return self._merge(op, seg)
            outcome = self._validate(op, seg)
            if outcome.logged:
                op.seq = self.next_seq()
                seg.apply(op)
                if isinstance(op, ops.Delete):
                    self._names[seg.name] = None
            return outcome

    def _composite(self, op: ops.Composite) -> Outcome:
        """Judge every part on a scratch view of this one; keep the view only if all of them pass.

        A refused part's error says which part it was (``step``); nothing of
        the composite is then staged, and the sequence numbers its parts took
        are given again (none of them was written).
        """
        assert op.parts, "a composite needs at least one part"
        scratch = MetadataUpdater(self.base, self)
        outcomes: list[Outcome] = []
        for step, part in enumerate(op.parts):
            try:
                if isinstance(part, ops.Append) and part.render is not None:
                    part.data = part.render(scratch.state_of)
                    part.length = len(part.data)
                    if not part.data:
                        raise InvalidArgument("an append needs at least one byte")
                outcomes.append(scratch.pre_process(part))
            except SegstoreError as error:
                error.step = step
                raise
        self._segments.update(scratch._segments)
        self._names.update(scratch._names)
        self.seq, self.next_segment_id = scratch.seq, scratch.next_segment_id
        op.logged = [outcome.logged for outcome in outcomes]
        logged = op.logged_parts()
        if logged:
            op.seq = logged[-1].seq
        return Outcome(bool(logged), parts=tuple(outcomes))

    def state_of(self, name: str) -> SegmentInfo:
        """The state of segment ``name`` as this view has it (SegmentNotFound if it has none)."""
        return self._lookup(name).info()

    def _merge(self, op: ops.MergeSegment, target: SegmentMetadata) -> Outcome:
        if op.source == target.name:
            raise InvalidArgument(f"segment {target.name!r} cannot be merged into itself")
        if target.sealed:
            raise SegmentSealed(f"segment {target.name!r} is sealed", segment=target.info())
        source = self._lookup(op.source)
        if op.source_id not in (-1, source.segment_id):
            raise SegmentNotFound(f"segment {op.source!r} (id {op.source_id}) was deleted")
        if not source.sealed:
            raise SegmentNotSealed(f"segment {source.name!r} must be sealed before it is merged")
        if source.start_offset > 0:
            raise InvalidArgument(f"segment {source.name!r} is truncated; only a whole segment can be merged")
        op.source_id = source.segment_id
        op.offset = target.length
        op.length = source.length
        op.timestamp = time.time()
        if not op.record_as:
            op.record_as, op.record_created = source.name, source.created
        op.seq = self.next_seq()
        merge_into(target, source, op)
        self._names[source.name] = None
        return Outcome(True)

    def _create(self, op: ops.CreateSegment) -> Outcome:
        try:
            existing = self._lookup(op.name)
        except SegmentNotFound:
            pass
        else:
            raise SegmentExists(f"segment {op.name!r} already exists", segment=existing.info())
        if isinstance(op, ops.ForkSegment):
            # Committed state: only applied operations change a layout, and this thread applies them.
            check_fork(op, self._lookup(op.source))
        op.segment_id = self.next_segment_id
        self.next_segment_id += 1
        op.seq = self.next_seq()
        self._segments[op.segment_id] = new_segment(op)
        self._names[op.name] = op.segment_id
        return Outcome(True)

    def _validate(self, op: ops.SegmentOperation, seg: SegmentMetadata) -> Outcome:
        if isinstance(op, ops.Append):
            if seg.sealed:
                raise SegmentSealed(f"segment {seg.name!r} is sealed", segment=seg.info())
            if op.expected_offset is not None and op.expected_offset != seg.length:
                raise ConditionalCheckFailed(
                    f"expected offset {op.expected_offset}, but the length is {seg.length}",
                    segment=seg.info(),
                )
            current = functools.partial(self._attribute, seg, op.preloaded)
            if op.writer_id is not None:
                last = current(str(op.writer_id))
                assert op.event_number is not None
                if last is not None and op.event_number <= last:
                    return Outcome(False, duplicate_of=last)
                if op.previous_event_number is not None and last != op.previous_event_number:
                    raise EventNumberMismatch(
                        f"writer {op.writer_id}'s last event number on {seg.name!r} is "
                        f"{'none' if last is None else last}, not {op.previous_event_number}",
                        stored=last,
                        segment=seg.info(),
                    )
            if op.attribute_updates:
                op.attributes = resolve(op.attribute_updates, current, seg.info())
                if op.writer_id is not None and str(op.writer_id) in op.attributes:
                    raise InvalidArgument(f"attribute {op.writer_id} is the append's writer id")
            op.offset = seg.length
            op.timestamp = time.time()
            return Outcome(True)
        if isinstance(op, ops.Seal):
            return Outcome(not seg.sealed)
        if isinstance(op, ops.Truncate):
            if op.offset > seg.length:
                error = SegmentSealed if seg.sealed else BadOffset
                raise error(
                    f"truncate offset {op.offset} is past the length {seg.length}",
                    segment=seg.info(),
                )
            return Outcome(op.offset > seg.start_offset)
        if isinstance(op, ops.UpdateAttributes):
            if seg.sealed:
                raise SegmentSealed(f"segment {seg.name!r} is sealed", segment=seg.info())
            if op.updates:
                current = functools.partial(self._attribute, seg, op.preloaded)
                op.attributes = resolve(op.updates, current, seg.info())
            for key, value in op.attributes.items():
                if not INT64_MIN <= value <= INT64_MAX:
                    raise InvalidArgument(f"attribute {key} value {value} is not an int64")
            return Outcome(True)
        return Outcome(True)

    def _attribute(self, seg: SegmentMetadata, preloaded: Preloaded | None, key: str) -> int | None:
        """A key's value in this batch: staged or committed memory, else the operation's preload.

        Eviction changes the committed segment (under the lock held here), so
        its count is read there, not from the batch's copy.
        """
        if key in seg.attributes:
            return seg.attributes[key]
        committed = self.base.segments.get(seg.segment_id)
        if committed is None:  # created by a batch still in flight: every value is staged
            return None
        return committed.attribute(key, preloaded)

    def burn_sequence_numbers(self) -> None:
        """After a failed write: sequence numbers are never reused (seed 000)."""
        with self.base.lock:
            self.base.seq = max(self.base.seq, self.seq)
