"""SegmentContainer: one shard of segments and its components (seed 000 "Segment Containers").

It receives its Tier 1 log and Tier 2 chunk storage from outside (easy to
test with the in-memory twins), builds metadata, cache, read index, durable
log, chunked segment storage and storage writer, recovers them on ``start``
and turns requests into log operations. Reads are served by the read index
from the cache; the storage reader fetches what was evicted from Tier 2.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence

from engine import naming
from engine.attributes.segment_attributes import SegmentAttributes
from engine.config import Settings
from engine.container import composite
from engine.container.forks import fork_operation
from engine.container.lifecycle import ContainerLifecycle
from engine.durable_log.data_log import DurableDataLog
from engine.durable_log.durable_log import DurableLog
from engine.durable_log.metadata_updater import Outcome
from engine.errors import (
    AttributesNotLoaded,
    BadOffset,
    ContainerNotReady,
    InvalidArgument,
    LayoutChanged,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegstoreError,
    StorageFull,
    Throttled,
)
from engine.metadata import operations as ops
from engine.metadata.attribute_updates import AttributeUpdate, Preloaded, check_request
from engine.metadata.container_metadata import ContainerMetadata
from engine.metrics import EngineMetrics
from engine.reads.cache import Cache
from engine.reads.read_index import ReadIndex
from engine.reads.storage_reader import StorageReader
from engine.storage_writer import StorageWriter
from engine.tier2.chunk_storage import (
    ChunkNotFound,
    ChunkStorage,
    ChunkStorageError,
    ChunkStorageFull,
)
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo

log = logging.getLogger(__name__)

_INT64_MAX = 2**63 - 1
# Fetches of attribute values an operation may need before it gives up (AttributesNotLoaded, 503).
_PRELOAD_TRIES = 5
# Forks a source's layout changes may overtake before the fork gives up (LayoutChanged, 503).
_FORK_TRIES = 5
# How long a fork with a large unflushed tail waits for Tier 2 to take it.
_FORK_FLUSH_TIMEOUT_S = 30.0
def _parts(op: ops.Operation) -> list[ops.Operation]:
    return list(op.parts) if isinstance(op, ops.Composite) else [op]


def _keys(op: ops.Append | ops.UpdateAttributes) -> list[str]:
    """The attribute keys an operation reads: its updates' keys, and an append's writer id."""
    updates = op.attribute_updates if isinstance(op, ops.Append) else op.updates
    keys = [str(u.key) for u in updates]
    if isinstance(op, ops.Append) and op.writer_id is not None:
        keys.insert(0, str(op.writer_id))
    return keys


class SegmentContainer(ContainerLifecycle):
    """All segments whose names hash to ``container_id``."""

    def __init__(
        self,
        container_id: int,
        settings: Settings,
        data_log: DurableDataLog,
        storage: ChunkStorage,
        metrics: EngineMetrics,
    ) -> None:
        self.container_id = container_id
        self.settings = settings
        self.chunked = ChunkedSegmentStorage(storage, container_id)
        self.metadata = ContainerMetadata(container_id)
        cache = Cache(max(settings.cache_max_bytes // settings.container_count, 1))
        self.read_index = ReadIndex(cache, block_bytes=settings.cache_block_bytes)
        self.durable_log = DurableLog(settings, data_log, self.metadata, self.read_index, metrics)
        node_cache_bytes = max(settings.attribute_index_cache_bytes // settings.container_count, 1)
        self.attributes = SegmentAttributes(self.metadata, self.chunked, node_cache_bytes)
        self.storage_writer = StorageWriter(
            container_id,
            settings,
            self.durable_log,
            self.metadata,
            self.read_index,
            self.chunked,
            self.attributes,
            metrics,
        )
        self.metrics = metrics
        self._backlog_max = max(settings.tier1_backlog_max_bytes // settings.container_count, 1)
        self.storage_reader = StorageReader(settings, self.metadata, self.read_index, self.chunked, metrics)
        super().__init__()

    def _submit(self, op: ops.Operation) -> Outcome:
        self._check_ready()
        return self.durable_log.add(op).result()

    def _answer(self, op: ops.SegmentOperation) -> SegmentInfo:
        """The state a committed operation's own change left its segment in."""
        self._submit(op)
        assert op.state is not None, f"{op!r} committed without its state"
        return op.state

    def _submit_with_attributes(self, op: ops.Operation) -> Outcome:
        """Submit an operation that reads attributes, fetching from the index what memory lacks.

        Seed 001 steps 1.1-1.3: the values come before the operation enters the
        pipeline, so the pipeline never waits on Tier 2. If keys were evicted
        between the fetch and the check, the fetch is done again.
        """
        reading = [p for p in _parts(op) if isinstance(p, ops.Append | ops.UpdateAttributes) and _keys(p)]
        if not reading:  # a plain append reads no attribute
            return self._submit(op)
        for attempt in range(_PRELOAD_TRIES):
            for part in reading:
                part.preloaded = self._preload(part.name, _keys(part))
            try:
                return self._submit(op)
            except AttributesNotLoaded:
                if attempt == _PRELOAD_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _preload(self, name: str, keys: list[str]) -> Preloaded | None:
        self._check_ready()
        with self.metadata.lock:
            if name not in self.metadata.names:  # created by an earlier step of a composite
                return None
            seg = self.metadata.by_name(name)
            if seg.attribute_root is None:
                return None
            missing = [k for k in keys if k not in seg.attributes]
            segment_id, evictions = seg.segment_id, seg.evictions
        if not missing:
            return None
        # Tier 2 bindings make their own blocking calls cooperative (engine/blocking.py).
        return Preloaded(self.attributes.lookup(segment_id, missing), evictions)

    # ------------------------------------------------------------- operations
    def create(self, name: str, *, rollover_bytes: int | None) -> SegmentInfo:
        composite.check_rollover(rollover_bytes)
        return self._answer(ops.CreateSegment(name=name, created=time.time(), rollover_bytes=rollover_bytes))

    def export_layout(self, name: str, timeout_s: float) -> str:
        """Flush the segment to Tier 2 and write its layout next to its chunks; returns the key."""
        self._check_ready()
        self.storage_writer.flush(timeout_s)
        with self.metadata.lock:
            seg = self.metadata.by_name(name)
            chunks, length = list(seg.chunks), seg.storage_length
            start_offset = min(seg.start_offset, length)
        try:
            return self.chunked.export_layout(name, chunks, length, start_offset)
        except ChunkStorageError as exc:
            raise Throttled(f"Tier 2 cannot be written now: {exc}", retry_after_s=1) from exc

    def import_segment(self, name: str) -> SegmentInfo:
        """Create ``name`` from its exported layout: its chunks become the segment's bytes."""
        self._check_ready()
        try:
            chunks, length, start_offset = self.chunked.import_layout(name)
        except ChunkNotFound as exc:
            raise SegmentNotFound(str(exc)) from None
        except ChunkStorageError as exc:
            raise Throttled(f"Tier 2 cannot be read now: {exc}", retry_after_s=1) from exc
        return self._answer(
            ops.CreateSegment(
                name=name,
                created=time.time(),
                chunks=[list(c) for c in chunks],
                length=length,
                start_offset=start_offset,
            )
        )

    def fork(self, source: str, name: str, offset: int | None) -> SegmentInfo:
        """Create ``name`` holding ``source``'s bytes below ``offset`` (default: its length).

        Where those bytes are in Tier 2, the new segment's layout names the
        source's chunks (seed 002: a metadata operation, nothing copied); the
        rest, still only in Tier 1, rides on the log operation. A tail larger
        than one append is flushed to Tier 2 first. A defrag or truncation of
        the source that overtakes the fork makes the processor refuse it;
        the fork then takes the layout again.
        """
        tries = 0
        while True:
            op, end = self._fork_layout(source, name, offset)
            if end - op.length > self.settings.max_append_bytes and tries == 0:
                self.storage_writer.flush(_FORK_FLUSH_TIMEOUT_S)
                op, end = self._fork_layout(source, name, offset)
            op.data = self._read_exactly(source, op.source_id, op.length, end)
            op.data_length = len(op.data)
            try:
                return self._answer(op)
            except LayoutChanged:
                tries += 1
                if tries >= _FORK_TRIES:
                    raise

    def _fork_layout(self, source: str, name: str, offset: int | None) -> tuple[ops.ForkSegment, int]:
        """A fork of ``source``'s committed layout (its bytes not yet read), and where the fork ends."""
        self._check_ready()
        with self.metadata.lock:
            return fork_operation(self.metadata.by_name(source), name, offset)

    def _read_exactly(self, name: str, segment_id: int, start: int, end: int) -> bytes:
        """Bytes [start, end) of segment ``segment_id`` (SegmentNotFound if ``name`` is another now)."""
        data = bytearray()
        while start + len(data) < end:
            result = self.read(name, start + len(data), end - start - len(data), wait_s=0)
            if result.info.segment_id != segment_id:
                raise SegmentNotFound(f"segment {name!r} was deleted meanwhile")
            data += result.data
        return bytes(data)

    def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None,
        writer_id: uuid.UUID | None,
        event_number: int | None,
        event_count: int,
        attributes: Sequence[AttributeUpdate] = (),
        previous_event_number: int | None = None,
    ) -> AppendResult:
        composite.check_append(
            len(data), self.settings.max_append_bytes, expected_offset=expected_offset,
            writer_id=writer_id, event_number=event_number, event_count=event_count,
            previous_event_number=previous_event_number,
        )  # fmt: skip
        self._check_ready()
        self._check_backlog(len(data))
        op = ops.Append(
            name=name,
            data=data,
            expected_offset=expected_offset,
            writer_id=writer_id,
            event_number=event_number,
            event_count=event_count,
            previous_event_number=previous_event_number,
            attribute_updates=tuple(check_request(attributes)),
        )
        outcome = self._submit_with_attributes(op)
        if outcome.duplicate_of is not None:
            self.durable_log.metrics.duplicates.inc()
        result = composite.result_of(op, outcome.duplicate_of)
        assert isinstance(result, AppendResult)
        return result

    def _check_backlog(self, appended: int) -> None:
        """Refuse appends (Throttled, or StorageFull) while too many bytes wait for Tier 2."""
        if self.metadata.unflushed_bytes + appended <= self._backlog_max:
            return
        failing = self.storage_writer.failing
        if isinstance(failing, ChunkStorageFull):
            self.metrics.throttled_storage_full.inc()
            raise StorageFull(f"Tier 2 is full ({failing}); appends resume once space is freed")
        self.metrics.throttled_backlog.inc()
        raise Throttled("too many bytes are waiting for Tier 2; retry later", retry_after_s=1)

    def composite(self, steps: Sequence[composite.Step]) -> list[composite.StepResult]:
        """Apply ``steps`` as one composite operation (engine/container/composite.py); each step's answer.

        Refused as a whole when any step is: the error is that step's, with
        its index in ``step``.
        """
        if not steps:
            raise InvalidArgument("a composite operation needs at least one step")
        now = time.time()
        parts: list[ops.SegmentOperation] = []
        for i, step in enumerate(steps):
            try:
                parts.append(composite.to_operation(step, self.settings.max_append_bytes, now))
            except SegstoreError as error:
                error.step = i
                raise
        self._check_ready()
        self._check_backlog(sum(len(s.data) for s in steps if isinstance(s, composite.AppendStep)
                                and isinstance(s.data, bytes)))  # fmt: skip
        op = ops.Composite(parts=parts)
        outcome = self._submit_with_attributes(op)
        outcomes = outcome.parts
        return [composite.result_of(part, o.duplicate_of) for part, o in zip(parts, outcomes, strict=True)]

    def info(self, name: str) -> SegmentInfo:
        self._check_readable()
        return self.metadata.info(name)

    def seal(self, name: str) -> SegmentInfo:
        return self._answer(ops.Seal(name=name))

    def truncate(self, name: str, offset: int) -> SegmentInfo:
        composite.check_truncate(offset)
        return self._answer(ops.Truncate(name=name, offset=offset))

    def delete(self, name: str) -> None:
        """Delete the segment, then its transactions (any the crash of a delete leaves, the reaper takes)."""
        self._submit(ops.Delete(name=name))
        for internal in self._internal_segments(name):
            with contextlib.suppress(SegmentNotFound):
                self._submit(ops.Delete(name=internal))

    def _internal_segments(self, parent: str) -> list[str]:
        prefix = parent + "#"
        with self.metadata.lock:
            return [n for n in self.metadata.names if n.startswith(prefix)]

    # ------------------------------------------------------ merges, transactions
    def merge(
        self, target: str, source: str, *, record_as: str = "", record_created: float = 0.0
    ) -> MergeResult:
        """Merge the sealed ``source`` into ``target`` in one operation (seed 000 MergeSegmentOperation).

        A retry after the source is gone answers with the first merge's result
        (the target remembers recent merges by ``record_as``, default the source).
        """
        op = ops.MergeSegment(name=target, source=source, record_as=record_as, record_created=record_created)
        try:
            state = self._answer(op)
        except SegmentNotFound:
            recorded = self.merge_record(target, record_as or source)
            if recorded is None:
                raise
            return recorded
        return MergeResult(op.offset, op.length, state)

    def merge_record(self, target: str, source: str, created: float | None = None) -> MergeResult | None:
        """A recent merge of a segment called ``source`` into ``target`` (created then, if given)."""
        self._check_readable()
        with self.metadata.lock:
            seg = self.metadata.by_name(target)
            record = seg.merges.get(source)
            if record is None or (created is not None and record[2] != created):
                return None
            return MergeResult(int(record[0]), int(record[1]), seg.info())

    def open_transaction(self, parent: str) -> uuid.UUID:
        """A new transaction of ``parent``: a segment of its own until commit (seed 000 "Transactions")."""
        info = self.info(parent)
        if info.sealed:
            raise SegmentSealed(f"segment {parent!r} is sealed", segment=info)
        txid = uuid.uuid4()
        self.create(naming.transaction_name(parent, txid), rollover_bytes=None)
        return txid

    def commit_transaction(self, parent: str, txid: uuid.UUID) -> MergeResult:
        """Seal, then merge into the parent, as one composite: a refused merge leaves it open."""
        name = naming.transaction_name(parent, txid)
        try:
            merged = self.composite([composite.SealStep(name), composite.MergeStep(parent, name)])[1]
        except SegmentNotFound as error:
            if error.step == 1 and name in self.metadata.names:
                raise  # the parent is gone
            recorded = self.merge_record(parent, name)
            if recorded is None:
                raise SegmentNotFound(f"transaction {txid} of {parent!r} does not exist") from None
            return recorded
        assert isinstance(merged, MergeResult)
        return merged

    def writer_event_number(self, name: str, writer_id: uuid.UUID) -> int | None:
        """A writer's last event number: the attribute its id names."""
        return self.get_attributes(name, [writer_id])[writer_id]

    def update_attributes(self, name: str, updates: Sequence[AttributeUpdate]) -> dict[uuid.UUID, int]:
        updates = check_request(updates)
        if not updates:
            raise InvalidArgument("an attribute update needs at least one update")
        op = ops.UpdateAttributes(name=name, updates=tuple(updates))
        self._submit_with_attributes(op)
        return {uuid.UUID(key): value for key, value in op.attributes.items()}

    def get_attributes(self, name: str, keys: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        """Values from memory; those it lacks from the attribute index (memory wins a race)."""
        self._check_readable()
        names = [str(k) for k in keys]
        with self.metadata.lock:
            seg = self.metadata.by_name(name)
            values = {k: seg.attributes.get(k) for k in names}
            missing = [k for k, v in values.items() if v is None]
            segment_id, indexed = seg.segment_id, seg.attribute_root is not None
        if missing and indexed:
            fetched = self.attributes.lookup(segment_id, missing)
            with self.metadata.lock:
                held = self.metadata.by_name(name).attributes
                values.update({k: held.get(k, fetched[k]) for k in missing})
        return {uuid.UUID(k): v for k, v in values.items()}

    def attribute_items(self, name: str) -> dict[uuid.UUID, int]:
        """Every attribute of the segment: the index's values, overridden by those in memory."""
        self._check_ready()
        with self.metadata.lock:
            seg = self.metadata.by_name(name)
            held = dict(seg.attributes)
            segment_id, indexed = seg.segment_id, seg.attribute_root is not None
        values = self.attributes.items(segment_id) if indexed else {}
        values.update(held)
        return {uuid.UUID(k): v for k, v in values.items()}

    def partitions(self, name: str, target_bytes: int) -> list[tuple[int, int]]:
        self._check_readable()
        with self.metadata.lock:
            return self.metadata.by_name(name).partitions(target_bytes)

    def list(self, prefix: str, after: str | None, limit: int) -> list[SegmentInfo]:
        self._check_readable()
        with self.metadata.lock:
            names = sorted(
                n
                for n in self.metadata.names
                if n.startswith(prefix) and (after is None or n > after) and not naming.hidden_from(prefix, n)
            )[:limit]
            return [self.metadata.by_name(n).info() for n in names]

    # ------------------------------------------------------------------ reads
    def read(self, name: str, offset: int | None, max_length: int | None, *, wait_s: float) -> ReadResult:
        self._check_readable()
        if max_length is not None and max_length < 0:
            raise InvalidArgument(f"read length must be >= 0, got {max_length}")
        if not 0 <= wait_s <= self.settings.tail_wait_max_s:
            raise InvalidArgument(f"wait must be from 0 to {self.settings.tail_wait_max_s} seconds")
        limit = self.settings.max_read_bytes
        if max_length is not None:
            limit = min(limit, max_length)
        deadline = time.monotonic() + wait_s
        while True:
            with self.metadata.lock:
                seg = self.metadata.by_name(name)
                info = seg.info()
            start = info.start_offset if offset is None else offset
            if start < info.start_offset:
                raise SegmentTruncated(
                    f"offset {start} is below the start offset {info.start_offset}", segment=info
                )
            if start > info.length:
                raise BadOffset(f"offset {start} is past the length {info.length}", segment=info)
            if start < info.length and limit > 0:
                count = min(limit, info.length - start)
                scan = start == info.start_offset  # a scan from the start: read ahead at once
                pieces = self.storage_reader.read_range(seg.segment_id, name, start, count, scan=scan)
                end = start + sum(map(len, pieces))
                self.metrics.read_bytes.inc(end - start)
                self.storage_reader.reader_at(seg.segment_id, end)
                return ReadResult(tuple(pieces), start, end, info)
            remaining = deadline - time.monotonic()
            if info.sealed or limit == 0 or remaining <= 0 or self._draining:
                return ReadResult((), start, start, info)
            self._wait_for_change(seg.segment_id, info.length, remaining)
            offset = start

    def _wait_for_change(self, segment_id: int, length: int, timeout_s: float) -> None:
        waiter = self.read_index.register_waiter(segment_id)
        try:
            with self.metadata.lock:
                seg = self.metadata.segments.get(segment_id)
                changed = seg is None or seg.deleted or seg.length != length or seg.sealed
            if not changed and not self._draining:
                self.metrics.tail_waits.inc()
                try:
                    waiter.wait(timeout_s)
                finally:
                    self.metrics.tail_waits.dec()
        finally:
            self.read_index.discard_waiter(segment_id, waiter)
        if self._closed:
            raise ContainerNotReady(f"container {self.container_id} is stopping")
