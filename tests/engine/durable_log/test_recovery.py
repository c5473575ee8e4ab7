"""Recovery: state survives restarts at any point, epochs grow, damaged stores refuse to start."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine import (
    AttributeUpdate,
    AttributeUpdateType,
    BadOffset,
    ContainerNotReady,
    DataCorrupted,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
)
from engine.durable_log.frames import encode_batch
from engine.metadata import operations as ops
from engine.naming import chunk_name, layout_key, parse_chunk_name, parse_log_file_name, tier1_dir
from tests.engine.conftest import Node, logged_operations, small_settings

W1, W2 = uuid.UUID(int=11), uuid.UUID(int=12)
K1, K2 = uuid.UUID(int=21), uuid.UUID(int=22)

# Replayed: nothing reaches Tier 2, every restart replays Tier 1.
# Truncated: everything is flushed and Tier 1 truncated before each restart.
MODES = {
    "replayed": {"flush_threshold_ms": 60_000, "flush_threshold_bytes": 1 << 20},
    # ... and every attribute value in the index is evicted from memory.
    "truncated": {"checkpoint_every_bytes": 1, "attribute_cache_max_bytes": 0},
}


TICK = "tick"  # a segment whose appends make Tier 1 log checkpoints; not part of the state


def state(store: SegmentStore) -> dict[str, Any]:
    """Everything a client can observe about every segment (the flush progress aside)."""
    segments, _ = store.list(limit=1000)
    return {
        info.name: (
            dataclasses.replace(info, storage_length=0),
            store.read(info.name, info.start_offset, info.length).data,
            store.writer_event_number(info.name, W1),
            store.writer_event_number(info.name, W2),
            store.get_attributes(info.name, [K1, K2]),
        )
        for info in segments
        if info.name != TICK
    }


def settle(node: Node, mode: str) -> None:
    if mode == "truncated":
        node.truncate_tier1(TICK)
        tick_id = node.store.info(TICK).segment_id
        appends = [op for op in logged_operations(node.data_log) if isinstance(op, ops.Append)]
        assert all(op.segment_id == tick_id for op in appends)


STEPS: list[tuple[str, Callable[[SegmentStore], object]]] = [
    ("create", lambda s: (s.create("a"), s.create("b/c"), s.create("d"))),
    ("appends", lambda s: [s.append("a", os.urandom(300), writer_id=W1, event_number=i) for i in range(5)]),
    ("events", lambda s: s.append("b/c", b"xyz" * 50, writer_id=W2, event_number=9, event_count=3)),
    ("seal", lambda s: s.seal("b/c")),
    ("truncate", lambda s: s.truncate("a", 700)),
    ("attributes", lambda s: s.update_attributes("a", [_set(K1, 5), _set(K2, -1)])),
    ("attributes again", lambda s: s.append("a", b"!", attributes=[_add(K1, 2)])),
    ("delete", lambda s: s.delete("d")),
    ("recreate", lambda s: (s.create("d"), s.append("d", b"second life"))),
    ("more", lambda s: s.append("a", os.urandom(5000))),
    ("transaction", lambda s: _commit(s, "a", os.urandom(3000))),
    ("merge", lambda s: (s.create("m"), s.append("m", os.urandom(2000)), s.seal("m"), s.merge("d", "m"))),
    ("fork", lambda s: (s.fork("a", "f", 1500), s.fork("b/c", "g", 100))),
    ("forks diverge", lambda s: (s.append("f", b"f"), s.append("g", b"g"), s.append("a", b"a"))),
    ("fork's source deleted", lambda s: s.delete("b/c")),
]


def _set(key: uuid.UUID, value: int) -> AttributeUpdate:
    return AttributeUpdate(key, AttributeUpdateType.REPLACE, value)


def _add(key: uuid.UUID, value: int) -> AttributeUpdate:
    return AttributeUpdate(key, AttributeUpdateType.ACCUMULATE, value)


def _commit(store: SegmentStore, parent: str, data: bytes) -> None:
    txid = store.open_transaction(parent)
    store.append_transaction(parent, txid, data, writer_id=W2, event_number=1)
    store.commit_transaction(parent, txid)


@pytest.mark.parametrize("mode", MODES)
def test_state_survives_a_restart_after_every_step(make_node: Callable[..., Node], mode: str) -> None:
    node = make_node(**MODES[mode])
    for step, action in STEPS:
        action(node.store)
        settle(node, mode)
        expected = state(node.store)
        node.restart()
        assert state(node.store) == expected, step
    assert node.store.info("d").segment_id != 3  # the first "d" was segment 3
    if mode == "truncated":  # the attributes came from the index, not from memory
        with node.container.metadata.lock:
            seg = node.container.metadata.by_name("a")
            assert seg.attribute_root is not None and str(K1) not in seg.attributes
    assert node.store.append("a", b"!", writer_id=W1, event_number=4).duplicate
    with pytest.raises(SegmentNotFound):
        node.store.info("never")


@pytest.mark.parametrize("mode", MODES)
def test_epoch_grows_by_one_on_every_start(make_node: Callable[..., Node], mode: str) -> None:
    node = make_node(**MODES[mode])
    node.store.create("s")
    epochs = [node.container.metadata.epoch]
    for i in range(4):
        node.store.append("s", b"x" * (i + 1))
        settle(node, mode)
        node.restart()
        epochs.append(node.container.metadata.epoch)
    assert epochs == [1, 2, 3, 4, 5]


def test_sequence_numbers_strictly_increase_across_restarts(make_node: Callable[..., Node]) -> None:
    node = make_node(**MODES["replayed"])
    node.store.create("s")
    node.store.append("s", b"x")  # unflushed: Tier 1 keeps every write from here on
    for _ in range(3):
        node.restart()
    node.store.append("s", b"y")
    seqs = [op.seq for op in logged_operations(node.data_log)]
    assert seqs == sorted(set(seqs)), seqs


def test_torn_tail_of_the_memory_log_is_dropped(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"acked")
    torn, _ = encode_batch(b"never acknowledged", 10_000, node.settings.max_frame_bytes)
    node.store.close()
    node.data_log.writes.append(torn[:-3])
    node.restart()
    assert node.store.read("s").data == b"acked"
    node.store.append("s", b"!")
    assert node.store.read("s").data == b"acked!"


def test_store_is_not_ready_until_recovered(make_node: Callable[..., Node]) -> None:
    node = make_node()
    node.store.create("s")
    node.restart(wait=False, hold_tier1=True)
    assert not node.store.ready
    with pytest.raises(ContainerNotReady):
        node.store.wait_ready(0.01)
    with pytest.raises(ContainerNotReady):
        node.store.append("s", b"x")
    with pytest.raises(ContainerNotReady):
        node.store.read("s")
    node.data_log.gate.set()
    node.store.wait_ready(5)
    assert node.store.ready and node.store.failure is None
    node.store.append("s", b"x")


@pytest.mark.parametrize("mode", MODES)
def test_late_bytes_past_a_chunks_recorded_length_never_show(
    make_node: Callable[..., Node], mode: str
) -> None:
    """Failover: an older epoch's write lands after its layout was recorded, before and after a restart."""
    node = make_node(**MODES[mode])
    node.store.create("s")
    node.store.append("s", b"abc")
    node.store.flush()
    settle(node, mode)
    [chunk] = node.layout("s")
    node.store.close()
    node.storage.write(node.storage.open_write(chunk.name), 3, b"late")  # while no one owns the container
    node.restart()
    assert node.layout("s") == [chunk]
    assert node.store.info("s").length == node.store.info("s").storage_length == 3
    node.evict_all()
    assert node.store.read("s").data == b"abc"
    node.storage.write(node.storage.open_write(chunk.name), 7, b"later")  # after the new epoch started
    node.store.append("s", b"def")
    node.store.flush()
    layout = node.layout("s")
    assert layout[0] == chunk and len(layout) == 2  # the new epoch writes a chunk of its own
    assert parse_chunk_name(layout[1].name).epoch == node.container.metadata.epoch  # type: ignore[union-attr]
    assert node.storage.chunks[chunk.name] == b"abclatelater"
    node.evict_all()
    assert node.store.read("s").data == b"abcdef"
    settle(node, mode)
    node.restart()
    node.evict_all()
    assert node.store.read("s").data == b"abcdef"
    assert node.tier2_bytes("s") == b"abcdef"


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_chunk_named_by_the_layout_but_lost_in_tier2_fails_reads(
    make_node: Callable[..., Node], damage: str
) -> None:
    node = make_node(**MODES["truncated"], storage_read_block_bytes=5, read_ahead_bytes=0)
    node.store.create("s", rollover_bytes=5)
    node.store.append("s", b"0123456789")
    settle(node, "truncated")
    _first, second = node.layout("s")
    node.store.close()
    if damage == "missing":
        node.storage.delete(second.name)
    else:
        node.storage.chunks[second.name] = bytearray(b"56")  # Tier 2 lost bytes
    node.restart()  # the layout comes from Tier 1; Tier 2 is not listed chunk by chunk
    node.evict_all()
    assert node.store.read("s", 0, 5).data == b"01234"
    with pytest.raises(DataCorrupted):
        node.store.read("s", 5, 5)
    with pytest.raises(DataCorrupted):
        node.store.read("s")
    assert node.store.info("s").length == 10  # the segment is still there, its bytes are not


