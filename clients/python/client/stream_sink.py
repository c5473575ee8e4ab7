"""Writing rows to a stream through stream transactions: one transaction per write or micro-batch.

Each row's ``value`` is one event, routed by the row's routing key (a
column; a null key lets the server draw one). All the tasks of a write put
their events into one stream transaction, so its events become visible
together when it commits, or never (docs/api.md "Streams", Transactions).

A task sends its events with a writer id of its own (derived from the
transaction or micro-batch and the Spark partition) and numbers them from
1. The server drops an event whose number the writer already stored in the
transaction, so a task that is tried again, or a micro-batch that runs
again, adds nothing that its earlier attempt stored, provided the task
gets the same rows in the same order (Spark's retries of a deterministic
plan do). A key's rows keep their order within one task; rows of one key
in several Spark partitions have none between them (repartition by the key
to keep it).

Batch writes: the driver opens the transaction when the write is planned,
the tasks write into it, the driver commits it (or aborts it).

Streaming: the driver runs no code before a micro-batch's tasks, so the
tasks agree on its transaction through attributes (docs/api.md
"Attributes") of a sidecar segment, ``{scope}/{stream}.sinks``, keyed by the
sink id: ``last`` (the last committed batch id), and the claim: ``batch``
and the transaction id's two halves. A task of batch B (its id is the
``streaming.sql.batchId`` property Spark gives every task):

1. ``last >= B``: B was committed; it writes nothing.
2. The claim is B's: its transaction is written into if open; committed or
   committing, B's events are all in it and the task writes nothing.
3. Otherwise (an older batch's claim, or B's transaction aborted or
   expired) it opens a transaction and claims it with one atomic update
   conditional on the claim's previous high half; the loser of a race
   aborts its own and takes the winner's.

The driver's commit of B: ``last >= B`` is a replay and does nothing;
otherwise it commits B's claimed transaction (idempotent), after checking
that every task wrote into it (a transaction that expired while the batch
ran fails the batch, which runs again on restart), then raises ``last`` to
B. A crash between the commit and raising ``last`` leaves a batch whose
replay finds its transaction committed: nothing is written twice.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from client.errors import ConditionalCheckFailed, SegmentExists, SegmentNotFound, TransactionNotOpen
from client.results import AttributeUpdate
from client.segment_client import SegmentClient
from client.sink_keys import STREAM_SINK, SinkKeys, from_halves, halves
from client.stream_client import StreamClient

OPEN, COMMITTING, COMMITTED = "open", "committing", "committed"


class TransactionLost(RuntimeError):
    """A micro-batch's tasks wrote into a transaction that is no longer the batch's: it must run again."""


@dataclass(frozen=True)
class StreamTarget:
    """The stream written to, and the client's view of it."""

    client: SegmentClient
    scope: str
    stream: str

    @property
    def streams(self) -> StreamClient:
        return StreamClient(self.client)

    @property
    def state_segment(self) -> str:
        """The sidecar segment holding the sinks' attributes (no data is ever appended to it)."""
        return f"{self.scope}/{self.stream}.sinks"

    def prepare(self, streaming: bool) -> None:
        """Check that the stream exists; create the sidecar segment a streaming sink needs."""
        self.streams.stream(self.scope, self.stream)
        if streaming:
            with contextlib.suppress(SegmentExists):
                self.client.create(self.state_segment)


def sink_keys(sink_id: str) -> SinkKeys:
    """The keys of the streaming sink ``sink_id`` on the sidecar segment (see the module doc)."""
    return SinkKeys(sink_id, STREAM_SINK)


def writer_id(*parts: object) -> uuid.UUID:
    """A task's writer id: the same for every attempt of one partition of one write."""
    return uuid.uuid5(STREAM_SINK, "\n".join(str(p) for p in parts))


