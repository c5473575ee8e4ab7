"""DurableLog: operation queue, operation processor, recovery (seed 000 "Durable Log").

Flow ("Information Flow in the Durable Log"): callers ``add`` an operation
and get a future. The processor thread takes everything queued, validates it
against the metadata (``MetadataUpdater``: conditions, offsets, sequence
numbers), serializes the batch and writes it to Tier 1 with one fdatasync
(group commit: whatever queues while a write is in flight goes into the
next one). Only when the write is durable does it apply the batch to the
metadata, the read index and the in-memory operation log, then complete the
futures. A failed write discards the updater (rollback) and fails its
callers.

Checkpoints: every start, and after ``checkpoint_every_bytes`` of log, a
batch begins with a ``MetadataCheckpoint``. Recovery replays from the first
checkpoint in the log; Tier 1 is truncated at the newest checkpoint below the
storage writer's lowest unflushed sequence number.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine import operations as ops
from engine.blocking import run_blocking
from engine.config import Settings
from engine.durable_log.completion import Completion
from engine.durable_log.data_log import DurableDataLog, LogFenced
from engine.durable_log.frames import frame_payload_sizes
from engine.durable_log.operation_log import OperationLog
from engine.errors import ContainerNotReady, DataCorrupted, SegstoreError, StorageFull
from engine.metadata import ContainerMetadata, MetadataUpdater, Outcome
from engine.metrics import EngineMetrics
from engine.read_index import ReadIndex

log = logging.getLogger(__name__)

# A processor batch stops taking operations past this payload size.
_BATCH_MAX_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class _Pending:
    op: ops.Operation
    future: Completion[Outcome]
    queued_at: float


class DurableLog:
    """One container's log of operations: queue, processor, Tier 1, memory log."""

    def __init__(
        self,
        settings: Settings,
        data_log: DurableDataLog,
        metadata: ContainerMetadata,
        read_index: ReadIndex,
        metrics: EngineMetrics,
        *,
        on_commit: Callable[[list[ops.Operation]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.data_log = data_log
        self.metadata = metadata
        self.read_index = read_index
        self.metrics = metrics
        self.memory_log = OperationLog()
        self._on_commit = on_commit
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._failure: str | None = None
        self._thread: threading.Thread | None = None
        self._bytes_since_checkpoint = 0
        self._checkpoints: list[tuple[int, int]] = []  # (checkpoint seq, frame address)
        self._truncate_lock = threading.Lock()
        self.last_committed_seq = 0

    # ----------------------------------------------------------------- recovery
    def recover(self) -> int:
        """Rebuild metadata, memory log and read index from Tier 1; returns operations replayed.

        Then durably starts a new epoch with a checkpoint. Must run before ``start``.
        """
        replayed = 0
        started = False
        batches = run_blocking(lambda: list(self.data_log.recover()))
        for batch in batches:
            for op in ops.decode_all(batch.payload):
                if isinstance(op, ops.MetadataCheckpoint):
                    if not started:
                        self.metadata.restore(op.snapshot, op.seq)
                        started = True
                    else:
                        self.metadata.epoch = max(self.metadata.epoch, op.snapshot["epoch"])
                        self.metadata.seq = max(self.metadata.seq, op.seq)
                    self._checkpoints.append((op.seq, batch.first_frame_seq))
                    continue
                if not started:
                    continue  # before the first checkpoint: already in Tier 2
                self._apply([op])
                replayed += 1
        if batches and not started:
            raise DataCorrupted("the Tier 1 log holds writes but no metadata checkpoint")
        self.metadata.epoch += 1
        self._write_checkpoint()
        return replayed

    def _write_checkpoint(self) -> None:
        updater = MetadataUpdater(self.metadata)
        checkpoint = ops.MetadataCheckpoint(snapshot=self.metadata.snapshot())
        updater.pre_process(checkpoint)
        payload = ops.encode(checkpoint)
        address, _ = run_blocking(self.data_log.append, payload)
        self._apply([checkpoint])
        self._checkpoints.append((checkpoint.seq, address))
        self._bytes_since_checkpoint = 0

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"processor-{self.metadata.container_id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(30)
        self._fail_queued(ContainerNotReady("the container is stopping"))
        self.memory_log.close()
        run_blocking(self.data_log.close)

    # --------------------------------------------------------------- requests
    def add(self, op: ops.Operation) -> Completion[Outcome]:
        """Queue an operation; the future resolves once it is durable (or refused)."""
        future: Completion[Outcome] = Completion()
        with self._cond:
            if self._closed or self._failure:
                raise ContainerNotReady(self._failure or "the container is stopping")
            self._queue.append(_Pending(op, future, time.monotonic()))
            self._cond.notify()
        return future

    def _take_batch(self) -> list[_Pending]:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            batch: list[_Pending] = []
            size = 0
            while self._queue and size < _BATCH_MAX_BYTES:
                item = self._queue.popleft()
                if isinstance(item.op, ops.Append):
                    size += item.op.length
                batch.append(item)
            return batch

    def _fail_queued(self, error: SegstoreError) -> None:
        with self._cond:
            pending, self._queue = list(self._queue), deque()
        for item in pending:
            item.future.set_exception(error)

    # -------------------------------------------------------------- processor
    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return  # closed and drained
            try:
                self._process(batch)
                if self._failure:
                    return
            except Exception as exc:  # a bug: stop taking writes rather than corrupt
                log.exception("container %d: processor failed", self.metadata.container_id)
                self._failure = f"the operation processor failed: {exc}"
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(ContainerNotReady(self._failure))
                self._fail_queued(ContainerNotReady(self._failure))
                return

    def _process(self, batch: list[_Pending]) -> None:
        updater = MetadataUpdater(self.metadata)
        if self._bytes_since_checkpoint >= self.settings.checkpoint_every_bytes:
            batch.insert(0, _Pending(ops.MetadataCheckpoint(), Completion(), time.monotonic()))
        accepted: list[tuple[_Pending, Outcome]] = []
        refused: list[tuple[_Pending, SegstoreError]] = []
        for item in batch:
            if isinstance(item.op, ops.MetadataCheckpoint):
                item.op.snapshot = self.metadata.snapshot()
            try:
                accepted.append((item, updater.pre_process(item.op)))
            except SegstoreError as error:
                refused.append((item, error))
        logged = [item.op for item, outcome in accepted if outcome.logged]
        if logged:
            try:
                self._write(logged)
            except OSError as exc:
                updater.burn_sequence_numbers()
                error: SegstoreError
                if isinstance(exc, LogFenced):  # stop for good: nothing is acknowledged again
                    self._failure = f"fenced: {exc}"
                    error = ContainerNotReady(self._failure, retry_after_s=1)
                elif exc.errno == errno.ENOSPC:
                    error = StorageFull(f"Tier 1 is full: {exc.strerror}")
                else:
                    error = ContainerNotReady(f"Tier 1 write failed: {exc}", retry_after_s=1)
                log.error("container %d: %s", self.metadata.container_id, error.detail)
                for item in batch:
                    item.future.set_exception(error)
                if self._failure:
                    self._fail_queued(ContainerNotReady(self._failure, retry_after_s=1))
                return
        self._apply(logged)
        now = time.monotonic()
        for item, outcome in accepted:
            self.metrics.observe_latency(item.op, now - item.queued_at)
            item.future.set_result(outcome)
        for item, error in refused:
            item.future.set_exception(error)

    def _write(self, logged: list[ops.Operation]) -> None:
        payload = b"".join(ops.encode(op) for op in logged)
        started = time.monotonic()
        address, _frames = run_blocking(self.data_log.append, payload)
        self.metrics.tier1_write_seconds.observe(time.monotonic() - started)
        self.metrics.tier1_write_operations.observe(len(logged))
        for size in frame_payload_sizes(len(payload), self.settings.max_frame_bytes):
            self.metrics.tier1_frame_bytes.observe(size)
        self._bytes_since_checkpoint += len(payload)
        first = logged[0]
        if isinstance(first, ops.MetadataCheckpoint):
            self._bytes_since_checkpoint = 0
            with self._truncate_lock:
                self._checkpoints.append((first.seq, address))

    def _apply(self, logged: list[ops.Operation]) -> None:
        """Commit durable operations: metadata, read index, memory log, tails."""
        grown: set[int] = set()
        appends = appended_bytes = 0
        for op in logged:
            self.metadata.apply(op)
            if isinstance(op, ops.Append):
                assert op.data is not None
                self.read_index.append(op.segment_id, op.offset, op.data)
                op.data = None
                appends += 1
                appended_bytes += op.length
            elif isinstance(op, ops.MergeSegment):
                self.read_index.move(op.source_id, op.segment_id, op.offset)
            elif isinstance(op, ops.ForkSegment) and op.data_length:
                assert op.data is not None
                self.read_index.append(op.segment_id, op.length, op.data)
                op.data = None
            if isinstance(op, ops.SegmentOperation):
                grown.add(op.segment_id)
        if appends:
            self.metrics.appends.inc(appends)
            self.metrics.append_bytes.inc(appended_bytes)
        self.memory_log.add(logged)
        if logged:
            self.last_committed_seq = logged[-1].seq
        for segment_id in grown:
            self.read_index.notify(segment_id)
        if self._on_commit is not None:
            self._on_commit(logged)

    # ------------------------------------------------------------- truncation
    def read(self, after_seq: int, max_count: int, timeout_s: float) -> list[ops.Operation]:
        """Committed operations after ``after_seq``, for the storage writer."""
        return self.memory_log.read(after_seq, max_count, timeout_s)

    def truncate(self, lowest_unflushed_seq: int) -> int:
        """Drop Tier 1 data no longer needed: all before the newest checkpoint below the given seq."""
        with self._truncate_lock:
            usable = [c for c in self._checkpoints if c[0] < lowest_unflushed_seq]
            if len(usable) < 1:
                return 0
            seq, address = usable[-1]
            self._checkpoints = [c for c in self._checkpoints if c[0] >= seq]
        freed = run_blocking(self.data_log.truncate, address)
        if freed:
            log.debug("container %d: Tier 1 truncated at checkpoint %d, %d bytes freed",
                      self.metadata.container_id, seq, freed)
        return freed

    def check_recovered_data(self) -> None:
        """Every unflushed byte must be in the read index after recovery, or data is lost."""
        with self.metadata.lock:
            segments = [s for s in self.metadata.segments.values() if not s.deleted]
        for seg in segments:
            end = seg.storage_length
            for merge in [*seg.pending, None]:
                stop = seg.length if merge is None else merge.offset
                end = self.read_index.cached_end(seg.segment_id, end)
                if end < stop:
                    raise DataCorrupted(
                        f"segment {seg.name!r}: bytes {end}..{stop} are neither in Tier 2 "
                        f"(length {seg.storage_length}) nor in Tier 1"
                    )
                if merge is not None:
                    end = max(end, merge.end)
