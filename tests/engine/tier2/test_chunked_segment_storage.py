"""Chunked segment storage (seed 002): layouts, rolling, epoch fencing, truncation, concat, defrag, GC."""

from __future__ import annotations

import pytest

from engine.errors import DataCorrupted
from engine.naming import parse_chunk_name
from engine.tier2.chunk_storage import ChunkHandle, ChunkNotFound
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage, ChunkRef, check_layout, concat_layouts
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage


def storage_like_s3() -> MemoryChunkStorage:
    return MemoryChunkStorage(supports_append=False, supports_truncation=False)


def write_all(chunked: ChunkedSegmentStorage, pieces: list[bytes], rollover: int) -> list[ChunkRef]:
    layout: list[ChunkRef] = []
    offset = 0
    for piece in pieces:
        layout = chunked.write("s/0", 1, layout, offset, piece, rollover)
        offset += len(piece)
        check_layout(layout, offset, 0)
    return layout


def test_append_binding_grows_the_last_chunk_until_rollover() -> None:
    chunked = ChunkedSegmentStorage(MemoryChunkStorage(), 0)
    layout = write_all(chunked, [b"a" * 4, b"b" * 4, b"c" * 4], rollover=10)
    assert [c.length for c in layout] == [10, 2]
    assert chunked.read(layout, 0, 12) == b"aaaabbbbcccc"
    assert chunked.read(layout, 9, 3) == b"ccc"


def test_without_append_every_write_is_a_new_chunk_and_big_writes_roll() -> None:
    chunked = ChunkedSegmentStorage(storage_like_s3(), 0)
    layout = write_all(chunked, [b"x" * 3, b"y" * 25], rollover=10)
    assert [(c.start, c.length) for c in layout] == [(0, 3), (3, 10), (13, 10), (23, 5)]
    assert chunked.read(layout, 0, 28) == b"x" * 3 + b"y" * 25


def test_chunk_names_carry_container_segment_epoch_and_offset() -> None:
    chunked = ChunkedSegmentStorage(storage_like_s3(), 3)
    chunked.epoch = 7
    layout = chunked.write("a/b", 42, [], 0, b"hello", 100)
    layout = chunked.write("a/b", 42, layout, 5, b"world", 100)
    parts = [parse_chunk_name(c.name) for c in layout]
    assert [(p.container_id, p.segment_id, p.epoch, p.offset) for p in parts if p] == [
        (3, 42, 7, 0),
        (3, 42, 7, 5),
    ]


def test_a_new_epoch_never_writes_to_an_older_epochs_chunk() -> None:
    storage = MemoryChunkStorage()
    old = ChunkedSegmentStorage(storage, 0)
    old.epoch = 1
    layout = old.write("s", 1, [], 0, b"old", 100)
    new = ChunkedSegmentStorage(storage, 0)
    new.epoch = 2
    layout = new.write("s", 1, layout, 3, b"new", 100)
    assert len(layout) == 2 and parse_chunk_name(layout[1].name).epoch == 2  # type: ignore[union-attr]
    assert storage.info(layout[0].name).length == 3


def test_unrecorded_bytes_in_the_last_chunk_start_a_new_chunk() -> None:
    storage = MemoryChunkStorage()
    chunked = ChunkedSegmentStorage(storage, 0)
    layout = chunked.write("s", 1, [], 0, b"abc", 100)
    # A write whose layout update never became durable left bytes past the recorded length.
    storage.write(storage.open_write(layout[0].name), 3, b"zzz")
    layout = chunked.write("s", 1, layout, 3, b"def", 100)
    assert len(layout) == 2
    assert chunked.read(layout, 0, 6) == b"abcdef"
    layout = chunked.write("s", 1, layout, 6, b"g", 100)
    assert len(layout) == 2, "the new chunk is appended to, the abandoned one is not"


def test_a_chunk_cut_back_to_its_recorded_length_is_written_on() -> None:
    storage = MemoryChunkStorage()
    chunked = ChunkedSegmentStorage(storage, 0)
    layout = chunked.write("s", 1, [], 0, b"abc", 100)
    storage.write(storage.open_write(layout[0].name), 3, b"zzz")  # a write whose layout never committed
    chunked.cut_back(layout)
    layout = chunked.write("s", 1, layout, 3, b"def", 100)
    assert len(layout) == 1 and storage.info(layout[0].name).length == 6
    assert chunked.read(layout, 0, 6) == b"abcdef"


@pytest.mark.parametrize("cannot", ["no truncation", "truncate fails"])
def test_a_chunk_that_cannot_be_cut_back_is_never_written_on(cannot: str) -> None:
    inner = MemoryChunkStorage(supports_truncation=cannot != "no truncation")
    storage = FaultyChunkStorage(inner)
    chunked = ChunkedSegmentStorage(storage, 0)
    layout = chunked.write("s", 1, [], 0, b"abc", 100)
    inner.write(inner.open_write(layout[0].name), 3, b"zzz")
    storage.fail("truncate")
    chunked.cut_back(layout)
    layout = chunked.write("s", 1, layout, 3, b"def", 100)
    assert len(layout) == 2 and chunked.read(layout, 0, 6) == b"abcdef"


