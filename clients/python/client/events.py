"""Framed events over segments: ``EventWriter`` batches them in, ``EventReader`` decodes them out.

Byte layout (docs/api.md "Appends"): each event is a 4-byte big-endian length, then
that many payload bytes. segstore stores bytes only; the framing is ours.

``EventWriter`` numbers events 1, 2, 3, ... per writer id (continuing after
the last number the server stored for that id). Each batch is one append
carrying ``Writer-Id``, ``Event-Number`` (the number of the batch's last
event) and ``Event-Count``, so a batch resent after a lost answer is dropped
by the server as a duplicate. One background thread sends batches one at a
time, in order; while a batch is in flight, ``write`` keeps filling the next.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from client.segment_client import SegmentClient

MiB = 1024 * 1024
HEADER_BYTES = 4
DEFAULT_MAX_BATCH_BYTES = MiB
DEFAULT_LINGER_S = 0.005


def frame(payload: bytes) -> bytes:
    """One event as stored: length prefix, then the payload."""
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


class EventWriter:
    """Appends framed events to one segment in batches bounded by size and linger time."""

    def __init__(
        self,
        client: SegmentClient,
        segment: str,
        *,
        writer_id: uuid.UUID | str | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger_s: float = DEFAULT_LINGER_S,
    ):
        assert max_batch_bytes > 0 and linger_s >= 0
        self.client = client
        self.segment = segment
        self.writer_id = uuid.UUID(str(writer_id)) if writer_id is not None else uuid.uuid4()
        self.max_batch_bytes = max_batch_bytes
        self.max_pending_bytes = 4 * max_batch_bytes
        self.linger_s = linger_s
        stored = client.writer_event_number(segment, self.writer_id)
        # Event numbers: _written >= _taken (handed to the sender) >= _acked (stored).
        self._written = self._taken = self._acked = stored or 0
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._first_pending_at = 0.0
        self._flushers = 0
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"EventWriter:{segment}", daemon=True)
        self._thread.start()

    @property
    def last_event_number(self) -> int:
        """The number of the last event given to ``write``."""
        return self._written

    def write(self, payload: bytes) -> int:
        """Queue one event; returns its event number. Blocks while too many bytes wait to be sent."""
        framed = frame(payload)
        with self._cond:
            while self._pending_bytes >= self.max_pending_bytes and self._error is None and not self._closed:
                self._cond.wait()
            self._raise_if_unusable()
            if not self._pending:
                self._first_pending_at = time.monotonic()
            self._pending.append(framed)
            self._pending_bytes += len(framed)
            self._written += 1
            self._cond.notify_all()
            return self._written

    def flush(self) -> None:
        """Send what is queued now and block until all of it is acknowledged; raise the first error."""
        with self._cond:
            target = self._written
            self._flushers += 1
            self._cond.notify_all()
            try:
                while self._acked < target and self._error is None:
                    self._cond.wait()
            finally:
                self._flushers -= 1
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Send everything queued, stop the sender thread, and raise the first error if any."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("write on a closed EventWriter")

    def _send(self, data: bytes, last_event_number: int, event_count: int) -> None:
        """One batch as one deduplicated append."""
        self.client.append(
            self.segment,
            data,
            writer_id=self.writer_id,
            event_number=last_event_number,
            event_count=event_count,
        )

    def _batch_due(self) -> bool:
        return (
            self._pending_bytes >= self.max_batch_bytes
            or self._flushers > 0
            or self._closed
            or time.monotonic() >= self._first_pending_at + self.linger_s
        )

    def _next_batch(self) -> tuple[list[bytes], int] | None:
        """Wait for a due batch and take it off the queue; ``None`` when closed and drained, or failed."""
        with self._cond:
            while True:
                if self._error is not None:
                    return None
                if self._pending and self._batch_due():
                    break
                if not self._pending and self._closed:
                    return None
                timeout = self._first_pending_at + self.linger_s - time.monotonic() if self._pending else None
                self._cond.wait(timeout)
            batch = [self._pending.popleft()]
            size = len(batch[0])
            while self._pending and size + len(self._pending[0]) <= self.max_batch_bytes:
                size += len(self._pending[0])
                batch.append(self._pending.popleft())
            self._pending_bytes -= size
            self._taken += len(batch)
            self._cond.notify_all()
            return batch, self._taken

    def _run(self) -> None:
        while (taken := self._next_batch()) is not None:
            batch, last = taken
            try:
                self._send(b"".join(batch), last, len(batch))
            except BaseException as err:
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            with self._cond:
                self._acked = last
                self._cond.notify_all()


@dataclass(frozen=True)
class Event:
    """One decoded event: where its frame starts in the segment, and its payload."""

    offset: int
    payload: bytes


class EventReader:
    """Iterates the framed events of a segment from ``offset`` (default: the start offset).

    Without ``follow`` it stops at the current end. With ``follow`` it reads
    up to the end with plain reads (``read_bytes`` each), then follows the
    tail on one live stream (``SegmentClient.follow``), and stops once the
    segment is sealed and fully read.
    """

    def __init__(
        self,
        client: SegmentClient,
        segment: str,
        *,
        offset: int | None = None,
        follow: bool = False,
        read_bytes: int | None = None,
    ):
        self.client = client
        self.segment = segment
        self.offset = offset
        self.follow = follow
        self.read_bytes = read_bytes

    def _pieces(self, sealed: list[bool]) -> Iterator[tuple[int, bytes]]:
        """``(offset, bytes)`` in order from ``self.offset``: reads to the end, then the live stream.

        Appends ``True`` to ``sealed`` when it stops at the end of a sealed segment.
        """
        next_offset = self.offset
        while True:
            result = self.client.read(self.segment, next_offset, self.read_bytes)
            next_offset = result.next_offset
            if result.data:
                yield next_offset - len(result.data), result.data
            elif result.at_sealed_end or not self.follow:
                sealed.append(result.at_sealed_end)
                return
            else:
                break
        for live in self.client.follow(self.segment, next_offset):
            yield live.next_offset - len(live.data), live.data
        sealed.append(True)  # a live stream ends only at the end of a sealed segment

    def __iter__(self) -> Iterator[Event]:
        buffer = bytearray()
        buffer_offset: int | None = None
        sealed: list[bool] = []
        for offset, data in self._pieces(sealed):
            if buffer_offset is None:
                buffer_offset = offset
            assert offset == buffer_offset + len(buffer), (offset, buffer_offset, len(buffer))
            buffer += data
            position = 0
            while len(buffer) - position >= HEADER_BYTES:
                size = int.from_bytes(buffer[position : position + HEADER_BYTES], "big")
                end = position + HEADER_BYTES + size
                if end > len(buffer):
                    break
                yield Event(buffer_offset + position, bytes(buffer[position + HEADER_BYTES : end]))
                position = end
            del buffer[:position]
            buffer_offset += position
        if buffer and sealed[0]:
            raise ValueError(
                f"{self.segment}: {len(buffer)} bytes at offset {buffer_offset} end the sealed "
                "segment without completing an event frame"
            )
