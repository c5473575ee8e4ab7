"""The write side of the Spark source: task transactions and the streaming sink's commit protocol.

Each write task appends its rows, framed as events (4-byte big-endian length,
then the value), to a transaction of its own and hands the transaction id to
the driver in its commit message. Only the driver commits, and only the
transactions named in the messages of successful tasks, so a failed or
speculative attempt's transaction is never merged: its rows never appear.
A task that fails aborts its own transaction on the way out; one that dies
outright leaves it to the server's ``transaction_timeout_s``.

Streaming: a micro-batch is committed once. Three kinds of attributes (docs/api.md
"Attributes") live on the target segment under keys derived from the sink id:
``last`` (the last committed batch id), and the commit intent: ``intent``
(the batch being committed), ``count`` and two halves per transaction id.
The driver's commit for batch B:

1. ``last >= B``: B was committed before (Spark replays a batch whose commit
   it did not log); the new attempt's transactions are aborted.
2. ``intent == B``: a previous commit of B stopped part way (a crash between
   committing the transactions and raising ``last``); the recorded
   transactions are committed again, which is idempotent, and the new ones
   are aborted.
3. Otherwise the intent for B is written in one atomic update, then each
   transaction is committed, then ``last`` is raised to B with
   ``replace_if_greater``.

So neither a replay nor a crash anywhere in the commit writes a batch twice
or loses it, provided a recorded transaction is committed again within
``transaction_timeout_s`` (600 s by default); later, its bytes are gone and
the commit fails loudly (``SegmentNotFound``) rather than silently.

The sink id must be one query's own: a new query (a fresh checkpoint) that
writes under a sink id whose batches were committed before has its batch
ids up to that ``last`` skipped as replays.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import struct
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from client.errors import ConditionalCheckFailed, SegmentNotFound
from client.results import AttributeUpdate
from client.segment_client import SegmentClient
from client.sink_keys import SEGMENT_SINK, SinkKeys, from_halves, halves

HEADER_BYTES = 4
DEFAULT_APPEND_BYTES = 4 * 1024 * 1024
# Keys per attribute request the server takes (docs/api.md "Attributes": 1024).
MAX_ATTRIBUTE_UPDATES = 1024


class InjectedTaskFailure(RuntimeError):
    """Raised by the ``fail_first_attempt_after_rows`` fault injection; leaves its transaction open."""


@dataclass(frozen=True)
class TaskTransaction:
    """A write task's commit message: the transaction holding its rows."""

    partition_id: int
    attempt: int
    txid: str
    rows: int


@dataclass(frozen=True)
class TaskContextInfo:
    """Which task attempt is writing (from ``pyspark.TaskContext``)."""

    partition_id: int
    attempt: int


def frame_values(values: pa.Array) -> tuple[memoryview, list[int]]:
    """A binary or string column as framed events back to back, and where each frame ends.

    Arrow joins headers and values; Python touches only the lengths.
    """
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())
    if values.null_count:
        raise ValueError("the value column holds a null; every row must carry a value")
    count = len(values)
    if count == 0:
        return memoryview(b""), []
    lengths = pc.binary_length(values).to_pylist()
    packed = pa.py_buffer(struct.pack(f">{count}I", *lengths))
    headers = pa.Array.from_buffers(pa.binary(HEADER_BYTES), count, [None, packed]).cast(values.type)
    framed = pc.binary_join_element_wise(headers, values, pa.scalar(b"", values.type))
    ends = list(itertools.accumulate(length + HEADER_BYTES for length in lengths))
    offset_type = "=q" if pa.types.is_large_binary(framed.type) else "=i"
    width = struct.calcsize(offset_type)
    start = struct.unpack_from(offset_type, framed.buffers()[1], framed.offset * width)[0]
    return memoryview(framed.buffers()[2])[start : start + ends[-1]], ends


def write_task(
    client: SegmentClient,
    segment: str,
    batches: Iterable[pa.RecordBatch],
    task: TaskContextInfo,
    *,
    append_bytes: int = DEFAULT_APPEND_BYTES,
    fail_first_attempt_after_rows: int | None = None,
) -> TaskTransaction | None:
    """Append every row's ``value`` to a new transaction of ``segment``; returns the commit message
    (``None`` when there were no rows).

    Appends hold whole frames, about ``append_bytes`` each (one frame alone if
    larger), and carry a task-local writer id and event numbers, so one resent
    after a lost answer is dropped by the server rather than stored twice.
    """
    txid: str | None = None  # opened with the first append: a task without rows leaves none
    writer_id = uuid.uuid4()
    rows = 0
    pending: list[memoryview] = []
    pending_bytes = pending_rows = 0

    def send() -> None:
        nonlocal pending, pending_bytes, pending_rows, txid
        if pending:
            if txid is None:
                txid = client.open_transaction(segment)
            client.append_transaction(
                segment,
                txid,
                b"".join(pending),
                writer_id=writer_id,
                event_number=rows,
                event_count=pending_rows,
            )
            pending, pending_bytes, pending_rows = [], 0, 0

    try:
        for batch in batches:
            index = batch.schema.get_field_index("value")
            if index < 0:
                raise ValueError("the data frame written to segstore needs a 'value' column")
            data, ends = frame_values(batch.column(index))
            taken = 0  # frames of this batch already pending
            while taken < len(ends):
                begin = ends[taken - 1] if taken else 0
                upto = max(taken + 1, bisect.bisect_right(ends, begin + append_bytes - pending_bytes))
                pending.append(data[begin : ends[upto - 1]])
                pending_bytes += ends[upto - 1] - begin
                pending_rows += upto - taken
                rows += upto - taken
                taken = upto
                if pending_bytes >= append_bytes:
                    send()
                _maybe_fail(task, rows, fail_first_attempt_after_rows, send)
        send()
    except InjectedTaskFailure:
        raise
    except BaseException:
        if txid is not None:
            with contextlib.suppress(Exception):
                client.abort_transaction(segment, txid)
        raise
    if txid is None:
        return None
    return TaskTransaction(task.partition_id, task.attempt, txid, rows)


