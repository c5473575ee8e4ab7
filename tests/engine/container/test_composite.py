"""Composite operations: judged, logged, applied and answered as one; all or nothing after a crash."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable

import pytest

from engine import (
    AppendResult,
    AppendStep,
    AttributeUpdate,
    AttributeUpdateType,
    ConditionalCheckFailed,
    CreateStep,
    DeleteStep,
    InvalidArgument,
    MergeResult,
    MergeStep,
    SealStep,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
    TruncateStep,
    UpdateAttributesStep,
)
from engine.container.composite import results_from_json, results_to_json, steps_from_json, steps_to_json
from engine.durable_log import frames
from engine.metadata import operations as ops
from engine.naming import container_for
from engine.tier1.memory_log import MemoryDataLog
from tests.engine.conftest import HeldProcessor, Node, logged_operations

W = uuid.UUID(int=11)
KEY = uuid.UUID(int=12)


def whole(store: SegmentStore, name: str) -> bytes:
    info = store.info(name)
    data = bytearray()
    while info.start_offset + len(data) < info.length:
        data += store.read(name, info.start_offset + len(data)).data
    return bytes(data)


def replace_steps(store: SegmentStore, name: str, data: bytes) -> list:
    """An S3-style overwrite: the old segment out, a new one with ``data`` in, sealed."""
    return [
        DeleteStep(name, segment_id=store.info(name).segment_id),
        CreateStep(name),
        AppendStep(name, data),
        SealStep(name),
    ]


def _user_operations(write: bytes) -> list[ops.Operation]:
    """The operations of a Tier 1 write but the storage writer's and checkpoints."""
    decoded = [op for batch in frames.iter_batches(write) for op in ops.decode_all(batch.payload)]
    own = (ops.UpdateLayout, ops.UpdateAttributeIndex, ops.MetadataCheckpoint)
    return [op for op in decoded if not isinstance(op, own)]


def _holds_a_composite(write: bytes) -> bool:
    return any(isinstance(op, ops.Composite) for op in _user_operations(write))


# ------------------------------------------------------------------ semantics
def test_the_steps_are_one_log_entry_in_one_tier1_write(node: Node) -> None:
    store = node.store
    store.create("old")
    store.append("old", b"old bytes")
    writes = len(node.data_log.writes)
    store.composite(replace_steps(store, "old", b"new bytes"))
    later = [i for i, write in enumerate(node.data_log.writes[writes:]) if _user_operations(write)]
    assert len(later) == 1  # besides the storage writer's layout updates
    [entry] = [op for op in logged_operations(node.data_log) if isinstance(op, ops.Composite)]
    assert [type(p) for p in entry.parts] == [ops.Delete, ops.CreateSegment, ops.Append, ops.Seal]
    assert [p.seq for p in entry.parts] == list(range(entry.parts[0].seq, entry.seq + 1))
    assert whole(store, "old") == b"new bytes" and store.info("old").sealed


def test_a_refused_step_refuses_every_step(node: Node) -> None:
    store = node.store
    store.create("taken")
    store.create("kept")
    store.append("kept", b"kept")
    writes = len(node.data_log.writes)
    steps = [
        CreateStep("fresh"),
        AppendStep("fresh", b"never"),
        AppendStep("kept", b" never"),
        SealStep("kept"),
        CreateStep("taken"),
    ]
    with pytest.raises(SegmentExists) as refused:
        store.composite(steps)
    assert refused.value.step == 4
    assert len(node.data_log.writes) == writes
    with pytest.raises(SegmentNotFound):
        store.info("fresh")
    assert store.info("kept").length == 4 and not store.info("kept").sealed
    store.composite(steps[:4])  # the numbers the refused composite took are given again, in order
    assert whole(store, "fresh") == b"never" and store.info("kept").sealed
    seqs = [op.seq for op in logged_operations(node.data_log)]
    assert seqs == sorted(set(seqs))
    node.restart()
    assert whole(node.store, "kept") == b"kept never"