def test_read_of_a_chunk_shorter_than_its_layout_is_corruption() -> None:
    storage = storage_like_s3()
    chunked = ChunkedSegmentStorage(storage, 0)
    layout = chunked.write("s", 1, [], 0, b"abc", 100)
    with pytest.raises(DataCorrupted):
        chunked.read([layout[0]._replace(length=5)], 0, 5)


def test_truncate_drops_only_chunks_wholly_below_the_start() -> None:
    chunked = ChunkedSegmentStorage(storage_like_s3(), 0)
    layout = write_all(chunked, [b"a" * 5, b"b" * 5, b"c" * 5], rollover=100)
    kept, removed = chunked.truncate(layout, 7)
    assert kept == layout[1:] and removed == [layout[0].name]
    kept, removed = chunked.truncate(layout, 15)
    assert kept == [] and len(removed) == 3


def test_concat_layouts_shifts_the_source_to_the_target_end() -> None:
    target = [ChunkRef("t0", 0, 4), ChunkRef("t1", 4, 6)]
    source = [ChunkRef("s0", 0, 3), ChunkRef("s1", 3, 2)]
    merged = concat_layouts(target, 10, source)
    assert merged == [*target, ChunkRef("s0", 10, 3), ChunkRef("s1", 13, 2)]
    check_layout(merged, 15, 0)


def test_defrag_joins_a_run_of_small_chunks_without_changing_bytes() -> None:
    storage = storage_like_s3()
    chunked = ChunkedSegmentStorage(storage, 0)
    chunked.epoch = 3
    pieces = [bytes([65 + i]) * (i + 1) for i in range(6)]
    layout = write_all(chunked, pieces, rollover=100)
    result = chunked.defrag("s/0", 1, layout, small_bytes=10, min_run=3, max_bytes=100)
    assert result is not None
    new_layout, replaced = result
    # The last chunk may still grow, so it stays out of the run.
    assert len(new_layout) == 2 and replaced == [c.name for c in layout[:5]]
    assert parse_chunk_name(new_layout[0].name).epoch == 3  # type: ignore[union-attr]
    check_layout(new_layout, layout[-1].end, 0)
    assert chunked.read(new_layout, 0, layout[-1].end) == b"".join(pieces)


def test_defrag_needs_native_concat_and_a_long_enough_run() -> None:
    no_concat = ChunkedSegmentStorage(MemoryChunkStorage(supports_concat=False), 0)
    layout = write_all(no_concat, [b"a"] * 5, rollover=1)
    assert no_concat.defrag("s/0", 1, layout, small_bytes=10, min_run=2, max_bytes=100) is None
    chunked = ChunkedSegmentStorage(storage_like_s3(), 0)
    layout = write_all(chunked, [b"a", b"b" * 50, b"c", b"d"], rollover=100)
    assert chunked.defrag("s/0", 1, layout, small_bytes=10, min_run=3, max_bytes=100) is None


def test_garbage_collection_keeps_referenced_and_current_epoch_chunks() -> None:
    storage = storage_like_s3()
    chunked = ChunkedSegmentStorage(storage, 0)
    chunked.epoch = 1
    kept = chunked.write("s", 1, [], 0, b"kept", 100)
    orphan = chunked.write("s", 1, kept, 4, b"orphan", 100)[-1]
    other_container = ChunkedSegmentStorage(storage, 1)
    foreign = other_container.write("t", 1, [], 0, b"foreign", 100)
    chunked.epoch = 2
    current = chunked.write("s", 1, kept, 4, b"current", 100)[-1]
    exported = chunked.export_layout("s", kept, 4)
    deleted = chunked.collect_garbage({kept[0].name}, chunked.chunk_names())
    assert deleted == [orphan.name]
    for name in (kept[0].name, current.name, foreign[0].name, exported):
        assert storage.exists(name)


def test_layout_export_and_import_round_trip() -> None:
    storage = storage_like_s3()
    chunked = ChunkedSegmentStorage(storage, 0)
    layout = write_all(chunked, [b"ab", b"cd", b"ef"], rollover=100)
    chunked.export_layout("a/b", layout[1:], 6)
    chunks, length, start_offset = ChunkedSegmentStorage(storage, 0).import_layout("a/b")
    assert chunks == layout[1:] and length == 6 and start_offset == 2
    assert chunked.read(chunks, 2, 4) == b"cdef"


def test_import_refuses_a_missing_layout_or_a_short_chunk() -> None:
    storage = storage_like_s3()
    chunked = ChunkedSegmentStorage(storage, 0)
    with pytest.raises(ChunkNotFound):
        chunked.import_layout("nothing/here")
    layout = write_all(chunked, [b"ab", b"cd"], rollover=100)
    chunked.export_layout("a/b", layout, 4)
    storage.delete(layout[1].name)
    storage.create(layout[1].name, b"c")
    with pytest.raises(DataCorrupted):
        chunked.import_layout("a/b")


def test_reads_use_plain_handles_without_extra_requests() -> None:
    storage = storage_like_s3()
    chunked = ChunkedSegmentStorage(storage, 0)
    layout = write_all(chunked, [b"abc"], rollover=100)
    assert storage.read(ChunkHandle(layout[0].name, read_only=True), 1, 5) == b"bc"
