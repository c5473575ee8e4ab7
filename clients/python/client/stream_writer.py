"""``StreamWriter``: events with routing keys into a stream, exactly once, in order per key (seed 004).

Each ``write`` routes its event by the key's hash (``client/routing.py``) to
the current segment covering it, and queues it, framed (``client/events.py``),
in that segment's lane. A lane sends batches straight to its segment
(a batch goes when it is full, or when its linger time is over and none of
the lane's is in flight, so batches grow under load) with the native API's
headers: ``Writer-Id``
(one per writer), ``Event-Number`` (the batch's last number; numbers grow
across the writer's batches), ``Event-Count`` and ``Previous-Event-Number``
(the number of the lane's batch before it). Up to ``max_in_flight`` batches
per lane are in flight at once, on several connections:

- a batch that overtakes the one before it is refused (412, seed 001's
  conditional append) and sent again once that one is acknowledged, so
  nothing lands out of order and nothing is dropped as a duplicate;
- a batch resent after a lost answer or a broken connection (with the
  same numbers) is dropped by the server as a duplicate if it had landed;
- a sealed segment (409 ``SegmentSealed``: the stream scaled) stops its
  lane; once none of its batches is in flight, the writer's final number
  on the segment says which batches landed; the others' events, and those
  still queued, go in their order to the successors covering their keys
  (``GET .../successors``), in new batches with new numbers. Successors
  accept appends only once all their predecessors are sealed, and each key
  has one lane at a time, so every key's events keep their order.

``flush`` waits until everything written is acknowledged; ``close`` flushes
and stops the senders. The first error that cannot be retried is raised by
the next ``write``, ``flush`` or ``close``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import requests

from client.errors import (
    ConditionalCheckFailed,
    OutcomeUnknown,
    SegmentSealed,
    StreamSealed,
    Throttled,
)
from client.events import DEFAULT_LINGER_S, DEFAULT_MAX_BATCH_BYTES, frame
from client.routing import KeyRange, KeyRanges, key_hash
from client.segment_client import SegmentClient
from client.stream_client import StreamClient, StreamSegment

DEFAULT_MAX_IN_FLIGHT = 4
DEFAULT_SENDERS = 8
# How long a batch is resent after connection errors, throttling or unknown outcomes before the writer fails.
DEFAULT_RESEND_TIMEOUT_S = 60.0
_BACKOFF_S = (0.05, 1.0)
# What a resend may cure: the server did not answer (or not whole), pushed back, or may not have
# applied the request.
_TRANSIENT = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    Throttled,
    OutcomeUnknown,
)
# Routing keys whose hash and lane a writer remembers.
_ROUTES_KEPT = 65536
QUEUED, SENDING, WAITING, SEALED, DONE = "queued", "sending", "waiting", "sealed", "done"


@dataclass(slots=True)
class _Batch:
    frames: list[bytes]
    points: list[float]  # each event's key hash (to route it again after a seal)
    first: int
    last: int
    previous: int | None  # the last number of the lane's batch before it (None: the lane's first)
    state: str = SENDING
    not_before: float = 0.0
    started: float = field(default_factory=time.monotonic)
    tries: int = 0


@dataclass(slots=True)
class _Lane:
    """One segment's queue and batches in flight."""

    segment: StreamSegment
    frames: list[bytes] = field(default_factory=list)  # queued, not yet in a batch
    points: list[float] = field(default_factory=list)  # their keys' hashes
    pending_bytes: int = 0
    first_pending_at: float = 0.0
    batches: deque[_Batch] = field(default_factory=deque)
    chain: int | None = None  # the last number of the newest batch formed
    acked: int | None = None  # the writer's last number the segment acknowledged
    sealed: bool = False
    sealed_at: float = 0.0
    following: bool = False

    def unacked_batches(self) -> int:
        return sum(1 for b in self.batches if b.state != DONE)


