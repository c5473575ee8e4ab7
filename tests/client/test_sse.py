"""The live stream's parser: events cut anywhere by the network come out whole and in order."""

from __future__ import annotations

from collections.abc import Iterator

from client import sse

STREAM = (
    b": keepalive\n\n"
    b"event: data\nid: 3\ndata: YWJj\n\n"
    b"data: first line\r\ndata: second line\r\n\r\n"  # CRLF line ends, the default event type
    b"event: data\ndata: no id\n\n"  # keeps the last id
    b"event: sealed\nid: 9\ndata: {\"length\": 9}\n\n"
    b"event: data\nid: 10\ndata: cut off"  # no blank line: never dispatched
)
EVENTS = [
    ("data", "3", "YWJj"),
    ("message", "3", "first line\nsecond line"),
    ("data", "3", "no id"),
    ("sealed", "9", '{"length": 9}'),
]


def _reads(pieces: list[bytes]) -> Iterator[bytes]:
    yield from pieces
    yield b""


def test_events_are_the_same_however_the_stream_is_cut() -> None:
    for size in (1, 2, 3, 7, 64, len(STREAM)):
        pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
        assert list(sse.events(_reads(pieces).__next__)) == EVENTS, size


def test_an_event_is_given_as_soon_as_its_blank_line_arrives() -> None:
    pieces = iter([b"event: data\nid: 1\ndata: QQ==\n", b"\n", b"data: later\n\n", b""])
    events = sse.events(pieces.__next__)
    assert next(events) == ("data", "1", "QQ==")
    assert next(pieces) == b"data: later\n\n"  # the first event came before this was read
