"""``SegstoreDataSource``: segstore as a PySpark source and sink (format ``segstore``).

Register it once per session, then use it as any format::

    spark.dataSource.register(SegstoreDataSource)
    df = spark.read.format("segstore").option("endpoint", url).option("segments", "a/b/").load()
    df.write.format("segstore").option("endpoint", url).option("segment", "a/c/0").mode("append").save()

Rows are ``segment string, offset bigint, value binary``: one per event, at
the offset where its record starts. Options:

- ``endpoint`` (required: a node's URL, or a cluster's nodes comma-separated,
  each taking over while the one before cannot be reached), ``token``
  (bearer token, optional);
- ``segments`` (or the path given to ``load``): comma-separated names; an
  item ending in ``/`` is a prefix whose segments are listed (for streams:
  listed again each trigger, so new segments are picked up from their start);
- ``framing``: ``length_prefixed`` (default) | ``lines`` | ``raw``
  (see ``client.spark_ranges``);
- ``target_bytes``: bytes per input partition, from the server's
  ``:partitions`` (default 64 MiB); ``read_bytes``: bytes per GET (8 MiB);
- streaming: ``startingOffsets`` = ``earliest`` (default) | ``latest`` |
  JSON ``{"segment": offset, ...}`` (segments not named start at their
  start offset); ``maxBytesPerTrigger`` caps the bytes of one micro-batch,
  cut on a record boundary (at least one record per segment, so one record
  larger than the cap is read whole);
- writing: ``segment`` (the target: the driver creates it before any task
  runs if it is missing, and refuses a sealed one), ``append_bytes`` (bytes
  per append, 4 MiB, below the server's ``max_append_bytes``); streaming writes:
  ``sinkId`` names the sink's committed-batch attributes (default: the
  ``checkpointLocation`` option, else the target's name);
  ``fail_first_attempt_after_rows`` is fault injection for tests.

A cluster (docs/cluster.md): the endpoint may be any node. Planning asks it
for each segment's info and partitions; a node that does not serve the
segment forwards and names the one that does (``Segment-Owner``, its URL from
``GET /v1/cluster``), and each input partition then reads straight from that
node. A partition whose node refuses (the container moved) or is gone goes
back to the endpoint, which forwards and names the new node, and reads on
from there (``SegmentClient``'s routes).

Streaming offsets are ``{"segment name": next offset}``. Writes go through
transactions (``client.spark_sink``); overwrite is refused: segments only grow.

Streams: the option ``stream`` (``scope/stream``) instead of ``segments`` or
``segment`` reads a stream between stream cuts and writes to it through
stream transactions (``client.spark_stream``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from client import spark_sink, spark_stream
from client.driver_client import DriverClient
from client.errors import SegmentExists
from client.results import SegmentInfo
from client.segment_client import SegmentClient
from client.spark_ranges import (
    DEFAULT_READ_BYTES,
    FRAMINGS,
    HEADER_BYTES,
    ByteRange,
    read_range,
    split_frames,
)

SCHEMA = "segment string, offset bigint, value binary"
DEFAULT_TARGET_BYTES = 64 * 1024 * 1024


class SegstoreOptions:
    """The options of one read or write, parsed and checked once (see the module doc)."""

    def __init__(self, options: Any):
        self.raw = {str(k).lower(): str(v) for k, v in dict(options).items()}
        if not self.get("endpoint"):
            raise ValueError("segstore: the 'endpoint' option is required")
        self.endpoint = self.raw["endpoint"]
        self.token = self.get("token")
        self.framing = self.raw.get("framing", "length_prefixed")
        if self.framing not in FRAMINGS:
            raise ValueError(f"segstore: framing must be one of {', '.join(FRAMINGS)}, not {self.framing!r}")
        self.target_bytes = self._positive("target_bytes", DEFAULT_TARGET_BYTES)
        self.read_bytes = self._positive("read_bytes", DEFAULT_READ_BYTES)
        self.append_bytes = self._positive("append_bytes", spark_sink.DEFAULT_APPEND_BYTES)
        self.max_bytes_per_trigger = self._positive_or_none("maxbytespertrigger")
        failing = self.get("fail_first_attempt_after_rows")
        self.fail_first_attempt_after_rows = int(failing) if failing else None
        if self.get("stream") and (self.get("segments") or self.get("segment")):
            raise ValueError("segstore: give either 'stream' or 'segments' / 'segment', not both")
        self.stream = spark_stream.StreamOptions(self.raw) if self.get("stream") else None

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.raw.get(key.lower(), default)

    def _positive(self, key: str, default: int) -> int:
        value = self._positive_or_none(key)
        return default if value is None else value

    def _positive_or_none(self, key: str) -> int | None:
        text = self.get(key)
        if text is None:
            return None
        value = int(text)
        if value < 1:
            raise ValueError(f"segstore: option {key} must be at least 1, not {value}")
        return value

    def client(self) -> SegmentClient:
        return SegmentClient(self.endpoint, token=self.token)

    @property
    def target(self) -> str:
        segment = self.get("segment")
        if not segment:
            raise ValueError("segstore: writing needs the 'segment' option (the target segment)")
        return segment

    def segment_items(self) -> list[str]:
        text = self.get("segments") or self.get("path")
        if not text:
            raise ValueError("segstore: reading needs the 'segments' option (names, or a prefix ending in /)")
        return [item.strip() for item in text.split(",") if item.strip()]

    def segments(self, client: SegmentClient) -> dict[str, SegmentInfo]:
        """The segments to read, by name: named ones, and those listed under each prefix."""
        found: dict[str, SegmentInfo] = {}
        for item in self.segment_items():
            if item.endswith("/"):
                found.update((info.name, info) for info in client.list(item))
            else:
                found[item] = client.info(item)
        return dict(sorted(found.items()))


class SegstoreDataSource(DataSource):
    """segstore segments as rows ``(segment, offset, value)``; see the module doc."""

    @classmethod
    def name(cls) -> str:
        return "segstore"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = SegstoreOptions(self.options)
        if options.stream is not None:
            return spark_stream.StreamBatchReader(options.stream)
        return SegstoreReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        _check_writable(schema, overwrite)
        options = SegstoreOptions(self.options)
        if options.stream is not None:
            return spark_stream.StreamWriter(options.stream)
        _prepare_target(options)
        return SegstoreWriter(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = SegstoreOptions(self.options)
        if options.stream is not None:
            return spark_stream.StreamMicroBatchReader(options.stream)
        return SegstoreStreamReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        _check_writable(schema, overwrite)
        options = SegstoreOptions(self.options)
        if options.stream is not None:
            return spark_stream.StreamStreamWriter(options.stream)
        _prepare_target(options)
        return SegstoreStreamWriter(options)


def _check_writable(schema: StructType, overwrite: bool) -> None:
    if overwrite:
        raise ValueError("segstore: segments are append-only; write with mode('append')")
    if "value" not in schema.fieldNames():
        raise ValueError("segstore: the data frame written needs a 'value' column (binary or string)")


def _prepare_target(options: SegstoreOptions) -> None:
    """Create a missing target segment, or refuse a sealed one, on the driver before any task runs.

    Every write task opens a transaction of the target: left to them, a
    missing or sealed target failed each task (and its retries) on its own.
    """
    with options.client() as client:
        try:
            client.create(options.target)
        except SegmentExists:
            if client.info(options.target).sealed:
                raise ValueError(
                    f"segstore: the target segment {options.target!r} is sealed and takes no more rows"
                ) from None


class RangePartition(InputPartition):
    """One Spark task's byte range, and the URL of the node that served its segment when planned."""

    def __init__(self, byte_range: ByteRange, node: str | None = None):
        super().__init__(byte_range)
        self.byte_range = byte_range
        self.node = node


