"""Container and segment metadata (seed 000 "Segment Container Metadata").

``ContainerMetadata`` is the committed state: it changes only through
``apply`` (an operation made durable, or replayed in recovery) and through
the storage writer (storage length, sealed in storage, collection of deleted
segments). The processor's view of a batch not yet durable is
``engine.durable_log.metadata_updater.MetadataUpdater``.

Invariants, asserted on every change:
``0 <= start_offset <= length``, ``storage_length <= length``, start offset
and length never decrease, sequence numbers strictly increase.

A merge (seed 000 "MergeSegmentOperation") moves a sealed source's bytes to
the end of its target in one operation: the source's name is released at
once, and the Tier 2 chunks that already hold its bytes become the target's
*pending merges* until the storage writer joins them to the target's layout
(``UpdateLayout.merged``). Its unflushed bytes move into the target's read
index. The target remembers recent merges by source name, so a retried
commit answers with the first one's offset.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from engine.errors import (
    AttributesNotLoaded,
    LayoutChanged,
    SegmentNotFound,
)
from engine.metadata import operations as ops
from engine.metadata.attribute_updates import Preloaded
from engine.tier2.chunked_segment_storage import (
    ChunkRef,
    Layout,
    check_layout,
    concat_layouts,
    layout_from_json,
)
from engine.types import SegmentInfo

# Merges a target remembers for idempotent retries (the oldest are forgotten first).
MERGE_RECORDS_MAX = 1024
# Append boundaries a segment remembers for ``partitions``: one every
# ``boundary_spacing`` bytes at least, starting at BOUNDARY_SPACING_MIN_BYTES;
# past BOUNDARIES_MAX every other one is dropped and the spacing doubles.
BOUNDARY_SPACING_MIN_BYTES = 64 * 1024
BOUNDARIES_MAX = 1024


class PendingMerge(NamedTuple):
    """Chunks of a merged source, in target offsets from ``offset``, not yet in the target's layout."""

    offset: int
    chunks: Layout

    @property
    def end(self) -> int:
        return self.chunks[-1].end


def _pending_from_json(raw: list[Any]) -> list[PendingMerge]:
    return [PendingMerge(int(offset), layout_from_json(chunks)) for offset, chunks in raw]