@pytest.mark.parametrize(
    ("step", "error"),
    [
        (AppendStep("a", b"x", expected_offset=0), ConditionalCheckFailed),
        (DeleteStep("a", segment_id=10**6), SegmentNotFound),
        (UpdateAttributesStep("a", [AttributeUpdate(KEY, AttributeUpdateType.REPLACE_IF_EQUALS, 2, 0)]),
         ConditionalCheckFailed),
        (MergeStep("a", "missing"), SegmentNotFound),
        (AppendStep("a", b""), InvalidArgument),
    ],
    ids=["expected offset", "another segment id", "attribute condition", "merge source", "empty append"],
)
def test_every_condition_of_every_step_is_judged(
    store: SegmentStore, step: object, error: type[Exception]
) -> None:
    """Each refused step is judged on what the steps before it did (the append moved the length)."""
    store.create("a")
    with pytest.raises(error) as refused:
        store.composite([AppendStep("a", b"first"), UpdateAttributesStep("a", [_set(KEY, 1)]), step])
    assert refused.value.step == 2
    assert store.info("a").length == 0
    assert store.get_attributes("a", [KEY]) == {KEY: None}


def _set(key: uuid.UUID, value: int) -> AttributeUpdate:
    return AttributeUpdate(key, AttributeUpdateType.REPLACE, value)


def test_each_step_is_answered_with_the_state_its_own_change_left(store: SegmentStore) -> None:
    store.create("source")
    store.append("source", b"src")
    store.seal("source")
    results = store.composite(
        [
            CreateStep("a"),
            AppendStep("a", b"xy", writer_id=W, event_number=1),
            AppendStep("a", b"z"),
            AppendStep("a", b"dup", writer_id=W, event_number=1),
            MergeStep("a", "source"),
            UpdateAttributesStep("a", [_set(KEY, 5)]),
            TruncateStep("a", 1),
            SealStep("a"),
            SealStep("a"),
            CreateStep("b"),
            DeleteStep("b"),
        ]
    )
    created, first, second, duplicate, merged, attributes, truncated, sealed, again, made, deleted = results
    assert isinstance(created, SegmentInfo) and created.length == 0
    assert isinstance(first, AppendResult) and (first.offset, first.info.length) == (0, 2)
    assert isinstance(second, AppendResult) and (second.offset, second.info.length) == (2, 3)
    assert isinstance(duplicate, AppendResult) and duplicate.duplicate and duplicate.event_number == 1
    assert duplicate.info.length == 3
    assert isinstance(merged, MergeResult) and (merged.offset, merged.length, merged.info.length) == (3, 3, 6)
    assert attributes == {KEY: 5}
    assert isinstance(truncated, SegmentInfo) and truncated.start_offset == 1 and not truncated.sealed
    assert isinstance(sealed, SegmentInfo) and sealed.sealed
    assert again == sealed
    assert isinstance(made, SegmentInfo) and made.name == "b"
    assert deleted is None
    assert whole(store, "a") == b"yzsrc"
    with pytest.raises(SegmentNotFound):
        store.info("source")


def test_a_rendered_append_sees_what_the_earlier_steps_did(store: SegmentStore) -> None:
    def record(state: Callable[[str], SegmentInfo]) -> bytes:
        return f"{state('object').segment_id}:{state('object').length}".encode()

    steps = [CreateStep("object"), AppendStep("object", b"12345"), CreateStep("record")]
    _, _, _, _, rendered = store.composite([*steps, SealStep("object"), AppendStep("record", record)])
    info = store.info("object")
    assert whole(store, "record") == f"{info.segment_id}:5".encode()
    assert isinstance(rendered, AppendResult) and rendered.info.length == len(whole(store, "record"))


def test_a_composite_spans_one_container(file_store: SegmentStore) -> None:
    names = [f"n{i}" for i in range(40)]
    first = names[0]
    other = next(n for n in names if container_for(n, 4) != container_for(first, 4))
    with pytest.raises(InvalidArgument):
        file_store.composite([CreateStep(first), CreateStep(other)])
    with pytest.raises(SegmentNotFound):
        file_store.info(first)


def test_a_transaction_whose_parent_is_sealed_stays_open(store: SegmentStore) -> None:
    store.create("p")
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"tx")
    store.seal("p")
    with pytest.raises(SegmentSealed):
        store.commit_transaction("p", txid)
    assert not store.transaction_info("p", txid).sealed
    store.append_transaction("p", txid, b" still open")


