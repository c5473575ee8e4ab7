"""DurableLog: one container's log of operations, its recovery and truncation (seed 000 "Durable Log").

Flow ("Information Flow in the Durable Log"): callers ``add`` an operation
and get a future; the ``OperationProcessor`` (``processor.py``) validates,
batches and writes it to Tier 1. Once a write is durable, and every write
before it, the durable log applies the batch to the metadata, the read index
and the in-memory operation log (``OperationLog``, which the storage writer
reads).

Checkpoints: every start, and after ``checkpoint_every_bytes`` of log,
``checkpoint_every_operations`` operations or ``checkpoint_every_s``
seconds, a batch begins with a ``MetadataCheckpoint``. Recovery replays from
the first checkpoint in the log; Tier 1 is truncated at the newest
checkpoint below the storage writer's lowest unflushed sequence number.
"""

from __future__ import annotations

import logging
import threading

from engine.completion import Completion
from engine.config import Settings
from engine.durable_log.data_log import DurableDataLog, log_call
from engine.durable_log.metadata_updater import MetadataUpdater, Outcome
from engine.durable_log.operation_log import OperationLog
from engine.durable_log.processor import OperationProcessor
from engine.errors import DataCorrupted
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata
from engine.metrics import EngineMetrics
from engine.reads.read_index import ReadIndex

log = logging.getLogger(__name__)

# Replay applies the operations of the log in batches of about this many.
_REPLAY_BATCH = 4096


class RecoveryStopped(Exception):
    """The container was stopped while it recovered: the recovery is abandoned, nothing is written."""


class DurableLog:
    """One container's log of operations: processor, recovery, memory log, truncation."""

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
        self.processor = OperationProcessor(
            settings, data_log, metadata, metrics, commit=self._apply, checkpointed=self._checkpointed
        )
        self._checkpoints: list[tuple[int, int]] = []  # (checkpoint seq, frame address)
        self._truncate_lock = threading.Lock()
        self.last_committed_seq = 0

    @property
    def failure(self) -> str | None:
        """Why the log stopped taking writes for good (fenced, or the processor failed), or None."""
        return self.processor.failure

    @property
    def full(self) -> str | None:
        """Why the last Tier 1 write failed for want of space (None once a write succeeds again)."""
        return self.processor.full

    # ----------------------------------------------------------------- recovery
    def recover(self) -> int:
        """Rebuild metadata, memory log and read index from Tier 1, then begin the new epoch.

        ``replay`` then ``begin_epoch``; returns operations replayed. Must run before ``start``.
        """
        replayed = self.replay()
        self.begin_epoch()
        return replayed

    def replay(self, stopping: threading.Event | None = None) -> int:
        """Rebuild metadata, memory log and read index from Tier 1; returns operations replayed.

        Operations are applied in batches (one metadata lock and one memory
        log append per batch, not per operation). Reads are possible
        afterwards; writes only after ``begin_epoch``. ``stopping`` set: the
        container stops, and the replay is abandoned (``RecoveryStopped``).
        """
        replayed = 0
        started = False
        batches = log_call(self.data_log, lambda: list(self.data_log.recover()))
        pending: list[ops.Operation] = []
        for batch in batches:
            if stopping is not None and stopping.is_set():
                raise RecoveryStopped(f"container {self.metadata.container_id} stopped during its recovery")
            for op in ops.decode_all(batch.payload):
                if not isinstance(op, ops.MetadataCheckpoint):
                    if started:  # before the first checkpoint: already in Tier 2
                        pending.append(op)
                    continue
                self._apply(pending)
                replayed, pending = replayed + len(pending), []
                if not started:
                    self.metadata.restore(op.snapshot, op.seq)
                    started = True
                else:
                    self.metadata.epoch = max(self.metadata.epoch, op.snapshot["epoch"])
                    self.metadata.seq = max(self.metadata.seq, op.seq)
                self._checkpoints.append((op.seq, batch.first_frame_seq))
            if len(pending) >= _REPLAY_BATCH:
                self._apply(pending)
                replayed, pending = replayed + len(pending), []
        self._apply(pending)
        replayed += len(pending)
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
            address, _ = log_call(self.data_log, self.data_log.append, payload)
        except OSError:
            updater.burn_sequence_numbers()
            raise
        self._apply([checkpoint])
        self._checkpointed(checkpoint.seq, address)
        self.processor.count_from_checkpoint()

    def _checkpointed(self, seq: int, address: int) -> None:
        """A checkpoint is durable at frame ``address``: Tier 1 may later be truncated there."""
        with self._truncate_lock:
            self._checkpoints.append((seq, address))

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.processor.start()

    def close(self) -> None:
        self.processor.close()
        self.memory_log.close()
        log_call(self.data_log, self.data_log.close)

    def add(self, op: ops.Operation) -> Completion[Outcome]:
        """Queue an operation; the future resolves once it is durable (or refused)."""
        return self.processor.add(op)

    # ---------------------------------------------------------------- commits
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
        freed = log_call(self.data_log, self.data_log.truncate, address)
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