def _maybe_fail(task: TaskContextInfo, rows: int, after_rows: int | None, send: Callable[[], None]) -> None:
    """Fault injection for tests: attempt 0 of partition 0 dies once ``after_rows`` rows are stored."""
    if after_rows is not None and task.partition_id == 0 and task.attempt == 0 and rows >= after_rows:
        send()
        raise InjectedTaskFailure(f"injected failure after {rows} rows in attempt 0 of partition 0")


def task_transactions(messages: Iterable[object]) -> list[TaskTransaction]:
    """The commit messages of successful tasks, in partition order."""
    found = [m for m in messages if isinstance(m, TaskTransaction)]
    return sorted(found, key=lambda m: m.partition_id)


def commit_all(client: SegmentClient, segment: str, transactions: Iterable[TaskTransaction | str]) -> None:
    """Commit each transaction in order (each commit is idempotent)."""
    for tx in transactions:
        client.commit_transaction(segment, tx.txid if isinstance(tx, TaskTransaction) else tx)


def abort_all(client: SegmentClient, segment: str, transactions: Iterable[TaskTransaction]) -> None:
    """Abort each transaction; one already gone (aborted, expired) is fine."""
    for tx in transactions:
        with contextlib.suppress(SegmentNotFound):
            client.abort_transaction(segment, tx.txid)


# ------------------------------------------------------------------ streaming commit
def sink_keys(sink_id: str) -> SinkKeys:
    """The keys of the streaming sink ``sink_id`` on its target segment (see the module doc)."""
    return SinkKeys(sink_id, SEGMENT_SINK)


def commit_batch(
    client: SegmentClient, segment: str, sink_id: str, batch_id: int, transactions: list[TaskTransaction]
) -> str:
    """Commit micro-batch ``batch_id`` exactly once; returns what happened: committed, replayed, resumed."""
    keys = sink_keys(sink_id)
    state = client.get_attributes(segment, [keys.last, keys.intent, keys.count])
    last, intent, count = (state.get(str(k)) for k in (keys.last, keys.intent, keys.count))
    if last is not None and last >= batch_id:
        abort_all(client, segment, transactions)
        return "replayed"
    if intent == batch_id and count is not None:
        halves = [keys.half(i, which) for i in range(count) for which in ("hi", "lo")]
        recorded = client.get_attributes(segment, halves) if halves else {}
        txids = [_recorded_txid(recorded, keys, i) for i in range(count)]
        commit_all(client, segment, txids)
        abort_all(client, segment, [tx for tx in transactions if tx.txid not in txids])
        _raise_last(client, segment, keys, batch_id)
        return "resumed"
    if 2 * len(transactions) + 2 > MAX_ATTRIBUTE_UPDATES:
        raise ValueError(
            f"a micro-batch of {len(transactions)} write tasks needs more than the server's "
            f"{MAX_ATTRIBUTE_UPDATES} attribute updates per request to record; use fewer partitions"
        )
    client.update_attributes(segment, intent_updates(keys, batch_id, transactions))
    commit_all(client, segment, transactions)
    _raise_last(client, segment, keys, batch_id)
    return "committed"


def intent_updates(
    keys: SinkKeys, batch_id: int, transactions: list[TaskTransaction]
) -> list[AttributeUpdate]:
    """The one atomic update recording that ``batch_id`` commits exactly ``transactions``."""
    updates = [
        AttributeUpdate(keys.intent, "replace", batch_id),
        AttributeUpdate(keys.count, "replace", len(transactions)),
    ]
    for index, tx in enumerate(transactions):
        high, low = halves(tx.txid)
        updates += [AttributeUpdate(keys.half(index, "hi"), "replace", high)]
        updates += [AttributeUpdate(keys.half(index, "lo"), "replace", low)]
    return updates


def _recorded_txid(recorded: dict[str, int | None], keys: SinkKeys, index: int) -> str:
    """The id of the ``index``-th transaction of the commit intent, from its two halves."""
    high, low = recorded[str(keys.half(index, "hi"))], recorded[str(keys.half(index, "lo"))]
    assert high is not None and low is not None, "a batch's intent is recorded with its transaction ids"
    return from_halves(high, low)


def _raise_last(client: SegmentClient, segment: str, keys: SinkKeys, batch_id: int) -> None:
    """Set the last committed batch id to ``batch_id`` unless it is already there or above."""
    try:
        client.update_attributes(segment, [AttributeUpdate(keys.last, "replace_if_greater", batch_id)])
    except ConditionalCheckFailed:
        current = client.get_attributes(segment, [keys.last]).get(str(keys.last))
        if current is None or current < batch_id:
            raise
