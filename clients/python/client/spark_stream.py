"""The ``segstore`` format over a stream (option ``stream`` = ``scope/stream``): reads and writes.

``client.spark`` hands reads and writes here when the ``stream`` option is
given. Rows are those of segment reads, ``segment string, offset bigint,
value binary``: one per event, ``segment`` the data segment's native name.

Batch read: between ``start_stream_cut`` (``head``, the default, ``tail``
or a cut as JSON, as ``GET .../cut`` answers) and ``end_stream_cut``
(``tail`` by default). One input partition per lineage group
(``client.stream_cuts``): the ranges of segments that descend from one
another are read by one task, a predecessor's events before its
successors', so every routing key's events come in order within their
partition. Segments that never split from or merged with one another are
read in parallel.

Streaming: offsets are stream cuts (``{"epoch", "positions"}``, JSON in
the checkpoint). ``startingOffsets`` is ``earliest`` (the head, default),
``latest`` (the tail) or a cut. Each micro-batch reads every segment of its
start cut up to its length; a sealed segment read to its end in an earlier
micro-batch is followed by its successors (a merge's once all its
predecessors are), so one input partition per segment range keeps per-key
order, micro-batch after micro-batch. A scale between micro-batches, or a
restart from the checkpoint, resumes at the cut: each event is read once.
``maxBytesPerTrigger`` does not apply to streams: a micro-batch reads all
that is available.

Each range is read from the node that served its segment when planned
(``Segment-Owner``), as segment reads are.

Writing (batch and streaming): ``routing_key_column`` (default
``routing_key``) names the column of routing keys, ``value`` the events;
one stream transaction per write or micro-batch (``client.stream_sink``).
Streaming: ``sinkId`` names the sink's committed-batch record (default: the
``checkpointLocation`` option, else ``scope/stream``);
``transaction_timeout_s`` is the transaction's timeout (the server's
default otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from client import stream_sink
from client.driver_client import DriverClient
from client.segment_client import SegmentClient
from client.spark_ranges import DEFAULT_READ_BYTES, ByteRange, read_range
from client.stream_client import StreamClient, StreamCut
from client.stream_cuts import Lineage, SegmentRange, advance, parse_cut, ranges_between


class StreamOptions:
    """The options of one read or write of a stream, parsed once (see the module doc)."""

    def __init__(self, raw: dict[str, str]):
        self.raw = raw
        self.endpoint = raw["endpoint"]
        self.token = raw.get("token")
        scope, _, stream = raw["stream"].strip().partition("/")
        if not scope or not stream or "/" in stream:
            raise ValueError(f"segstore: the 'stream' option is scope/stream, not {raw['stream']!r}")
        self.scope, self.stream = scope, stream
        self.read_bytes = int(raw.get("read_bytes", DEFAULT_READ_BYTES))
        self.key_column = raw.get("routing_key_column", "routing_key")
        timeout = raw.get("transaction_timeout_s")
        self.transaction_timeout_s = float(timeout) if timeout else None
        self.sink_id = raw.get("sinkid") or raw.get("checkpointlocation") or f"{scope}/{stream}"

    def client(self) -> SegmentClient:
        return SegmentClient(self.endpoint, token=self.token)

    def lineage(self, client: SegmentClient) -> Lineage:
        return Lineage(client, self.scope, self.stream)

    def target(self, client: SegmentClient) -> stream_sink.StreamTarget:
        return stream_sink.StreamTarget(client, self.scope, self.stream)

    def cut(self, client: SegmentClient, text: str) -> StreamCut:
        """``head``, ``tail`` or a JSON cut."""
        if text.strip() in ("head", "tail"):
            return StreamClient(client).cut(self.scope, self.stream, at=text.strip())
        return parse_cut(text)


class StreamPartition(InputPartition):
    """One task's ranges, read in order, each with the node that served its segment when planned."""

    def __init__(self, ranges: list[tuple[ByteRange, str]]):
        super().__init__([r for r, _ in ranges])
        self.ranges = ranges


def _partition(client: SegmentClient, lineage: Lineage, group: Sequence[SegmentRange]) -> StreamPartition:
    found = []
    for piece in group:
        name = lineage.name(piece.segment_id)
        byte_range = ByteRange(name, piece.start, piece.end, limit=piece.end)
        found.append((byte_range, client.route(name)))
    return StreamPartition(found)


