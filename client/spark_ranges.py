"""Reading one byte range of a segment as Arrow record batches, in one of three framings.

The Spark source (``client.spark``) plans ranges on the driver and reads each
in a task with these functions. Rows are ``(segment, offset, value)``:

- ``length_prefixed``: each event is a 4-byte big-endian length then the
  payload (API.md, Appends). A range starts on an append boundary and the
  writers append whole frames, so a range holds whole frames: a frame cut
  by the end of a range is a data error. A frame may span two GETs; it is
  joined again here.
- ``lines``: records end with ``\\n``. Ranges may start and end anywhere
  (``segstore put`` cuts a file at any byte), so a line belongs to the range
  where it starts, as Hadoop's line reader does: a range that does not start
  right after a newline skips its first partial line, and the last line is
  read on past the range's end up to ``limit``. A last line without a
  newline at ``limit`` is a record as it is.
- ``raw``: one row per GET, the bytes as they are.

Each GET asks for at most ``read_bytes`` (the server's ``max_read_bytes`` is
8 MiB by default), and each GET's complete records become one batch.
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from client.segment_client import SegmentClient

HEADER_BYTES = 4
FRAMINGS = ("length_prefixed", "lines", "raw")
DEFAULT_READ_BYTES = 8 * 1024 * 1024
# GETs fetched ahead of the one being decoded.
READ_AHEAD = 2
_HEADER = struct.Struct(">I")
SCHEMA = pa.schema([("segment", pa.string()), ("offset", pa.int64()), ("value", pa.binary())])


class FramingError(ValueError):
    """The bytes of a range do not hold whole records of the framing."""


@dataclass(frozen=True)
class ByteRange:
    """``[start, end)`` of a segment to read; ``first``: ``start`` is where the segment's bytes begin.

    ``limit`` bounds how far a ``lines`` range may read past ``end`` to finish
    its last line (the segment's length when the range was planned).
    """

    segment: str
    start: int
    end: int
    first: bool = False
    limit: int | None = None


def to_batch(segment: str, offsets: list[int], values: list[bytes] | pa.Array) -> pa.RecordBatch:
    """The rows ``(segment, offset, value)`` as one record batch."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([segment] * len(offsets), pa.string()),
            pa.array(offsets, pa.int64()),
            values if isinstance(values, pa.Array) else pa.array(values, pa.binary()),
        ],
        schema=SCHEMA,
    )


def split_frames(data: bytes, base: int) -> tuple[list[int], pa.Array, int]:
    """Complete length-prefixed frames at the head of ``data``: their offsets, payloads, bytes used.

    Only the headers are walked in Python. The payloads are cut out by Arrow:
    ``data`` is seen as a binary array alternating header and payload, and
    the payloads are taken from it in one call.
    """
    unpack = _HEADER.unpack_from
    offsets: list[int] = []
    bounds = [0]
    size = len(data)
    position = 0
    while size - position >= HEADER_BYTES:
        end = position + HEADER_BYTES + unpack(data, position)[0]
        if end > size:
            break
        offsets.append(base + position)
        bounds += (position + HEADER_BYTES, end)
        position = end
    count = len(offsets)
    if count == 0:
        return offsets, pa.array([], pa.binary()), 0
    pieces = pa.Array.from_buffers(
        pa.binary(), 2 * count, [None, pa.array(bounds, pa.int32()).buffers()[1], pa.py_buffer(data)]
    )
    values = pieces.take(pa.array(range(1, 2 * count, 2), pa.int32()))
    return offsets, values, position


def split_lines(data: bytes | bytearray, base: int) -> tuple[list[int], list[bytes], int]:
    """Complete ``\\n``-ended lines at the head of ``data``: their offsets, contents, bytes used."""
    offsets: list[int] = []
    values: list[bytes] = []
    position = 0
    while (newline := data.find(b"\n", position)) >= 0:
        offsets.append(base + position)
        values.append(bytes(data[position:newline]))
        position = newline + 1
    return offsets, values, position


def read_range(
    client: SegmentClient, byte_range: ByteRange, framing: str, read_bytes: int = DEFAULT_READ_BYTES
) -> Iterator[pa.RecordBatch]:
    """The records of ``byte_range`` in ``framing`` as record batches (see the module doc)."""
    if framing == "length_prefixed":
        return _read_frames(client, byte_range, read_bytes)
    if framing == "lines":
        return _read_lines(client, byte_range, read_bytes)
    if framing == "raw":
        return _read_raw(client, byte_range, read_bytes)
    raise ValueError(f"framing must be one of {', '.join(FRAMINGS)}, not {framing!r}")


