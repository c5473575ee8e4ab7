"""The segstore format over streams: a batch read across splits and merges, a streaming query stopped
and restarted across scalings, one killed in its own driver process and restarted from its checkpoint,
and the stream sink's exactly-once micro-batches."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from bench.servers import ServerProcess
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from client.stream_writer import StreamWriter
from tests.polling import wait_until
from tests.scopes.writers import KeyedWriters, assert_exactly_once_in_order, read_in_successor_order

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = [f"key-{i}" for i in range(12)]


def _new_stream(client: SegmentClient, segments: int) -> tuple[str, str]:
    scope, stream = f"sp{uuid.uuid4().hex[:10]}", "st"
    streams = StreamClient(client)
    streams.create_scope(scope)
    streams.create_stream(scope, stream, segments=segments)
    return scope, stream


def _write(client: SegmentClient, scope: str, stream: str, counts: dict[str, int], per_key: int) -> None:
    """``per_key`` more events ``key:n`` of every key, numbered on from ``counts``."""
    with StreamWriter(client, scope, stream, linger_s=0.001) as writer:
        for _ in range(per_key):
            for key in KEYS:
                counts[key] += 1
                writer.write(f"{key}:{counts[key]}".encode(), key)


def _numbers(values: list[bytes]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for value in values:
        key, _, number = value.decode().rpartition(":")
        found[key].append(int(number))
    return found


def _read(spark: Any, server: ServerProcess, stream: str, **options: str) -> Any:
    reader = spark.read.format("segstore").option("endpoint", server.url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_a_batch_read_across_a_split_and_a_merge_keeps_every_key_in_order(
    spark: Any, server: ServerProcess, client: SegmentClient
) -> None:
    scope, stream = _new_stream(client, segments=3)  # 0, 1, 2
    streams = StreamClient(client)
    counts: dict[str, int] = defaultdict(int)
    _write(client, scope, stream, counts, 20)
    third = 1 / 3
    streams.scale(scope, stream, [0], [(0.0, third / 2), (third / 2, third)])  # 3, 4
    middle = streams.cut(scope, stream, "tail")
    _write(client, scope, stream, counts, 20)
    streams.scale(scope, stream, [4, 1], [(third / 2, 2 * third)])  # 5
    _write(client, scope, stream, counts, 20)

    df = _read(spark, server, f"{scope}/{stream}")
    # Segment 2 never scaled: its own partition; 0, 1, 3, 4 and 5 descend from one another: one more.
    assert df.rdd.getNumPartitions() == 2
    assert_exactly_once_in_order(_numbers([bytes(r.value) for r in df.collect()]), counts)

    tail_part = _read(spark, server, f"{scope}/{stream}", start_stream_cut=json.dumps(middle.to_json()))
    later = _numbers([bytes(r.value) for r in tail_part.collect()])
    assert all(numbers == list(range(21, 61)) for numbers in later.values()) and set(later) == set(KEYS)


def _start_query(
    spark: Any, server: ServerProcess, stream: str, checkpoint: Path, seen: dict, **trigger: Any
) -> Any:
    def collect(batch: Any, batch_id: int) -> None:
        seen[batch_id] = [bytes(r.value) for r in batch.collect()]

    df = spark.readStream.format("segstore").option("endpoint", server.url).option("stream", stream).load()
    return (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def test_a_streaming_query_stopped_and_restarted_across_scalings_reads_each_event_once(
    spark: Any, server: ServerProcess, client: SegmentClient, tmp_path: Path
) -> None:
    scope, stream = _new_stream(client, segments=2)  # 0 [0, .5), 1 [.5, 1)
    streams = StreamClient(client)
    checkpoint = tmp_path / "ckpt"
    seen: dict[int, list[bytes]] = {}  # by batch id: a batch run again replaces its first run
    writers = KeyedWriters(client, scope, stream, KEYS, threads=2).start()
    every = {"processingTime": "200 milliseconds"}
    query = _start_query(spark, server, f"{scope}/{stream}", checkpoint, seen, **every)
    try:
        wait_until(lambda: sum(map(len, seen.values())) > 50, "the query read events", timeout_s=60)
        streams.scale(scope, stream, [0], [(0.0, 0.25), (0.25, 0.5)])  # 2, 3
        streams.scale(scope, stream, [3, 1], [(0.25, 1.0)])  # 4
        batches = len(seen)
        wait_until(lambda: len(seen) > batches + 3, "more micro-batches ran after the scalings", timeout_s=60)
    finally:
        query.stop()
    streams.scale(scope, stream, [4], [(0.25, 0.6), (0.6, 1.0)])  # 5, 6, while the query is stopped
    writers.stop()
    query = _start_query(spark, server, f"{scope}/{stream}", checkpoint, seen, availableNow=True)
    query.awaitTermination(120)
    assert query.exception() is None
    ordered = [value for batch_id in sorted(seen) for value in seen[batch_id]]
    assert_exactly_once_in_order(_numbers(ordered), dict(writers.written))


DRIVER = Path(__file__).with_name("stream_driver.py")


def _start_driver(
    server: ServerProcess, stream: str, output: Path, checkpoint: Path, trigger: str
) -> subprocess.Popen[bytes]:
    """``stream_driver.py`` in a process group of its own: the driver, its JVM and Spark's Python workers."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    command = [sys.executable, str(DRIVER), server.url, stream, str(output), str(checkpoint), trigger]
    return subprocess.Popen(command, env=env, start_new_session=True)