# ------------------------------------------------------------ batch answers
def test_an_append_answered_durable_never_answers_404_or_another_appends_offset(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends and a delete of their segment in one processor batch."""
    store = node.store
    store.create("busy")
    store.create("s")
    held = HeldProcessor(node, monkeypatch)
    held.hold("busy", lambda: store.append("busy", b"holds the processor"))
    held.submit("first", lambda: store.append("s", b"first"))
    held.wait_queued(1)
    held.submit("second", lambda: store.append("s", b"second"))
    held.wait_queued(2)
    held.submit("delete", lambda: store.delete("s"))
    held.wait_queued(3)
    results = held.release()
    first, second = results["first"], results["second"]
    assert isinstance(first, AppendResult) and isinstance(second, AppendResult), results
    assert (first.offset, first.info.length) == (0, 5)
    assert (second.offset, second.info.length) == (5, 11)
    assert results["delete"] is None
    with pytest.raises(SegmentNotFound):
        store.info("s")


# ------------------------------------------------------------------- crashes
def _frame_cuts(write: bytes) -> list[int]:
    """Where to cut a Tier 1 write: nothing, around every frame boundary, mid-frame, all of it."""
    cuts = {0, len(write)}
    pos = 0
    while pos < len(write):
        size = frames.HEADER.unpack_from(write, pos)[0]
        end = pos + frames.HEADER.size + size
        cuts |= {pos + 1, pos + frames.HEADER.size, pos + frames.HEADER.size + size // 2, end - 1, end}
        pos = end
    return sorted(c for c in cuts if 0 <= c <= len(write))




def test_a_crash_anywhere_in_a_composite_leaves_all_of_it_or_none_of_it(node: Node) -> None:
    store = node.store
    store.create("object")
    store.append("object", b"the old object")
    store.seal("object")
    store.create("record")
    store.append("record", b"old record")
    new = os.urandom(3 * node.settings.max_frame_bytes)  # a write of several frames
    old_id = store.info("object").segment_id
    record = [AppendStep("record", b"new record", expected_offset=10), TruncateStep("record", 10)]
    store.composite([*replace_steps(store, "object", new), *record])
    store.close()
    at = next(i for i, w in enumerate(node.data_log.writes) if _holds_a_composite(w))
    before, last = node.data_log.writes[:at], node.data_log.writes[at]  # a crash now: nothing after it
    outcomes = set()
    for cut in _frame_cuts(last):
        writes = [*before, last[:cut]]
        node.data_log = MemoryDataLog(max_frame_bytes=node.settings.max_frame_bytes, _writes=writes)
        node.restart()
        obj, record = node.store.info("object"), whole(node.store, "record")
        if obj.segment_id == old_id:
            assert whole(node.store, "object") == b"the old object" and record == b"old record", cut
            outcomes.add("none")
        else:
            assert whole(node.store, "object") == new and obj.sealed and record == b"new record", cut
            outcomes.add("all")
        node.store.close()
    assert outcomes == {"none", "all"}


def test_steps_and_their_answers_cross_the_wire_unchanged(store: SegmentStore) -> None:
    """What a cluster node sends for a composite served elsewhere, and what comes back."""
    updates = (AttributeUpdate(KEY, AttributeUpdateType.REPLACE_IF_EQUALS, 3, None),)
    steps = [
        CreateStep("w", rollover_bytes=4096),
        AppendStep(
            "w", b"\x00\xffbytes", expected_offset=0, writer_id=W, event_number=4, event_count=2,
            attributes=updates,
        ),
        UpdateAttributesStep("w", (_set(KEY, 8),)),
        TruncateStep("w", 1),
        SealStep("w"),
        MergeStep("w2", "w"),
        DeleteStep("w2", segment_id=9),
    ]
    assert steps_from_json(json.loads(json.dumps(steps_to_json(steps)))) == steps
    store.create("w2")
    results = store.composite([step for step in steps[:-1] if not isinstance(step, TruncateStep)])
    assert results_from_json(json.loads(json.dumps(results_to_json([*results, None])))) == [*results, None]