class StreamWriter:
    """Writes events to ``scope``/``stream`` through ``client``; thread-safe ``write``."""

    def __init__(
        self,
        client: SegmentClient,
        scope: str,
        stream: str,
        *,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger_s: float = DEFAULT_LINGER_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        senders: int = DEFAULT_SENDERS,
        resend_timeout_s: float = DEFAULT_RESEND_TIMEOUT_S,
    ):
        assert max_batch_bytes > 0 and linger_s >= 0 and max_in_flight >= 1 and senders >= 1
        self.client = client
        self.streams = StreamClient(client)
        self.scope, self.stream = scope, stream
        self.writer_id = uuid.uuid4()
        self.max_batch_bytes = max_batch_bytes
        self.max_pending_bytes = 4 * max_batch_bytes * max(1, max_in_flight)
        self.linger_s = linger_s
        self.max_in_flight = max_in_flight
        self.resend_timeout_s = resend_timeout_s
        _, segments = self.streams.segments(scope, stream)
        self._lanes = {s.id: _Lane(s) for s in segments}
        self._ranges = KeyRanges(KeyRange(s.key_lo, s.key_hi, s.id) for s in segments)
        self._number = 0
        self._unacked = 0
        self._pending_bytes = 0
        self._flushers = 0
        self._closed = False
        self._error: BaseException | None = None
        # One lock; senders wait for work on one condition, writers and flushers for room and
        # acknowledgements on the other, so each wake-up reaches only those it concerns.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self._routes: dict[str, tuple[float, _Lane]] = {}
        self._threads = [
            threading.Thread(target=self._run, name=f"StreamWriter:{scope}/{stream}:{i}", daemon=True)
            for i in range(senders)
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ public
    def write(self, payload: bytes, routing_key: str | None = None) -> None:
        """Queue one event (a random key when none); blocks while too many bytes wait to be sent."""
        data = frame(payload)
        with self._lock:
            while self._pending_bytes >= self.max_pending_bytes and self._error is None and not self._closed:
                self._room.wait()
            self._raise_if_unusable()
            point, lane = self._route(routing_key)
            self._queue(lane, data, point)
            self._unacked += 1
            # A sender needs to hear of a full batch, and of the first event of an idle lane (its
            # linger starts); a lane with a batch in flight is looked at again when that one is answered.
            if lane.pending_bytes >= self.max_batch_bytes or (len(lane.frames) == 1 and not lane.batches):
                self._work.notify()

    def _route(self, key: str | None) -> tuple[float, _Lane]:
        """Under the lock: the key's hash and lane, remembered per key until the routing changes."""
        if key is None:
            point = key_hash(uuid.uuid4().hex)
            return point, self._lanes[self._ranges.find(point).segment]
        found = self._routes.get(key)
        if found is None:
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            point = key_hash(key)
            found = self._routes[key] = (point, self._lanes[self._ranges.find(point).segment])
        return found

    def flush(self) -> None:
        """Send what is queued now and block until all of it is acknowledged; raise the first error."""
        with self._lock:
            self._flushers += 1
            self._work.notify_all()
            try:
                while self._unacked > 0 and self._error is None:
                    self._room.wait()
            finally:
                self._flushers -= 1
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Send everything queued, stop the senders, and raise the first error if any."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
            self._room.notify_all()
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def segments(self) -> list[StreamSegment]:
        """The segments this writer sends to now (it learns successors as segments are sealed)."""
        with self._lock:
            return [lane.segment for lane in self._lanes.values()]

    # ------------------------------------------------------------------ queueing
    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("write on a closed StreamWriter")

    def _queue(self, lane: _Lane, data: bytes, point: float) -> None:
        if not lane.frames:
            lane.first_pending_at = time.monotonic()
        lane.frames.append(data)
        lane.points.append(point)
        lane.pending_bytes += len(data)
        self._pending_bytes += len(data)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._work.notify_all()
        self._room.notify_all()

    def _next_job(self) -> tuple[_Lane, _Batch | None] | None:
        """Under the lock: wait for a batch to send, or a sealed lane to follow (its batch None).

        A sender that takes a job wakes another, which looks for more; one that finds the writer
        done (or failed) wakes them all, to stop.
        """
        job = self._find_job()
        if job is None:
            self._work.notify_all()
        else:
            self._work.notify()
        return job

    def _find_job(self) -> tuple[_Lane, _Batch | None] | None:
        while True:
            if self._error is not None or (self._closed and self._unacked == 0):
                return None
            now = time.monotonic()
            wake: float | None = None
            for lane in list(self._lanes.values()):
                if lane.sealed:
                    if not lane.following and all(b.state != SENDING for b in lane.batches):
                        lane.following = True
                        return lane, None
                    continue
                for batch in lane.batches:
                    if batch.state == QUEUED:
                        if batch.not_before <= now:
                            batch.state = SENDING
                            return lane, batch
                        wake = min(wake or batch.not_before, batch.not_before)
                in_flight = lane.unacked_batches()
                if lane.frames and in_flight < self.max_in_flight:
                    # A full batch goes at once; a partial one when its linger is over and none is in
                    # flight (then the next ones grow while it is), or on a flush.
                    due_at = lane.first_pending_at + self.linger_s
                    urgent = self._flushers > 0 or self._closed or lane.pending_bytes >= self.max_batch_bytes
                    if urgent or (due_at <= now and in_flight == 0):
                        return lane, self._form(lane)
                    if in_flight == 0:
                        wake = min(wake or due_at, due_at)
            self._work.wait(None if wake is None else max(0.0, wake - now))

    def _form(self, lane: _Lane) -> _Batch:
        """Take a batch off the lane's queue (all of it when it fits) and number it."""
        count, size = len(lane.frames), lane.pending_bytes
        if size > self.max_batch_bytes:
            count, size = 1, len(lane.frames[0])
            while count < len(lane.frames) and size + len(lane.frames[count]) <= self.max_batch_bytes:
                size += len(lane.frames[count])
                count += 1
        frames, points = lane.frames[:count], lane.points[:count]
        del lane.frames[:count], lane.points[:count]
        lane.pending_bytes -= size
        if lane.frames:
            lane.first_pending_at = time.monotonic()
        if self._pending_bytes >= self.max_pending_bytes:
            self._room.notify_all()  # writers wait for room
        self._pending_bytes -= size
        batch = _Batch(frames, points, self._number + 1, self._number + count, lane.chain)
        self._number = lane.chain = batch.last
        lane.batches.append(batch)
        return batch

    # ------------------------------------------------------------------ sending
    def _run(self) -> None:
        while True:
            with self._lock:
                job = self._next_job()
            if job is None:
                return
            lane, batch = job
            try:
                if batch is not None:
                    self._send(lane, batch)
                else:
                    self._follow_or_pause(lane)
            except BaseException as err:
                with self._lock:
                    self._fail(err)
                return

    def _send(self, lane: _Lane, batch: _Batch) -> None:
        """One batch as one conditional, deduplicated append; its outcome moves the lane on."""
        data = b"".join(batch.frames)
        try:
            self.client.append(
                lane.segment.name,
                data,
                writer_id=self.writer_id,
                event_number=batch.last,
                event_count=len(batch.frames),
                previous_event_number=batch.previous,
            )
        except ConditionalCheckFailed as refused:
            stored = refused.writer_event_number
            if batch.previous is None or (stored is not None and stored >= batch.previous):
                raise  # only an overtaken batch is refused, and then the stored number is older
            with self._lock:
                batch.state = WAITING
                self._release_waiting(lane)
            return
        except SegmentSealed:
            with self._lock:
                batch.state = SEALED
                if not lane.sealed:
                    lane.sealed, lane.sealed_at = True, time.monotonic()
                self._work.notify()
            return
        except _TRANSIENT:
            with self._lock:
                if time.monotonic() - batch.started > self.resend_timeout_s:
                    raise
                batch.tries += 1
                batch.state = QUEUED
                batch.not_before = time.monotonic() + min(_BACKOFF_S[0] * 2**batch.tries, _BACKOFF_S[1])
                self._work.notify()
            return
        with self._lock:
            self._acknowledged(lane, batch)

    def _acknowledged(self, lane: _Lane, batch: _Batch) -> None:
        batch.state = DONE
        lane.acked = max(lane.acked or 0, batch.last)
        self._unacked -= len(batch.frames)
        while lane.batches and lane.batches[0].state == DONE:
            lane.batches.popleft()
        self._room.notify_all()  # flushers
        self._release_waiting(lane)

    def _release_waiting(self, lane: _Lane) -> None:
        """Batches refused for overtaking go again once the batch before each is acknowledged."""
        for batch in lane.batches:
            ready = lane.acked is not None and batch.previous is not None and lane.acked >= batch.previous
            if batch.state == WAITING and ready:
                batch.state = QUEUED
                batch.not_before = 0.0
        self._work.notify()  # the lane may have a batch to send (again) now

    def _follow_or_pause(self, lane: _Lane) -> None:
        """Follow a sealed lane; if the server cannot say now, let another sender ask again later."""
        try:
            self._follow(lane)
        except _TRANSIENT:
            with self._lock:
                if time.monotonic() - lane.sealed_at > self.resend_timeout_s:
                    raise
                lane.following = False
            time.sleep(_BACKOFF_S[1])

    def _follow(self, lane: _Lane) -> None:
        """A sealed lane: settle what landed, then move the rest to the successors, in order."""
        final = self.client.writer_event_number(lane.segment.name, self.writer_id)
        successors, _ = self.streams.successors(self.scope, self.stream, lane.segment.id)
        with self._lock:
            frames: list[bytes] = []
            points: list[float] = []
            for batch in list(lane.batches):
                if batch.state == DONE:
                    continue
                if final is not None and batch.last <= final:
                    self._acknowledged(lane, batch)  # it landed; its answer was lost, or said sealed
                else:
                    frames.extend(batch.frames)
                    points.extend(batch.points)
            frames.extend(lane.frames)
            points.extend(lane.points)
            self._pending_bytes -= lane.pending_bytes
            lane.batches.clear()
            if not successors:
                detail = f"{lane.segment.name} was sealed with the stream; {len(frames)} events not written"
                self._fail(StreamSealed(409, "StreamSealed", detail))
                return
            for successor in successors:
                self._lanes.setdefault(successor.id, _Lane(successor))
            self._ranges = KeyRanges(_replaced(self._ranges.ranges, lane.segment, successors))
            self._routes.clear()
            del self._lanes[lane.segment.id]
            for data, point in zip(frames, points, strict=True):
                self._queue(self._lanes[self._ranges.find(point).segment], data, point)
            self._work.notify_all()


def _replaced(
    ranges: list[KeyRange], sealed: StreamSegment, successors: list[StreamSegment]
) -> list[KeyRange]:
    """The routing table with ``sealed``'s share of the key space given to its successors."""
    out = []
    for r in ranges:
        if r.segment != sealed.id:
            out.append(r)
            continue
        for s in successors:
            lo, hi = max(r.lo, s.key_lo), min(r.hi, s.key_hi)
            if lo < hi:
                out.append(KeyRange(lo, hi, s.id))
    return out