def _log(output: Path) -> list[Path]:
    """The file sink's log of committed micro-batches in order: ``N``, or ``N.compact`` (all up to N)."""
    log = output / "_spark_metadata"
    entries = [p for p in log.iterdir() if p.name[0].isdigit()] if log.is_dir() else []
    return sorted(entries, key=lambda p: int(p.name.partition(".")[0]))


def _committed(output: Path) -> list[bytes]:
    """The lines of the files the file sink's log lists, batch after batch: only committed micro-batches."""
    entries = _log(output)
    compacted = [i for i, p in enumerate(entries) if p.name.endswith(".compact")]
    files = []
    for entry in entries[compacted[-1] if compacted else 0 :]:
        for line in entry.read_text().splitlines()[1:]:  # after the version line
            files.append(Path(urlparse(json.loads(line)["path"]).path))
    return [line for file in files for line in file.read_bytes().splitlines()]


def _kill_group(driver: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone once all of it exited
        os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()


@pytest.mark.process
def test_a_streaming_query_killed_and_restarted_from_its_checkpoint_delivers_each_event_once(
    spark: Any, server: ServerProcess, client: SegmentClient, tmp_path: Path
) -> None:
    """Killed with its driver's JVM mid-run; restarted from the checkpoint in another JVM, this run's."""
    from tests.spark.stream_driver import start_copy  # imports pyspark: not at collection

    scope, stream = _new_stream(client, segments=2)  # 0 [0, .5), 1 [.5, 1)
    streams = StreamClient(client)
    output, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    driver = _start_driver(server, f"{scope}/{stream}", output, checkpoint, "continuous")
    try:
        # Write once the query runs, so that its first micro-batch is small and lands soon.
        wait_until((checkpoint / "metadata").exists, "the query started", timeout_s=120)
        writers = KeyedWriters(client, scope, stream, KEYS, threads=2).start()
        wait_until(lambda: len(_committed(output)) > 50, "a micro-batch landed", timeout_s=120)
        streams.scale(scope, stream, [0], [(0.0, 0.25), (0.25, 0.5)])  # 2, 3
        streams.scale(scope, stream, [3, 1], [(0.25, 1.0)])  # 4
        batches = len(_log(output))
        wait_until(lambda: len(_log(output)) > batches + 3, "micro-batches landed after the scalings", 60)
    finally:
        _kill_group(driver)  # mid-run: a micro-batch may be half written
    streams.scale(scope, stream, [4], [(0.25, 0.6), (0.6, 1.0)])  # 5, 6, while no driver runs
    writers.stop()
    query = start_copy(spark, server.url, f"{scope}/{stream}", str(output), str(checkpoint), "available-now")
    query.awaitTermination(180)
    assert query.exception() is None
    assert_exactly_once_in_order(_numbers(_committed(output)), dict(writers.written))


def _sink_query(spark: Any, server: ServerProcess, source: str, target: str, checkpoint: Path) -> None:
    from pyspark.sql import functions as f

    df = spark.readStream.format("segstore").option("endpoint", server.url).option("stream", source).load()
    keyed = df.select("value", f.substring_index(f.col("value").cast("string"), ":", 1).alias("routing_key"))
    query = (
        keyed.writeStream.format("segstore")
        .option("endpoint", server.url)
        .option("stream", target)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_the_stream_sink_writes_a_replayed_micro_batch_once(
    spark: Any, server: ServerProcess, client: SegmentClient, tmp_path: Path
) -> None:
    scope, source = _new_stream(client, segments=2)
    streams = StreamClient(client)
    streams.create_stream(scope, "out", segments=3)
    counts: dict[str, int] = defaultdict(int)
    _write(client, scope, source, counts, 10)
    checkpoint = tmp_path / "sink"
    _sink_query(spark, server, f"{scope}/{source}", f"{scope}/out", checkpoint)
    assert_exactly_once_in_order(read_in_successor_order(client, scope, "out"), counts)

    # Forget that the last batch committed, as a crash right before Spark logs it would: Spark runs it again.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(commits[-1])).unlink()
    (checkpoint / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    _sink_query(spark, server, f"{scope}/{source}", f"{scope}/out", checkpoint)
    assert_exactly_once_in_order(read_in_successor_order(client, scope, "out"), counts)

    _write(client, scope, source, counts, 5)
    _sink_query(spark, server, f"{scope}/{source}", f"{scope}/out", checkpoint)
    assert_exactly_once_in_order(read_in_successor_order(client, scope, "out"), counts)