def test_unreferenced_chunks_of_older_epochs_are_collected_at_start(make_node: Callable[..., Node]) -> None:
    node = make_node()
    node.store.create("s", rollover_bytes=4)
    node.store.append("s", b"0123456789")
    node.store.create("backup")
    node.store.append("backup", b"saved")
    exported = node.store.export_layout("backup")
    assert exported == layout_key("backup")
    node.store.delete("backup")  # its exported layout stays; its chunks go with it
    node.store.flush()
    seg_id, epoch = node.store.info("s").segment_id, node.container.metadata.epoch
    referenced = {c.name for c in node.layout("s")}
    assert len(referenced) == 3
    orphans = {  # writes whose layout never became durable, of this epoch and an older one
        chunk_name(0, "s", seg_id, epoch, 10),
        chunk_name(0, "s", seg_id, epoch - 1 if epoch > 1 else 0, 0),
        chunk_name(0, "gone", 99, epoch, 0),
    }
    foreign = {chunk_name(1, "s", seg_id, 0, 0), "not/a/chunk"}  # another container's, and not a chunk at all
    for name in orphans | foreign:
        node.storage.create(name, b"junk")
    node.restart()
    assert set(node.storage.chunks) == referenced | foreign | {exported}
    assert node.layout("s") == sorted(node.layout("s"), key=lambda c: c.start)
    assert {c.name for c in node.layout("s")} == referenced
    node.evict_all()
    assert node.store.read("s").data == b"0123456789"
    current = chunk_name(0, "s", seg_id, node.container.metadata.epoch, 10)
    node.storage.create(current, b"junk")
    node.store.append("s", b"!")
    node.store.flush()
    assert node.storage.exists(current)  # the running epoch's own chunks are never collected
    node.restart()
    assert not node.storage.exists(current) and node.storage.exists(exported)


