"""Storage writer: flush triggers, Tier 2 retries, Tier 1 truncation, layouts, chunks of dropped data."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import ContainerNotReady, SegmentStore
from engine.metadata import operations as ops
from engine.naming import parse_chunk_name, parse_log_file_name, tier1_dir
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage
from engine.tier2.local import LocalChunkStorage
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import Node, leads_with_checkpoint, logged_operations, small_settings
from tests.polling import wait_until

W = uuid.UUID(int=3)


def writer_rounds(node: Node, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the storage writer's completed rounds (read, flush what is due, truncate)."""
    writer = node.container.storage_writer
    original = writer._after_round
    count = [0]

    def after_round() -> None:
        original()
        count[0] += 1

    monkeypatch.setattr(writer, "_after_round", after_round)
    return lambda: count[0]


def test_flush_by_size(make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1000)
    rounds = writer_rounds(node, monkeypatch)
    node.store.create("s")
    node.store.append("s", b"a" * 999)
    seq = node.container.metadata.seq
    wait_until(lambda: node.container.storage_writer._last_seq >= seq, what="the writer to read the append")
    seen = rounds()
    wait_until(lambda: rounds() >= seen + 2, what="a full writer round after it")
    assert node.store.info("s").storage_length == 0
    node.store.append("s", b"b")
    wait_until(lambda: node.store.info("s").storage_length == 1000, what="the size flush")
    assert node.tier2_bytes("s") == b"a" * 999 + b"b"