def _chunks(client: SegmentClient, segment: str, start: int, end: int, read_bytes: int) -> Iterator[bytes]:
    """Ranged GETs covering ``[start, end)``, in order, the next ones fetched while one is used.

    The GETs are planned at fixed offsets and run one at a time on a helper
    thread, up to ``READ_AHEAD`` ahead; a short answer is completed in place.
    """

    def fetch(a: int, b: int) -> bytes:
        data = client.read(segment, a, b - a).data
        if not data:
            raise FramingError(f"{segment}: nothing readable at {a}, below the planned end {end}")
        return data

    planned = iter([(a, min(a + read_bytes, end)) for a in range(start, end, read_bytes)])
    with ThreadPoolExecutor(1, thread_name_prefix=f"read-ahead:{segment}") as pool:
        inflight = deque((a, b, pool.submit(fetch, a, b)) for a, b in itertools.islice(planned, READ_AHEAD))
        try:
            while inflight:
                a, b, future = inflight.popleft()
                if (following := next(planned, None)) is not None:
                    inflight.append((*following, pool.submit(fetch, *following)))
                data = future.result()
                yield data
                position = a + len(data)
                while position < b:
                    data = fetch(position, b)
                    yield data
                    position += len(data)
        finally:
            for _, _, future in inflight:
                future.cancel()


def _read_frames(client: SegmentClient, byte_range: ByteRange, read_bytes: int) -> Iterator[pa.RecordBatch]:
    pending = b""
    pending_offset = byte_range.start
    for data in _chunks(client, byte_range.segment, byte_range.start, byte_range.end, read_bytes):
        buffer = pending + data if pending else data
        offsets, values, used = split_frames(buffer, pending_offset)
        if offsets:
            yield to_batch(byte_range.segment, offsets, values)
        pending = buffer[used:]
        pending_offset += used
    if pending:
        raise FramingError(
            f"{byte_range.segment}: the range [{byte_range.start}, {byte_range.end}) ends inside an event "
            f"frame starting at {pending_offset} ({len(pending)} bytes of it); ranges start on append "
            "boundaries and writers append whole frames, so the segment holds a partial frame"
        )


def _read_lines(client: SegmentClient, byte_range: ByteRange, read_bytes: int) -> Iterator[pa.RecordBatch]:
    segment, start, end = byte_range.segment, byte_range.start, byte_range.end
    limit = max(end, byte_range.limit if byte_range.limit is not None else end)
    position = start
    skip_partial = False
    if not byte_range.first and start > 0:
        skip_partial = client.read(segment, start - 1, 1).data != b"\n"
    pending = b""
    pending_offset = start
    while position < limit and (pending_offset < end or pending):
        # Past the range's end, only the rest of its last line is wanted.
        want = read_bytes if position < end else min(read_bytes, 64 * 1024)
        result = client.read(segment, position, min(want, limit - position))
        if not result.data:
            break
        position += len(result.data)
        buffer = pending + result.data if pending else result.data
        base = pending_offset
        if skip_partial:
            newline = buffer.find(b"\n")
            if newline < 0:
                pending, pending_offset = b"", base + len(buffer)
                continue
            buffer, base = buffer[newline + 1 :], base + newline + 1
            skip_partial = False
        offsets, values, used = split_lines(buffer, base)
        keep = _count_below(offsets, end)
        if keep:
            yield to_batch(segment, offsets[:keep], values[:keep])
        if keep < len(offsets):
            return
        pending, pending_offset = buffer[used:], base + used
        if pending_offset >= end:
            return
    if pending and pending_offset < end:
        yield to_batch(segment, [pending_offset], [bytes(pending)])


def _count_below(offsets: list[int], end: int) -> int:
    """How many of the ascending ``offsets`` are below ``end``."""
    count = len(offsets)
    while count and offsets[count - 1] >= end:
        count -= 1
    return count


def _read_raw(client: SegmentClient, byte_range: ByteRange, read_bytes: int) -> Iterator[pa.RecordBatch]:
    position = byte_range.start
    for data in _chunks(client, byte_range.segment, byte_range.start, byte_range.end, read_bytes):
        yield to_batch(byte_range.segment, [position], [data])
        position += len(data)
