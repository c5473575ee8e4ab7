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

The in-memory state holds the streams whose meta segments this store
serves: all of them on a single node, those of its containers on a cluster
node (loaded when it starts serving a container, forgotten when it stops;
requests for the others go to the node serving them). Weak spot, named: a
container's streams are loaded at once, a cost that grows with their number.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any

from app.streams import appends, creation, fork_refs, migration
from app.streams.errors import StreamGone, StreamNotFound
from app.streams.format import FRAME, format_offset, parse_offset, unframe
from app.streams.names import (
    STREAM_DATA_PREFIX,
    STREAM_META_PREFIX,
    stream_meta_of_data_segment,
    stream_meta_segment,
    stream_of_meta_segment,
)
from app.streams.producers import SEQ_GENERATION_KEY, AppendOutcome, Producer
from app.streams.reaper import Reaper
from app.streams.records import Stream, StreamInfo, StreamRead, encode_record, replay
from engine import (
    ContainerNotReady,
    ReadResult,
    SegmentNotFound,
    SegmentStore,
)

log = logging.getLogger(__name__)


class StreamStore:
    """Every Durable Stream of one ``SegmentStore``. Thread-safe (and gevent-cooperative)."""

    def __init__(self, store: SegmentStore, *, reap_interval_s: float = 1.0) -> None:
        self.store = store
        self.streams: dict[str, Stream] = {}
        self.lock = threading.RLock()
        self._loaded: dict[int, int] = {}  # the containers whose streams are in memory, and their hosting
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
        if self.store.node is not None:  # soft-deleted streams whose last fork went meanwhile
            with self.lock:
                for stream in [s for s in self.streams.values() if s.soft_deleted]:
                    if self.streams.get(stream.name) is stream:
                        fork_refs.remove(self, stream)
        return [s.name for s in expired]

    def ensure_loaded(self) -> None:
        """Hold the streams of every container served here, and only those, in memory.

        A single node reads every meta segment once; a cluster node reads a
        container's when it starts serving it and forgets them when it stops
        (``SegmentStore.served_containers``). Half-created or half-deleted
        leftovers found on the way are dropped. Streams of a data folder
        from before reserved names move to them first (``migration``).
        """
        if self._loaded and self.store.node is None:
            return
        if self._wanted() == self._loaded:
            return
        with self.lock:
            wanted = self._wanted()
            if wanted == self._loaded:
                return
            migration.migrate(self.store)
            new = sorted(c for c, hosting in wanted.items() if self._loaded.get(c) != hosting)
            kept = {c: hosting for c, hosting in self._loaded.items() if wanted.get(c) == hosting}
            streams = {n: s for n, s in self.streams.items() if self._container_of(n) in kept}
            for segment in self._scan(new, STREAM_META_PREFIX):
                name = stream_of_meta_segment(segment)
                stream = self._load(name, segment)
                if stream is None:
                    with contextlib.suppress(SegmentNotFound):
                        self.store.delete(segment)
                else:
                    streams[name] = stream
            for stream in streams.values():
                stream.forks = 0
            for stream in streams.values():
                source = streams.get(stream.config.forked_from or "")
                if source is not None:
                    source.forks += 1
            loaded = kept | {c: wanted[c] for c in new}
            live = {s.config.data_segment for s in streams.values() if not s.soft_deleted}
            for segment in self._scan(new, STREAM_DATA_PREFIX):
                # A data segment whose stream's meta lives on another node is that node's to judge.
                meta_here = self.store.container_of(stream_meta_of_data_segment(segment)) in loaded
                if segment not in live and meta_here:
                    with contextlib.suppress(SegmentNotFound):
                        self.store.delete(segment)
            self.streams = streams
            self._loaded = loaded
            log.info("streams: %d loaded from containers %s", len(streams), new)

    def _wanted(self) -> dict[int, int]:
        """The containers whose streams belong in memory: all of a single node, a cluster node's served."""
        if self.store.node is None:
            return dict.fromkeys(range(self.store.settings.container_count), 0)
        return self.store.served_containers()

    def _scan(self, containers: list[int], prefix: str) -> list[str]:
        """The names under ``prefix`` in ``containers`` (served here)."""
        found: list[str] = []
        for container in containers:
            after = None
            while True:
                page = self.store.list_served([container], prefix, after=after, limit=1000)
                found.extend(i.name for i in page)
                if len(page) < 1000:
                    break
                after = page[-1].name
        return found

    def _container_of(self, name: str) -> int:
        return self.store.container_of(stream_meta_segment(name))

    def _here(self, name: str) -> None:
        """ContainerNotReady unless stream ``name``'s meta segment is served (and loaded) here."""
        if self._container_of(name) not in self._loaded:
            owner = self.store.owner_of(stream_meta_segment(name))
            where = f"node {owner[0]}" if owner is not None else "no node now"
            raise ContainerNotReady(f"stream {name!r} is served by {where}")

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

    def read_all(self, segment: str, *, anywhere: bool = False) -> list[bytes]:
        """Every frame of ``segment`` (``anywhere``: on another node too)."""
        frames: list[bytes] = []
        offset = 0
        while True:
            got, offset, _ = self.read_frames(segment, offset, None, anywhere=anywhere)
            if not got:
                return frames
            frames.extend(got)

    # -------------------------------------------------------------- helpers
    def find(self, name: str) -> Stream | None:
        """The stream (soft-deleted ones too), expiring it first if its time is up.

        ContainerNotReady when another node serves it.
        """
        self.ensure_loaded()
        stream = self.streams.get(name)  # no lock: a create or delete in flight does not hold up others
        if stream is None:
            self._here(name)
        if stream is not None and stream.soft_deleted and self.store.node is not None:
            with self.lock:  # its last fork may have gone meanwhile, through another member
                if self.streams.get(name) is stream:
                    fork_refs.remove(self, stream)
                return self.streams.get(name)
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

    def tail(self, stream: Stream, *, anywhere: bool = False) -> tuple[int, bool]:
        """(tail position, closed) of the stream (``anywhere``: its data on another node too)."""
        info = self.store.info(stream.config.data_segment, anywhere=anywhere)
        return info.length, info.sealed

    def fork_source(self, name: str) -> Stream | None:
        """Stream ``name`` as a fork's source: here, or (cluster) read from the node serving it.

        One served elsewhere is replayed from its meta segment read through
        that node; it is not kept (the fork registers with it: ``fork_refs``).
        """
        with contextlib.suppress(ContainerNotReady):
            return self.find(name)
        if self.store.node is None:
            raise ContainerNotReady(f"stream {name!r} is not served now")
        meta = stream_meta_segment(name)
        try:
            records = [json.loads(p) for p in self.read_all(meta, anywhere=True)]
        except SegmentNotFound:
            return None
        replayed = replay(name, records)
        return None if replayed is None else replayed[0]

    def remove(self, stream: Stream) -> None:
        """Delete the stream (soft-delete while forks need it); a last fork takes its soft-deleted source.

        Caller holds ``self.lock``. A cluster node counts forks in the source's meta segment
        (``fork_refs``), since a fork may live on another member.
        """
        if self.store.node is not None:
            fork_refs.remove(self, stream)
            return
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
        self, segment: str, offset: int, limit: int | None, wait_s: float = 0.0, *, anywhere: bool = False
    ) -> tuple[list[bytes], int, ReadResult]:
        """Whole frames of ``segment`` from ``offset`` (at most about ``limit`` bytes).

        Returns (payloads, next offset, read result). A frame larger than one
        read is assembled from several. ``anywhere``: a segment another node
        serves is read through it (no wait).
        """
        result = self.store.read(segment, offset, limit, wait_s=wait_s, anywhere=anywhere)
        data = result.data
        frames, used = unframe(data)
        if not frames and len(data) >= FRAME.size:
            (size,) = FRAME.unpack_from(data, 0)
            whole = bytearray(data)
            while len(whole) < FRAME.size + size:
                more = self.store.read(
                    segment, offset + len(whole), FRAME.size + size - len(whole), anywhere=anywhere
                ).data
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
