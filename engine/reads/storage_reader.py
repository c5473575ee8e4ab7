"""StorageReader: reads evicted bytes back from Tier 2 and prefetches for sequential readers.

Seed 002 names the component ("StorageReader: prefetches the data from
tier-2"); seed 000's read index hands it the cache misses. A miss is fetched
in aligned ``storage_read_block_bytes`` blocks through the segment's layout
(then its pending merges) and cached. A sequential reader gets a read-ahead:
one Tier 2 stream per chunk that fills the cache ``read_ahead_bytes`` ahead
of it, the next chunk's stream opened while the current one streams.
"""

from __future__ import annotations

import logging
import threading
import time

from engine.config import Settings
from engine.errors import DataCorrupted, SegmentNotFound, SegmentTruncated, SegstoreError, Throttled
from engine.metadata.container_metadata import ContainerMetadata
from engine.metrics import EngineMetrics
from engine.reads.read_ahead import PrefetchedStream, ReadAhead
from engine.reads.read_index import ReadIndex
from engine.tier2.chunk_storage import ChunkNotFound, ChunkStorageError
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage, ChunkRef, contiguous_run

log = logging.getLogger(__name__)


class StorageReader:
    """One container's reads of cache misses from Tier 2, and its read-aheads."""

    def __init__(
        self,
        settings: Settings,
        metadata: ContainerMetadata,
        read_index: ReadIndex,
        chunked: ChunkedSegmentStorage,
        metrics: EngineMetrics,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.metadata = metadata
        self.read_index = read_index
        self.chunked = chunked
        self._read_ends: dict[int, int] = {}  # segment id -> end of its last Tier 2 fetch
        self._read_aheads: dict[int, ReadAhead] = {}

    def reader_at(self, segment_id: int, end: int) -> None:
        """A read of the segment ended at ``end``: its read-ahead (if any) keeps that far ahead."""
        read_ahead = self._read_aheads.get(segment_id)
        if read_ahead is not None:
            read_ahead.reader_at(end)

    def finish(self) -> None:
        """End every read-ahead (shutdown)."""
        for state in list(self._read_aheads.values()):
            state.finish()

    def read_range(self, segment_id: int, name: str, start: int, count: int, *, scan: bool) -> list[bytes]:
        """``count`` bytes from ``start`` in pieces: cached first, the gaps from Tier 2.

        ``scan``: the read starts at the segment's start offset; a miss there
        starts the read-ahead at once and waits for it (one Tier 2 stream, not
        a ranged read first and a stream after).
        """
        parts: list[bytes] = []
        pos, end = start, start + count
        rechecked = -1  # the one position whose miss was read again after the read-ahead passed it
        cached = self.read_index.read_pieces(segment_id, pos, count)
        found = sum(map(len, cached))
        if found == count:
            self.metrics.cache_hits.inc()
            return [part for part in cached if part]
        self.metrics.cache_misses.inc()
        parts.extend(cached)
        pos += found
        while pos < end:
            cached = self.read_index.read_pieces(segment_id, pos, end - pos)
            if cached:
                parts.extend(cached)
                pos += sum(map(len, cached))
                continue
            read_ahead = self._read_aheads.get(segment_id)
            if read_ahead is None and scan and pos == start and self.settings.read_ahead_bytes:
                read_ahead = self._start_read_ahead(segment_id, name, reader=pos, pos=pos)
            if (
                read_ahead is not None
                and rechecked != pos
                and read_ahead.wait_past(pos, self.settings.read_ahead_bytes)
            ):
                rechecked = pos
                continue  # the read-ahead brought the bytes at pos (unless already evicted)
            parts.append(self._read_tier2(segment_id, name, pos, end))
            pos += len(parts[-1])
        return [part for part in parts if part]

    def _read_tier2(self, segment_id: int, name: str, pos: int, end: int) -> bytes:
        """Fetch an evicted range from Tier 2 in aligned blocks, cache it, maybe read ahead.

        Empty when the bytes at ``pos`` turned up in the cache meanwhile (the caller reads them there).
        """
        block = self.settings.storage_read_block_bytes
        fetch_to = -(-end // block) * block
        fetched = self._fetch(segment_id, name, pos, pos - pos % block, fetch_to)
        if fetched is None:
            self._read_ends.pop(segment_id, None)
            raise SegmentNotFound(f"segment {name!r} was deleted")
        start, data = fetched
        if not data:
            return b""
        assert start <= pos < start + len(data), (start, len(data), pos)
        sequential = self._read_ends.get(segment_id, -1) >= start
        self._read_ends[segment_id] = start + len(data)
        if sequential and self.settings.read_ahead_bytes and segment_id not in self._read_aheads:
            self._start_read_ahead(segment_id, name, reader=end, pos=start + len(data))
        return data[pos - start : end - start]

    def _fetch(self, segment_id: int, name: str, pos: int, start: int, end: int) -> tuple[int, bytes] | None:
        """Read what Tier 2 holds of [start, end) around ``pos`` into the cache.

        The range is clipped to the run of contiguous chunks that holds
        ``pos`` (the layout, then pending merges) and ends at the next cached
        byte. None if the segment is gone; no bytes if ``pos`` is cached now.
        A chunk or range that vanished while the layout changed under the
        read (flush, merge, defrag, truncation) is read again through the new
        layout; one the current layout still names is lost: DataCorrupted.
        """
        seen: list[ChunkRef] | None = None
        while True:
            with self.metadata.lock:
                seg = self.metadata.segments.get(segment_id)
                if seg is None or seg.deleted:
                    return None
                if pos < seg.start_offset:
                    raise SegmentTruncated(
                        f"segment {name!r} was truncated during the read", segment=seg.info()
                    )
                chunks = list(seg.read_layout())
            run = contiguous_run(chunks, pos)
            if run is None:
                if self.read_index.cached_end(segment_id, pos) > pos:
                    return pos, b""
                if chunks == seen:
                    raise DataCorrupted(f"segment {name!r}: neither Tier 2 nor the cache has byte {pos}")
                seen = chunks
                continue
            start, end = max(start, run[0]), min(end, run[1])
            next_cached = self.read_index.next_cached(segment_id, pos)
            if next_cached is not None:
                end = min(end, next_cached)
            try:
                began = time.monotonic()
                data = self.chunked.read(chunks, start, end - start)
                self.metrics.tier2_read_seconds.observe(time.monotonic() - began)
                self.metrics.tier2_read_bytes.inc(len(data))
            except ChunkNotFound as exc:
                with self.metadata.lock:
                    seg = self.metadata.segments.get(segment_id)
                    if seg is None or seg.deleted:
                        return None
                    changed = seg.read_layout() != chunks
                if changed:
                    continue
                raise DataCorrupted(f"segment {name!r}: a chunk its layout names is lost: {exc}") from None
            except ChunkStorageError as exc:
                raise Throttled(f"Tier 2 cannot be read now: {exc}", retry_after_s=1) from exc
            self.read_index.insert(segment_id, start, data)
            self.read_index.evict(self.metadata.storage_lengths())
            return start, data

    def _start_read_ahead(self, segment_id: int, name: str, *, reader: int, pos: int) -> ReadAhead:
        state = self._read_aheads[segment_id] = ReadAhead(reader, pos)
        threading.Thread(target=self._read_ahead, args=(segment_id, name, state), daemon=True).start()
        return state

    def _read_ahead(self, segment_id: int, name: str, state: ReadAhead) -> None:
        """Stream a sequential reader's next bytes into the cache, ``read_ahead_bytes`` ahead of it.

        One Tier 2 stream per chunk (on S3, one GetObject instead of one per
        block), the next chunk's opened while this one streams, paused while
        the reader is far enough behind, ended when the reader stops, the
        segment goes or its layout no longer has the bytes.
        """
        ahead = self.settings.read_ahead_bytes
        current: PrefetchedStream | None = None
        upcoming: PrefetchedStream | None = None
        try:
            while state.wait_for_room(ahead):
                pos = state.pos
                with self.metadata.lock:
                    seg = self.metadata.segments.get(segment_id)
                    if seg is None or seg.deleted:
                        return
                    chunks = list(seg.read_layout())
                at = next((i for i, c in enumerate(chunks) if c.start <= pos < c.end), None)
                if at is None:
                    return  # past the end of Tier 2
                cached_end = self.read_index.cached_end(segment_id, pos)
                if cached_end > pos:
                    state.moved_to(cached_end)
                    continue
                if current is not None:
                    current.close()  # streamed to its end
                current, upcoming = upcoming, None
                if current is None or current.key != self._stream_key(segment_id, chunks[at], pos):
                    if current is not None:
                        current.close()  # opened for bytes the layout or the cache changed meanwhile
                    current = self._open_stream(segment_id, chunks[at], pos)
                following = chunks[at + 1] if at + 1 < len(chunks) else None
                if (
                    following is not None
                    and current.key[2] == following.start  # this stream runs into the next chunk
                    and self.read_index.cached_end(segment_id, following.start) == following.start
                ):
                    upcoming = self._open_stream(segment_id, following, following.start)
                for data in current.pieces():
                    with self.metadata.lock:
                        seg = self.metadata.segments.get(segment_id)
                        if seg is None or seg.deleted:
                            return
                    self.read_index.insert(segment_id, pos, data)
                    self.read_index.evict(self.metadata.storage_lengths())
                    self.metrics.tier2_read_bytes.inc(len(data))
                    pos += len(data)
                    self._read_ends[segment_id] = pos  # reading past here is still sequential
                    state.moved_to(pos)
                    if not state.wait_for_room(ahead):
                        return
        except ChunkNotFound:
            log.debug("read-ahead of %s ends: its layout changed", name)
        except (ChunkStorageError, OSError, SegstoreError) as exc:
            log.debug("read-ahead of %s at %d failed: %s", name, state.pos, exc)
        finally:
            for stream in (current, upcoming):
                if stream is not None:
                    stream.close()
            state.finish()
            self._read_aheads.pop(segment_id, None)

    def _stream_key(self, segment_id: int, chunk: ChunkRef, pos: int) -> tuple[str, int, int]:
        """What a read-ahead streams from ``pos`` in ``chunk``: up to its end or the next cached byte."""
        stop = chunk.end
        next_cached = self.read_index.next_cached(segment_id, pos)
        if next_cached is not None:
            stop = min(stop, next_cached)
        return chunk.name, pos, stop

    def _open_stream(self, segment_id: int, chunk: ChunkRef, pos: int) -> PrefetchedStream:
        key = self._stream_key(segment_id, chunk, pos)
        stream = self.chunked.stream(chunk, pos, key[2] - pos, self.settings.storage_read_block_bytes)
        return PrefetchedStream(key, stream)
