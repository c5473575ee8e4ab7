"""The stream sink's protocol (client.stream_sink) against a real server, without Spark."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from client.stream_sink import (
    StreamTarget,
    TransactionLost,
    abort_batch,
    batch_transaction,
    commit_batch,
    sink_keys,
    write_events,
    writer_id,
)
from tests.scopes.writers import read_in_successor_order


def _target(client: SegmentClient) -> StreamTarget:
    scope = f"sk{uuid.uuid4().hex[:10]}"
    streams = StreamClient(client)
    streams.create_scope(scope)
    streams.create_stream(scope, "out", segments=2)
    target = StreamTarget(client, scope, "out")
    target.prepare(streaming=True)
    return target


def _rows(key: str, first: int, last: int) -> list[pa.RecordBatch]:
    values = [f"{key}:{n}".encode() for n in range(first, last + 1)]
    return [pa.RecordBatch.from_pydict({"value": values, "routing_key": [key] * len(values)})]


def _write(target: StreamTarget, txid: str, key: str, last: int, batch_id: int = 0) -> int:
    return write_events(target, txid, _rows(key, 1, last), "routing_key", writer_id("q", batch_id, key))


def test_tasks_share_one_claimed_transaction_and_a_retry_adds_nothing(client: SegmentClient) -> None:
    target, keys = _target(client), sink_keys("q")
    with ThreadPoolExecutor(4) as pool:
        claimed = set(pool.map(lambda _: batch_transaction(target, keys, 0), range(4)))
    assert len(claimed) == 1
    txid = claimed.pop()
    assert txid is not None
    _write(target, txid, "a", 3)
    _write(target, txid, "b", 2)
    _write(target, txid, "a", 3)  # a task tried again: the same writer, the same numbers
    assert read_in_successor_order(client, target.scope, target.stream) == {}
    assert commit_batch(target, keys, 0, [txid, txid]) == "committed"
    assert read_in_successor_order(client, target.scope, target.stream) == {"a": [1, 2, 3], "b": [1, 2]}
    # Batch 0 run again: its tasks find it committed and write nothing; its commit is a replay.
    assert batch_transaction(target, keys, 0) is None
    assert commit_batch(target, keys, 0, []) == "replayed"
    assert commit_batch(target, keys, 1, []) == "empty"


def test_a_commit_cut_short_before_the_record_is_not_written_twice(client: SegmentClient) -> None:
    target, keys = _target(client), sink_keys("q")
    txid = batch_transaction(target, keys, 4)
    assert txid is not None
    _write(target, txid, "a", 2, batch_id=4)
    StreamClient(client).commit(target.scope, target.stream, txid)  # then a crash before ``last`` moved
    assert batch_transaction(target, keys, 4) is None  # the replay's tasks write nothing
    assert commit_batch(target, keys, 4, []) == "committed"
    assert read_in_successor_order(client, target.scope, target.stream) == {"a": [1, 2]}


def test_an_aborted_batch_claims_a_new_transaction_and_a_lost_one_fails_the_commit(
    client: SegmentClient,
) -> None:
    target, keys = _target(client), sink_keys("q")
    first = batch_transaction(target, keys, 0)
    assert first is not None
    _write(target, first, "a", 2)
    abort_batch(target, keys, 0)
    second = batch_transaction(target, keys, 0)
    assert second not in (None, first)
    with pytest.raises(TransactionLost):
        commit_batch(target, keys, 0, [first])
    assert second is not None
    _write(target, second, "a", 2)
    assert commit_batch(target, keys, 0, [second]) == "committed"
    assert read_in_successor_order(client, target.scope, target.stream) == {"a": [1, 2]}