def _planned(client: SegmentClient, byte_range: ByteRange) -> RangePartition:
    """A partition read from the node the planning requests of its segment were served by."""
    return RangePartition(byte_range, client.route(byte_range.segment))


def _read(options: SegstoreOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, RangePartition)
    with options.client() as client:
        if partition.node is not None:
            client.use_route(partition.byte_range.segment, partition.node)
        yield from read_range(client, partition.byte_range, options.framing, options.read_bytes)


# ------------------------------------------------------------------------- batch read
class SegstoreReader(DataSourceReader):
    """Batch read: one partition per range of the server's ``:partitions`` of each segment."""

    def __init__(self, options: SegstoreOptions):
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        found: list[InputPartition] = []
        with self.options.client() as client:
            for name in self.options.segments(client):
                ranges = client.partitions(name, self.options.target_bytes)
                limit = ranges[-1][1] if ranges else 0
                for index, (start, end) in enumerate(ranges):
                    found.append(_planned(client, ByteRange(name, start, end, first=index == 0, limit=limit)))
        return found

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


# ------------------------------------------------------------------------- stream read
class SegstoreStreamReader(DriverClient, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over ``{segment: offset}`` offsets; see the module doc."""

    options: SegstoreOptions

    def __init__(self, options: SegstoreOptions):
        self.options = options
        self._available_now: dict[str, int] | None = None

    def initialOffset(self) -> dict:
        infos = self.options.segments(self.client)
        starting = (self.options.get("startingOffsets") or "earliest").strip()
        if starting == "earliest":
            return {name: info.start_offset for name, info in infos.items()}
        if starting == "latest":
            return {name: info.length for name, info in infos.items()}
        given = json.loads(starting)
        if not isinstance(given, dict) or not all(isinstance(v, int) for v in given.values()):
            raise ValueError("segstore: startingOffsets is earliest, latest or JSON {segment: offset}")
        return {name: int(given.get(name, info.start_offset)) for name, info in infos.items()} | given

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_bytes_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.options.max_bytes_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {name: info.length for name, info in self.options.segments(self.client).items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        infos = self.options.segments(self.client)
        end = dict(start)
        pending: dict[str, tuple[int, int]] = {}
        for name, info in infos.items():
            begin = int(start.get(name, info.start_offset))
            last = info.length
            if self._available_now is not None:
                last = min(last, self._available_now.get(name, begin))
            end[name] = begin
            if last > begin:
                pending[name] = (begin, last)
        budget = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        for name, (begin, last) in pending.items():
            share = None if budget is None else max(1, budget // len(pending))
            end[name] = last if share is None or last - begin <= share else self._cut(name, begin, share)
        return end

    def _cut(self, name: str, begin: int, share: int) -> int:
        """An offset in ``(begin, begin + share]`` on a record boundary, or the end of the first record."""
        if self.options.framing != "length_prefixed":
            return begin + share  # lines and raw ranges may end at any byte (client.spark_ranges)
        if share > self.options.read_bytes:
            bounds = [
                a for a, _ in self.client.partitions(name, max(1, share // 4)) if begin < a <= begin + share
            ]
            if bounds:
                return bounds[-1]
        data = self.client.read(name, begin, min(share, self.options.read_bytes)).data
        _, _, used = split_frames(data, begin)
        if used:
            return begin + used
        header = (
            data[:HEADER_BYTES]
            if len(data) >= HEADER_BYTES
            else self.client.read(name, begin, HEADER_BYTES).data
        )
        return begin + HEADER_BYTES + int.from_bytes(header, "big")

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        found: list[InputPartition] = []
        for name, stop in sorted(end.items()):
            if name in start and stop <= start[name]:
                continue
            info = self.client.info(name)
            begin = int(start[name]) if name in start else info.start_offset
            bounds = [
                a for a, _ in self.client.partitions(name, self.options.target_bytes) if begin < a < stop
            ]
            edges = [begin, *bounds, stop]
            for a, b in itertools.pairwise(edges):
                byte_range = ByteRange(name, a, b, first=a == info.start_offset, limit=info.length)
                found.append(_planned(self.client, byte_range))
        return found

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: segstore keeps no reader state."""


# ------------------------------------------------------------------------------ writes
def _task() -> spark_sink.TaskContextInfo:
    context = TaskContext.get()
    if context is None:
        return spark_sink.TaskContextInfo(0, 0)
    return spark_sink.TaskContextInfo(context.partitionId(), context.attemptNumber())


class TransactionMessage(WriterCommitMessage):
    """A task's commit message: its transaction (``None``: the task had no rows)."""

    def __init__(self, transaction: spark_sink.TaskTransaction | None):
        self.transaction = transaction


def _write(options: SegstoreOptions, batches: Iterator[pa.RecordBatch]) -> TransactionMessage:
    with options.client() as client:
        transaction = spark_sink.write_task(
            client,
            options.target,
            batches,
            _task(),
            append_bytes=options.append_bytes,
            fail_first_attempt_after_rows=options.fail_first_attempt_after_rows,
        )
    return TransactionMessage(transaction)


def _transactions(messages: Sequence[WriterCommitMessage | None]) -> list[spark_sink.TaskTransaction]:
    return spark_sink.task_transactions(m.transaction for m in messages if isinstance(m, TransactionMessage))


class SegstoreWriter(DataSourceArrowWriter):
    """Batch write: each task into its own transaction; the driver commits the successful ones."""

    def __init__(self, options: SegstoreOptions):
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.client() as client:
            spark_sink.commit_all(client, self.options.target, _transactions(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.client() as client:
            spark_sink.abort_all(client, self.options.target, _transactions(messages))


class SegstoreStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: each micro-batch committed once (``client.spark_sink``)."""

    def __init__(self, options: SegstoreOptions):
        self.options = options
        self.sink_id = options.get("sinkId") or options.get("checkpointLocation") or options.target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with self.options.client() as client:
            spark_sink.commit_batch(
                client, self.options.target, self.sink_id, batchId, _transactions(messages)
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with self.options.client() as client:
            spark_sink.abort_all(client, self.options.target, _transactions(messages))
