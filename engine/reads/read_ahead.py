"""ReadAhead: where a sequential reader is, and where its read-ahead is (seed 000 "Read Index").

The container's read-ahead thread streams a chunk into the cache and keeps at
most ``read_ahead_bytes`` ahead of the reader; the reader, on a cache miss
the read-ahead is about to fill, waits for it instead of reading Tier 2
itself. This object is the one place both sides meet: positions, a
condition, and the waits with their time limits.

While one chunk streams, the next chunk's stream is opened in the background
(``PrefetchedStream``): a Tier 2 request's round trip (milliseconds on S3,
often more than the transfer of a chunk) overlaps the transfer before it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

from engine.tier2.chunk_storage import Pieces

# A read-ahead whose reader has not moved for this long ends (and closes its Tier 2 stream).
_READ_AHEAD_IDLE_S = 10.0
# How long a reader waits for a read-ahead that is about to bring its bytes.
_READ_AHEAD_WAIT_S = 5.0


class ReadAhead:
    """A sequential reader's position and its read-ahead's, shared by the two."""

    def __init__(self, reader: int, pos: int) -> None:
        self.reader = reader  # where the reader has got to
        self.pos = pos  # where the read-ahead has got to
        self.active = True
        self.cond = threading.Condition()

    def reader_at(self, offset: int) -> None:
        with self.cond:
            if offset > self.reader:
                self.reader = offset
                self.cond.notify_all()

    def moved_to(self, offset: int) -> None:
        with self.cond:
            self.pos = offset
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.active = False
            self.cond.notify_all()

    def wait_for_room(self, ahead: int) -> bool:
        """Wait until the read-ahead may go on (the reader came near); False to end it."""
        with self.cond:
            while self.active and self.pos >= self.reader + ahead:
                if not self.cond.wait(_READ_AHEAD_IDLE_S):
                    return False
            return self.active

    def wait_past(self, offset: int, ahead: int) -> bool:
        """A reader missing the cache at ``offset``: True once the read-ahead is past it (maybe already)."""
        self.reader_at(offset)
        deadline = time.monotonic() + _READ_AHEAD_WAIT_S
        with self.cond:
            if offset >= self.pos + ahead:
                return False  # it is not about to bring these bytes
            while self.active and self.pos <= offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)
            return self.pos > offset


class PrefetchedStream:
    """A Tier 2 stream whose first piece is fetched in a thread of its own, from the moment it is made.

    ``key`` names what it streams, so its user can tell whether it is still
    the stream wanted. At most one piece is held before ``pieces`` is read.
    """

    def __init__(self, key: tuple[str, int, int], stream: Pieces) -> None:
        self.key = key
        self._stream = stream
        self._first: Future[bytes | None] = Future()
        threading.Thread(target=self._open, daemon=True).start()

    def _open(self) -> None:
        try:
            self._first.set_result(next(self._stream, None))
        except BaseException as exc:  # handed to the reader of ``pieces``
            self._first.set_exception(exc)

    def pieces(self) -> Iterator[bytes]:
        """The stream's pieces; the first one's errors are raised here."""
        first = self._first.result()
        if first is None:
            return
        yield first
        yield from self._stream

    def close(self) -> None:
        """Close the stream (and its connection): now, or once its first piece is in."""
        self._first.add_done_callback(lambda _: self._stream.close())
