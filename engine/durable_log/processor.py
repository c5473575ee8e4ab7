"""OperationProcessor: the durable log's queue, batches and Tier 1 writes (seed 000 "Operation Processor").

Callers ``add`` an operation and get a future. The processor thread takes
everything queued, validates it against the metadata (``MetadataUpdater``:
conditions, offsets, sequence numbers), serializes the batch and writes it
to Tier 1 (group commit: whatever queues while writes are in flight goes
into the next one). Only when a write is durable, and every write before
it, does it hand the batch to ``commit`` (the durable log applies it), then
complete the futures.

A Tier 1 log may take several writes at once (``max_writes_in_flight``: an
object store, where a write takes milliseconds). Each batch is then
validated on top of the batches still in flight (its updater's parent) and
written by one of as many writer threads; batches are committed strictly in
order. When a write fails, the processor waits until none is running, the
log abandons it and every write begun after it, and all their callers fail:
the updaters are thrown away (that is the rollback) and their sequence
numbers are burnt. After ``checkpoint_every_bytes`` of log,
``checkpoint_every_operations`` operations or ``checkpoint_every_s`` seconds
(whichever comes first) a batch begins with a ``MetadataCheckpoint``, once no
write is in flight (its snapshot is the committed metadata): the log a
recovery replays holds a few seconds of writes, whatever the container's age.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.completion import Completion
from engine.config import Settings
from engine.durable_log.data_log import DurableDataLog, Fate, LogFenced, PendingWrite, log_call
from engine.durable_log.frames import frame_payload_sizes
from engine.durable_log.metadata_updater import MetadataUpdater, Outcome
from engine.errors import ContainerNotReady, OutcomeUnknown, SegstoreError, StorageFull
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata
from engine.metrics import EngineMetrics

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class _Since:
    """What the log took since its last checkpoint: bytes, operations, and when it was begun."""

    bytes: int
    operations: int
    at: float  # time.monotonic()
    forced: bool = False  # the next batch begins with a checkpoint, whatever the counts


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


class OperationProcessor:
    """One container's queue of operations, its processor thread and its Tier 1 writer threads."""

    def __init__(
        self,
        settings: Settings,
        data_log: DurableDataLog,
        metadata: ContainerMetadata,
        metrics: EngineMetrics,
        *,
        commit: Callable[[list[ops.Operation], list[Outcome]], None],
        checkpointed: Callable[[int, int], None],
    ) -> None:
        self.settings = settings
        self.data_log = data_log
        self.metadata = metadata
        self.metrics = metrics
        # Applies a durable batch (its operations with their outcomes), and notes a checkpoint's address.
        self.commit = commit
        self.checkpointed = checkpointed
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
        self.failure: str | None = None  # why it stopped taking writes for good (fenced, or a bug)
        self._thread: threading.Thread | None = None
        self._writers: list[threading.Thread] = []
        self._queued_bytes = 0  # of the appends queued
        self._write_seconds = 0.0  # moving average of a Tier 1 write's latency
        self._since_checkpoint = _Since(0, 0, time.monotonic())
        # Why the last Tier 1 write failed for want of space (None once a write succeeds again).
        self.full: str | None = None

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
        """Drain what is in flight (up to CLOSE_WAIT_S), then answer every caller left."""
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

    def add(self, op: ops.Operation) -> Completion[Outcome]:
        """Queue an operation; the future resolves once it is durable (or refused)."""
        future: Completion[Outcome] = Completion()
        with self._cond:
            if self._closed or self.failure:
                raise ContainerNotReady(self.failure or "the container is stopping")
            self._queue.append(_Pending(op, future, time.monotonic()))
            self._queued_bytes += _appended_bytes(op)
            self._cond.notify()
        return future

    def count_from_checkpoint(self) -> None:
        """A checkpoint was begun: the log's size, operations and age count from here."""
        self._since_checkpoint = _Since(0, 0, time.monotonic())

    def checkpoint_next(self) -> None:
        """Begin the next batch with a checkpoint (the last one failed, or a stop asks for one)."""
        self._since_checkpoint = _Since(0, 0, time.monotonic(), forced=True)

    def _checkpoint_due(self) -> bool:
        """Whether the next batch begins with a checkpoint: enough bytes, operations or time since the last.

        Time counts only once the log took an operation after the checkpoint:
        an idle container writes none.
        """
        since, s = self._since_checkpoint, self.settings
        return (
            since.forced
            or since.bytes >= s.checkpoint_every_bytes
            or since.operations >= s.checkpoint_every_operations
            or (since.operations > 0 and time.monotonic() - since.at >= s.checkpoint_every_s)
        )

    def _may_begin(self) -> bool:
        """Whether a new batch may begin: room in flight, no failure pending, no checkpoint waiting."""
        if self._failing or len(self._batches) >= self.data_log.max_writes_in_flight:
            return False
        return not (self._batches and self._checkpoint_due())

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
            while not self.failure:
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
            self.failure = f"the operation processor failed: {exc}"
            self._answer_begun(self.failure, committing=self._committing)
        finally:
            if self.failure:
                self._fail_queued(ContainerNotReady(self.failure, retry_after_s=1))

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
        # A checkpoint snapshots the committed metadata, so it begins only with nothing in flight. One
        # that fell due (by time) after _may_begin let this batch go goes with the next batch to begin
        # alone: _may_begin holds new batches back while it is due and others are in flight.
        if parent is None and self._checkpoint_due():
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
                if isinstance(batch.logged[0], ops.MetadataCheckpoint):
                    self.count_from_checkpoint()
                since = self._since_checkpoint
                self._since_checkpoint = _Since(
                    since.bytes + len(payload), since.operations + len(batch.logged), since.at
                )
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
                log_call(self.data_log, self.data_log.write, batch.write)
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
                self.checkpointed(first.seq, batch.write.first_frame_seq)
        self.commit([item.op for item, _ in batch.accepted], [outcome for _, outcome in batch.accepted])
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
            self.failure = f"fenced: {fenced}"
            error = ContainerNotReady(self.failure, retry_after_s=1)
            unknown = OutcomeUnknown(f"{self.failure}; its Tier 1 write may be in the new owner's log")
            errors = self._errors_by_fate(batches, error, unknown)
        else:
            unsettled: OSError | None = None
            if batches[0].write is not None:  # else its begin failed, and nothing began after it
                try:
                    log_call(self.data_log, self.data_log.abandon, batches[0].write)
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
            self.checkpoint_next()
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