def test_flush_by_age(make_node: Callable[..., Node]) -> None:
    node = make_node(flush_threshold_ms=100, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    started = time.monotonic()
    node.store.append("s", b"young")
    wait_until(lambda: node.store.info("s").storage_length == 5, what="the age flush")
    assert time.monotonic() - started >= 0.1
    assert node.tier2_bytes("s") == b"young"


@pytest.mark.parametrize(
    "faults",
    [
        {"create": 1, "write": 1},  # refused before anything landed
        {"create": 2},
        {"write": 2},
    ],
    ids=["create and write fail", "creates fail", "writes fail"],
)
def test_tier2_failures_are_retried_and_nothing_is_lost(
    make_node: Callable[..., Node], faults: dict[str, int]
) -> None:
    node = make_node(flush_threshold_bytes=1000)
    node.store.create("s")
    for operation, count in faults.items():
        node.faults.fail(operation, count)
    data = os.urandom(5000)
    for i in range(0, len(data), 250):
        node.store.append("s", data[i : i + 250])
    node.store.flush()
    assert node.metric("segstore_tier2_errors_total") == 2
    assert node.tier2_bytes("s") == data
    assert node.store.info("s").storage_length == len(data)
    node.restart()
    assert node.store.read("s", 0, len(data)).data == data


@pytest.mark.parametrize("operation", ["create", "write"])
def test_tier2_write_that_landed_but_failed_is_retried_without_its_bytes_showing(
    make_node: Callable[..., Node], operation: str
) -> None:
    node = make_node(flush_threshold_bytes=1000)
    node.store.create("s")
    node.faults.fail_after_landing(operation)
    data = os.urandom(5000)
    for i in range(0, len(data), 250):
        node.store.append("s", data[i : i + 250])
    node.store.flush()
    assert node.metric("segstore_tier2_errors_total") == 1
    assert node.tier2_bytes("s") == data
    layout = node.layout("s")
    assert layout[0].start == 0 and layout[-1].end == len(data) == node.store.info("s").storage_length
    node.evict_all()
    assert node.store.read("s", 0, len(data)).data == data
    node.restart()
    node.evict_all()
    assert node.store.read("s", 0, len(data)).data == data
    assert node.layout("s") == layout


def test_replayed_appends_already_in_tier2_are_not_written_again(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"once")
    node.store.flush()
    layout = node.layout("s")
    written = node.faults.calls["create"] + node.faults.calls["write"]
    node.restart()  # the log still holds the append: it is replayed
    node.store.flush()
    assert node.faults.calls["create"] + node.faults.calls["write"] == written
    assert node.layout("s") == layout
    assert node.tier2_bytes("s") == b"once"
    assert set(node.storage.chunks) == {c.name for c in layout}


def test_seal_reaches_storage(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"abc")
    node.store.seal("s")
    node.store.flush()
    seg = node.container.metadata.segments[node.store.info("s").segment_id]
    assert seg.sealed_in_storage and seg.storage_length == 3


def test_flush_returns_after_a_failed_tier1_write(node: Node) -> None:
    node.store.create("s")
    node.data_log.fail_writes = 1
    with pytest.raises(ContainerNotReady):
        node.store.append("s", b"never")
    node.store.flush(timeout_s=1)


def test_tier1_is_truncated_and_a_restart_recovers_from_checkpoint_and_tier2(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(checkpoint_every_bytes=1)
    store = node.store
    store.create("s")
    store.create("t")
    store.create("gone")
    data = os.urandom(3000)
    for event in range(30):
        store.append("s", data[event * 100 : (event + 1) * 100], writer_id=W, event_number=event)
    store.append("t", b"0123456789", event_count=4)
    store.truncate("t", 3)
    store.seal("t")
    store.append("gone", b"bye")
    store.flush()
    assert node.tier2_bytes("gone") == b"bye"
    gone_chunks = {c.name for c in node.layout("gone")}
    store.delete("gone")
    node.truncate_tier1("marker")
    marker_id = store.info("marker").segment_id
    appends = [op for op in logged_operations(node.data_log) if isinstance(op, ops.Append)]
    assert all(op.segment_id == marker_id for op in appends)
    assert gone_chunks and not gone_chunks & set(node.storage.chunks)
    before = {name: store.info(name) for name in ("s", "t", "marker")}
    layouts = {name: node.layout(name) for name in before}

    node.restart()
    store = node.store
    assert {name: store.info(name) for name in before} == before
    assert {name: node.layout(name) for name in before} == layouts
    assert store.read("s", 0, 5000).data == data
    assert store.read("t").data == b"3456789"
    assert store.writer_event_number("s", W) == 29
    retried = store.append("s", b"again", writer_id=W, event_number=29)
    assert retried.duplicate and store.info("s").length == 3000
    assert store.append("s", b"next", writer_id=W, event_number=30).offset == 3000
    assert store.list()[0] == [before["marker"], store.info("s"), before["t"]]


def test_deleted_segment_chunks_are_removed_when_the_delete_is_only_in_a_checkpoint(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(checkpoint_every_bytes=1)
    node.store.create("gone", rollover_bytes=3)
    node.store.append("gone", b"data")
    node.store.flush()
    gone_chunks = {c.name for c in node.layout("gone")}
    assert len(gone_chunks) == 2 and gone_chunks <= set(node.storage.chunks)

    node.faults.outage("delete")  # the writer cannot remove the chunks ...
    node.store.delete("gone")
    for i in range(10):  # ... then a checkpoint that knows it is deleted is logged
        node.store.create(f"other-{i}")  # (no data: dropping Tier 1 before it loses nothing)
        if leads_with_checkpoint(node.data_log.writes[-1]):
            break
    node.container.durable_log.truncate(node.container.metadata.seq + 1)
    assert not any(isinstance(op, ops.Delete) for op in logged_operations(node.data_log))
    node.store.close()
    assert gone_chunks <= set(node.storage.chunks)
    node.faults.end_outage()
    node.restart()
    node.store.flush()
    assert not gone_chunks & set(node.storage.chunks)
    assert all(not seg.deleted for seg in node.container.metadata.segments.values())


def log_files(data_dir: Path) -> list[Path]:
    folder = tier1_dir(data_dir, 0)
    return [p for p in folder.iterdir() if parse_log_file_name(p.name) is not None]


def test_file_log_files_are_deleted_after_flushes(tmp_path: Path) -> None:
    settings = small_settings(
        tmp_path, tier1_file_bytes=2048, checkpoint_every_bytes=1, flush_threshold_ms=60_000
    )
    store = SegmentStore(settings)
    store.start(wait=True)
    store.create("s")
    data = os.urandom(40_000)
    for i in range(0, len(data), 400):
        store.append("s", data[i : i + 400])
    assert len(log_files(tmp_path)) >= 10
    store.flush()
    store.create("marker")
    store.flush()
    wait_until(lambda: len(log_files(tmp_path)) <= 2, what="Tier 1 files to be deleted")
    chunks = store._containers[0].metadata.by_name("s").chunks
    assert ChunkedSegmentStorage(LocalChunkStorage(tmp_path / "tier2"), 0).read(chunks, 0, len(data)) == data
    store.close()
    again = SegmentStore(settings)
    again.start(wait=True)
    try:
        assert again.read("s", 0, len(data)).data == data
        assert again.info("marker").length == 0
    finally:
        again.close()


def test_truncate_past_whole_chunks_drops_them_from_the_layout_and_from_tier2(
    make_node: Callable[..., Node],
) -> None:
    node = make_node()
    node.store.create("s", rollover_bytes=100)
    data = os.urandom(500)
    node.store.append("s", data)
    node.store.flush()
    layout = node.layout("s")
    assert [(c.start, c.length) for c in layout] == [(start, 100) for start in range(0, 500, 100)]
    node.store.truncate("s", 250)
    node.store.flush()
    assert node.layout("s") == layout[2:]  # [200, 300) holds the start offset: it stays
    assert not {c.name for c in layout[:2]} & set(node.storage.chunks)
    assert {c.name for c in layout[2:]} <= set(node.storage.chunks)
    assert node.metric("segstore_tier2_chunks_deleted_total") == 2
    dropped = [
        op
        for op in logged_operations(node.data_log)
        if isinstance(op, ops.UpdateLayout) and op.chunks == [list(c) for c in layout[2:]]
    ]
    assert len(dropped) == 1 and dropped[0].storage_length == 500  # the change is in Tier 1
    node.restart()
    assert node.layout("s") == layout[2:]
    node.evict_all()
    assert node.store.read("s").data == data[250:]
    node.store.truncate("s", 500)  # every chunk is below the start offset now
    node.store.flush()
    assert node.layout("s") == [] and not {c.name for c in layout} & set(node.storage.chunks)
    info = node.store.info("s")
    assert (info.start_offset, info.storage_length, info.length) == (500, 500, 500)
    node.store.append("s", b"after")
    node.store.flush()
    node.restart()
    node.evict_all()
    assert node.store.read("s").data == b"after"
    assert [(c.start, c.length) for c in node.layout("s")] == [(500, 5)]


def test_all_chunks_of_a_deleted_segment_are_deleted(make_node: Callable[..., Node]) -> None:
    node = make_node()
    node.store.create("s", rollover_bytes=64)
    node.store.create("kept")
    for _ in range(5):
        node.store.append("s", os.urandom(100))
        node.store.append("kept", b"k")
        node.store.flush()
    seg_id = node.store.info("s").segment_id
    chunks = {c.name for c in node.layout("s")}
    assert len(chunks) >= 8 and chunks <= set(node.storage.chunks)
    node.store.delete("s")
    node.store.flush()
    assert set(node.storage.chunks) == {c.name for c in node.layout("kept")}
    assert seg_id not in node.container.metadata.segments
    node.restart()
    assert set(node.storage.chunks) == {c.name for c in node.layout("kept")}
    assert node.store.read("kept").data == b"k" * 5


def test_without_append_each_flush_writes_a_new_chunk_and_defrag_joins_small_runs(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(storage=MemoryChunkStorage(supports_append=False), defrag_min_chunks=4)
    node.store.create("s")
    pieces = [os.urandom(10 + i) for i in range(5)]
    layouts = []
    for piece in pieces[:4]:
        node.store.append("s", piece)
        node.store.flush()
        layouts.append(node.layout("s"))
    for before, after in zip([[], *layouts], layouts, strict=False):
        assert after[:-1] == before  # the earlier chunks are untouched ...
        assert after[-1].start == (before[-1].end if before else 0)  # ... and one new chunk follows
    assert [c.length for c in layouts[-1]] == [len(p) for p in pieces[:4]]
    assert set(node.storage.chunks) == {c.name for c in layouts[-1]}

    node.store.append("s", pieces[4])
    node.store.flush()  # 5 chunks, more than defrag_min_chunks: the first 4 (the last may grow) are joined
    layout = node.layout("s")
    assert len(layout) == 2 and (layout[1].start, layout[1].length) == (layouts[-1][-1].end, len(pieces[4]))
    assert (layout[0].start, layout[0].length) == (0, sum(len(p) for p in pieces[:4]))
    joined = parse_chunk_name(layout[0].name)
    assert joined is not None and joined.epoch == node.container.metadata.epoch
    assert node.tier2_bytes("s") == b"".join(pieces)
    assert set(node.storage.chunks) == {c.name for c in layout}  # the joined chunks are gone
    node.restart()
    assert node.layout("s") == layout
    node.evict_all()
    assert node.store.read("s").data == b"".join(pieces)


def test_a_flush_racing_delete_and_recreate_never_gives_its_chunks_to_the_new_segment(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    node.store.append("s", b"old bytes")
    old_id = node.store.info("s").segment_id
    in_create, release = threading.Event(), threading.Event()
    original = node.storage.create

    def create(name: str, data: bytes = b"") -> object:
        handle = original(name, data)
        if not in_create.is_set():
            in_create.set()
            release.wait(5)  # the chunk is written; its UpdateLayout is not submitted yet
        return handle

    monkeypatch.setattr(node.storage, "create", create)
    flusher = threading.Thread(target=node.store.flush)
    flusher.start()
    assert in_create.wait(5)
    node.store.delete("s")
    node.store.create("s")
    new = b"the new segment's own, longer bytes"
    node.store.append("s", new)
    assert node.store.info("s").segment_id != old_id
    release.set()
    flusher.join(10)
    node.store.flush()
    for chunk in node.layout("s"):
        parts = parse_chunk_name(chunk.name)
        assert parts is not None and parts.segment_id == node.store.info("s").segment_id, chunk
    assert node.tier2_bytes("s") == new
    node.evict_all()
    assert node.store.read("s").data == new
    node.restart()
    node.evict_all()
    assert node.store.read("s").data == new


@pytest.mark.parametrize(("small_bytes", "step"), [(1000, 2000), (5000, 5000)])
def test_a_large_backlog_is_flushed_in_steps_under_one_layout_commit(
    make_node: Callable[..., Node], small_bytes: int, step: int
) -> None:
    """Bytes leave the cache a step at a time, but one UpdateLayout covers them.

    A step is flush_threshold_bytes; without append (every step an object of
    its own) at least defrag_small_bytes, so defrag never copies them again.
    """
    node = make_node(
        storage=MemoryChunkStorage(supports_append=False),
        flush_threshold_ms=60_000,
        flush_threshold_bytes=1 << 20,
    )
    node.store.create("s")
    data = os.urandom(10_000)
    for i in range(0, len(data), 1000):
        node.store.append("s", data[i : i + 1000])
    node.container.settings = small_settings(
        flush_threshold_ms=60_000, flush_threshold_bytes=2000, defrag_small_bytes=small_bytes
    )
    node.container.storage_writer.settings = node.container.settings
    node.store.flush()
    layout = node.layout("s")
    assert [(c.start, c.length) for c in layout] == [(start, step) for start in range(0, 10_000, step)]
    updates = [op for op in logged_operations(node.data_log) if isinstance(op, ops.UpdateLayout)]
    assert len(updates) == 1 and updates[0].storage_length == 10_000
    node.restart()
    node.evict_all()
    assert node.store.read("s").data == data


@pytest.mark.parametrize("truncation", [True, False], ids=["cut back", "no truncation"])
def test_a_flush_overtaken_by_a_merge_leaves_no_chunk_bytes_its_layout_does_not_name(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    truncation: bool,
) -> None:  # fmt: skip
    """A flush writes the source's tail into its last chunk, then the source merges into the target
    before the flush's layout commits: the chunk now belongs to the target's layout, which names
    fewer bytes of it than it holds. Cut back, the target writes on in it; a binding that cannot
    cut leaves it alone and the target starts a chunk of its own. Never a BadChunkOffset."""
    node = make_node(
        storage=MemoryChunkStorage(supports_truncation=truncation),
        flush_threshold_ms=60_000,
        flush_threshold_bytes=1 << 20,
    )
    node.store.create("target")
    node.store.create("source")
    head, tail = os.urandom(1000), os.urandom(700)
    node.store.append("source", head)
    node.store.flush()
    node.store.append("source", tail)
    in_write, release = threading.Event(), threading.Event()
    original = node.storage.write

    def write(handle: Any, offset: int, data: bytes) -> int:
        length = original(handle, offset, data)
        if not in_write.is_set():
            in_write.set()
            release.wait(5)  # the tail is in the chunk; its UpdateLayout is not submitted yet
        return length

    monkeypatch.setattr(node.storage, "write", write)
    caplog.set_level(logging.INFO, logger="engine.tier2.chunked_segment_storage")
    flusher = threading.Thread(target=node.store.flush)
    flusher.start()
    assert in_write.wait(5)
    node.store.seal("source")
    node.store.merge("target", "source")
    release.set()
    flusher.join(10)
    node.store.flush()
    assert "unrecorded" not in caplog.text
    layout = node.layout("target")
    assert node.tier2_bytes("target") == head + tail
    if truncation:
        assert [(c.start, c.length) for c in layout] == [(0, 1700)]  # one chunk, written on
        assert all(node.storage.info(c.name).length == c.length for c in layout)
    else:
        assert [(c.start, c.length) for c in layout] == [(0, 1000), (1000, 700)]
    node.restart()
    node.evict_all()
    assert node.store.read("target").data == head + tail