def test_file_store_recovers_after_a_torn_write(tmp_path: Path) -> None:
    settings = small_settings(tmp_path)
    store = SegmentStore(settings)
    store.start(wait=True)
    store.create("s")
    store.append("s", b"acked")
    store.close()
    folder = tier1_dir(tmp_path, 0)
    newest = max(folder.iterdir(), key=lambda p: parse_log_file_name(p.name) or -1)
    with open(newest, "ab") as fh:
        fh.write(b"\x00\x00\x00\x40torn")
    store = SegmentStore(settings)
    store.start(wait=True)
    try:
        assert store.read("s").data == b"acked"
        store.append("s", b"!")
    finally:
        store.close()
    store = SegmentStore(settings)
    store.start(wait=True)
    try:
        assert store.read("s").data == b"acked!"
    finally:
        store.close()


def test_file_store_with_a_corrupt_older_log_file_does_not_start(tmp_path: Path) -> None:
    settings = small_settings(tmp_path, tier1_file_bytes=1, flush_threshold_ms=60_000)
    store = SegmentStore(settings)
    store.start(wait=True)
    store.create("s")
    store.append("s", b"x" * 100)
    store.close()
    oldest = min(tier1_dir(tmp_path, 0).iterdir(), key=lambda p: parse_log_file_name(p.name) or -1)
    data = bytearray(oldest.read_bytes())
    data[-1] ^= 1
    oldest.write_bytes(data)
    store = SegmentStore(settings)
    store.start()
    try:
        with pytest.raises(ContainerNotReady) as info:
            store.wait_ready(5)
        assert isinstance(info.value.__cause__, DataCorrupted)
    finally:
        store.close()


NAMES = st.sampled_from(["a", "b/c", "d é"])


