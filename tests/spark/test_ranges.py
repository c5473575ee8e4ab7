"""Reading byte ranges in each framing (client.spark_ranges) against a real server, without Spark."""

from __future__ import annotations

import itertools

import pytest

from client.segment_client import SegmentClient
from client.spark_ranges import ByteRange, FramingError, read_range, split_frames


def _rows(client: SegmentClient, byte_range: ByteRange, framing: str, read_bytes: int) -> list[tuple]:
    return [
        (row["segment"], row["offset"], row["value"])
        for batch in read_range(client, byte_range, framing, read_bytes)
        for row in batch.to_pylist()
    ]


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_split_frames_keeps_a_partial_frame_for_later() -> None:
    data = _frame(b"ab") + _frame(b"") + _frame(b"cdef")[:5]
    offsets, values, used = split_frames(data, 100)
    assert (offsets, values.to_pylist(), used) == ([100, 106], [b"ab", b""], 10)
    assert split_frames(data[:3], 0)[2] == 0


def test_frames_spanning_gets_are_joined(client: SegmentClient, scope: str) -> None:
    name = scope + "frames"
    client.create(name)
    payloads = [bytes([i]) * (i * 37 % 300) for i in range(60)]
    client.append(name, b"".join(_frame(p) for p in payloads))
    length = client.info(name).length
    rows = _rows(client, ByteRange(name, 0, length, first=True), "length_prefixed", read_bytes=101)
    assert [value for _, _, value in rows] == payloads
    offsets = list(itertools.accumulate((4 + len(p) for p in payloads[:-1]), initial=0))
    assert [offset for _, offset, _ in rows] == offsets


def test_a_range_ending_inside_a_frame_is_a_data_error(client: SegmentClient, scope: str) -> None:
    name = scope + "cut"
    client.create(name)
    client.append(name, _frame(b"whole") + _frame(b"cut short")[:6])
    with pytest.raises(FramingError, match="inside an event frame starting at 9"):
        _rows(client, ByteRange(name, 0, 15, first=True), "length_prefixed", read_bytes=4)


def test_lines_belong_to_the_range_where_they_start(client: SegmentClient, scope: str) -> None:
    name = scope + "lines"
    client.create(name)
    lines = [b"line %d " % i + b"x" * (i % 17) for i in range(200)]
    text = b"\n".join(lines)  # no newline after the last line
    for piece in range(0, len(text), 333):  # appends cut lines anywhere, as `segstore put` does
        client.append(name, text[piece : piece + 333])
    edges = [0, 1, 50, 51, 700, 1234, 2000, len(text) - 3, len(text)]
    rows = []
    for a, b in itertools.pairwise(edges):
        rows += _rows(client, ByteRange(name, a, b, first=a == 0, limit=len(text)), "lines", read_bytes=64)
    assert [value for _, _, value in rows] == lines
    starts = [0, *(i + 1 for i, byte in enumerate(text) if byte == ord("\n"))]
    assert [offset for _, offset, _ in rows] == starts


def test_raw_rows_are_the_bytes_per_get(client: SegmentClient, scope: str) -> None:
    name = scope + "raw"
    client.create(name)
    client.append(name, bytes(range(256)) * 4)
    rows = _rows(client, ByteRange(name, 10, 1000, first=False), "raw", read_bytes=300)
    assert [offset for _, offset, _ in rows] == [10, 310, 610, 910]
    assert b"".join(value for _, _, value in rows) == (bytes(range(256)) * 4)[10:1000]
