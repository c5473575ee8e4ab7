"""Read index: where each segment's bytes are in the cache (seed 000 "Read Index").

Per segment, a sorted map (sortedcontainers) from start offset to block
length; the bytes live in the ``Cache``. Appends land here only after they
are durable, so a read never sees unacknowledged bytes. Small appends grow
the segment's tail block up to ``block_bytes``. Blocks read back from Tier 2
are inserted the same way. Future reads (tails) register a waiter that is
woken when the segment grows, is sealed or deleted.
"""

from __future__ import annotations

import threading

from sortedcontainers import SortedDict

from engine.completion import Completion
from engine.reads.cache import Cache, Key


class _SegmentIndex:
    __slots__ = ("blocks", "tail", "waiters")

    def __init__(self) -> None:
        self.blocks: SortedDict = SortedDict()  # start offset -> length
        self.tail: int | None = None  # start of the growable tail block
        self.waiters: list[Completion[None]] = []


class ReadIndex:
    """Sorted per-segment indexes over one cache."""

    def __init__(self, cache: Cache, *, block_bytes: int) -> None:
        self.cache = cache
        self.block_bytes = block_bytes
        self._segments: dict[int, _SegmentIndex] = {}
        self._lock = threading.Lock()

    def _index(self, segment_id: int) -> _SegmentIndex:
        index = self._segments.get(segment_id)
        if index is None:
            index = self._segments[segment_id] = _SegmentIndex()
        return index

    # ----------------------------------------------------------------- writes
    def append(self, segment_id: int, offset: int, data: bytes) -> None:
        """Add durable bytes at ``offset`` (the segment's previous length)."""
        with self._lock:
            index = self._index(segment_id)
            tail = index.tail
            if tail is not None and tail + index.blocks[tail] == offset and (
                index.blocks[tail] + len(data) <= self.block_bytes
            ):
                self.cache.extend((segment_id, tail), data)
                index.blocks[tail] += len(data)
                return
            if len(data) < self.block_bytes:
                self.cache.put((segment_id, offset), bytearray(data))
                index.tail = offset
            else:
                self.cache.put((segment_id, offset), data)
                index.tail = None
            index.blocks[offset] = len(data)

    def insert(self, segment_id: int, offset: int, data: bytes) -> None:
        """Add bytes read back from Tier 2, where nothing is cached yet."""
        with self._lock:
            index = self._index(segment_id)
            pos = index.blocks.bisect_right(offset)
            if pos and self._end(index, pos - 1) > offset:
                cut = self._end(index, pos - 1) - offset
                data, offset = data[cut:], offset + cut
            if pos < len(index.blocks):
                data = data[: index.blocks.keys()[pos] - offset]
            if data:
                self.cache.put((segment_id, offset), data)
                index.blocks[offset] = len(data)

    @staticmethod
    def _end(index: _SegmentIndex, pos: int) -> int:
        start = index.blocks.keys()[pos]
        return start + index.blocks[start]

    # ------------------------------------------------------------------ reads
    def read(self, segment_id: int, offset: int, max_length: int) -> bytes:
        """The cached bytes contiguous from ``offset``, at most ``max_length`` (maybe empty)."""
        return b"".join(self._pieces(segment_id, offset, max_length))

    def read_pieces(self, segment_id: int, offset: int, max_length: int) -> list[bytes]:
        """As ``read``, unjoined: whole blocks as they are cached (no copy), parts of blocks copied."""
        return [p if isinstance(p, bytes) else bytes(p) for p in self._pieces(segment_id, offset, max_length)]

    def _pieces(self, segment_id: int, offset: int, max_length: int) -> list[bytes | memoryview]:
        """The cached pieces contiguous from ``offset``; views of immutable blocks, copies of the tail.

        A view of an immutable block stays valid after the lock is released
        (and after the block is evicted); a growing tail block is copied here.
        """
        parts: list[bytes | memoryview] = []
        wanted = max_length
        with self._lock:
            index = self._segments.get(segment_id)
            if index is None:
                return parts
            pos = index.blocks.bisect_right(offset) - 1
            if pos < 0:
                return parts
            keys = index.blocks.keys()
            while wanted > 0 and pos < len(keys):
                start = keys[pos]
                length = index.blocks[start]
                if start > offset or start + length <= offset:
                    break
                block = self.cache.get((segment_id, start))
                assert block is not None, (segment_id, start)
                cut = slice(offset - start, offset - start + wanted)
                if not isinstance(block, bytes):
                    piece: bytes | memoryview = bytes(block[cut])
                elif offset == start and wanted >= length:
                    piece = block
                else:
                    piece = memoryview(block)[cut]
                parts.append(piece)
                offset += len(piece)
                wanted -= len(piece)
                pos += 1
        return parts

    def cached_end(self, segment_id: int, offset: int) -> int:
        """The end of the cached range that contains ``offset`` (``offset`` if none)."""
        with self._lock:
            index = self._segments.get(segment_id)
            if index is None:
                return offset
            keys = index.blocks.keys()
            pos = index.blocks.bisect_right(offset) - 1
            while 0 <= pos < len(keys) and keys[pos] <= offset < self._end(index, pos):
                offset = self._end(index, pos)
                pos += 1
            return offset

    def next_cached(self, segment_id: int, offset: int) -> int | None:
        """Start of the first cached block after ``offset`` (to bound a Tier 2 read)."""
        with self._lock:
            index = self._segments.get(segment_id)
            if index is None:
                return None
            pos = index.blocks.bisect_right(offset)
            return index.blocks.keys()[pos] if pos < len(index.blocks) else None

    # ---------------------------------------------------------------- eviction
    def evict(self, storage_length: dict[int, int]) -> int:
        """Evict flushed blocks (below each segment's storage length) past the cache budget."""

        def evictable(key: Key, size: int) -> bool:
            seg_id, start = key
            return start + size <= storage_length.get(seg_id, -1)

        with self._lock:
            dropped = self.cache.evict(evictable)
            for seg_id, start in dropped:
                index = self._segments[seg_id]
                del index.blocks[start]
                if index.tail == start:
                    index.tail = None
        return len(dropped)

    def move(self, source_id: int, target_id: int, offset: int) -> None:
        """A merge: the source's blocks become the target's from ``offset`` on, none copied.

        The target's bytes end where the source's begin, so the source's
        growable tail block, if it is the last block, stays growable.
        """
        with self._lock:
            source = self._segments.pop(source_id, None)
            if source is None:
                return
            target = self._index(target_id)
            last = len(target.blocks) - 1
            assert last < 0 or self._end(target, last) <= offset, (target_id, offset)
            for start, length in source.blocks.items():
                self.cache.rekey((source_id, start), (target_id, start + offset))
                target.blocks[start + offset] = length
            if source.blocks:
                tail = source.blocks.keys()[-1]
                target.tail = tail + offset if source.tail == tail else None
            waiters, source.waiters = source.waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    def drop_segment(self, segment_id: int) -> None:
        """Forget a deleted segment's blocks and wake its tails."""
        with self._lock:
            index = self._segments.pop(segment_id, None)
            if index is None:
                return
            for start in index.blocks:
                self.cache.delete((segment_id, start))
            waiters, index.waiters = index.waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    # ----------------------------------------------------------- future reads
    def register_waiter(self, segment_id: int) -> Completion[None]:
        """A completion set at the segment's next change (append, seal, delete, close)."""
        waiter: Completion[None] = Completion()
        with self._lock:
            self._index(segment_id).waiters.append(waiter)
        return waiter

    def discard_waiter(self, segment_id: int, waiter: Completion[None]) -> None:
        with self._lock:
            index = self._segments.get(segment_id)
            if index is not None and waiter in index.waiters:
                index.waiters.remove(waiter)

    def notify(self, segment_id: int) -> None:
        with self._lock:
            index = self._segments.get(segment_id)
            if index is None or not index.waiters:
                return
            waiters, index.waiters = index.waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    def close(self) -> None:
        """Wake every waiting tail (the container is stopping)."""
        with self._lock:
            waiters = [w for index in self._segments.values() for w in index.waiters]
            for index in self._segments.values():
                index.waiters = []
        for waiter in waiters:
            waiter.set_result(None)