def _read(options: StreamOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, StreamPartition)
    with options.client() as client:
        for byte_range, node in partition.ranges:
            client.use_route(byte_range.segment, node)
        for byte_range, _ in partition.ranges:
            yield from read_range(client, byte_range, "length_prefixed", options.read_bytes)


class StreamBatchReader(DataSourceReader):
    """Batch read between two cuts: one partition per lineage group (see the module doc)."""

    def __init__(self, options: StreamOptions):
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        with self.options.client() as client:
            start = self.options.cut(client, self.options.raw.get("start_stream_cut", "head"))
            end = self.options.cut(client, self.options.raw.get("end_stream_cut", "tail"))
            lineage = self.options.lineage(client)
            return [_partition(client, lineage, group) for group in ranges_between(lineage, start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class StreamMicroBatchReader(DriverClient, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between stream cuts (see the module doc)."""

    options: StreamOptions

    def __init__(self, options: StreamOptions):
        self.options = options
        self._available_now: StreamCut | None = None

    def initialOffset(self) -> dict:
        starting = (self.options.raw.get("startingoffsets") or "earliest").strip()
        named = {"earliest": "head", "latest": "tail"}
        return self.options.cut(self.client, named.get(starting, starting)).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.options.cut(self.client, "tail")

    def latestOffset(self, start: dict, limit: Any) -> dict:
        lineage = self.options.lineage(self.client)
        return advance(lineage, StreamCut.from_json(start), self._available_now).to_json()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lineage = self.options.lineage(self.client)
        groups = ranges_between(lineage, StreamCut.from_json(start), StreamCut.from_json(end))
        return [_partition(self.client, lineage, [piece]) for group in groups for piece in group]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: segstore keeps no reader state."""


# ------------------------------------------------------------------------------ writes
class StreamWriteMessage(WriterCommitMessage):
    """A task's commit message: the transaction it wrote into (``None``: nothing written) and its rows."""

    def __init__(self, txid: str | None, rows: int):
        self.txid = txid
        self.rows = rows


def _partition_id() -> int:
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _nonempty(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """``batches`` from the first with rows on, or ``None`` when none has any."""
    for batch in batches:
        if batch.num_rows:
            return itertools.chain([batch], batches)
    return None


def _written(messages: Sequence[WriterCommitMessage | None]) -> list[str]:
    return [m.txid for m in messages if isinstance(m, StreamWriteMessage) and m.txid is not None]


class StreamWriter(DataSourceArrowWriter):
    """Batch write: one transaction, opened when the write is planned, committed by the driver."""

    def __init__(self, options: StreamOptions):
        self.options = options
        with options.client() as client:
            target = options.target(client)
            target.prepare(streaming=False)
            self.txid = target.streams.open_transaction(
                options.scope, options.stream, timeout_s=options.transaction_timeout_s
            )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        writer = stream_sink.writer_id(self.txid, _partition_id())
        with self.options.client() as client:
            target = self.options.target(client)
            rows = stream_sink.write_events(target, self.txid, iterator, self.options.key_column, writer)
        return StreamWriteMessage(self.txid, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.client() as client:
            StreamClient(client).commit(self.options.scope, self.options.stream, self.txid)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.client() as client:
            StreamClient(client).abort(self.options.scope, self.options.stream, self.txid)


class StreamStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: each micro-batch through one transaction, committed once (``client.stream_sink``)."""

    def __init__(self, options: StreamOptions):
        self.options = options
        self.keys = stream_sink.sink_keys(options.sink_id)
        with options.client() as client:
            options.target(client).prepare(streaming=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        context = TaskContext.get()
        batch_text = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        if not batch_text:
            raise RuntimeError("segstore: a streaming write task runs without Spark's micro-batch id")
        batch_id = int(batch_text)
        rows = _nonempty(iterator)
        if rows is None:
            return StreamWriteMessage(None, 0)  # no transaction claimed for a task without rows
        with self.options.client() as client:
            target = self.options.target(client)
            txid = stream_sink.batch_transaction(
                target, self.keys, batch_id, self.options.transaction_timeout_s
            )
            if txid is None:
                return StreamWriteMessage(None, 0)
            writer = stream_sink.writer_id(self.options.sink_id, batch_id, _partition_id())
            count = stream_sink.write_events(target, txid, rows, self.options.key_column, writer)
        return StreamWriteMessage(txid, count)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with self.options.client() as client:
            stream_sink.commit_batch(self.options.target(client), self.keys, batchId, _written(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with self.options.client() as client:
            stream_sink.abort_batch(self.options.target(client), self.keys, batchId)
