"""StorageWriter: moves committed operations to Tier 2 (seed 000 "Storage Writer").

It reads the in-memory operation log in order and keeps one aggregator per
segment. An aggregator is flushed when it holds ``flush_threshold_bytes``,
is ``flush_threshold_ms`` old, or carries a seal, truncate or delete. A
flush writes the segment's bytes from its storage length up to the last
append seen (read from the read index) into chunks, then makes the new
layout durable with an ``UpdateLayout`` log operation, which also advances
the storage length (seed 002: layout changes are fenced by Tier 1). Bytes
below the storage length are never written again, which makes replay after
a crash idempotent. Chunks leave Tier 2 only after a durable layout stops
naming them (truncation, defrag, delete), and only when no other layout
names them (a fork shares its source's chunks). Tier 2 errors are retried with
exponential backoff; the bytes stay in Tier 1 and the cache meanwhile. After
each round Tier 1 is truncated below the lowest sequence number not yet in
Tier 2.

A merge hands the source's aggregator to the target (its unflushed bytes are
the target's now, and its oldest sequence number keeps Tier 1 from being
truncated past them). Flushing the target, the writer stops at each pending
merge and joins the source's chunks to the layout without copying a byte
(seed 002 "Concatenation"), then goes on with the bytes after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.attributes.segment_attributes import SegmentAttributes
from engine.config import Settings
from engine.durable_log.durable_log import DurableLog
from engine.errors import SegmentNotFound, SegstoreError
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata, PendingMerge, set_attributes
from engine.metrics import EngineMetrics
from engine.reads.read_index import ReadIndex
from engine.tier2.chunk_storage import ChunkStorageError
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage, ChunkRef

log = logging.getLogger(__name__)

_BACKOFF_MAX_S = 10.0
# Most bytes a flush writes to Tier 2 before it commits the new layout.
_LAYOUT_COMMIT_BYTES = 64 * 1024 * 1024
# What one attribute value held in metadata costs in memory, roughly (key string, int, dict slot).
ATTRIBUTE_MEMORY_BYTES = 200


@dataclass(slots=True)
class _Aggregator:
    first_seq: int
    first_time: float
    end: int = 0
    seal: bool = False
    truncate: bool = False
    delete: bool = False
    # The latest value of each attribute changed since the last index write, and the
    # sequence number of the last change (seed 001: one value per key per flush).
    attributes: dict[str, int] = field(default_factory=dict)
    attribute_seq: int = 0


class StorageWriter:
    """One container's background flusher from Tier 1 to Tier 2."""

    def __init__(
        self,
        container_id: int,
        settings: Settings,
        durable_log: DurableLog,
        metadata: ContainerMetadata,
        read_index: ReadIndex,
        chunked: ChunkedSegmentStorage,
        attributes: SegmentAttributes,
        metrics: EngineMetrics,
    ) -> None:
        self.container_id = container_id
        self.settings = settings
        self.durable_log = durable_log
        self.metadata = metadata
        self.read_index = read_index
        self.chunked = chunked
        self.attributes = attributes
        self.metrics = metrics
        self._aggregators: dict[int, _Aggregator] = {}
        self._last_seq = 0
        self._truncated_below = 0
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._force = False
        self._thread: threading.Thread | None = None
        # The error of the last round when Tier 2 writes fail (retried), None once a round succeeds.
        self.failing: Exception | None = None
        self._lag_gauge = metrics.writer_lag_bytes.labels(str(container_id))
        self._cache_gauge = metrics.cache_bytes.labels(str(container_id))

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        with self.metadata.lock:
            deleted = [s.segment_id for s in self.metadata.segments.values() if s.deleted]
            merging = {s.segment_id: s.length for s in self.metadata.segments.values() if s.pending}
        for segment_id in deleted:  # deleted before the checkpoint we recovered from
            self._aggregators[segment_id] = _Aggregator(0, 0.0, delete=True)
        for segment_id, length in merging.items():  # merges that must still reach Tier 2
            self._aggregators.setdefault(segment_id, _Aggregator(0, 0.0, end=length))
        self._thread = threading.Thread(target=self._run, name=f"writer-{self.container_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No flush begins from now on (one under way ends at its next Tier 1 commit, once the log closes)."""
        self._stop.set()
        self.durable_log.memory_log.close()

    def close(self) -> None:
        """Stop, and wait for a Tier 2 write under way where the next owner could read what it adds.

        A write on a binding that appends may add bytes to a chunk this
        epoch created, which the next owner reads up to its recorded length
        and may join (defrag): it is waited for. Elsewhere (S3) a write under
        way can only create an object of this epoch that no layout will name
        (its commit fails once the log is closed; the next epoch's start
        collects it), so a hand-over does not wait for it.
        """
        self.stop()
        if self._thread is not None and self.chunked.storage.supports_append:
            self._thread.join(30)

    def flush(self, timeout_s: float) -> None:
        """Wait until every operation committed so far is applied to Tier 2."""
        target = self.durable_log.last_committed_seq
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._last_seq < target or self._aggregators:
                self._force = True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    raise TimeoutError(f"container {self.container_id}: Tier 2 flush timed out")
                self._cond.wait(min(remaining, 0.05))

    # ------------------------------------------------------------------- loop
    def _run(self) -> None:
        backoff = 0.0
        poll_s = max(0.005, min(self.settings.flush_threshold_ms / 4000, 0.25))
        while not self._stop.is_set():
            batch = self.durable_log.read(self._last_seq, 4096, 0 if self._force else poll_s)
            for op in batch:
                self._accept(op)
                self._last_seq = op.seq
            try:
                self._flush_due()
            except (OSError, ChunkStorageError, SegstoreError) as exc:
                if self._stop.is_set():
                    return  # the log closed under the flush: the next owner writes its bytes again
                if self.durable_log.failure is not None:  # fenced, or its processor failed: for good
                    log.info(
                        "container %d: Tier 2 flushes stop, as the Tier 1 log takes no more writes (%s); "
                        "its bytes stay in Tier 1 for the next owner",
                        self.container_id,
                        self.durable_log.failure,
                    )
                    self._stop.set()  # a flush waited for ends now
                    return
                self.metrics.tier2_errors.inc()
                self.failing = exc
                backoff = min(max(0.1, backoff * 2), _BACKOFF_MAX_S)
                log.warning(
                    "container %d: Tier 2 flush failed (%s); retrying in %.1fs",
                    self.container_id,
                    exc,
                    backoff,
                )
                self._stop.wait(backoff)
                continue
            if self._stop.is_set():
                return  # Tier 1 is not truncated past a close: the next owner owns the log
            backoff = 0.0
            self.failing = None
            self._after_round()

    def _accept(self, op: ops.Operation) -> None:
        if not isinstance(
            op, ops.Append | ops.Seal | ops.Truncate | ops.Delete | ops.MergeSegment | ops.UpdateAttributes
        ) and not (isinstance(op, ops.ForkSegment) and op.data_length):
            return
        agg = self._aggregators.get(op.segment_id)
        if agg is None:
            agg = self._aggregators[op.segment_id] = _Aggregator(op.seq, time.monotonic())
        if isinstance(op, ops.Append | ops.UpdateAttributes) and (values := set_attributes(op)):
            agg.attributes.update(values)
            agg.attribute_seq = op.seq
        if isinstance(op, ops.Append):
            agg.end = max(agg.end, op.offset + op.length)
        elif isinstance(op, ops.ForkSegment):  # its tail, past the chunks it shares with its source
            agg.end = max(agg.end, op.length + op.data_length)
        elif isinstance(op, ops.MergeSegment):
            # The source's attributes stay with it (seed 001 keeps no rule to carry them).
            source = self._aggregators.pop(op.source_id, None)
            if source is not None:
                agg.first_seq = min(agg.first_seq, source.first_seq)
            self.attributes.forget(op.source_id)
            agg.end = max(agg.end, op.offset + op.length)
        elif isinstance(op, ops.Seal):
            agg.seal = True
        elif isinstance(op, ops.Truncate):
            agg.truncate = True
        elif isinstance(op, ops.Delete):
            agg.delete = True

    def _flush_due(self) -> None:
        now = time.monotonic()
        age_s = self.settings.flush_threshold_ms / 1000
        for segment_id, agg in list(self._aggregators.items()):
            with self.metadata.lock:
                seg = self.metadata.segments.get(segment_id)
                storage_length = seg.storage_length if seg else 0
            if seg is None:
                # Merged into another segment: the merge, once read, hands this aggregator
                # (and its oldest sequence number, which holds Tier 1) to the target.
                continue
            due = (
                self._force
                or agg.seal
                or agg.truncate
                or agg.delete
                or agg.end - storage_length >= self.settings.flush_threshold_bytes
                or now - agg.first_time >= age_s
            )
            if not due:
                continue
            if self._stop.is_set():
                return
            began = time.monotonic()
            flushed = self._flush(segment_id, agg)
            self.metrics.tier2_flush_seconds.observe(time.monotonic() - began)
            if flushed:
                del self._aggregators[segment_id]

    def _flush(self, segment_id: int, agg: _Aggregator) -> bool:
        """Apply the aggregator to Tier 2; False if the segment went meanwhile (keep the aggregator).

        A segment merged into another keeps its aggregator until the merge
        operation hands it over; one deleted gets the delete flag when its
        delete is read.
        """
        with self.metadata.lock:
            seg = self.metadata.segments.get(segment_id)
            if seg is None:
                return False
            name, chunks, flushed = seg.name, list(seg.chunks), seg.storage_length
            pending = list(seg.pending)
            attribute_chunks = list(seg.attribute_chunks)
            rollover = seg.rollover_bytes or self.settings.rollover_bytes
        if agg.delete:
            self._delete_chunks(
                c.name for c in [*chunks, *(c for m in pending for c in m.chunks), *attribute_chunks]
            )
            self.read_index.drop_segment(segment_id)
            self.attributes.forget(segment_id)
            self.metadata.forget(segment_id)
            return True
        # Bytes are copied out of the cache a step at a time (bounded memory); the
        # layout is committed through Tier 1 once per commit_bytes, not per step,
        # so a large backlog is not paced by one Tier 1 round trip per step.
        step = max(self.settings.flush_threshold_bytes, 1)
        if not self.chunked.storage.supports_append:
            # Every step is an object of its own: none small enough for defrag to copy again.
            step = max(step, self.settings.defrag_small_bytes)
        commit_bytes = max(step, _LAYOUT_COMMIT_BYTES)
        layout, written = chunks, flushed
        pending = [m for m in pending if m.offset < agg.end]
        merged: list[PendingMerge] = []
        while written < agg.end:
            if pending and pending[0].offset == written:
                merge = pending.pop(0)
                layout = [*layout, *merge.chunks]
                written = merge.end
                merged.append(merge)
            else:
                stop = pending[0].offset if pending else agg.end
                data = self.read_index.read(segment_id, written, min(stop - written, step))
                if not data:
                    with self.metadata.lock:
                        gone = segment_id not in self.metadata.segments
                    assert gone, f"segment {segment_id}: unflushed bytes at {written} are not cached"
                    # Merged meanwhile: its bytes were moved to the target, which flushes them.
                    self._drop_uncommitted(chunks, layout, merged)
                    return False
                layout = self.chunked.write(name, segment_id, layout, written, data, rollover)
                written += len(data)
                self.metrics.tier2_flush_bytes.inc(len(data))
            if written - flushed >= commit_bytes or written >= agg.end:
                if not self._commit_layout(name, segment_id, chunks, layout, written, merged):
                    return False
                known = {c.name for c in chunks} | {c.name for m in merged for c in m.chunks}
                self.metrics.tier2_chunks_created.inc(sum(c.name not in known for c in layout))
                self.metrics.tier2_merge_bytes.inc(sum(m.end - m.offset for m in merged))
                chunks, flushed, merged = layout, written, []
        with self.metadata.lock:
            seg = self.metadata.segments.get(segment_id)
            start_offset = seg.start_offset if seg is not None else 0
        kept, removed = self.chunked.truncate(chunks, start_offset)
        if removed and self._commit_layout(name, segment_id, chunks, kept, flushed, []):
            self._delete_chunks(removed)
            chunks = kept
        if len(chunks) > self.settings.defrag_min_chunks:
            self._defrag(name, segment_id, chunks, flushed, rollover)
        if agg.attributes:
            self._delete_chunks(
                self.attributes.write(segment_id, agg.attributes, agg.attribute_seq, self._commit_index)
            )
            agg.attributes = {}
        if agg.seal:
            self.metadata.mark_sealed_in_storage(segment_id)
        return True

    def _defrag(
        self, name: str, segment_id: int, chunks: list[ChunkRef], flushed: int, rollover: int
    ) -> None:
        joined = self.chunked.defrag(
            name,
            segment_id,
            chunks,
            small_bytes=self.settings.defrag_small_bytes,
            min_run=self.settings.defrag_min_chunks,
            max_bytes=rollover,
        )
        if joined is not None:
            layout, replaced = joined
            if self._commit_layout(name, segment_id, chunks, layout, flushed, []):
                self.metrics.tier2_chunks_created.inc()
                self._delete_chunks(replaced)

    def _delete_chunks(self, names: Iterable[str]) -> None:
        names = self.metadata.unreferenced(names)  # a fork may still name them
        self.chunked.delete_chunks(names)
        self.metrics.tier2_chunks_deleted.inc(len(names))

    def _commit_layout(
        self,
        name: str,
        segment_id: int,
        old: list[ChunkRef],
        new: list[ChunkRef],
        storage_length: int,
        merged: list[PendingMerge],
    ) -> bool:
        """Make a new layout durable; False (and the chunks it wrote deleted) if the segment is gone.

        ``merged``: the pending merges whose chunks ``new`` takes over.
        """
        op = ops.UpdateLayout(
            name=name,
            segment_id=segment_id,
            chunks=[list(c) for c in new],
            storage_length=storage_length,
            merged=[m.offset for m in merged],
        )
        try:
            self.durable_log.add(op).result()
        except SegmentNotFound:
            self._drop_uncommitted(old, new, merged)
            return False
        return True

    def _drop_uncommitted(self, old: list[ChunkRef], new: list[ChunkRef], merged: list[PendingMerge]) -> None:
        """Undo a flush whose layout never committed (its segment was merged or deleted meanwhile).

        The chunks it created are deleted and the chunks it extended are cut
        back to their recorded length, so no chunk holds bytes no layout names:
        the target of a merge, which now owns them, appends to them where its
        layout says they end (it used to find the extra bytes by BadChunkOffset
        and start a chunk of its own, the bytes written twice).
        """
        recorded = {c.name: c.length for c in old} | {c.name: c.length for m in merged for c in m.chunks}
        self._delete_chunks(c.name for c in new if c.name not in recorded)
        self.chunked.cut_back(
            c._replace(length=recorded[c.name])
            for c in new
            if c.name in recorded and c.length > recorded[c.name]
        )

    def _commit_index(self, op: ops.UpdateAttributeIndex, written: int) -> bool:
        """Make an attribute index update durable; False if the segment is gone."""
        self.metrics.attribute_index_bytes.inc(written)
        try:
            self.durable_log.add(op).result()
        except SegmentNotFound:
            return False
        return True

    def _after_round(self) -> None:
        lowest = min((a.first_seq for a in self._aggregators.values()), default=self._last_seq + 1)
        if lowest > self._truncated_below:
            self.durable_log.truncate(lowest)
            self._truncated_below = lowest
        if self.read_index.cache.size > self.read_index.cache.max_bytes:
            self.read_index.evict(self.metadata.storage_lengths())
        with self.metadata.lock:
            orphans, self.metadata.orphan_chunks = self.metadata.orphan_chunks, []
        try:
            self._delete_chunks(orphans)
        except (OSError, ChunkStorageError) as exc:  # the next round tries again
            log.warning("container %d: deleting unused chunks failed: %s", self.container_id, exc)
            with self.metadata.lock:
                self.metadata.orphan_chunks.extend(orphans)
        held_max = self.settings.attribute_cache_max_bytes // ATTRIBUTE_MEMORY_BYTES
        self.metrics.attributes_evicted.inc(self.metadata.evict_attributes(held_max))
        self._lag_gauge.set(self.metadata.unflushed_bytes)
        self._cache_gauge.set(self.read_index.cache.size)
        with self._cond:
            if not self._aggregators:
                self._force = False
            self._cond.notify_all()