@dataclass(slots=True)
class SegmentMetadata:
    segment_id: int
    name: str
    created: float
    rollover_bytes: int | None = None
    start_offset: int = 0
    storage_length: int = 0
    length: int = 0
    last_modified: float = 0.0
    sealed: bool = False
    sealed_in_storage: bool = False
    deleted: bool = False
    event_count: int = 0
    # Writer ids (UUID strings) -> last event number stored with an append.
    attributes: MutableMapping[str, int] = field(default_factory=dict)
    # Tier 2 layout: the chunks holding [first chunk's start, storage_length).
    chunks: list[ChunkRef] = field(default_factory=list)
    # Merged sources' chunks above storage_length, by offset (replaced, never changed in place).
    pending: list[PendingMerge] = field(default_factory=list)
    # Source name -> [offset, length, source's creation time] of recent merges into this one.
    merges: dict[str, list[float]] = field(default_factory=dict)
    # Offsets where appends (or merges) began, sparse and sorted (replaced, never changed in place).
    boundaries: list[int] = field(default_factory=list)
    boundary_spacing: int = BOUNDARY_SPACING_MIN_BYTES
    # The attribute index in Tier 2 (seed 001): the attribute segment's layout and
    # length, and the B+Tree root as [offset, length, lowest live page offset].
    attribute_chunks: list[ChunkRef] = field(default_factory=list)
    attribute_length: int = 0
    attribute_root: list[int] | None = None
    # Keys changed in ``attributes`` and not yet in the index -> sequence number of the change.
    dirty: dict[str, int] = field(default_factory=dict)
    # How many times clean keys were evicted from ``attributes`` (see attributes.Preloaded).
    evictions: int = 0

    def check(self) -> None:
        assert 0 <= self.start_offset <= self.length, self
        assert 0 <= self.storage_length <= self.length, self
        assert self.event_count >= 0, self

    def check_pending(self) -> None:
        """Pending merges lie in order between the storage length and the length."""
        end = self.storage_length
        for merge in self.pending:
            assert merge.offset >= end, (merge.offset, end)
            check_layout(merge.chunks, merge.end, merge.offset)
            assert merge.chunks[0].start == merge.offset, merge
            end = merge.end
        assert end <= self.length, (end, self.length)

    def read_layout(self) -> Layout:
        """Every chunk holding the segment's bytes in Tier 2: its layout, then pending merges.

        Not contiguous when bytes between them are still only in Tier 1 (and the cache).
        """
        if not self.pending:
            return self.chunks
        return [*self.chunks, *(c for merge in self.pending for c in merge.chunks)]

    def add_boundaries(self, offsets: list[int]) -> None:
        """Remember append boundaries (ascending, at or past the last one) for ``partitions``."""
        kept = self.boundaries
        for offset in offsets:
            if not kept or offset >= kept[-1] + self.boundary_spacing:
                if kept is self.boundaries:
                    kept = list(kept)
                kept.append(offset)
        while len(kept) > BOUNDARIES_MAX:
            kept = kept[::2]
            self.boundary_spacing *= 2
        self.boundaries = kept

    def partitions(self, target_bytes: int) -> list[tuple[int, int]]:
        """Contiguous ranges covering [start offset, length), each starting on an append boundary.

        Each range ends at the remembered boundary nearest to ``target_bytes``
        past its start; a short rest joins the last range. The first range
        starts at the start offset, which may be any offset a truncate named.
        """
        assert target_bytes > 0, target_bytes
        if self.start_offset == self.length:
            return []
        cuts = [b for b in self.boundaries if self.start_offset < b < self.length]
        ranges: list[tuple[int, int]] = []
        start, i = self.start_offset, 0
        while i < len(cuts):
            goal = start + target_bytes
            while i + 1 < len(cuts) and abs(cuts[i + 1] - goal) < abs(cuts[i] - goal):
                i += 1
            if cuts[i] - start < target_bytes / 2:  # no cut near the goal: take a longer range
                i += 1
                continue
            if self.length - cuts[i] < target_bytes / 2:  # the rest joins this range
                break
            ranges.append((start, cuts[i]))
            start = cuts[i]
            i += 1
        ranges.append((start, self.length))
        return ranges

    def attribute(self, key: str, preloaded: Preloaded | None) -> int | None:
        """The key's value for validating an operation: memory, else what was fetched for it.

        Raises AttributesNotLoaded when neither can tell (the caller fetches and retries).
        """
        value = self.attributes.get(key)
        if value is not None or self.attribute_root is None:  # no index: memory has every value
            return value
        if preloaded is not None and key in preloaded.values and preloaded.evictions == self.evictions:
            return preloaded.values[key]
        raise AttributesNotLoaded(f"attribute {key} of segment {self.name!r} must be fetched first")

    def info(self) -> SegmentInfo:
        return SegmentInfo(
            name=self.name,
            segment_id=self.segment_id,
            length=self.length,
            start_offset=self.start_offset,
            storage_length=self.storage_length,
            sealed=self.sealed,
            event_count=self.event_count,
            created=self.created,
            last_modified=self.last_modified or self.created,
        )

    def apply(self, op: ops.SegmentOperation) -> None:
        """Apply a validated operation of this segment."""
        assert op.segment_id == self.segment_id, (op, self.segment_id)
        if isinstance(op, ops.Append):
            assert op.offset == self.length, f"append at {op.offset}, length {self.length}"
            assert not self.sealed and not self.deleted
            self.add_boundaries([op.offset])
            self.length += op.length
            self.last_modified = op.timestamp
            self.event_count += op.event_count
            if op.writer_id is not None:
                key = str(op.writer_id)
                assert op.event_number is not None
                assert op.event_number > self.attributes.get(key, -1)
                self.attributes[key] = op.event_number
            if op.attributes:
                self.attributes.update(op.attributes)
        elif isinstance(op, ops.Seal):
            self.sealed = True
        elif isinstance(op, ops.Truncate):
            assert op.offset <= self.length
            self.start_offset = max(self.start_offset, op.offset)
            if self.boundaries and self.boundaries[0] < self.start_offset:
                self.boundaries = [b for b in self.boundaries if b >= self.start_offset]
        elif isinstance(op, ops.Delete):
            self.deleted = True
        elif isinstance(op, ops.UpdateAttributes):
            self.attributes.update(op.attributes)
        elif isinstance(op, ops.UpdateAttributeIndex):
            assert op.length >= self.attribute_length, (op.length, self.attribute_length)
            self.attribute_chunks = layout_from_json(op.chunks)
            self.attribute_length = op.length
            self.attribute_root = op.root
            if self.attribute_chunks:
                check_layout(self.attribute_chunks, op.length, self.attribute_chunks[0].start)
            assert op.root is None or op.root[0] + op.root[1] <= op.length, op
        elif isinstance(op, ops.UpdateLayout):
            assert op.storage_length >= self.storage_length, (op, self.storage_length)
            self.chunks = layout_from_json(op.chunks)
            self.storage_length = op.storage_length
            check_layout(self.chunks, self.storage_length, self.start_offset)
            if op.merged or self.pending:
                taken = [m for m in self.pending if m.offset in op.merged]
                assert len(taken) == len(op.merged), (op.merged, self.pending)
                names = {c.name for c in self.chunks}  # a merged last chunk may have grown since
                assert all(c.name in names for m in taken for c in m.chunks), taken
                self.pending = [m for m in self.pending if m.offset not in op.merged]
                self.check_pending()
        else:
            raise AssertionError(f"not a segment operation: {op!r}")
        self.check()


