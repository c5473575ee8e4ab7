"""Reading byte ranges in each framing (client.spark_ranges) against a real server, without Spark."""

from __future__ import annotations

import itertools

import pytest

from client.segment_client import SegmentClient
from client.spark_ranges import ByteRange, FramingError, read_range, split_frames
from tests.spark.conftest import MAX_APPEND_BYTES


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
    assert (offsets.to_pylist(), values.to_pylist(), used) == ([100, 106], [b"ab", b""], 10)
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
    with pytest.raises(FramingError, match="inside an event frame starting at 9") as err:
        _rows(client, ByteRange(name, 0, 15, first=True), "length_prefixed", read_bytes=4)
    assert '.option("framing", "raw")' in str(err.value)  # what to do about bytes written unframed


def _append_frames(client: SegmentClient, name: str, payloads: list[bytes]) -> int:
    """The payloads framed, appended whole frames at a time below the test server's append limit."""
    batch = b""
    for payload in payloads:
        if len(batch) + 4 + len(payload) > MAX_APPEND_BYTES:
            client.append(name, batch)
            batch = b""
        batch += _frame(payload)
    client.append(name, batch)
    return client.info(name).length


@pytest.mark.parametrize("read_bytes", [1002, 1004 * 20 + 2, 64 * 1024])
def test_events_of_one_size_spanning_gets(client: SegmentClient, scope: str, read_bytes: int) -> None:
    """Long runs of one size, cut by each GET: in a header (1002), in a payload, at the server's limit."""
    name = scope + "uniform"
    client.create(name)
    payloads = [b"%06d" % i + b"v" * 994 for i in range(300)]
    payloads[150] = b""
    length = _append_frames(client, name, payloads)
    rows = _rows(client, ByteRange(name, 0, length, first=True), "length_prefixed", read_bytes)
    assert [value for _, _, value in rows] == payloads
    assert [offset for _, offset, _ in rows] == list(
        itertools.accumulate((4 + len(p) for p in payloads[:-1]), initial=0)
    )


def test_a_frame_longer_than_several_gets(client: SegmentClient, scope: str) -> None:
    name = scope + "big"
    client.create(name)
    payloads = [b"", b"a" * 50_000, b"", b"b" * 3, b"c" * 40_000]
    length = _append_frames(client, name, payloads)
    rows = _rows(client, ByteRange(name, 0, length, first=True), "length_prefixed", 7000)
    assert [value for _, _, value in rows] == payloads
    assert [offset for _, offset, _ in rows] == [0, 4, 50_008, 50_012, 50_019]


def test_empty_payloads_across_gets(client: SegmentClient, scope: str) -> None:
    name = scope + "empty"
    client.create(name)
    client.append(name, _frame(b"") * 1000)
    rows = _rows(client, ByteRange(name, 400, 4000, first=False), "length_prefixed", read_bytes=998)
    assert [(offset, value) for _, offset, value in rows] == [(o, b"") for o in range(400, 4000, 4)]


@pytest.mark.parametrize("cut", [2, 4, 700])
def test_a_run_of_events_then_a_frame_cut_by_the_range_end_is_a_data_error(
    client: SegmentClient, scope: str, cut: int
) -> None:
    """The cut frame's first ``cut`` bytes are the range's last: in its header, or in its payload."""
    name = scope + "cut-run"
    client.create(name)
    client.append(name, _frame(b"e" * 96) * 200 + _frame(b"f" * 1000))
    end = 200 * 100 + cut
    with pytest.raises(FramingError, match="inside an event frame starting at 20000"):
        _rows(client, ByteRange(name, 0, end, first=True), "length_prefixed", read_bytes=1500)


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
