"""Layouts through a container: recovered from Tier 1, fenced against lost updates, exported, imported."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from engine import SegmentExists, SegmentNotFound
from engine.metadata import operations as ops
from engine.naming import layout_key
from engine.tier2.chunked_segment_storage import ChunkRef
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import Node, logged_operations, small_settings

# Replayed: layouts come back from the UpdateLayout operations left in Tier 1.
# Checkpointed: Tier 1 is truncated, layouts come back from the newest checkpoint.
MODES = {
    "replayed": {"flush_threshold_ms": 60_000, "flush_threshold_bytes": 1 << 20},
    "checkpointed": {"checkpoint_every_bytes": 1},
}
BINDINGS: dict[str, Callable[[], MemoryChunkStorage]] = {
    "append": MemoryChunkStorage,
    "no append": lambda: MemoryChunkStorage(supports_append=False),
}


def layouts(node: Node) -> dict[str, tuple[list[ChunkRef], int, int]]:
    """Every live segment's layout, storage length and start offset."""
    with node.container.metadata.lock:
        return {
            seg.name: (list(seg.chunks), seg.storage_length, seg.start_offset)
            for seg in node.container.metadata.segments.values()
            if not seg.deleted
        }


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_restart_recovers_layouts_and_storage_lengths_exactly(
    make_node: Callable[..., Node], mode: str, binding: str
) -> None:
    node = make_node(storage=BINDINGS[binding](), defrag_min_chunks=6, **MODES[mode])
    data = {"a": bytearray(), "b/c": bytearray(), "tiny": bytearray()}
    node.store.create("a", rollover_bytes=700)
    node.store.create("b/c")
    node.store.create("tiny")
    for round_ in range(8):
        for name in ("a", "b/c"):
            piece = os.urandom(300 + 50 * round_)
            node.store.append(name, piece)
            data[name] += piece
        node.store.flush()
    node.store.append("tiny", b"t")
    data["tiny"] += b"t"
    node.store.truncate("a", 1000)
    node.store.flush()
    flushed = len(data["b/c"])
    if mode == "replayed":
        node.store.append("b/c", b"unflushed")  # in Tier 1 and the cache only
        data["b/c"] += b"unflushed"
    if mode == "checkpointed":
        node.truncate_tier1()
        kept = {op.name for op in logged_operations(node.data_log) if isinstance(op, ops.UpdateLayout)}
        assert not kept & {"a", "tiny"}
    else:
        assert {op.name for op in logged_operations(node.data_log) if isinstance(op, ops.UpdateLayout)} >= {
            "a",
            "b/c",
            "tiny",
        }
    before = layouts(node)
    assert len(before["a"][0]) > 1 and before["a"][2] == 1000 and before["a"][0][0].start <= 1000
    assert before["b/c"][1] == flushed and before["tiny"][1] == 1
    referenced = {c.name for chunks, _, _ in before.values() for c in chunks}
    assert referenced <= set(node.storage.chunks)

    node.restart()
    assert layouts(node) == before
    assert referenced <= set(node.storage.chunks)
    node.evict_all()
    for name, expected in data.items():
        start = node.store.info(name).start_offset
        assert node.store.read(name, start, len(expected)).data == bytes(expected[start:]), name
    node.store.flush()
    node.restart()
    node.evict_all()
    assert node.store.read("b/c", 0, len(data["b/c"])).data == bytes(data["b/c"])


def fail_tier1_after(node: Node, monkeypatch: pytest.MonkeyPatch, operation: str, writes: int) -> list[str]:
    """After the first Tier 2 ``operation`` lands, the next ``writes`` Tier 1 writes fail.

    The Tier 1 write that follows a chunk write is its UpdateLayout (nothing
    else is logged meanwhile), so the chunk lands and its layout does not.
    Returns the chunks that ``operation`` touched while Tier 1 was failing.
    """
    touched: list[str] = []
    original = getattr(node.storage, operation)

    def landed(*args: object) -> object:
        result = original(*args)
        name = args[0] if isinstance(args[0], str) else args[0].name  # type: ignore[attr-defined]
        if not touched:
            node.data_log.fail_writes = writes
        if node.data_log.fail_writes:
            touched.append(name)
        return result

    monkeypatch.setattr(node.storage, operation, landed)
    return touched


