"""DurableLog: operation queue, operation processor, recovery (seed 000 "Durable Log").

Flow ("Information Flow in the Durable Log"): callers ``add`` an operation
and get a future. The processor thread takes everything queued, validates it
against the metadata (``MetadataUpdater``: conditions, offsets, sequence
numbers), serializes the batch and writes it to Tier 1 (group commit:
whatever queues while writes are in flight goes into the next one). Only
when a write is durable, and every write before it, does it apply the batch
to the metadata, the read index and the in-memory operation log, then
complete the futures.

A Tier 1 log may take several writes at once (``max_writes_in_flight``: an
object store, where a write takes milliseconds). Each batch is then
validated on top of the batches still in flight (its updater's parent) and
written by one of as many writer threads; batches are committed strictly in
order. When a write fails, the processor waits until none is running, the
log abandons it and every write begun after it, and all their callers fail:
the updaters are thrown away (that is the rollback) and their sequence
numbers are burnt.

Checkpoints: every start, and after ``checkpoint_every_bytes`` of log, a
batch begins with a ``MetadataCheckpoint``, written once no write is in
flight (its snapshot is the committed metadata). Recovery replays from the
first checkpoint in the log; Tier 1 is truncated at the newest checkpoint
below the storage writer's lowest unflushed sequence number.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.blocking import run_blocking
from engine.completion import Completion
from engine.config import Settings
from engine.durable_log.data_log import DurableDataLog, Fate, LogFenced, PendingWrite
from engine.durable_log.frames import frame_payload_sizes
from engine.durable_log.metadata_updater import MetadataUpdater, Outcome
from engine.durable_log.operation_log import OperationLog
from engine.errors import ContainerNotReady, DataCorrupted, OutcomeUnknown, SegstoreError, StorageFull
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata
from engine.metrics import EngineMetrics
from engine.reads.read_index import ReadIndex

log = logging.getLogger(__name__)

T = TypeVar("T")

# A processor batch stops taking operations past this payload size.
_BATCH_MAX_BYTES = 16 * 1024 * 1024
# While writes are in flight another begins only once it carries this many bytes of appends, or
# once the oldest request queued has waited this share of a write's latency: each write costs a
# request (and CPU), so small appends share writes, while large ones fill several at once.
_IN_FLIGHT_MIN_BYTES = 1024 * 1024
_IN_FLIGHT_WAIT_SHARE = 0.5
# How long closing waits for the processor to drain the writes in flight, and then for each writer.
CLOSE_WAIT_S = 30.0


def _appended_bytes(op: ops.Operation) -> int:
    """The bytes an operation queues to append (what sizes a batch)."""
    if isinstance(op, ops.Append):
        return op.length
    if isinstance(op, ops.Composite):
        return sum(part.length for part in op.parts if isinstance(part, ops.Append))
    return 0


@dataclass(slots=True)
class _Pending:
    op: ops.Operation
    future: Completion[Outcome]
    queued_at: float


@dataclass(slots=True)
class _Batch:
    """One processor batch: its requests, what validation made of them, and its Tier 1 write."""

    items: list[_Pending]
    updater: MetadataUpdater
    accepted: list[tuple[_Pending, Outcome]] = field(default_factory=list)
    refused: list[tuple[_Pending, SegstoreError]] = field(default_factory=list)
    logged: list[ops.Operation] = field(default_factory=list)
    payload_bytes: int = 0
    write: PendingWrite | None = None
    started: float = 0.0
    done: bool = False
    error: OSError | None = None


class DurableLog:
    """One container's log of operations: queue, processor, Tier 1 writers, memory log."""

    def __init__(
        self,
        settings: Settings,
        data_log: DurableDataLog,
        metadata: ContainerMetadata,
        read_index: ReadIndex,
        metrics: EngineMetrics,
    ) -> None:
        self.settings = settings
        self.data_log = data_log
        self.metadata = metadata
        self.read_index = read_index
        self.metrics = metrics
        self.memory_log = OperationLog(wake_bytes=settings.flush_threshold_bytes)
        self._queue: deque[_Pending] = deque()
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the processor waits here: requests, completed writes
        self._work = threading.Condition(lock)  # the writer threads wait here: writes to send
        self._batches: deque[_Batch] = deque()  # begun, not yet committed, in order
        self._committing: _Batch | None = None  # taken off _batches, its callers not all answered yet
        self._to_write: deque[_Batch] = deque()
        self._failing = False  # a write failed and its batch is not handled yet
        self._closed = False
        self._stopping = False
        self._failure: str | None = None
        self._thread: threading.Thread | None = None
        self._writers: list[threading.Thread] = []
        self._queued_bytes = 0  # of the appends queued
        self._write_seconds = 0.0  # moving average of a Tier 1 write's latency
        self._bytes_since_checkpoint = 0
        self._checkpoints: list[tuple[int, int]] = []  # (checkpoint seq, frame address)
        self._truncate_lock = threading.Lock()
        self.last_committed_seq = 0
        # Why the last Tier 1 write failed for want of space (None once a write succeeds again).
        self.full: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the log stopped taking writes for good (fenced, or the processor failed), or None."""
        return self._failure

    def _log_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call the Tier 1 log in place when its I/O is cooperative, else through run_blocking."""
        return fn(*args) if self.data_log.cooperative else run_blocking(fn, *args)

    # ----------------------------------------------------------------- recovery
    def recover(self) -> int:
        """Rebuild metadata, memory log and read index from Tier 1, then begin the new epoch.

        ``replay`` then ``begin_epoch``; returns operations replayed. Must run before ``start``.
        """
        replayed = self.replay()
        self.begin_epoch()
        return replayed

    def replay(self) -> int:
        """Rebuild metadata, memory log and read index from Tier 1; returns operations replayed.

        Reads are possible afterwards; writes only after ``begin_epoch``.
        """
        replayed = 0
        started = False
        batches = self._log_call(lambda: list(self.data_log.recover()))
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
        return replayed

    def begin_epoch(self) -> None:
        """Make the new epoch durable with a checkpoint (OSError if Tier 1 cannot take it: call again)."""
        self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        updater = MetadataUpdater(self.metadata)
        checkpoint = ops.MetadataCheckpoint(snapshot=self.metadata.snapshot())
        updater.pre_process(checkpoint)
        payload = ops.encode(checkpoint)
        try:
            address, _ = self._log_call(self.data_log.append, payload)
        except OSError:
            updater.burn_sequence_numbers()
            raise
        self._apply([checkpoint])
        self._checkpoints.append((checkpoint.seq, address))
        self._bytes_since_checkpoint = 0

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        container = self.metadata.container_id
        self._thread = threading.Thread(target=self._run, name=f"processor-{container}", daemon=True)
        self._thread.start()
        if self.data_log.max_writes_in_flight > 1:
            for i in range(self.data_log.max_writes_in_flight):
                writer = threading.Thread(target=self._write_loop, name=f"tier1-{container}-{i}", daemon=True)
                writer.start()
                self._writers.append(writer)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)
        with self._cond:
            self._stopping = True
            self._work.notify_all()
        for writer in self._writers:
            writer.join(CLOSE_WAIT_S)
        self._fail_queued(ContainerNotReady("the container is stopping"))
        self._answer_begun("the container stopped before its Tier 1 write completed")
        self.memory_log.close()
        self._log_call(self.data_log.close)

    # --------------------------------------------------------------- requests
    def add(self, op: ops.Operation) -> Completion[Outcome]:
        """Queue an operation; the future resolves once it is durable (or refused)."""
        future: Completion[Outcome] = Completion()
        with self._cond:
            if self._closed or self._failure:
                raise ContainerNotReady(self._failure or "the container is stopping")
            self._queue.append(_Pending(op, future, time.monotonic()))
            self._queued_bytes += _appended_bytes(op)
            self._cond.notify()
        return future

    def _may_begin(self) -> bool:
        """Whether a new batch may begin: room in flight, no failure pending, no checkpoint waiting."""
        if self._failing or len(self._batches) >= self.data_log.max_writes_in_flight:
            return False
        return not (self._batches and self._bytes_since_checkpoint >= self.settings.checkpoint_every_bytes)

    def _wait_to_begin(self) -> float:
        """Seconds until the queued requests are worth a write besides those in flight (<= 0: now)."""
        if not self._batches or self._closed or self._queued_bytes >= _IN_FLIGHT_MIN_BYTES:
            return 0.0
        return self._queue[0].queued_at + _IN_FLIGHT_WAIT_SHARE * self._write_seconds - time.monotonic()

    def _take(self) -> list[_Pending]:
        """Everything queued, up to _BATCH_MAX_BYTES of appends; the caller holds the lock."""
        items: list[_Pending] = []
        size = 0
        while self._queue and size < _BATCH_MAX_BYTES:
            item = self._queue.popleft()
            size += _appended_bytes(item.op)
            items.append(item)
        self._queued_bytes -= size
        return items

    def _fail_queued(self, error: SegstoreError) -> None:
        with self._cond:
            pending, self._queue = list(self._queue), deque()
        for item in pending:
            item.future.set_exception(error)

    # -------------------------------------------------------------- processor
    def _run(self) -> None:
        try:
            while not self._failure:
                with self._cond:
                    while True:
                        if self._batches and self._batches[0].done:
                            items = None
                            break
                        wait = self._wait_to_begin() if self._queue and self._may_begin() else None
                        if wait is not None and wait <= 0:
                            items = self._take()
                            break
                        if self._closed and not self._queue and not self._batches:
                            return  # closed and drained
                        self._cond.wait(wait)
                if items is None:
                    self._commit_done()
                else:
                    self._begin(items)
        except Exception as exc:  # a bug: stop taking writes rather than corrupt
            log.exception("container %d: processor failed", self.metadata.container_id)
            self._failure = f"the operation processor failed: {exc}"
            self._answer_begun(self._failure, committing=self._committing)
        finally:
            if self._failure:
                self._fail_queued(ContainerNotReady(self._failure, retry_after_s=1))

    def _answer_begun(self, reason: str, committing: _Batch | None = None) -> None:
        """Answer the callers of every batch begun and not committed, which the processor no longer will.

        A batch whose Tier 1 write began may be in the log (even applied), so
        its callers get ``OutcomeUnknown``; the others were not applied (503).
        """
        with self._cond:
            batches, self._batches = list(self._batches), deque()
        if committing is not None:
            batches.insert(0, committing)
        refused = ContainerNotReady(reason)
        unknown = OutcomeUnknown(f"{reason}; the request's Tier 1 write may be in the log")
        for batch in batches:
            for item in batch.items:
                if not item.future.done():
                    item.future.set_exception(refused if batch.write is None else unknown)

    def _begin(self, items: list[_Pending]) -> None:
        """Validate a batch on top of those in flight and begin its Tier 1 write."""
        parent = self._batches[-1].updater if self._batches else None
        batch = _Batch(items, MetadataUpdater(self.metadata, parent))
        if self._bytes_since_checkpoint >= self.settings.checkpoint_every_bytes:
            assert parent is None, "a checkpoint snapshots the committed metadata: nothing may be in flight"
            items.insert(0, _Pending(ops.MetadataCheckpoint(), Completion(), time.monotonic()))
        for item in items:
            if isinstance(item.op, ops.MetadataCheckpoint):
                item.op.snapshot = self.metadata.snapshot()
            try:
                batch.accepted.append((item, batch.updater.pre_process(item.op)))
            except SegstoreError as error:
                batch.refused.append((item, error))
        batch.logged = [item.op for item, outcome in batch.accepted if outcome.logged]
        if batch.logged:
            payload = b"".join(ops.encode(op) for op in batch.logged)
            batch.payload_bytes = len(payload)
            batch.started = time.monotonic()
            try:
                batch.write = self.data_log.begin(payload)
            except OSError as exc:
                batch.error = exc
                self._failing = True
            else:
                self._bytes_since_checkpoint += len(payload)
                if isinstance(batch.logged[0], ops.MetadataCheckpoint):
                    self._bytes_since_checkpoint = 0
        with self._cond:
            self._batches.append(batch)
            batch.done = batch.write is None
            if batch.write is not None and self._writers:
                self._to_write.append(batch)
                self._work.notify()
        if batch.write is not None and not self._writers:
            self._write(batch)

    def _write_loop(self) -> None:
        """A writer thread: send begun writes to Tier 1 (several at once) until the log closes."""
        while True:
            with self._cond:
                while not self._to_write and not self._stopping:
                    self._work.wait()
                if not self._to_write:
                    return
                batch = self._to_write.popleft()
            self._write(batch)

    def _write(self, batch: _Batch) -> None:
        assert batch.write is not None
        error: OSError | None = None
        took: float | None = None
        try:
            if self.data_log.cooperative_write:
                self.data_log.write(batch.write)
            else:
                self._log_call(self.data_log.write, batch.write)
            took = time.monotonic() - batch.started
            self.metrics.tier1_write_seconds.observe(took)
        except OSError as exc:
            error = exc
        except Exception as exc:  # a bug or corrupt data: the batch fails, the log stops
            log.exception("container %d: Tier 1 write failed", self.metadata.container_id)
            error = OSError(errno.EIO, f"Tier 1 write failed: {exc}")
        with self._cond:
            if took is not None:
                self._write_seconds += 0.2 * (took - self._write_seconds)
            batch.error = error
            batch.done = True
            if error is not None:
                self._failing = True
            self._cond.notify()

    def _commit_done(self) -> None:
        """Commit the completed batches at the head, in order; a failed one fails all in flight."""
        while self._batches and self._batches[0].done:
            batch = self._batches[0]
            if batch.error is not None:
                self._fail_in_flight()
                return
            with self._cond:
                self._batches.popleft()
                if self._batches:  # its view of this batch is the committed metadata now
                    self._batches[0].updater.parent = None
            self._committing = batch
            self._commit(batch)
            self._committing = None

    def _commit(self, batch: _Batch) -> None:
        if batch.write is not None:
            self.full = None
            self.metrics.tier1_write_operations.observe(len(batch.logged))
            for size in frame_payload_sizes(batch.payload_bytes, self.settings.max_frame_bytes):
                self.metrics.tier1_frame_bytes.observe(size)
            first = batch.logged[0]
            if isinstance(first, ops.MetadataCheckpoint):
                with self._truncate_lock:
                    self._checkpoints.append((first.seq, batch.write.first_frame_seq))
        self._apply([item.op for item, _ in batch.accepted], [outcome for _, outcome in batch.accepted])
        now = time.monotonic()
        for item, outcome in batch.accepted:
            self.metrics.observe_latency(item.op, now - item.queued_at)
            item.future.set_result(outcome)
        for item, error in batch.refused:
            item.future.set_exception(error)

    def _fail_in_flight(self) -> None:
        """The head batch failed: once no write runs, abandon it and all after it, and fail their callers."""
        with self._cond:
            while not all(batch.done for batch in self._batches):
                self._cond.wait()
            batches, self._batches = list(self._batches), deque()
        cause = batches[0].error
        assert cause is not None
        fenced = next((b.error for b in batches if isinstance(b.error, LogFenced)), None)
        error: SegstoreError
        errors: list[SegstoreError] | None = None
        if fenced is not None:  # stop for good: nothing is acknowledged again
            self._failure = f"fenced: {fenced}"
            error = ContainerNotReady(self._failure, retry_after_s=1)
            unknown = OutcomeUnknown(f"{self._failure}; its Tier 1 write may be in the new owner's log")
            errors = self._errors_by_fate(batches, error, unknown)
        else:
            unsettled: OSError | None = None
            if batches[0].write is not None:  # else its begin failed, and nothing began after it
                try:
                    self._log_call(self.data_log.abandon, batches[0].write)
                except OSError as exc:
                    unsettled = exc
            if unsettled is not None:
                error = ContainerNotReady(f"Tier 1 write failed: {cause}", retry_after_s=1)
                unknown = OutcomeUnknown(f"{error.detail}; it may still be in the log: {unsettled}")
                errors = self._errors_by_fate(batches, error, unknown)
            elif cause.errno in (errno.ENOSPC, errno.EDQUOT):
                error = StorageFull(f"Tier 1 is full: {cause.strerror}; writes resume once space is freed")
                self.full = error.detail
                self.metrics.throttled_storage_full.inc(sum(len(b.items) for b in batches))
            else:
                error = ContainerNotReady(f"Tier 1 write failed: {cause}", retry_after_s=1)
        batches[-1].updater.burn_sequence_numbers()
        if any(b.logged and isinstance(b.logged[0], ops.MetadataCheckpoint) for b in batches):
            self._bytes_since_checkpoint = self.settings.checkpoint_every_bytes  # the next one leads with it
        log.error("container %d: %s", self.metadata.container_id, error.detail)
        for i, batch in enumerate(batches):
            for item in batch.items:
                item.future.set_exception(error if errors is None else errors[i])
        with self._cond:
            self._failing = False

    @staticmethod
    def _errors_by_fate(
        batches: list[_Batch], refused: ContainerNotReady, unknown: OutcomeUnknown
    ) -> list[SegstoreError]:
        """Each batch's error when its write may still be read back (fenced, or not abandoned).

        Only a write never sent, or one at or behind a write whose place a
        newer writer holds (``Fate``), is surely not applied (``refused``,
        503: resend it); any other is ``unknown``, whether or not it completed.
        """
        errors: list[SegstoreError] = []
        barred = False
        for batch in batches:
            fate = Fate.NOT_SENT if batch.write is None else batch.write.fate
            barred = barred or fate is Fate.BARRED
            errors.append(refused if barred or fate is Fate.NOT_SENT else unknown)
        return errors

    def _apply(self, operations: list[ops.Operation], outcomes: list[Outcome] | None = None) -> None:
        """Commit durable operations: read index, metadata, memory log, tails.

        Replay passes logged operations only. A commit passes every accepted
        one with its ``outcomes`` and records each operation's answer
        (``state``), in order, as its own change left it: one that changed
        nothing (a duplicate) is answered with the state at its place.
        The whole batch is applied under the metadata lock, so a reader sees
        a composite before it or after it, and the bytes an append or merge
        brings are in the read index before the length that covers them.
        """
        answer = outcomes is not None
        logged: list[ops.Operation] = []
        touched: set[int] = set()
        appends = appended_bytes = 0
        with self.metadata.lock:
            for i, op in enumerate(operations):
                if outcomes is not None and not outcomes[i].logged:
                    self._answer(op, outcomes[i])
                    continue
                parts = op.parts if isinstance(op, ops.Composite) else [op]
                part_outcomes = outcomes[i].parts if outcomes is not None and outcomes[i].parts else None
                for j, part in enumerate(parts):
                    if part_outcomes is not None and not part_outcomes[j].logged:
                        self._answer(part, part_outcomes[j])
                        continue
                    appended_bytes += self._apply_one(part, answer)
                    appends += isinstance(part, ops.Append)
                    logged.append(part)
                    if isinstance(part, ops.SegmentOperation):
                        touched.add(part.segment_id)
        if appends:
            self.metrics.appends.inc(appends)
            self.metrics.append_bytes.inc(appended_bytes)
        for segment_id in touched:  # first: a woken tail reader runs before the storage writer
            self.read_index.notify(segment_id)
        self.memory_log.add(logged)
        if logged:
            self.last_committed_seq = logged[-1].seq

    def _apply_one(self, op: ops.Operation, answer: bool) -> int:
        """Apply one logged operation (the caller holds the metadata lock); returns bytes appended."""
        appended = 0
        if isinstance(op, ops.Append):
            assert op.data is not None
            self.read_index.append(op.segment_id, op.offset, op.data)
            op.data = None
            appended = op.length
        elif isinstance(op, ops.MergeSegment):
            self.read_index.move(op.source_id, op.segment_id, op.offset)
        elif isinstance(op, ops.ForkSegment) and op.data_length:
            assert op.data is not None
            self.read_index.append(op.segment_id, op.length, op.data)
            op.data = None
        self.metadata.apply(op)
        if answer and isinstance(op, ops.SegmentOperation) and not isinstance(op, ops.Delete):
            op.state = self.metadata.segments[op.segment_id].info()
        return appended

    def _answer(self, op: ops.Operation, outcome: Outcome) -> None:
        """Record the answer of an operation that changed nothing: its segment's state at its place."""
        if isinstance(op, ops.Composite):
            for part, part_outcome in zip(op.parts, outcome.parts, strict=True):
                self._answer(part, part_outcome)
        elif isinstance(op, ops.SegmentOperation):
            seg = self.metadata.segments.get(op.segment_id)
            op.state = seg.info() if seg is not None and not seg.deleted else None

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
        freed = self._log_call(self.data_log.truncate, address)
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