def write_events(
    target: StreamTarget, txid: str, batches: Iterable[pa.RecordBatch], key_column: str, writer: uuid.UUID
) -> int:
    """Every row's ``value`` as one event of transaction ``txid``, keyed by ``key_column``; the rows sent.

    The events carry ``writer`` and numbers from 1, so a retry adds nothing
    the earlier attempt stored (see the module doc).
    """
    streams = target.streams
    number = 0
    for batch in batches:
        values = _column(batch, "value").to_pylist()
        keys = _column(batch, key_column).cast(pa.string()).to_pylist()
        for value, key in zip(values, keys, strict=True):
            if value is None:
                raise ValueError("the value column holds a null; every row must carry a value")
            number += 1
            payload = value.encode() if isinstance(value, str) else bytes(value)
            streams.write_transaction_event(
                target.scope, target.stream, txid, payload,
                routing_key=key, writer_id=writer, event_number=number,
            )  # fmt: skip
    return number


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise ValueError(f"the data frame written to a stream needs a {name!r} column")
    return batch.column(index)


@dataclass(frozen=True)
class SinkState:
    """The sink's attributes as read once: the last committed batch and the claim."""

    last: int | None
    batch: int | None
    txid: str | None

    @classmethod
    def read(cls, target: StreamTarget, keys: SinkKeys) -> SinkState:
        got = target.client.get_attributes(target.state_segment, [keys.last, keys.batch, keys.high, keys.low])
        last, batch, high, low = (got.get(str(k)) for k in (keys.last, keys.batch, keys.high, keys.low))
        txid = from_halves(high, low) if high is not None and low is not None else None
        return cls(last, batch, txid)

    def committed(self, batch_id: int) -> bool:
        return self.last is not None and self.last >= batch_id

    def claimed(self, batch_id: int) -> str | None:
        """The transaction claimed for ``batch_id``, if the claim is that batch's."""
        return self.txid if self.batch == batch_id else None


def batch_transaction(
    target: StreamTarget, keys: SinkKeys, batch_id: int, timeout_s: float | None = None
) -> str | None:
    """The open transaction micro-batch ``batch_id`` writes into; ``None`` when it has nothing to write."""
    streams = target.streams
    while True:
        state = SinkState.read(target, keys)
        if state.committed(batch_id):
            return None
        claimed = state.claimed(batch_id)
        if claimed is not None:
            status = streams.transaction(target.scope, target.stream, claimed)["state"]
            if status == OPEN:
                return claimed
            if status in (COMMITTING, COMMITTED):
                return None
        fresh = streams.open_transaction(target.scope, target.stream, timeout_s=timeout_s)
        high, low = halves(fresh)
        expected = halves(state.txid)[0] if state.txid is not None else None
        try:
            target.client.update_attributes(
                target.state_segment,
                [
                    AttributeUpdate(keys.high, "replace_if_equals", high, expected=expected),
                    AttributeUpdate(keys.low, "replace", low),
                    AttributeUpdate(keys.batch, "replace", batch_id),
                ],
            )
            return fresh
        except ConditionalCheckFailed:
            streams.abort(target.scope, target.stream, fresh)


def commit_batch(target: StreamTarget, keys: SinkKeys, batch_id: int, written: Iterable[str]) -> str:
    """Commit micro-batch ``batch_id`` once; ``written``: the transactions its tasks wrote into.

    Returns what happened: ``committed``, ``empty`` (no rows) or ``replayed``.
    """
    state = SinkState.read(target, keys)
    if state.committed(batch_id):
        return "replayed"
    txid = state.claimed(batch_id)
    stale = {t for t in written if t != txid}
    if stale:
        raise TransactionLost(
            f"micro-batch {batch_id} wrote into {sorted(stale)}, which is no longer its transaction "
            f"({txid}): it expired or was aborted while the batch ran; the batch runs again on restart"
        )
    if txid is not None:
        target.streams.commit(target.scope, target.stream, txid)
    try:
        target.client.update_attributes(
            target.state_segment, [AttributeUpdate(keys.last, "replace_if_greater", batch_id)]
        )
    except ConditionalCheckFailed:
        if not SinkState.read(target, keys).committed(batch_id):
            raise
    return "committed" if txid is not None else "empty"


def abort_batch(target: StreamTarget, keys: SinkKeys, batch_id: int) -> None:
    """Abort micro-batch ``batch_id``'s transaction, unless the batch was committed."""
    state = SinkState.read(target, keys)
    txid = state.claimed(batch_id)
    if txid is not None and not state.committed(batch_id):
        with contextlib.suppress(SegmentNotFound, TransactionNotOpen):
            target.streams.abort(target.scope, target.stream, txid)