def test_chunk_without_its_layout_update_is_ignored_and_collected_at_the_next_start(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    orphans = fail_tier1_after(node, monkeypatch, "create", 1)
    node.store.append("s", b"first")
    node.store.flush()  # the writer retries: the failed UpdateLayout's chunk is left behind
    assert node.metric("segstore_tier2_errors_total") == 1
    [orphan] = orphans
    layout = node.layout("s")
    assert orphan not in {c.name for c in layout} and orphan in node.storage.chunks
    assert node.tier2_bytes("s") == b"first"
    node.storage.chunks[orphan][:] = b"wrong"  # reads never look at it
    node.evict_all()
    assert node.store.read("s").data == b"first"
    node.restart()
    assert orphan not in node.storage.chunks
    assert node.layout("s") == layout and set(node.storage.chunks) == {c.name for c in layout}
    node.evict_all()
    assert node.store.read("s").data == b"first"


def test_bytes_appended_without_their_layout_update_never_show(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    node.store.append("s", b"first")
    node.store.flush()
    [chunk] = node.layout("s")
    grown = fail_tier1_after(node, monkeypatch, "write", 1)
    node.store.append("s", b"second")
    node.store.flush()  # the append to the chunk landed, its UpdateLayout failed: a new chunk follows
    assert grown == [chunk.name]
    layout = node.layout("s")
    assert layout[0] == chunk and len(layout) == 2 and layout[1].start == 5
    assert bytes(node.storage.chunks[chunk.name]) == b"firstsecond"  # more than the layout records
    node.evict_all()
    assert node.store.read("s").data == b"firstsecond"
    node.restart()
    assert node.layout("s") == layout
    node.store.append("s", b"third")
    node.store.flush()
    node.evict_all()
    assert node.store.read("s").data == b"firstsecondthird"


@pytest.mark.parametrize("binding", BINDINGS)
def test_crash_between_a_chunk_write_and_its_layout_update(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch, binding: str
) -> None:
    node = make_node(storage=BINDINGS[binding](), flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    node.store.append("s", b"durable")
    node.store.flush()
    layout = node.layout("s")
    operation = "write" if node.storage.supports_append else "create"
    landed = fail_tier1_after(node, monkeypatch, operation, 1_000_000)  # then Tier 1 fails for good
    node.store.append("s", b" and acknowledged")
    with pytest.raises(TimeoutError):
        node.store.flush(timeout_s=0.5)  # the chunk write lands, its UpdateLayout never does
    assert landed
    node.store.close()  # the process dies
    monkeypatch.undo()
    assert sum(map(len, node.storage.chunks.values())) > sum(c.length for c in layout)  # unrecorded bytes
    node.restart()
    assert node.layout("s") == layout
    assert set(node.storage.chunks) == {c.name for c in layout}  # every chunk without a layout is gone
    node.evict_all()
    assert node.store.read("s").data == b"durable and acknowledged"
    node.store.flush()
    assert node.layout("s")[:1] == layout
    assert set(node.storage.chunks) == {c.name for c in node.layout("s")}
    node.evict_all()
    assert node.store.read("s").data == b"durable and acknowledged"


def test_export_then_import_into_a_fresh_node_on_the_same_tier2(make_node: Callable[..., Node]) -> None:
    source = make_node(storage=MemoryChunkStorage(supports_append=False))
    source.store.create("a/b", rollover_bytes=1000)
    data = os.urandom(2500)
    for i in range(0, len(data), 500):
        source.store.append("a/b", data[i : i + 500])
        source.store.flush()
    source.store.append("a/b", b"+tail")  # export flushes first
    data += b"+tail"
    source.restart()  # chunks of two epochs
    key = source.store.export_layout("a/b")
    assert key == layout_key("a/b") and source.storage.exists(key)
    chunks = source.layout("a/b")
    assert chunks[-1].end == len(data)
    source.store.close()

    fresh = Node(small_settings(), storage=source.storage).start()
    try:
        with pytest.raises(SegmentNotFound):
            fresh.store.import_segment("never/exported")
        info = fresh.store.import_segment("a/b")
        assert (info.length, info.storage_length, info.start_offset) == (len(data), len(data), 0)
        assert fresh.layout("a/b") == chunks
        assert fresh.store.read("a/b", 0, len(data)).data == data
        with pytest.raises(SegmentExists):
            fresh.store.import_segment("a/b")
        fresh.store.append("a/b", b"more")
        fresh.store.flush()
        assert fresh.layout("a/b")[: len(chunks)] == chunks  # the imported chunks are not written to
        assert all(len(fresh.storage.chunks[c.name]) == c.length for c in chunks)
        fresh.restart()  # a new epoch: the imported chunks are referenced, so they stay
        fresh.evict_all()
        assert fresh.store.read("a/b", 0, len(data) + 4).data == data + b"more"
        assert {c.name for c in chunks} <= set(fresh.storage.chunks)
    finally:
        fresh.close()


def test_import_without_an_exported_layout_is_not_found(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"never exported")
    node.store.flush()
    node.store.delete("s")
    with pytest.raises(SegmentNotFound):
        node.store.import_segment("s")
    with pytest.raises(SegmentNotFound):
        node.store.info("s")


def test_import_of_a_truncated_segment_keeps_its_start_offset(make_node: Callable[..., Node]) -> None:
    source = make_node()
    source.store.create("s", rollover_bytes=100)
    data = os.urandom(500)
    source.store.append("s", data)
    source.store.truncate("s", 250)
    source.store.export_layout("s")
    assert [c.start for c in source.layout("s")] == [200, 300, 400]
    source.store.close()

    fresh = Node(small_settings(), storage=source.storage).start()
    try:
        info = fresh.store.import_segment("s")
        assert (info.start_offset, info.length) == (250, 500)  # bytes below 250 were truncated away
        assert fresh.store.read("s").data == data[250:]
    finally:
        fresh.close()