def merge_into(target: SegmentMetadata, source: SegmentMetadata, op: ops.MergeSegment) -> None:
    """Apply a validated merge to the target: its length, event count, pending chunks, record.

    Collections are replaced, not changed in place: a processor batch's
    staged copy of the target shares them with the committed one.
    """
    assert source.sealed and not source.deleted and source.start_offset == 0, source
    assert not target.sealed and not target.deleted, target
    assert op.offset == target.length and op.length == source.length, (op, target.length, source.length)
    moved = [PendingMerge(op.offset, concat_layouts([], op.offset, source.chunks))] if source.chunks else []
    moved += [PendingMerge(op.offset + m.offset, _shifted(m.chunks, op.offset)) for m in source.pending]
    target.pending = [*target.pending, *moved]
    target.add_boundaries([op.offset] + [op.offset + b for b in source.boundaries if b > 0])
    target.length += source.length
    target.event_count += source.event_count
    target.last_modified = op.timestamp
    merges = {k: v for k, v in target.merges.items() if k != op.record_as}
    merges[op.record_as] = [op.offset, op.length, op.record_created]
    if len(merges) > MERGE_RECORDS_MAX:
        merges = dict(list(merges.items())[-MERGE_RECORDS_MAX:])
    target.merges = merges
    target.check()
    target.check_pending()


def set_attributes(op: ops.Append | ops.UpdateAttributes) -> dict[str, int]:
    """The attribute values an applied operation set (a writer id's event number is one)."""
    if isinstance(op, ops.Append) and op.writer_id is not None:
        assert op.event_number is not None
        return {**op.attributes, str(op.writer_id): op.event_number}
    return op.attributes


def _load(seg: SegmentMetadata, preloaded: Preloaded) -> None:
    """Keep fetched values in memory (seed 001, 1.3), never over a value memory already has."""
    if preloaded.evictions != seg.evictions:
        return
    for key, value in preloaded.values.items():
        if value is not None and key not in seg.attributes:
            seg.attributes[key] = value


def _shifted(chunks: Layout, by: int) -> Layout:
    return [c._replace(start=c.start + by) for c in chunks]


