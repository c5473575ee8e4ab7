"""Reading one byte range of a segment as Arrow record batches, in one of three framings.

The Spark source (``client.spark``) plans ranges on the driver and reads each
in a task with these functions. Rows are ``(segment, offset, value)``:

- ``length_prefixed``: each event is a 4-byte big-endian length then the
  payload (docs/api.md "Appends"). A range starts on an append boundary and the
  writers append whole frames, so a range holds whole frames: a frame cut
  by the end of a range is a data error. A frame cut by the end of a GET is
  completed from the next GETs and becomes a batch of its own, so the
  bytes of a GET are never joined to the next one.
- ``lines``: records end with ``\\n``. Ranges may start and end anywhere
  (``segstore put`` cuts a file at any byte), so a line belongs to the range
  where it starts, as Hadoop's line reader does: a range that does not start
  right after a newline skips its first partial line, and the last line is
  read on past the range's end up to ``limit``. A last line without a
  newline at ``limit`` is a record as it is.
- ``raw``: one row per GET, the bytes as they are.

Each GET asks for at most ``read_bytes`` (the server's ``max_read_bytes`` is
8 MiB by default), and each GET's complete records become one batch. A read
is bound by CPU (Spark's JVM, its Python workers and the server share the
cores), so the Python side copies the bytes as few times as it can: the
body is read in one call, and the payloads are cut out by Arrow (see
``split_frames``).
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from client.segment_client import SegmentClient

HEADER_BYTES = 4
FRAMINGS = ("length_prefixed", "lines", "raw")
DEFAULT_READ_BYTES = 8 * 1024 * 1024
# GETs fetched ahead of the one being decoded.
READ_AHEAD = 2
# Frames of one size in a row after which the rest of the run is checked by Arrow.
_LONG_RUN = 16
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


def to_batch(segment: str, offsets: list[int] | pa.Array, values: list[bytes] | pa.Array) -> pa.RecordBatch:
    """The rows ``(segment, offset, value)`` as one record batch."""
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(segment, pa.string()), len(offsets)),
            offsets if isinstance(offsets, pa.Array) else pa.array(offsets, pa.int64()),
            values if isinstance(values, pa.Array) else pa.array(values, pa.binary()),
        ],
        schema=SCHEMA,
    )


def split_frames(data: bytes | bytearray, base: int, start: int = 0) -> tuple[pa.Array, pa.Array, int]:
    """Complete length-prefixed frames of ``data`` from ``start``: their offsets, payloads, where they end.

    Offsets are ``base`` plus the frame's position in ``data``. The headers
    are walked in Python until ``_LONG_RUN`` frames in a row have one size
    (events of one size are the common case); the rest of such a run is
    checked by Arrow and its payloads cut out in one strided copy. Walked
    frames are cut out of ``data`` seen as a binary array alternating
    header and payload, in one ``take``.
    """
    buffer = pa.py_buffer(data)
    unpack = _HEADER.unpack_from
    offsets: list[pa.Array] = []
    values: list[pa.Array] = []
    walked: list[int] = []  # walked frames not yet in ``values``: their offsets
    bounds: list[int] = []  # and where their payloads start and end in ``data``

    def flush_walked() -> None:
        if walked:
            offsets.append(pa.array(walked, pa.int64()))
            values.append(_walked_payloads(buffer, walked[0] - base, bounds))
            walked.clear()
            bounds.clear()

    size = len(data)
    position = start
    last = streak = 0
    # Doubled each time a check finds fewer than that many more frames, so that runs only
    # just that long do not cost one check each.
    long_run = _LONG_RUN
    while size - position >= HEADER_BYTES:
        frame = HEADER_BYTES + unpack(data, position)[0]
        if frame > size - position:
            break
        walked.append(base + position)
        bounds += (position + HEADER_BYTES, position + frame)
        position += frame
        streak = streak + 1 if frame == last else 1
        last = frame
        if streak != long_run:
            continue
        count = _run_length(buffer, position, frame, (size - position) // frame, long_run)
        if count < long_run:
            long_run *= 2
            continue
        # The run starts with the walked frames of the streak.
        del walked[-streak:], bounds[-2 * streak :]
        position -= frame * streak
        count += streak
        flush_walked()
        offsets.append(_sequence(base + position, frame, count, pa.int64()))
        values.append(_run_payloads(buffer, position, frame, count))
        position += frame * count
        last = streak = 0
        long_run = _LONG_RUN
    flush_walked()
    if not values:
        return pa.array([], pa.int64()), pa.array([], pa.binary()), start
    if len(values) == 1:
        return offsets[0], values[0], position
    return pa.concat_arrays(offsets), pa.concat_arrays(values), position


def _run_length(buffer: pa.Buffer, position: int, frame: int, fits: int, seen: int) -> int:
    """How many of the ``fits`` frames from ``position`` are ``frame`` bytes long (by their headers).

    ``seen`` frames of that size came just before. The headers are compared
    in steps growing fourfold from that, so a run is never checked much
    beyond its end.
    """
    expected = pa.scalar((frame - HEADER_BYTES).to_bytes(HEADER_BYTES, "big"), pa.binary(HEADER_BYTES))
    count = 0
    while count < fits:
        more = min(fits - count, 4 * (seen + count))
        frames = _fixed_frames(buffer, position + count * frame, frame, more)
        other = pc.index(pc.equal(pc.binary_slice(frames, 0, HEADER_BYTES), expected), False).as_py()
        if other >= 0:
            return count + other
        count += more
    return count


def _fixed_frames(buffer: pa.Buffer, position: int, frame: int, count: int) -> pa.Array:
    """``count`` frames of ``frame`` bytes from ``position``, as a fixed-size binary array (no copy)."""
    return pa.Array.from_buffers(pa.binary(frame), count, [None, buffer.slice(position, frame * count)])


def _run_payloads(buffer: pa.Buffer, position: int, frame: int, count: int) -> pa.Array:
    """The payloads of ``count`` frames of ``frame`` bytes from ``position``, in one strided copy."""
    length = frame - HEADER_BYTES
    payloads = pc.binary_slice(_fixed_frames(buffer, position, frame, count), HEADER_BYTES)
    ends = _sequence(0, length, count + 1, pa.int32())
    return pa.Array.from_buffers(pa.binary(), count, [None, ends.buffers()[1], payloads.buffers()[1]])


def _walked_payloads(buffer: pa.Buffer, first: int, bounds: list[int]) -> pa.Array:
    """The payloads at ``bounds`` (start, end, start, end, ...), the first frame starting at ``first``."""
    count = len(bounds) // 2
    pieces = pa.Array.from_buffers(
        pa.binary(), 2 * count, [None, pa.array([first, *bounds], pa.int32()).buffers()[1], buffer]
    )
    return pieces.take(_sequence(1, 2, count, pa.int32()))


def _sequence(first: int, step: int, count: int, type_: pa.DataType) -> pa.Array:
    """``first, first + step, ...``: ``count`` integers, built by Arrow."""
    return pc.cumulative_sum(pa.repeat(pa.scalar(step, type_), count), start=pa.scalar(first - step, type_))


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
    segment = byte_range.segment
    cut = bytearray()  # the start of a frame that the previous GETs cut
    cut_offset = offset = byte_range.start  # where ``cut`` and the next GET's bytes start
    for data in _chunks(client, segment, byte_range.start, byte_range.end, read_bytes):
        start = 0
        if cut:
            start = _complete_frame(cut, data)
            if start < 0:
                offset += len(data)
                continue
            yield to_batch(segment, [cut_offset], [bytes(memoryview(cut)[HEADER_BYTES:])])
            cut.clear()
        offsets, values, end = split_frames(data, offset, start)
        if len(offsets):
            yield to_batch(segment, offsets, values)
        cut += memoryview(data)[end:]
        cut_offset = offset + end
        offset += len(data)
    if cut:
        raise FramingError(
            f"{segment}: the range [{byte_range.start}, {byte_range.end}) ends inside an event "
            f"frame starting at {cut_offset} ({len(cut)} bytes of it): the default framing is "
            "length_prefixed (a 4-byte big-endian length, then the event, as EventWriter and the "
            'sink write); bytes written otherwise are read with .option("framing", "raw") or '
            '.option("framing", "lines")'
        )


def _complete_frame(cut: bytearray, data: bytes) -> int:
    """Append to ``cut`` the rest of its frame from ``data``: the bytes taken, or -1 if ``data`` ran out.

    Only the cut frame is copied, never the GET's bytes that follow it.
    """
    view = memoryview(data)
    taken = max(0, HEADER_BYTES - len(cut))
    if taken:
        cut += view[:taken]
        if len(cut) < HEADER_BYTES:
            return -1
    rest = HEADER_BYTES + _HEADER.unpack_from(cut)[0] - len(cut)
    cut += view[taken : taken + rest]
    return taken + rest if len(data) >= taken + rest else -1


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
        data = client.read(segment, position, min(want, limit - position)).data
        if not data:
            break
        position += len(data)
        buffer = pending + data if pending else data
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
        # The GET's bytes are the one value's data buffer as they are, not copied.
        ends = pa.array([0, len(data)], pa.int32()).buffers()[1]
        value = pa.Array.from_buffers(pa.binary(), 1, [None, ends, pa.py_buffer(data)])
        yield to_batch(byte_range.segment, [position], value)
        position += len(data)
