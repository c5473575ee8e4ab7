"""Spark batch reads and writes through the segstore format, on a local Spark against a real server."""

from __future__ import annotations

from typing import Any

import pytest

from bench.servers import ServerProcess
from client.events import EventReader, EventWriter
from client.segment_client import SegmentClient

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _write_events(client: SegmentClient, name: str, payloads: list[bytes]) -> None:
    client.create(name)
    with EventWriter(client, name, max_batch_bytes=8 * 1024) as writer:
        for payload in payloads:
            writer.write(payload)


def _reader(spark: Any, server: ServerProcess, segments: str, **options: object) -> Any:
    reader = spark.read.format("segstore").option("endpoint", server.url).option("segments", segments)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_one_segment_reads_in_parallel_partitions(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str
) -> None:
    name = scope + "0"
    payloads = [b"event %05d " % i + b"p" * (i % 250) for i in range(3000)]
    _write_events(client, name, payloads)
    df = _reader(spark, server, name, target_bytes=64 * 1024)
    assert df.schema.simpleString() == "struct<segment:string,offset:bigint,value:binary>"
    assert df.rdd.getNumPartitions() >= 3
    rows = sorted(df.collect(), key=lambda row: row.offset)
    assert [bytes(row.value) for row in rows] == payloads
    assert [row.offset for row in rows] == [event.offset for event in EventReader(client, name)]
    assert {row.segment for row in rows} == {name}


def test_prefix_and_names_and_each_framing(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str
) -> None:
    by_segment = {f"{scope}{i}": [b"%d:%03d" % (i, j) for j in range(50 * (i + 1))] for i in range(3)}
    for name, payloads in by_segment.items():
        _write_events(client, name, payloads)
    client.create(scope + "empty")
    found: dict[str, list[bytes]] = {}
    for row in _reader(spark, server, scope).collect():
        found.setdefault(row.segment, []).append((row.offset, bytes(row.value)))
    assert {name: [v for _, v in sorted(rows)] for name, rows in found.items()} == by_segment
    two = f"{scope}0,{scope}2"
    assert _reader(spark, server, two).count() == 50 + 150

    text_name = scope + "text"
    lines = [b"%d," % i + b"t" * (i % 100) for i in range(6000)]  # about 330 KB
    text = b"\n".join(lines) + b"\n"
    client.create(text_name)
    for piece in range(0, len(text), 4000):  # appends cut lines anywhere
        client.append(text_name, text[piece : piece + 4000])
    lines_df = _reader(spark, server, text_name, framing="lines", target_bytes=16 * 1024)
    assert lines_df.rdd.getNumPartitions() >= 3
    rows = lines_df.collect()
    assert sorted(bytes(row.value) for row in rows) == sorted(lines)
    raw = _reader(spark, server, text_name, framing="raw", target_bytes=16 * 1024).collect()
    assert b"".join(bytes(row.value) for row in sorted(raw, key=lambda row: row.offset)) == text


def test_a_partial_frame_fails_the_read(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str
) -> None:
    name = scope + "broken"
    client.create(name)
    client.append(name, (5).to_bytes(4, "big") + b"whole" + (9).to_bytes(4, "big") + b"cut")
    with pytest.raises(Exception, match="inside an event frame"):
        _reader(spark, server, name).collect()


def test_write_appends_each_row_once(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str
) -> None:
    name = scope + "out"
    client.create(name)
    client.append(name, (3).to_bytes(4, "big") + b"old")
    values = [b"row %04d " % i + b"w" * (i % 90) for i in range(1500)]
    df = spark.createDataFrame([(v,) for v in values], "value binary").repartition(3)
    df.write.format("segstore").option("endpoint", server.url).option("segment", name).option(
        "append_bytes", 4096
    ).mode("append").save()
    events = [event.payload for event in EventReader(client, name)]
    assert events[0] == b"old"
    assert sorted(events[1:]) == sorted(values)

    strings = spark.createDataFrame([(f"ünï {i}",) for i in range(10)], "value string")
    strings.write.format("segstore").option("endpoint", server.url).option("segment", name).mode(
        "append"
    ).save()
    assert sorted(e.payload for e in EventReader(client, name))[-10:] == sorted(
        f"ünï {i}".encode() for i in range(10)
    )


def test_a_failed_first_attempt_leaves_exactly_the_input_rows(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str
) -> None:
    """Attempt 0 of partition 0 stores 300 rows in its transaction, then dies; its retry succeeds."""
    name = scope + "retried"
    client.create(name)
    values = [b"%05d" % i for i in range(2000)]
    df = spark.createDataFrame([(v,) for v in values], "value binary").repartition(2)
    group = f"inject-{scope}"
    spark.sparkContext.setJobGroup(group, "a write whose first attempt fails")
    (
        df.write.format("segstore")
        .option("endpoint", server.url)
        .option("segment", name)
        .option("append_bytes", 512)
        .option("fail_first_attempt_after_rows", 300)
        .mode("append")
        .save()
    )
    spark.sparkContext.setJobGroup("", "")
    tracker = spark.sparkContext.statusTracker()
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup(group)
        for stage in tracker.getJobInfo(job).stageIds
    ]
    assert sum(stage.numFailedTasks for stage in stages if stage) == 1
    events = [event.payload for event in EventReader(client, name)]
    assert len(events) == len(values)
    assert sorted(events) == values


def test_overwrite_and_a_missing_value_column_are_refused(
    spark: Any, server: ServerProcess, scope: str
) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    writer = df.write.format("segstore").option("endpoint", server.url).option("segment", scope + "x")
    with pytest.raises(Exception, match="append-only"):
        writer.mode("overwrite").save()
    other = spark.createDataFrame([(1,)], "n int")
    with pytest.raises(Exception, match="'value' column"):
        other.write.format("segstore").option("endpoint", server.url).option("segment", scope + "x").mode(
            "append"
        ).save()


def test_a_missing_target_is_created_before_any_task_and_a_sealed_one_refused(
    spark: Any, server: ServerProcess, client: SegmentClient, scope: str
) -> None:
    name = scope + "created-by-the-driver"
    df = spark.createDataFrame([(b"a",), (b"bc",)], "value binary").repartition(2)

    def write() -> None:
        df.write.format("segstore").option("endpoint", server.url).option("segment", name).mode(
            "append"
        ).save()

    write()
    events = [e.payload for e in EventReader(client, name, follow=False)]
    assert sorted(events) == [b"a", b"bc"]
    client.seal(name)
    with pytest.raises(Exception, match="is sealed and takes no more rows"):
        write()
    assert client.info(name).length == 4 + 1 + 4 + 2