def new_segment(op: ops.CreateSegment) -> SegmentMetadata:
    """The metadata a create starts a segment with (empty, an imported layout, or a fork's prefix)."""
    seg = SegmentMetadata(op.segment_id, op.name, op.created, op.rollover_bytes)
    if op.length:
        seg.chunks = layout_from_json(op.chunks)
        seg.length = seg.storage_length = op.length
        seg.start_offset = max(op.start_offset, seg.chunks[0].start if seg.chunks else op.length)
        check_layout(seg.chunks, seg.storage_length, seg.start_offset)
    if isinstance(op, ops.ForkSegment):
        seg.length += op.data_length
        seg.boundaries = list(op.boundaries)
        seg.last_modified = op.created
        assert all(seg.start_offset <= b < seg.length for b in seg.boundaries), op.boundaries
    seg.check()
    return seg


def check_fork(op: ops.ForkSegment, source: SegmentMetadata) -> None:
    """Refuse a fork whose chunks its source's layout no longer names (LayoutChanged: take it again).

    A chunk the source still names keeps its bytes: only a layout that
    stopped naming it lets it go (and then only if no fork names it either).
    """
    if op.source_id != source.segment_id:
        raise SegmentNotFound(f"segment {op.source!r} (id {op.source_id}) was deleted")
    assert op.length + op.data_length <= source.length, (op, source.length)
    held = {c.name: c for c in source.chunks}
    for chunk in layout_from_json(op.chunks):
        now = held.get(chunk.name)
        if now is None or now.start != chunk.start or now.length < chunk.length:
            detail = f"the Tier 2 layout of {source.name!r} changed during the fork"
            raise LayoutChanged(detail, retry_after_s=0)


