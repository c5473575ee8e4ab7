"""PrefetchedStream: a stream's first piece fetched in the background, errors and closing handed over."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from engine.reads.read_ahead import PrefetchedStream
from engine.tier2.chunk_storage import ChunkNotFound
from tests.polling import wait_until


class Recorded:
    """A stream of pieces that records who asked for them and whether it was closed."""

    def __init__(self, pieces: list[bytes], *, fail: Exception | None = None) -> None:
        self.pieces = pieces
        self.fail = fail
        self.threads: list[int] = []
        self.closed = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __iter__(self) -> Iterator[bytes]:
        try:
            self.release.wait(5)
            if self.fail is not None:
                raise self.fail
            for piece in self.pieces:
                self.threads.append(threading.get_ident())
                yield piece
        finally:
            self.closed.set()


def test_the_first_piece_is_fetched_at_once_in_another_thread() -> None:
    source = Recorded([b"one", b"two", b"three"])
    stream = PrefetchedStream(("chunk", 0, 11), iter(source))
    wait_until(lambda: len(source.threads) == 1, what="the first piece")
    assert source.threads[0] != threading.get_ident()
    assert list(stream.pieces()) == [b"one", b"two", b"three"]
    assert source.threads[1:] == [threading.get_ident()] * 2  # the rest as the reader asks
    assert stream.key == ("chunk", 0, 11)


def test_an_empty_stream_has_no_pieces() -> None:
    assert list(PrefetchedStream(("chunk", 0, 0), iter(Recorded([]))).pieces()) == []


def test_an_error_opening_the_stream_is_raised_to_its_reader() -> None:
    stream = PrefetchedStream(("chunk", 0, 5), iter(Recorded([], fail=ChunkNotFound("gone"))))
    with pytest.raises(ChunkNotFound, match="gone"):
        list(stream.pieces())


def test_closing_before_the_first_piece_arrives_closes_the_stream_once_it_does() -> None:
    source = Recorded([b"one", b"two"])
    source.release.clear()  # the request is still on its way
    stream = PrefetchedStream(("chunk", 0, 6), iter(source))
    stream.close()
    assert not source.closed.is_set()
    source.release.set()
    assert source.closed.wait(5)
    assert source.threads == [source.threads[0]]  # the second piece was never fetched


def test_closing_a_stream_half_read_closes_it() -> None:
    source = Recorded([b"one", b"two", b"three"])
    stream = PrefetchedStream(("chunk", 0, 11), iter(source))
    pieces = stream.pieces()
    assert next(pieces) == b"one"
    stream.close()
    assert source.closed.is_set()
