"""Reads: offsets and limits, tails, the read index and cache, eviction of flushed data only."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import (
    BadOffset,
    ContainerNotReady,
    InvalidArgument,
    ReadResult,
    SegmentNotFound,
    SegmentStore,
    SegmentTruncated,
)
from engine.reads.cache import Cache
from engine.reads.read_index import ReadIndex
from engine.tier2.chunked_segment_storage import ChunkRef
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import Node
from tests.polling import wait_until


def test_reads_at_offsets_and_lengths(store: SegmentStore) -> None:
    store.create("s")
    for part in (b"hello ", b"segment ", b"world"):
        store.append("s", part)
    full = b"hello segment world"
    assert store.read("s").data == full
    result = store.read("s", 6, 7)
    assert (result.data, result.offset, result.next_offset) == (b"segment", 6, 13)
    assert store.read("s", 3, 1000).data == full[3:]
    assert store.read("s", 4, 0).data == b""
    end = store.read("s", len(full))
    assert (end.data, end.next_offset, end.info.length) == (b"", len(full), len(full))
    store.truncate("s", 6)
    assert store.read("s").offset == 6 and store.read("s").data == full[6:]


def test_read_is_capped_at_max_read_bytes(make_node: Callable[..., Node]) -> None:
    store = make_node(max_read_bytes=100).store
    store.create("s")
    data = os.urandom(250)
    store.append("s", data)
    assert store.read("s").data == data[:100]
    assert store.read("s", 100, 1000).data == data[100:200]
    assert store.read("s", 100, 30).data == data[100:130]


def test_read_outside_the_segment(store: SegmentStore) -> None:
    store.create("s")
    store.append("s", b"0123456789")
    store.truncate("s", 4)
    with pytest.raises(SegmentTruncated) as below:
        store.read("s", 3)
    assert below.value.segment is not None and below.value.segment.start_offset == 4
    with pytest.raises(BadOffset) as past:
        store.read("s", 11)
    assert past.value.segment is not None and past.value.segment.length == 10
    with pytest.raises(InvalidArgument):
        store.read("s", 4, -1)
    with pytest.raises(InvalidArgument):
        store.read("s", 10, wait_s=store.settings.tail_wait_max_s + 1)
    with pytest.raises(SegmentNotFound):
        store.read("nope")


class Tail:
    """A read running in another thread."""

    def __init__(self, store: SegmentStore, name: str, offset: int, wait_s: float) -> None:
        self.result: ReadResult | Exception | None = None
        self.elapsed = 0.0
        self._thread = threading.Thread(target=self._run, args=(store, name, offset, wait_s))
        self._thread.start()

    def _run(self, store: SegmentStore, name: str, offset: int, wait_s: float) -> None:
        started = time.monotonic()
        try:
            self.result = store.read(name, offset, wait_s=wait_s)
        except Exception as exc:
            self.result = exc
        self.elapsed = time.monotonic() - started

    def join(self) -> Any:
        self._thread.join(10)
        assert not self._thread.is_alive()
        return self.result


def waiting_tail(node: Node, name: str, offset: int, wait_s: float = 10.0) -> Tail:
    """Start a tail read and return once it is parked on the segment."""
    seg_id = node.store.info(name).segment_id
    tail = Tail(node.store, name, offset, wait_s)
    segments = node.container.read_index._segments
    wait_until(lambda: seg_id in segments and segments[seg_id].waiters, what="a parked tail")
    return tail


def test_tail_read_returns_when_an_append_lands(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"old")
    tail = waiting_tail(node, "s", 3)
    node.store.append("s", b"new bytes")
    result = tail.join()
    assert (result.data, result.offset, result.next_offset) == (b"new bytes", 3, 12)
    assert tail.elapsed < 5


def test_tail_read_times_out_empty(store: SegmentStore) -> None:
    store.create("s")
    started = time.monotonic()
    result = store.read("s", 0, wait_s=0.15)
    assert time.monotonic() - started >= 0.15
    assert (result.data, result.next_offset) == (b"", 0)


def test_end_of_a_sealed_segment_returns_at_once(store: SegmentStore) -> None:
    store.create("s")
    store.append("s", b"abc")
    store.seal("s")
    started = time.monotonic()
    result = store.read("s", 3, wait_s=10)
    assert time.monotonic() - started < 1
    assert result.data == b"" and result.info.sealed and result.next_offset == result.info.length


def test_seal_wakes_a_waiting_tail(node: Node) -> None:
    node.store.create("s")
    tail = waiting_tail(node, "s", 0)
    node.store.seal("s")
    result = tail.join()
    assert result.data == b"" and result.info.sealed and tail.elapsed < 5


def test_delete_wakes_a_waiting_tail(node: Node) -> None:
    node.store.create("s")
    tail = waiting_tail(node, "s", 0)
    node.store.delete("s")
    assert isinstance(tail.join(), SegmentNotFound)
    assert tail.elapsed < 5


def test_close_wakes_a_waiting_tail(node: Node) -> None:
    node.store.create("s")
    tail = waiting_tail(node, "s", 0)
    node.store.close()
    assert isinstance(tail.join(), ContainerNotReady)


def test_drain_ends_waiting_tails_and_stops_new_waits(node: Node) -> None:
    node.store.create("s")
    tail = waiting_tail(node, "s", 0)
    node.store.drain()
    assert node.store.draining
    result = tail.join()
    assert result.data == b"" and tail.elapsed < 5
    started = time.monotonic()
    assert node.store.read("s", 0, wait_s=10).data == b""
    assert time.monotonic() - started < 1
    node.store.append("s", b"still served")
    assert node.store.read("s", 0, wait_s=10).data == b"still served"


def tier2_reads(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record every ranged Tier 2 read of the node as (segment offset, length)."""
    calls: list[tuple[int, int]] = []
    chunked = node.container.chunked
    original = chunked.read

    def read(chunks: list[ChunkRef], offset: int, length: int) -> bytes:
        calls.append((offset, length))
        return original(chunks, offset, length)

    monkeypatch.setattr(chunked, "read", read)
    return calls