class ContainerMetadata:
    """Committed metadata of one container; ``lock`` guards every read and change."""

    def __init__(self, container_id: int) -> None:
        self.container_id = container_id
        self.epoch = 0
        self.seq = 0  # the last sequence number assigned
        self.next_segment_id = 1
        self.segments: dict[int, SegmentMetadata] = {}
        self.names: dict[str, int] = {}  # live (not deleted) names only
        self.unflushed_bytes = 0  # sum of length - storage_length over live segments
        # Tier 2 chunks nothing names any more (a merged source's attribute index), to delete.
        self.orphan_chunks: list[str] = []
        self.lock = threading.RLock()

    # --------------------------------------------------------------- lookups
    def by_name(self, name: str) -> SegmentMetadata:
        """The live segment called ``name``; the caller holds ``lock``."""
        seg_id = self.names.get(name)
        if seg_id is None:
            raise SegmentNotFound(f"segment {name!r} does not exist")
        return self.segments[seg_id]

    def info(self, name: str) -> SegmentInfo:
        with self.lock:
            return self.by_name(name).info()

    def unreferenced(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` that no live segment's layout names, so they may leave Tier 2.

        A fork names its source's chunks: a chunk one segment lets go of
        (delete, truncation, defrag) may still hold another one's bytes, and
        goes with the last segment that names it.
        """
        names = list(names)
        if not names:
            return names
        with self.lock:
            held = {c.name for s in self.segments.values() if not s.deleted for c in s.read_layout()}
        return [n for n in names if n not in held]

    def storage_lengths(self) -> dict[int, int]:
        """Segment id -> storage length: what the cache may evict below."""
        with self.lock:
            return {s.segment_id: s.storage_length for s in self.segments.values()}

    # --------------------------------------------------------------- changes
    def apply(self, op: ops.Operation) -> None:
        """Apply one durable operation (commit or recovery)."""
        with self.lock:
            assert op.seq > self.seq or isinstance(op, ops.MetadataCheckpoint), (op.seq, self.seq)
            self.seq = max(self.seq, op.seq)
            if isinstance(op, ops.CreateSegment):
                assert op.name not in self.names, op.name
                assert op.segment_id >= self.next_segment_id, (op.segment_id, self.next_segment_id)
                seg = self.segments[op.segment_id] = new_segment(op)
                self.names[op.name] = op.segment_id
                self.next_segment_id = op.segment_id + 1
                self.unflushed_bytes += seg.length - seg.storage_length
            elif isinstance(op, ops.MergeSegment):
                target = self.segments[op.segment_id]
                source = self.segments.pop(op.source_id)
                del self.names[source.name]
                self.orphan_chunks.extend(c.name for c in source.attribute_chunks)
                unflushed = target.length - target.storage_length + source.length - source.storage_length
                merge_into(target, source, op)
                self.unflushed_bytes += target.length - target.storage_length - unflushed
            elif isinstance(op, ops.SegmentOperation):
                seg = self.segments[op.segment_id]
                flushed = seg.storage_length
                if isinstance(op, ops.Append | ops.UpdateAttributes) and op.preloaded is not None:
                    _load(seg, op.preloaded)
                seg.apply(op)
                if isinstance(op, ops.Append | ops.UpdateAttributes):
                    for key in set_attributes(op):
                        seg.dirty[key] = op.seq
                elif isinstance(op, ops.UpdateAttributeIndex):
                    seg.dirty = {k: seq for k, seq in seg.dirty.items() if seq > op.persisted_seq}
                self.unflushed_bytes -= seg.storage_length - flushed
                assert self.unflushed_bytes >= 0, self.unflushed_bytes
                if isinstance(op, ops.Append):
                    self.unflushed_bytes += op.length
                elif isinstance(op, ops.Delete):
                    del self.names[seg.name]
                    self.unflushed_bytes -= seg.length - seg.storage_length

    def evict_attributes(self, max_keys: int) -> int:
        """Drop clean attribute values (those in the index) until at most ``max_keys`` stay in memory.

        Returns how many were dropped. Dirty values never leave memory.
        """
        with self.lock:
            total = sum(len(s.attributes) for s in self.segments.values())
            dropped = 0
            for seg in self.segments.values():
                if total - dropped <= max_keys:
                    break
                if seg.attribute_root is None or seg.deleted:
                    continue
                clean = [k for k in seg.attributes if k not in seg.dirty][: total - dropped - max_keys]
                if clean:
                    for key in clean:
                        del seg.attributes[key]
                    seg.evictions += 1
                    dropped += len(clean)
            return dropped

    def mark_sealed_in_storage(self, segment_id: int) -> None:
        with self.lock:
            seg = self.segments.get(segment_id)
            if seg is not None:  # else merged into another meanwhile
                seg.sealed_in_storage = True

    def forget(self, segment_id: int) -> None:
        """Drop a deleted segment whose Tier 2 data is gone."""
        with self.lock:
            seg = self.segments.pop(segment_id)
            assert seg.deleted, seg

    # ----------------------------------------------------------- checkpoints
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "container_id": self.container_id,
                "epoch": self.epoch,
                "next_segment_id": self.next_segment_id,
                "segments": [asdict(s) for s in self.segments.values()],
            }

    def restore(self, snapshot: dict[str, Any], seq: int) -> None:
        with self.lock:
            assert snapshot["container_id"] == self.container_id, snapshot["container_id"]
            self.epoch = snapshot["epoch"]
            self.next_segment_id = snapshot["next_segment_id"]
            self.seq = seq
            self.segments = {}
            self.names = {}
            self.unflushed_bytes = 0
            for raw in snapshot["segments"]:
                chunks, pending = layout_from_json(raw["chunks"]), _pending_from_json(raw["pending"])
                attribute_chunks = layout_from_json(raw.get("attribute_chunks", []))
                seg = SegmentMetadata(
                    **{**raw, "chunks": chunks, "pending": pending, "attribute_chunks": attribute_chunks}
                )
                seg.check()
                check_layout(seg.chunks, seg.storage_length, seg.start_offset)
                seg.check_pending()
                self.segments[seg.segment_id] = seg
                if not seg.deleted:
                    self.names[seg.name] = seg.segment_id
                    self.unflushed_bytes += seg.length - seg.storage_length
