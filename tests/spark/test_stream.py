"""Structured Streaming through the segstore format: reading with limits and availableNow, and the sink."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.servers import ServerProcess
from client.events import EventReader, EventWriter
from client.segment_client import SegmentClient
from client.spark_sink import sink_keys

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENT_BYTES = 100


def _append_events(client: SegmentClient, name: str, tag: bytes, count: int) -> list[bytes]:
    payloads = [tag + b":%04d:" % i for i in range(count)]
    payloads = [p + b"s" * (EVENT_BYTES - len(p)) for p in payloads]
    with EventWriter(client, name, max_batch_bytes=2048) as writer:
        for payload in payloads:
            writer.write(payload)
    return payloads


def _stream(spark: Any, server: ServerProcess, segments: str, **options: object) -> Any:
    reader = spark.readStream.format("segstore").option("endpoint", server.url).option("segments", segments)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _run_collecting(df: Any, checkpoint: Path, seen: list[tuple[int, list[tuple[str, int, bytes]]]]) -> None:
    def collect(batch: Any, batch_id: int) -> None:
        seen.append((batch_id, [(r.segment, r.offset, bytes(r.value)) for r in batch.collect()]))

    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_available_now_in_byte_limited_batches_then_new_segments(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str, tmp_path: Path
) -> None:
    first, second = scope + "a", scope + "b"
    for name in (first, second):
        client.create(name)
    expected = {
        first: _append_events(client, first, b"a", 120),
        second: _append_events(client, second, b"b", 60),
    }
    limit = 5000  # shared by the segments with data pending
    seen: list[tuple[int, list[tuple[str, int, bytes]]]] = []
    _run_collecting(_stream(spark, server, scope, maxBytesPerTrigger=limit), tmp_path / "ckpt", seen)
    batches = [rows for _, rows in seen if rows]
    assert len(batches) >= 4  # 12,480 + 6,240 bytes: 24 events of each, then 48 of the longer one
    assert all(len(rows) * (EVENT_BYTES + 4) <= limit for rows in batches)
    got: dict[str, list[bytes]] = {}
    for rows in batches:
        for segment, _, value in sorted(rows):
            got.setdefault(segment, []).append(value)
    assert got == expected

    third = scope + "c"
    client.create(third)
    more = {third: _append_events(client, third, b"c", 10), first: _append_events(client, first, b"a2", 5)}
    seen.clear()
    _run_collecting(_stream(spark, server, scope, maxBytesPerTrigger=limit), tmp_path / "ckpt", seen)
    got.clear()
    for _, rows in seen:
        for segment, _, value in sorted(rows):
            got.setdefault(segment, []).append(value)
    assert got == more


def test_starting_offsets_latest_and_json(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str, tmp_path: Path
) -> None:
    name = scope + "s"
    client.create(name)
    old = _append_events(client, name, b"old", 10)
    middle = next(e.offset for i, e in enumerate(EventReader(client, name)) if i == 4)
    seen: list[Any] = []
    _run_collecting(_stream(spark, server, name, startingOffsets="latest"), tmp_path / "latest", seen)
    assert [rows for _, rows in seen if rows] == []
    seen.clear()
    start = json.dumps({name: middle})
    _run_collecting(_stream(spark, server, name, startingOffsets=start), tmp_path / "json", seen)
    assert [value for _, rows in seen for _, _, value in rows] == old[4:]


def test_the_sink_writes_a_replayed_batch_once(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str, tmp_path: Path
) -> None:
    source, target = scope + "in", scope + "out"
    client.create(source)
    client.create(target)
    payloads = _append_events(client, source, b"in", 80)
    checkpoint = tmp_path / "sink-ckpt"

    def run() -> None:
        query = (
            _stream(spark, server, source, maxBytesPerTrigger=3000)
            .select("value")
            .writeStream.format("segstore")
            .option("endpoint", server.url)
            .option("segment", target)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert [e.payload for e in EventReader(client, target)] == payloads
    commits = sorted(
        (checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last_batch = int(commits[-1].name)
    assert last_batch >= 2
    assert client.get_attributes(target, [sink_keys(str(checkpoint)).last]) == {
        str(sink_keys(str(checkpoint)).last): last_batch
    }
    # Forget that the last batch committed, as a crash right before Spark logs it would: Spark runs it again.
    commits[-1].unlink()
    (checkpoint / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    run()
    assert [e.payload for e in EventReader(client, target)] == payloads

    more = _append_events(client, source, b"more", 7)
    run()
    assert [e.payload for e in EventReader(client, target)] == payloads + more
