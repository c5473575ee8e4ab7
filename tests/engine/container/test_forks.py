"""Forks: a new segment from a prefix of another, sharing its Tier 2 chunks (seed 002, metadata-only)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import (
    BadOffset,
    InvalidArgument,
    SegmentExists,
    SegmentNotFound,
    SegmentStore,
    SegmentTruncated,
)
from engine.durable_log.metadata_updater import MetadataUpdater
from engine.errors import LayoutChanged
from engine.metadata import operations as ops
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import Node, logged_operations, small_settings

FLUSHED = "segstore_tier2_flush_bytes_total"
# The writer flushes only when told to: what is in Tier 2 is what the test put there.
MANUAL = {"flush_threshold_ms": 600_000, "flush_threshold_bytes": 1 << 30}


def whole(store: SegmentStore, name: str) -> bytes:
    info = store.info(name)
    return store.read(name, info.start_offset, info.length - info.start_offset).data


def chunk_names(node: Node, name: str) -> set[str]:
    return {c.name for c in node.layout(name)}


def test_a_fork_of_flushed_bytes_names_the_sources_chunks_and_writes_nothing(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(**MANUAL)
    data = os.urandom(20_000)
    node.store.create("src")
    node.store.append("src", data)
    node.store.flush()
    written = node.metric(FLUSHED)
    info = node.store.fork("src", "fork")
    node.store.flush()
    assert node.metric(FLUSHED) == written
    assert (info.length, info.storage_length, info.event_count) == (20_000, 20_000, 0)
    assert node.layout("fork") == node.layout("src")
    (shared,) = node.layout("src")
    node.store.append("fork", b"fork")  # into the shared chunk, at its end (this binding appends)
    node.store.flush()
    node.store.append("src", b"src")  # refused there (the chunk is longer than "src" names): a new one
    node.store.flush()
    assert node.storage.chunks[shared.name][:20_000] == data
    assert [c.length for c in node.layout("src")] == [20_000, 3]
    node.evict_all()
    assert whole(node.store, "fork") == data + b"fork"
    assert whole(node.store, "src") == data + b"src"


def test_a_fork_copies_only_the_unflushed_tail_through_tier1(make_node: Callable[..., Node]) -> None:
    node = make_node(**MANUAL)
    node.store.create("src")
    node.store.append("src", b"a" * 5000)
    node.store.flush()
    node.store.append("src", b"tail")
    info = node.store.fork("src", "fork")
    assert (info.length, info.storage_length) == (5004, 5000)
    forks = [op for op in logged_operations(node.data_log) if isinstance(op, ops.ForkSegment)]
    assert [(op.length, op.data_length, op.data) for op in forks] == [(5000, 4, b"tail")]
    written = node.metric(FLUSHED)
    node.store.flush()
    assert node.metric(FLUSHED) - written == 4 + 4  # the source's tail and the fork's, once each
    node.evict_all()
    assert whole(node.store, "fork") == b"a" * 5000 + b"tail"


def test_a_fork_inside_a_chunk_names_part_of_it_and_both_grow_apart(make_node: Callable[..., Node]) -> None:
    node = make_node(**MANUAL)
    node.store.create("src")
    node.store.append("src", b"0123456789")
    node.store.flush()
    node.store.fork("src", "fork", 4)
    (shared,) = node.layout("fork")
    assert shared.length == 4 and shared.name in chunk_names(node, "src")
    # The source appends to its chunk in place (this binding can append); the
    # fork cannot (the chunk is longer than it names) and starts its own.
    node.store.append("src", b"-src")
    node.store.append("fork", b"-fork")
    node.store.flush()
    assert node.layout("src")[0].name == shared.name and node.layout("src")[0].length == 14
    assert len(node.layout("fork")) == 2
    node.evict_all()
    assert whole(node.store, "src") == b"0123456789-src"
    assert whole(node.store, "fork") == b"0123-fork"


def test_a_shared_chunk_leaves_tier2_with_the_last_segment_that_names_it(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(**MANUAL)
    node.store.create("src")
    node.store.append("src", os.urandom(3000))
    node.store.flush()
    node.store.fork("src", "fork")
    shared = chunk_names(node, "src")
    node.store.delete("src")
    node.store.flush()
    assert shared <= set(node.storage.chunks)
    node.evict_all()
    assert len(whole(node.store, "fork")) == 3000
    node.store.delete("fork")
    node.store.flush()
    assert not shared & set(node.storage.chunks)


def test_truncating_the_source_keeps_the_chunks_its_fork_names(make_node: Callable[..., Node]) -> None:
    node = make_node(**MANUAL, rollover_bytes=1000)
    data = os.urandom(5000)
    node.store.create("src")
    node.store.append("src", data)
    node.store.flush()
    node.store.fork("src", "fork")
    node.store.truncate("src", 4000)
    node.store.flush()
    assert len(node.layout("src")) == 1 and len(node.layout("fork")) == 5
    assert chunk_names(node, "fork") <= set(node.storage.chunks)
    node.evict_all()
    assert whole(node.store, "fork") == data
    node.store.delete("fork")
    node.store.flush()
    assert set(node.storage.chunks) == chunk_names(node, "src")


def test_defrag_of_the_source_keeps_the_small_chunks_its_fork_names(make_node: Callable[..., Node]) -> None:
    storage = MemoryChunkStorage(supports_append=False)  # a chunk per flush
    node = make_node(storage=storage, **MANUAL, defrag_min_chunks=3, defrag_small_bytes=1000)
    node.store.create("src")
    for _ in range(3):
        node.store.append("src", b"s" * 100)
        node.store.flush()
    node.store.fork("src", "fork")
    small = chunk_names(node, "src")
    assert len(small) == 3
    node.store.append("src", b"t" * 100)
    node.store.flush()  # four chunks: defrag joins the first three
    assert len(node.layout("src")) == 2
    assert small <= set(storage.chunks) and chunk_names(node, "fork") == small
    node.evict_all()
    assert whole(node.store, "fork") == b"s" * 300
    assert whole(node.store, "src") == b"s" * 300 + b"t" * 100


def test_defrag_leaves_out_a_chunk_holding_more_than_the_layout_names(make_node: Callable[..., Node]) -> None:
    node = make_node(**MANUAL, defrag_min_chunks=3, defrag_small_bytes=1000)
    node.store.create("src")
    node.store.append("src", b"0123456789")
    node.store.flush()
    node.store.fork("src", "fork", 5)  # names 5 of the chunk's bytes
    node.store.append("src", b"more")
    node.store.flush()  # the source's chunk grows in place to 14
    for i in range(3):  # a chunk of the fork's own per epoch
        node.store.append("fork", bytes([65 + i]) * 10)
        node.store.flush()
        node.restart()
    node.store.append("fork", b"D" * 10)
    node.store.flush()  # five small chunks, but a concat of the first would take 14 bytes, not 5
    assert [c.length for c in node.layout("fork")] == [5, 30, 10]  # joined without the shared one
    node.evict_all()
    assert whole(node.store, "fork") == b"01234" + b"A" * 10 + b"B" * 10 + b"C" * 10 + b"D" * 10
    assert whole(node.store, "src") == b"0123456789more"


def test_a_fork_overtaken_by_a_layout_change_takes_the_layout_again(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(**MANUAL, rollover_bytes=1000)
    data = os.urandom(3000)
    node.store.create("src")
    node.store.append("src", data)
    node.store.flush()
    container = node.container
    take = container._fork_layout
    calls: list[ops.ForkSegment] = []

    def stale_first(source: str, name: str, offset: int | None) -> tuple[ops.ForkSegment, int]:
        op, end = take(source, name, offset)
        if not calls:  # the source drops its first chunk before the fork is logged
            node.store.truncate("src", 1000)
            node.store.flush()
        calls.append(op)
        return op, end

    monkeypatch.setattr(container, "_fork_layout", stale_first)
    info = node.store.fork("src", "fork")
    assert len(calls) == 2 and len(calls[0].chunks) == 3 and len(calls[1].chunks) == 2
    assert info.start_offset == 1000
    node.evict_all()
    assert whole(node.store, "fork") == data[1000:]


def test_the_processor_refuses_a_fork_naming_chunks_the_source_let_go(node: Node) -> None:
    node.store.create("src")
    node.store.append("src", b"x" * 100)
    node.store.flush()
    with node.container.metadata.lock:
        source_id = node.container.metadata.by_name("src").segment_id
    (chunk,) = node.layout("src")
    for chunks in ([[chunk.name + "-gone", 0, 100]], [[chunk.name, 0, 101]], [[chunk.name, 1, 99]]):
        op = ops.ForkSegment(name="f", source="src", source_id=source_id, chunks=chunks, length=100, data=b"")
        with pytest.raises(LayoutChanged):
            MetadataUpdater(node.container.metadata).pre_process(op)
    stale = ops.ForkSegment(name="f", source="src", source_id=source_id + 1, chunks=[], data=b"")
    with pytest.raises(SegmentNotFound):
        MetadataUpdater(node.container.metadata).pre_process(stale)


def test_a_fork_survives_restarts_from_tier1_and_from_a_checkpoint(make_node: Callable[..., Node]) -> None:
    node = make_node(**MANUAL, checkpoint_every_bytes=1)
    node.store.create("src")
    node.store.append("src", b"flushed.")
    node.store.flush()
    node.store.append("src", b"tail.")
    node.store.fork("src", "fork")
    node.store.append("fork", b"own.")
    node.restart()  # the fork and its tail are replayed from Tier 1
    assert whole(node.store, "fork") == b"flushed.tail.own."
    node.truncate_tier1()
    node.store.delete("src")
    node.store.flush()
    node.restart()  # from a checkpoint; start-up collection keeps the shared chunk
    node.evict_all()
    assert whole(node.store, "fork") == b"flushed.tail.own."


def test_a_tail_larger_than_an_append_is_flushed_first(make_node: Callable[..., Node]) -> None:
    node = make_node(**MANUAL, max_append_bytes=4096)
    node.store.create("src")
    for _ in range(3):
        node.store.append("src", b"z" * 4000)
    info = node.store.fork("src", "fork")
    assert info.storage_length == info.length == 12_000
    forks = [op for op in logged_operations(node.data_log) if isinstance(op, ops.ForkSegment)]
    assert [op.data_length for op in forks] == [0]


def test_fork_errors(node: Node) -> None:
    store = node.store
    store.create("src")
    store.append("src", b"0123456789")
    store.truncate("src", 3)
    store.create("taken")
    with pytest.raises(BadOffset):
        store.fork("src", "f", 11)
    with pytest.raises(SegmentTruncated):
        store.fork("src", "f", 2)
    with pytest.raises(SegmentExists):
        store.fork("src", "taken")
    with pytest.raises(SegmentNotFound):
        store.fork("missing", "f")
    info = store.fork("src", "f", 3)
    assert (info.start_offset, info.length) == (3, 3)


def test_a_fork_across_containers_is_refused(tmp_path: Path) -> None:
    store = SegmentStore(small_settings(tmp_path, container_count=4))
    store.start(wait=True)
    try:
        store.create("src")
        store.append("src", b"abc")
        names = (f"f{i}" for i in range(100))
        other = next(n for n in names if store.container_of(n) != store.container_of("src"))
        same = next(n for n in names if store.container_of(n) == store.container_of("src"))
        with pytest.raises(InvalidArgument):
            store.fork("src", other)
        store.flush()
        store.fork("src", same)
        store.append("src", b"-src")
        store.append(same, b"-fork")
        store.flush()
        assert whole(store, same) == b"abc-fork" and whole(store, "src") == b"abc-src"
    finally:
        store.close()
