"""Durable Streams over segments: ``StreamStore``, the stream layer behind ``/v1/stream/{name}``.

A stream is two segments, used only through ``SegmentStore``'s public methods:

- its **data segment** (``stream_data_segment``) holds the messages, framed
  (``format``); a stream offset maps to a byte offset of it;
- its **meta segment** (``stream_meta_segment``) is a log of records
  (``records``): the configuration first, then state changes.

The incarnation in the data segment's name makes a stream recreated after a
delete a new segment, so nothing of the old one can show through.

Closing is sealing the data segment. Producers and ``Stream-Seq`` are
attributes of the data segment (``producers``); appends are in ``appends``,
creation and forks in ``creation``, expiry in ``reaper``.

Deleting a source with forks soft-deletes it, as the protocol wants: it
answers 410 and keeps its name taken until its last fork goes. Its data
segment goes at once (the forks hold the chunks they share; the rest is
freed), only its meta segment stays.

Weak spot, named: the in-memory state is loaded from every meta segment at
the first request (a cost that grows with the number of streams).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any

from app.streams import appends, creation, migration
from app.streams.errors import StreamGone, StreamNotFound
from app.streams.format import FRAME, format_offset, parse_offset, unframe
from app.streams.producers import SEQ_GENERATION_KEY, AppendOutcome, Producer
from app.streams.reaper import Reaper
from app.streams.records import Stream, StreamInfo, StreamRead, encode_record, replay
from engine import (
    STREAM_DATA_PREFIX,
    STREAM_META_PREFIX,
    ReadResult,
    SegmentNotFound,
    SegmentStore,
    stream_meta_segment,
    stream_of_meta_segment,
)

log = logging.getLogger(__name__)


class StreamStore:
    """Every Durable Stream of one ``SegmentStore``. Thread-safe (and gevent-cooperative)."""

    def __init__(self, store: SegmentStore, *, reap_interval_s: float = 1.0) -> None:
        self.store = store
        self.streams: dict[str, Stream] = {}
        self.lock = threading.RLock()
        self._loaded = False
        self._reaper = Reaper(self, reap_interval_s)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the expiry reaper (it loads the streams once the store is ready)."""
        self._reaper.start()

    def close(self) -> None:
        self._reaper.stop()

    def reap(self) -> list[str]:
        """Delete (or soft-delete) every expired stream now; returns their names."""
        self.ensure_loaded()
        with self.lock:
            expired = [s for s in self.streams.values() if not s.soft_deleted and s.expired()]
        for stream in expired:
            with self.lock:
                if self.streams.get(stream.name) is stream and not stream.soft_deleted:
                    self.remove(stream)
        return [s.name for s in expired]

    def ensure_loaded(self) -> None:
        """Read every meta segment once; drop half-created or half-deleted leftovers.

        Streams of a data folder from before reserved names move to them first (``migration``).
        """
        if self._loaded:
            return
        with self.lock:
            if self._loaded:
                return
            migration.migrate(self.store)
            streams: dict[str, Stream] = {}
            for segment in (i.name for i in self.store.scan(STREAM_META_PREFIX)):
                name = stream_of_meta_segment(segment)
                stream = self._load(name, segment)
                if stream is None:
                    with contextlib.suppress(SegmentNotFound):
                        self.store.delete(segment)
                else:
                    streams[name] = stream
            for stream in streams.values():
                source = streams.get(stream.config.forked_from or "")
                if source is not None:
                    source.forks += 1
            live = {s.config.data_segment for s in streams.values() if not s.soft_deleted}
            for segment in (i.name for i in self.store.scan(STREAM_DATA_PREFIX)):
                if segment not in live:
                    with contextlib.suppress(SegmentNotFound):
                        self.store.delete(segment)
            self.streams = streams
            self._loaded = True
            log.info("streams: %d loaded", len(streams))

    def _load(self, name: str, segment: str) -> Stream | None:
        replayed = replay(name, [json.loads(p) for p in self.read_all(segment)])
        if replayed is None:
            return None
        stream, seqs = replayed
        if stream.soft_deleted:  # its data segment is gone, or goes with the leftovers at load
            return stream
        try:
            info = self.store.info(stream.config.data_segment)
        except SegmentNotFound:
            return None
        if stream.closed_by is not None and not info.sealed:
            self.store.seal(stream.config.data_segment)  # the crash came between record and seal
        # A seq record whose append never happened has a generation past the attribute's.
        stream.seq_generation = (
            self.store.get_attributes(info.name, [SEQ_GENERATION_KEY])[SEQ_GENERATION_KEY] or 0
        )
        stream.last_seq = seqs.get(stream.seq_generation)
        return stream

    def read_all(self, segment: str) -> list[bytes]:
        """Every frame of ``segment``."""
        frames: list[bytes] = []
        offset = 0
        while True:
            got, offset, _ = self.read_frames(segment, offset, None)
            if not got:
                return frames
            frames.extend(got)

    # -------------------------------------------------------------- helpers
    def find(self, name: str) -> Stream | None:
        """The stream (soft-deleted ones too), expiring it first if its time is up."""
        self.ensure_loaded()
        stream = self.streams.get(name)  # no lock: a create or delete in flight does not hold up others
        if stream is None or stream.soft_deleted or not stream.expired():
            return stream
        with self.lock:
            if self.streams.get(name) is stream and not stream.soft_deleted:
                self.remove(stream)
            return self.streams.get(name)

    def live(self, name: str) -> Stream:
        """The stream, or StreamNotFound (404) / StreamGone (410)."""
        stream = self.find(name)
        if stream is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        if stream.soft_deleted:
            raise StreamGone(f"stream {name!r} was deleted; its forks still read it")
        return stream

    def record(self, stream: Stream, record: dict[str, Any]) -> None:
        """Append a state record to the stream's meta segment."""
        self.store.append(stream_meta_segment(stream.name), encode_record(record))

    def tail(self, stream: Stream) -> tuple[int, bool]:
        """(tail position, closed) of the stream."""
        info = self.store.info(stream.config.data_segment)
        return info.length, info.sealed

    def remove(self, stream: Stream) -> None:
        """Delete the stream (soft-delete while forks need it); a last fork takes its soft-deleted source.

        Caller holds ``self.lock``.
        """
        if stream.forks > 0:
            self.record(stream, {"t": "soft_deleted"})
            stream.soft_deleted = True
            with contextlib.suppress(SegmentNotFound):
                self.store.delete(stream.config.data_segment)
            return
        # The meta segment goes first: without it the stream is gone, and a
        # crash before the data segment's delete leaves only what load collects.
        with contextlib.suppress(SegmentNotFound):
            self.store.delete(stream_meta_segment(stream.name))
        if not stream.soft_deleted:
            with contextlib.suppress(SegmentNotFound):
                self.store.delete(stream.config.data_segment)
        del self.streams[stream.name]
        source = self.streams.get(stream.config.forked_from or "")
        if source is not None:
            source.forks -= 1
            if source.forks == 0 and source.soft_deleted:
                self.remove(source)

    # ------------------------------------------------------------ reading
    def read_frames(
        self, segment: str, offset: int, limit: int | None, wait_s: float = 0.0
    ) -> tuple[list[bytes], int, ReadResult]:
        """Whole frames of ``segment`` from ``offset`` (at most about ``limit`` bytes).

        Returns (payloads, next offset, read result). A frame larger than one
        read is assembled from several.
        """
        result = self.store.read(segment, offset, limit, wait_s=wait_s)
        data = result.data
        frames, used = unframe(data)
        if not frames and len(data) >= FRAME.size:
            (size,) = FRAME.unpack_from(data, 0)
            whole = bytearray(data)
            while len(whole) < FRAME.size + size:
                more = self.store.read(segment, offset + len(whole), FRAME.size + size - len(whole)).data
                if not more:
                    break
                whole += more
            frames, used = unframe(bytes(whole))
        return frames, offset + used, result

    def read(self, name: str, offset: str | None, *, wait_s: float = 0.0) -> StreamRead:
        """Messages from ``offset`` (None: the start; ``"now"``: the tail).

        At the tail of an open stream it waits up to ``wait_s`` for an append
        or the close.
        """
        stream = self.live(name)
        stream.last_access = time.monotonic()
        config = stream.config
        tail, closed = self.tail(stream)
        position = tail if offset == "now" else (0 if offset is None else parse_offset(offset))
        position = min(position, tail)
        timed_out = False
        try:
            wait = 0 if position < tail or closed else wait_s
            frames, position, result = self.read_frames(config.data_segment, position, None, wait)
            if wait:
                closed = result.info.sealed
                tail = result.info.length
                timed_out = not frames and not closed
        except SegmentNotFound:
            raise StreamNotFound(f"stream {name!r} was deleted") from None
        if self.streams.get(name) is not stream:
            raise StreamNotFound(f"stream {name!r} expired or was deleted")
        stream.last_access = time.monotonic()
        at_tail = position >= tail
        return StreamRead(
            tuple(frames),
            format_offset(position),
            at_tail,
            closed and at_tail,
            timed_out,
            config.content_type,
        )

    def info(self, name: str) -> StreamInfo:
        """The stream's state (does not count as an access for TTL)."""
        stream = self.live(name)
        tail, closed = self.tail(stream)
        c = stream.config
        return StreamInfo(name, c.content_type, format_offset(tail), closed, c.ttl_s, c.expires_at)

    def touch(self, name: str) -> None:
        """Count an access (for the TTL window) without reading."""
        self.live(name).last_access = time.monotonic()

    # ------------------------------------------------------------- changes
    def create(
        self,
        name: str,
        *,
        content_type: str | None,
        ttl_s: int | None = None,
        expires_at: str | None = None,
        closed: bool = False,
        body: bytes = b"",
        forked_from: str | None = None,
        fork_offset: str | None = None,
        fork_sub_offset: int = 0,
    ) -> tuple[StreamInfo, bool]:
        """Create the stream, or confirm an identical one. Returns (info, created).

        StreamConflict for another configuration (or a soft-deleted name),
        StreamNotFound for a missing fork source, InvalidArgument for a fork
        offset past the source's tail or a sub-offset past its message.
        """
        return creation.create(
            self,
            name,
            content_type=content_type,
            ttl_s=ttl_s,
            expires_at=expires_at,
            closed=closed,
            body=body,
            forked_from=forked_from,
            fork_offset=fork_offset,
            fork_sub_offset=fork_sub_offset,
        )

    def delete(self, name: str) -> None:
        """Delete the stream; with forks it is soft-deleted (410) until the last fork goes."""
        with self.lock:
            self.remove(self.live(name))

    def append(
        self,
        name: str,
        body: bytes,
        *,
        content_type: str | None,
        seq: str | None = None,
        producer: Producer | None = None,
        close: bool = False,
    ) -> AppendOutcome:
        """Append one message (and close the stream if ``close``); an empty body only closes.

        StreamClosed for a closed stream (unless this is the retry of the
        producer request that closed it), StreamConflict for another content
        type or a ``Stream-Seq`` not above the last one, InvalidArgument for
        bad JSON.
        """
        stream = self.live(name)
        stream.last_access = time.monotonic()
        return appends.append(self, stream, body, content_type, seq, producer, close)
