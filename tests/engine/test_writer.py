"""Storage writer: flush triggers, Tier 2 retries, Tier 1 truncation, deleted segments' objects."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import ContainerNotReady, SegmentStore
from engine import operations as ops
from engine.naming import parse_log_file_name, segment_object_key, tier1_dir
from tests.engine.conftest import Node, leads_with_checkpoint, logged_operations, small_settings, wait_until

W = uuid.UUID(int=3)


def key(node: Node, name: str) -> str:
    return segment_object_key(node.container_id, name, node.store.info(name).segment_id)


def writer_rounds(node: Node, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the storage writer's completed rounds (read, flush what is due, truncate)."""
    writer = node.container.writer
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
    wait_until(lambda: node.container.writer._last_seq >= seq, what="the writer to read the append")
    seen = rounds()
    wait_until(lambda: rounds() >= seen + 2, what="a full writer round after it")
    assert node.store.info("s").storage_length == 0
    node.store.append("s", b"b")
    wait_until(lambda: node.store.info("s").storage_length == 1000, what="the size flush")
    assert node.storage.objects[key(node, "s")] == b"a" * 999 + b"b"


def test_flush_by_age(make_node: Callable[..., Node]) -> None:
    node = make_node(flush_threshold_ms=100, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    started = time.monotonic()
    node.store.append("s", b"young")
    wait_until(lambda: node.store.info("s").storage_length == 5, what="the age flush")
    assert time.monotonic() - started >= 0.1
    assert node.storage.objects[key(node, "s")] == b"young"


def test_tier2_failures_are_retried_and_nothing_is_lost(make_node: Callable[..., Node]) -> None:
    node = make_node(flush_threshold_bytes=1000)
    node.store.create("s")
    node.storage.fail_writes = 2
    data = os.urandom(5000)
    for i in range(0, len(data), 250):
        node.store.append("s", data[i : i + 250])
    node.store.flush()
    assert node.metric("segstore_tier2_errors_total") == 2
    assert node.storage.objects[key(node, "s")] == data
    assert node.store.info("s").storage_length == len(data)
    node.restart()
    assert node.store.read("s", 0, len(data)).data == data


def test_replayed_appends_already_in_tier2_are_not_written_again(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"once")
    node.store.flush()
    writes = node.storage.writes
    node.restart()  # the log still holds the append: it is replayed
    node.store.flush()
    assert node.storage.writes == writes
    assert node.storage.objects[key(node, "s")] == b"once"


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
    gone_key = key(node, "gone")
    store.flush()
    assert node.storage.objects[gone_key] == b"bye"
    store.delete("gone")
    node.truncate_tier1("marker")
    marker_id = store.info("marker").segment_id
    appends = [op for op in logged_operations(node.data_log) if isinstance(op, ops.Append)]
    assert all(op.segment_id == marker_id for op in appends)
    assert gone_key not in node.storage.objects
    before = {name: store.info(name) for name in ("s", "t", "marker")}

    node.restart()
    store = node.store
    assert {name: store.info(name) for name in before} == before
    assert store.read("s", 0, 5000).data == data
    assert store.read("t").data == b"3456789"
    assert store.writer_event_number("s", W) == 29
    retried = store.append("s", b"again", writer_id=W, event_number=29)
    assert retried.duplicate and store.info("s").length == 3000
    assert store.append("s", b"next", writer_id=W, event_number=30).offset == 3000
    assert store.list()[0] == [before["marker"], store.info("s"), before["t"]]


def test_deleted_segment_object_is_removed_when_the_delete_is_only_in_a_checkpoint(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(checkpoint_every_bytes=1)
    node.store.create("gone")
    node.store.append("gone", b"data")
    node.store.flush()
    gone_key = key(node, "gone")
    assert gone_key in node.storage.objects

    def delete(key: str) -> None:
        raise OSError(5, "injected Tier 2 delete failure")

    monkeypatch.setattr(node.storage, "delete", delete)  # the writer cannot remove the object ...
    node.store.delete("gone")
    for i in range(10):  # ... then a checkpoint that knows it is deleted is logged
        node.store.create(f"other-{i}")  # (no data: dropping Tier 1 before it loses nothing)
        if leads_with_checkpoint(node.data_log.writes[-1]):
            break
    node.container.durable_log.truncate(node.container.metadata.seq + 1)
    assert not any(isinstance(op, ops.Delete) for op in logged_operations(node.data_log))
    node.store.close()
    monkeypatch.undo()
    node.restart()
    node.store.flush()
    assert gone_key not in node.storage.objects
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
    assert (tmp_path / "tier2" / segment_object_key(0, "s", 1)).read_bytes() == data
    store.close()
    again = SegmentStore(settings)
    again.start(wait=True)
    try:
        assert again.read("s", 0, len(data)).data == data
        assert again.info("marker").length == 0
    finally:
        again.close()
