"""The streaming sink's commit protocol (client.spark_sink) against a real server, without Spark."""

from __future__ import annotations

import pyarrow as pa

from client.events import EventReader
from client.segment_client import SegmentClient
from client.spark_sink import (
    TaskContextInfo,
    TaskTransaction,
    commit_batch,
    frame_values,
    intent_updates,
    sink_keys,
    write_task,
)


def _task_rows(client: SegmentClient, name: str, values: list[bytes], partition: int = 0) -> TaskTransaction:
    batch = pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})
    return write_task(client, name, [batch], TaskContextInfo(partition, 0), append_bytes=64)


def _events(client: SegmentClient, name: str) -> list[bytes]:
    return [event.payload for event in EventReader(client, name)]


def test_values_are_framed_back_to_back() -> None:
    data, ends = frame_values(pa.array([b"zero", b"ab", b"", b"xyz"]).slice(1))
    assert (bytes(data), ends) == (b"\0\0\0\2ab\0\0\0\0\0\0\0\3xyz", [6, 10, 17])
    data, ends = frame_values(pa.array(["ü"], pa.large_string()))
    assert (bytes(data), ends) == (b"\0\0\0\2\xc3\xbc", [6])


def test_a_replayed_batch_is_not_written_again(client: SegmentClient, scope: str) -> None:
    name = scope + "sink"
    client.create(name)
    first = [_task_rows(client, name, [b"a1", b"a2"]), _task_rows(client, name, [b"a3"], 1)]
    assert commit_batch(client, name, "q", 0, first) == "committed"
    assert _events(client, name) == [b"a1", b"a2", b"a3"]
    replay = [_task_rows(client, name, [b"a1", b"a2"]), _task_rows(client, name, [b"a3"], 1)]
    assert commit_batch(client, name, "q", 0, replay) == "replayed"
    assert commit_batch(client, name, "q", 1, [_task_rows(client, name, [b"b1"])]) == "committed"
    assert _events(client, name) == [b"a1", b"a2", b"a3", b"b1"]
    assert client.get_attributes(name, [sink_keys("q").last]) == {str(sink_keys("q").last): 1}
    # Another sink on the same segment keeps its own batch ids.
    assert commit_batch(client, name, "other", 0, [_task_rows(client, name, [b"c1"])]) == "committed"
    assert _events(client, name)[-1] == b"c1"


def test_a_commit_cut_short_is_finished_by_the_replay(client: SegmentClient, scope: str) -> None:
    """A crash after the intent and one of two commits, before ``last`` moved: the replay completes it."""
    name = scope + "crash"
    client.create(name)
    assert commit_batch(client, name, "q", 0, [_task_rows(client, name, [b"zero"])]) == "committed"
    cut_short = [_task_rows(client, name, [b"x1"]), _task_rows(client, name, [b"x2"], 1)]
    keys = sink_keys("q")
    client.update_attributes(name, intent_updates(keys, 1, cut_short))
    client.commit_transaction(name, cut_short[0].txid)
    assert _events(client, name) == [b"zero", b"x1"]

    replay = [_task_rows(client, name, [b"x1"]), _task_rows(client, name, [b"x2"], 1)]
    assert commit_batch(client, name, "q", 1, replay) == "resumed"
    assert _events(client, name) == [b"zero", b"x1", b"x2"]
    assert commit_batch(client, name, "q", 1, replay) == "replayed"
    assert _events(client, name) == [b"zero", b"x1", b"x2"]