def tier2_streams(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record every Tier 2 stream of the node (read-ahead) as (segment offset, bytes delivered) as it ends."""
    calls: list[tuple[int, int]] = []
    chunked = node.container.chunked
    original = chunked.stream

    def stream(chunk: ChunkRef, offset: int, length: int, piece_bytes: int) -> Iterator[bytes]:
        delivered = 0
        try:
            for piece in original(chunk, offset, length, piece_bytes):
                delivered += len(piece)
                yield piece
        finally:
            calls.append((offset, delivered))

    monkeypatch.setattr(chunked, "stream", stream)
    return calls


# Tier 2 is read in blocks of 512 bytes and without read-ahead, so tests can count the reads.
TINY_CACHE = {
    "cache_max_bytes": 2048,
    "cache_block_bytes": 512,
    "storage_read_block_bytes": 512,
    "read_ahead_bytes": 0,
}


def test_flushed_data_is_evicted_and_read_back_from_tier2(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20, **TINY_CACHE)
    store, cache = node.store, node.container.read_index.cache
    store.create("s")
    data = os.urandom(20_000)
    for i in range(0, len(data), 100):
        store.append("s", data[i : i + 100])
    assert cache.size >= len(data)  # nothing is evicted before it is in Tier 2
    store.flush()
    wait_until(lambda: cache.size <= cache.max_bytes, what="eviction")
    reads = tier2_reads(node, monkeypatch)
    got = b"".join(store.read("s", offset, 3000).data for offset in range(0, len(data), 3000))
    assert got == data
    assert reads and cache.size <= cache.max_bytes + 2 * 512
    for offset, length in reads:  # whole blocks, up to the segment's end
        assert offset % 512 == 0 and length < 3000 + 2 * 512, (offset, length)
        assert (offset + length) % 512 == 0 or offset + length == len(data), (offset, length)


def test_tier2_block_size_is_its_own_setting(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(cache_block_bytes=512, storage_read_block_bytes=4096, read_ahead_bytes=0)
    node.store.create("s")
    data = os.urandom(10_000)
    node.store.append("s", data)
    node.store.flush()
    node.evict_all()
    reads = tier2_reads(node, monkeypatch)
    assert node.store.read("s", 5000, 10).data == data[5000:5010]
    assert reads == [(4096, 4096)]
    assert node.store.read("s", 9000, 1000).data == data[9000:]
    assert reads == [(4096, 4096), (8192, 10_000 - 8192)]


READ_AHEAD = {
    "flush_threshold_ms": 60_000,
    "flush_threshold_bytes": 1 << 20,
    "cache_block_bytes": 512,
    "storage_read_block_bytes": 512,
    "read_ahead_bytes": 2048,
}


def cold_segment(node: Node, size: int) -> tuple[int, bytes]:
    """A flushed segment ``s`` with nothing of it in the cache; returns its id and bytes."""
    node.store.create("s")
    data = os.urandom(size)
    for i in range(0, size, 512):
        node.store.append("s", data[i : i + 512])
    node.store.flush()
    node.evict_all()
    seg_id = node.store.info("s").segment_id
    assert node.container.read_index.cached_end(seg_id, 0) == 0
    return seg_id, data


def test_a_sequential_reader_gets_the_next_bytes_prefetched(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(**READ_AHEAD)
    index = node.container.read_index
    seg_id, data = cold_segment(node, 8192)
    reads, streams = tier2_reads(node, monkeypatch), tier2_streams(node, monkeypatch)
    assert node.store.read("s", 512, 512).data == data[512:1024]  # not at the start: not yet sequential
    time.sleep(0.05)
    assert reads == [(512, 512)] and index.cached_end(seg_id, 512) == 1024
    assert node.store.read("s", 1024, 512).data == data[1024:1536]  # follows the first read
    wait_until(lambda: index.cached_end(seg_id, 512) == 1536 + 2048, what="the read-ahead")
    assert reads == [(512, 512), (1024, 512)]  # fetched by one stream, paused read_ahead_bytes ahead
    assert b"".join(node.store.read("s", o, 512).data for o in range(1536, 3584, 512)) == data[1536:3584]
    assert reads == [(512, 512), (1024, 512)]  # served from the cache
    node.close()
    wait_until(lambda: streams and streams[-1][0] + streams[-1][1] >= 3584, what="the streams to end")
    assert streams[0][0] == 1536 and reads == [(512, 512), (1024, 512)]


def test_a_scan_from_the_start_offset_is_one_stream_that_keeps_ahead(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(**READ_AHEAD)
    index = node.container.read_index
    seg_id, data = cold_segment(node, 8192)
    reads, streams = tier2_reads(node, monkeypatch), tier2_streams(node, monkeypatch)
    for offset in range(0, 3584, 512):
        assert node.store.read("s", offset, 512).data == data[offset : offset + 512]
    # The stream follows the reader: read_ahead_bytes past its last read.
    wait_until(lambda: index.cached_end(seg_id, 0) >= 3584 + 2048, timeout_s=2, what="the read-ahead")
    assert reads == []  # not one ranged read: the first miss started the stream and waited for it
    node.close()
    wait_until(lambda: streams and streams[-1][0] + streams[-1][1] >= 3584 + 2048, what="the streams to end")
    assert streams[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(streams))  # one after the other


def test_the_read_ahead_opens_the_next_chunk_while_this_one_streams(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk's stream is requested before the one before it ends, and every stream is closed."""
    node = make_node(**READ_AHEAD)
    node.store.create("s", rollover_bytes=1024)
    data = os.urandom(6144)
    node.store.append("s", data)
    node.store.flush()
    node.evict_all()
    assert [c.start for c in node.layout("s")] == [0, 1024, 2048, 3072, 4096, 5120]
    events: list[tuple[str, int]] = []
    chunked = node.container.chunked
    original = chunked.stream

    def stream(chunk: ChunkRef, offset: int, length: int, piece_bytes: int) -> Iterator[bytes]:
        events.append(("open", offset))
        pieces = original(chunk, offset, length, piece_bytes)

        def recorded() -> Iterator[bytes]:
            try:
                yield from pieces
            finally:
                events.append(("end", offset))

        return recorded()

    monkeypatch.setattr(chunked, "stream", stream)
    got = b"".join(node.store.read("s", o, 512).data for o in range(0, 6144, 512))
    assert got == data
    node.close()
    wait_until(lambda: events.count(("end", 5120)) == 1, what="the last stream to end")
    opened = [offset for kind, offset in events if kind == "open"]
    assert opened == [0, 1024, 2048, 3072, 4096, 5120]  # one stream per chunk, none opened twice
    for current, following in itertools.pairwise(opened):
        assert events.index(("open", following)) < events.index(("end", current)), events
    assert sorted(offset for kind, offset in events if kind == "end") == opened


def test_read_ahead_stops_at_the_end_of_tier2_and_never_overwrites_cached_bytes(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(**READ_AHEAD)
    index = node.container.read_index
    seg_id, data = cold_segment(node, 2000)
    node.store.append("s", b"unflushed")  # cached, above the storage length
    assert node.store.read("s", 0, 512).data == data[:512]
    assert node.store.read("s", 512, 512).data == data[512:1024]
    wait_until(lambda: index.cached_end(seg_id, 0) == 2009, what="the read-ahead up to the cached tail")
    assert node.store.read("s", 0, 4000).data == data + b"unflushed"


def test_unflushed_data_is_never_evicted(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=10_000, **TINY_CACHE)
    store, index = node.store, node.container.read_index
    store.create("s")
    data = os.urandom(14_000)
    for i in range(0, 9_900, 100):
        store.append("s", data[i : i + 100])
    store.append("s", data[9_900:12_000])  # crosses the size threshold: flushed
    wait_until(lambda: store.info("s").storage_length == 12_000, what="the size flush")
    store.append("s", data[12_000:])  # below the threshold: stays unflushed
    seg_id = store.info("s").segment_id
    wait_until(lambda: index.cache.size < 12_000, what="eviction")
    assert index.cached_end(seg_id, 12_000) == 14_000
    index.evict(node.container.metadata.storage_lengths())
    assert index.cached_end(seg_id, 12_000) == 14_000
    reads = tier2_reads(node, monkeypatch)
    assert store.read("s", 12_000, 5000).data == data[12_000:]
    assert not reads
    assert b"".join(store.read("s", o, 4000).data for o in range(0, 14_000, 4000)) == data
    assert store.info("s").storage_length == 12_000


def test_read_racing_a_flush_and_eviction_returns_the_data(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that looked at the segment before a flush evicted its bytes still finds them in Tier 2."""
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20, **TINY_CACHE)
    store, index = node.store, node.container.read_index
    store.create("s")
    data = os.urandom(8000)
    for i in range(0, len(data), 500):
        store.append("s", data[i : i + 500])
    seg_id = store.info("s").segment_id
    original = index.read
    raced: list[bool] = []

    def read(segment_id: int, offset: int, max_length: int) -> bytes:
        if not raced and segment_id == seg_id:
            raced.append(True)  # between the reader's look at the metadata and its cache lookup:
            store.flush()  # the writer moves everything to Tier 2 ...
            wait_until(lambda: original(seg_id, 0, 1) == b"", what="eviction")  # ... and evicts it
        return original(segment_id, offset, max_length)

    monkeypatch.setattr(index, "read", read)
    assert store.read("s", 0, 1000).data == data[:1000]


def change_layout_during_the_first_tier2_read(
    node: Node, monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]
) -> None:
    """The first Tier 2 read of the node runs ``change`` after the reader took its layout."""
    chunked = node.container.chunked
    original = chunked.read
    changed: list[bool] = []

    def read(chunks: list[ChunkRef], offset: int, length: int) -> bytes:
        if not changed:
            changed.append(True)
            change()
        return original(chunks, offset, length)

    monkeypatch.setattr(chunked, "read", read)


def test_read_racing_a_defrag_returns_the_data(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(storage=MemoryChunkStorage(supports_append=False), defrag_min_chunks=3, **TINY_CACHE)
    store = node.store
    store.create("s")
    data = os.urandom(400)
    for i in range(0, 300, 100):
        store.append("s", data[i : i + 100])
        store.flush()
    node.evict_all()
    old = node.layout("s")

    def defrag() -> None:
        store.append("s", data[300:])
        store.flush()  # four chunks: the first three are joined and deleted
        assert len(node.layout("s")) == 2 and not node.storage.exists(old[0].name)

    change_layout_during_the_first_tier2_read(node, monkeypatch, defrag)
    assert store.read("s", 0, 300).data == data[:300]


def test_read_above_the_new_start_racing_a_truncation_returns_the_data(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(**TINY_CACHE)
    store = node.store
    store.create("s", rollover_bytes=100)
    data = os.urandom(500)
    store.append("s", data)
    store.flush()
    node.evict_all()
    old = node.layout("s")

    def truncate() -> None:
        store.truncate("s", 250)
        store.flush()  # the chunks [0, 100) and [100, 200) are deleted
        assert not node.storage.exists(old[0].name)

    change_layout_during_the_first_tier2_read(node, monkeypatch, truncate)
    assert store.read("s", 260, 100).data == data[260:360]


def test_evicted_range_next_to_a_cached_block_is_cached_once_read(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20, **TINY_CACHE)
    store, index = node.store, node.container.read_index
    store.create("s")
    data = os.urandom(1500)
    for i in range(0, 1500, 500):
        store.append("s", data[i : i + 500])  # blocks [0, 500), [500, 1000), [1000, 1500)
    store.flush()
    seg_id = store.info("s").segment_id
    for start in (0, 1000):
        index.cache.get((seg_id, start))  # [500, 1000) is now the least recently used
    index.cache.max_bytes = 1000
    index.evict(node.container.metadata.storage_lengths())
    index.cache.max_bytes = 1 << 20  # no further eviction
    assert index.cached_end(seg_id, 0) == 500 and index.cached_end(seg_id, 1000) == 1500
    assert index.read(seg_id, 500, 1) == b""
    reads = tier2_reads(node, monkeypatch)
    assert store.read("s", 500, 500).data == data[500:1000]
    assert len(reads) == 1
    assert store.read("s", 500, 500).data == data[500:1000]
    assert len(reads) == 1, reads  # the bytes fetched the first time were cached


# ------------------------------------------------------------- ReadIndex and Cache units
def test_small_appends_grow_one_block_up_to_block_bytes() -> None:
    index = ReadIndex(Cache(1 << 20), block_bytes=10)
    for i in range(7):
        index.append(1, i * 3, bytes([i]) * 3)
    assert list(index._segments[1].blocks.items()) == [(0, 9), (9, 9), (18, 3)]
    assert index.read(1, 0, 100) == b"".join(bytes([i]) * 3 for i in range(7))
    assert index.read(1, 8, 3) == b"\x02\x03\x03"
    assert index.read(2, 0, 10) == b""
    assert index.cache.size == 21


def test_read_pieces_are_whole_blocks_uncopied_and_parts_copied() -> None:
    index = ReadIndex(Cache(1 << 20), block_bytes=100)
    first, second = os.urandom(100), os.urandom(100)
    index.insert(1, 0, first)
    index.insert(1, 100, second)
    index.append(1, 200, b"tail")  # a growing block
    pieces = index.read_pieces(1, 0, 1000)
    assert pieces[0] is first and pieces[1] is second  # sent as they are, never joined
    assert pieces[2] == b"tail" and type(pieces[2]) is bytes
    parts = index.read_pieces(1, 50, 100)
    assert parts == [first[50:], second[:50]] and all(type(p) is bytes for p in parts)
    assert index.read_pieces(2, 0, 10) == [] and index.read_pieces(1, 300, 10) == []


def test_a_read_of_whole_cached_blocks_hands_them_out_as_they_are(store: SegmentStore) -> None:
    store.create("s")
    blocks = [os.urandom(store.settings.cache_block_bytes) for _ in range(3)]
    for block in blocks:
        store.append("s", block)
    result = store.read("s", 0)
    assert len(result.pieces) == 3 and all(p is b for p, b in zip(result.pieces, blocks, strict=True))
    assert result.data == b"".join(blocks) and result.next_offset == 3 * len(blocks[0])


def test_insert_never_overwrites_cached_bytes() -> None:
    index = ReadIndex(Cache(1 << 20), block_bytes=100)
    index.append(1, 50, b"B" * 10)
    index.insert(1, 0, b"a" * 60)  # trimmed at the cached block
    assert index.read(1, 0, 100) == b"a" * 50 + b"B" * 10
    assert index.next_cached(1, 10) == 50
    index.insert(1, 55, b"c" * 10)  # starts inside a cached block
    assert index.read(1, 50, 10) == b"B" * 10
    assert index.cached_end(1, 0) >= 60 and index.cached_end(1, 70) == 70
    assert index.next_cached(2, 0) is None


def test_evict_drops_only_blocks_below_the_storage_length() -> None:
    index = ReadIndex(Cache(10), block_bytes=10)
    for i in range(5):
        index.append(1, i * 10, bytes([i]) * 10)
    assert index.evict({1: 25}) == 2  # blocks [0, 10) and [10, 20)
    assert index.cached_end(1, 20) == 50 and index.read(1, 0, 10) == b""
    assert index.evict({1: 50}) == 2  # down to the budget: the newest block stays
    assert index.cache.size == 10


def test_cache_evicts_least_recently_used_first() -> None:
    cache = Cache(30)
    for start in (0, 10, 20, 30):
        cache.put((1, start), bytes(10))
    cache.get((1, 0))
    dropped = cache.evict(lambda key, size: True)
    assert dropped == [(1, 10)] and cache.size == 30
    assert cache.evict(lambda key, size: True) == []


def test_drop_segment_frees_its_blocks_and_wakes_tails() -> None:
    index = ReadIndex(Cache(1 << 20), block_bytes=10)
    index.append(1, 0, b"x" * 25)
    waiter = index.register_waiter(1)
    index.drop_segment(1)
    assert waiter.done() and index.cache.size == 0 and index.read(1, 0, 10) == b""


def test_a_tail_waiter_waits_until_the_segment_changes_or_its_time_runs_out() -> None:
    index = ReadIndex(Cache(1 << 20), block_bytes=10)
    index.append(1, 0, b"x")
    waiter = index.register_waiter(1)
    started = time.monotonic()
    assert not waiter.wait(0.05) and time.monotonic() - started >= 0.05
    index.append(1, 1, b"y")
    index.notify(1)
    assert waiter.wait(0) and waiter.wait(10)  # stays set