class SegmentModel:
    def __init__(self) -> None:
        self.data = bytearray()
        self.start = 0
        self.sealed = False
        self.events = 0
        self.last_event: int | None = None


class StoreMachine(RuleBasedStateMachine):
    """Random requests, flushes and restarts against a plain model of the segments."""

    def __init__(self) -> None:
        super().__init__()
        self.node = Node(
            small_settings(
                checkpoint_every_bytes=300,
                flush_threshold_ms=5,
                flush_threshold_bytes=500,
                cache_max_bytes=1024,
                cache_block_bytes=128,
            )
        ).start()
        self.model: dict[str, SegmentModel] = {}

    @property
    def store(self) -> SegmentStore:
        return self.node.store

    @rule(name=NAMES)
    def create(self, name: str) -> None:
        if name in self.model:
            with pytest.raises(SegmentExists):
                self.store.create(name)
        else:
            self.store.create(name)
            self.model[name] = SegmentModel()

    @rule(name=NAMES, data=st.binary(min_size=1, max_size=400), event=st.none() | st.integers(0, 6))
    def append(self, name: str, data: bytes, event: int | None) -> None:
        seg = self.model.get(name)
        writer = None if event is None else W1
        if seg is None or seg.sealed:
            with pytest.raises(SegmentNotFound if seg is None else SegmentSealed):
                self.store.append(name, data, writer_id=writer, event_number=event)
            return
        result = self.store.append(name, data, writer_id=writer, event_number=event)
        if event is not None and seg.last_event is not None and event <= seg.last_event:
            assert result.duplicate and result.event_number == seg.last_event
            return
        assert result.offset == len(seg.data) and not result.duplicate
        seg.data += data
        seg.events += 1
        if event is not None:
            seg.last_event = event

    @rule(name=NAMES, fraction=st.floats(0, 1.2))
    def truncate(self, name: str, fraction: float) -> None:
        seg = self.model.get(name)
        if seg is None:
            return
        offset = int(len(seg.data) * fraction)
        if offset > len(seg.data):
            with pytest.raises(SegmentSealed if seg.sealed else BadOffset):
                self.store.truncate(name, offset)
            return
        self.store.truncate(name, offset)
        seg.start = max(seg.start, offset)

    @rule(name=NAMES)
    def seal(self, name: str) -> None:
        if name in self.model:
            self.store.seal(name)
            self.model[name].sealed = True

    @rule(name=NAMES)
    def delete(self, name: str) -> None:
        if name in self.model:
            self.store.delete(name)
            del self.model[name]
        else:
            with pytest.raises(SegmentNotFound):
                self.store.delete(name)

    @rule(source=NAMES, name=NAMES, fraction=st.floats(0, 1.2))
    def fork(self, source: str, name: str, fraction: float) -> None:
        seg = self.model.get(source)
        if seg is None or name in self.model:
            with pytest.raises(SegmentNotFound if seg is None else SegmentExists):
                self.store.fork(source, name)
            return
        offset = seg.start + int((len(seg.data) - seg.start) * fraction)
        if offset > len(seg.data):
            with pytest.raises(BadOffset):
                self.store.fork(source, name, offset)
            return
        self.store.fork(source, name, offset)
        fork = self.model[name] = SegmentModel()
        fork.data, fork.start = seg.data[:offset], seg.start

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @rule()
    def restart(self) -> None:
        self.node.restart()

    @rule(name=NAMES, at=st.floats(0, 1), length=st.integers(1, 2000))
    def read(self, name: str, at: float, length: int) -> None:
        seg = self.model.get(name)
        if seg is None:
            return
        offset = seg.start + int((len(seg.data) - seg.start) * at)
        assert self.store.read(name, offset, length).data == bytes(seg.data[offset : offset + length])

    @invariant()
    def segments_match(self) -> None:
        infos = {info.name: info for info in self.store.list()[0]}
        assert set(infos) == set(self.model)
        for name, seg in self.model.items():
            info = infos[name]
            assert (info.length, info.start_offset, info.sealed, info.event_count) == (
                len(seg.data),
                seg.start,
                seg.sealed,
                seg.events,
            )
            assert info.start_offset <= info.length and info.storage_length <= info.length
            assert self.store.writer_event_number(name, W1) == seg.last_event

    def teardown(self) -> None:
        self.node.close()


StoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_store_matches_a_model_across_restarts = StoreMachine.TestCase
