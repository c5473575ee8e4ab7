"""Attribute verbs (seed 001): conditions, atomicity with each other and with appends, recovery."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from engine import (
    AttributeUpdate,
    AttributeUpdateType,
    ConditionalCheckFailed,
    InvalidArgument,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
)
from engine.metadata import operations as ops
from tests.engine.conftest import Node

T = AttributeUpdateType
A, B, W = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def _set(store: SegmentStore, *updates: AttributeUpdate) -> dict[uuid.UUID, int]:
    return store.update_attributes("s", list(updates))


def _get(store: SegmentStore, *keys: uuid.UUID) -> list[int | None]:
    values = store.get_attributes("s", list(keys))
    return [values[k] for k in keys]


@pytest.fixture
def seg(store: SegmentStore) -> SegmentStore:
    store.create("s")
    return store


def test_absent_keys_read_as_none(seg: SegmentStore) -> None:
    assert _get(seg, A, B) == [None, None]
    with pytest.raises(SegmentNotFound):
        seg.get_attributes("nope", [A])


def test_none_sets_only_an_absent_key(seg: SegmentStore) -> None:
    assert _set(seg, AttributeUpdate(A, T.NONE, 5)) == {A: 5}
    with pytest.raises(ConditionalCheckFailed, match=str(A)):
        _set(seg, AttributeUpdate(A, T.NONE, 6))
    assert _get(seg, A) == [5]


def test_replace_and_accumulate(seg: SegmentStore) -> None:
    _set(seg, AttributeUpdate(A, T.REPLACE, 10))
    assert _set(seg, AttributeUpdate(A, T.ACCUMULATE, -3), AttributeUpdate(B, T.ACCUMULATE, 4)) == {
        A: 7,
        B: 4,
    }
    _set(seg, AttributeUpdate(A, T.REPLACE, -(2**63)))
    assert _get(seg, A, B) == [-(2**63), 4]
    with pytest.raises(InvalidArgument, match="overflows"):
        _set(seg, AttributeUpdate(A, T.ACCUMULATE, -1))


def test_replace_if_greater(seg: SegmentStore) -> None:
    _set(seg, AttributeUpdate(A, T.REPLACE_IF_GREATER, 3))  # absent: set
    _set(seg, AttributeUpdate(A, T.REPLACE_IF_GREATER, 4))
    for value in (4, 2):
        with pytest.raises(ConditionalCheckFailed, match="not less than"):
            _set(seg, AttributeUpdate(A, T.REPLACE_IF_GREATER, value))
    assert _get(seg, A) == [4]


def test_replace_if_equals_is_compare_and_set(seg: SegmentStore) -> None:
    with pytest.raises(ConditionalCheckFailed, match="absent, expected 1"):
        _set(seg, AttributeUpdate(A, T.REPLACE_IF_EQUALS, 2, expected=1))
    _set(seg, AttributeUpdate(A, T.REPLACE_IF_EQUALS, 1, expected=None))  # None: expected absent
    with pytest.raises(ConditionalCheckFailed, match="is 1, expected absent"):
        _set(seg, AttributeUpdate(A, T.REPLACE_IF_EQUALS, 1, expected=None))
    _set(seg, AttributeUpdate(A, T.REPLACE_IF_EQUALS, 2, expected=1))
    assert _get(seg, A) == [2]


def test_updates_of_one_request_apply_together_or_not_at_all(seg: SegmentStore) -> None:
    _set(seg, AttributeUpdate(A, T.REPLACE, 1))
    with pytest.raises(ConditionalCheckFailed, match=str(A)):
        _set(seg, AttributeUpdate(B, T.REPLACE, 9), AttributeUpdate(A, T.REPLACE_IF_EQUALS, 3, expected=2))
    assert _get(seg, A, B) == [1, None]
    with pytest.raises(InvalidArgument, match="twice"):
        _set(seg, AttributeUpdate(A, T.REPLACE, 1), AttributeUpdate(A, T.REPLACE, 2))
    with pytest.raises(InvalidArgument, match="at least one"):
        _set(seg)
    with pytest.raises(InvalidArgument, match="expected value"):
        AttributeUpdate(A, T.REPLACE, 1, expected=0)
    with pytest.raises(InvalidArgument, match="int64"):
        AttributeUpdate(A, T.REPLACE, 2**63)


def test_an_append_and_its_attributes_change_together(seg: SegmentStore) -> None:
    result = seg.append("s", b"abc", attributes=[AttributeUpdate(A, T.REPLACE_IF_EQUALS, 1, expected=None)])
    assert (result.offset, _get(seg, A)) == (0, [1])
    with pytest.raises(ConditionalCheckFailed, match=str(A)):
        seg.append("s", b"def", attributes=[AttributeUpdate(A, T.REPLACE_IF_EQUALS, 2, expected=None)])
    assert (seg.info("s").length, _get(seg, A)) == (3, [1])
    dup = seg.append("s", b"x", writer_id=W, event_number=1, attributes=[AttributeUpdate(B, T.ACCUMULATE, 1)])
    assert not dup.duplicate
    again = seg.append(
        "s", b"x", writer_id=W, event_number=1, attributes=[AttributeUpdate(B, T.ACCUMULATE, 1)]
    )
    assert again.duplicate  # a duplicate changes no attribute either
    assert _get(seg, B, W) == [1, 1]
    assert seg.writer_event_number("s", W) == 1
    with pytest.raises(InvalidArgument, match="writer id"):
        seg.append("s", b"x", writer_id=W, event_number=2, attributes=[AttributeUpdate(W, T.REPLACE, 5)])


def test_a_sealed_segment_refuses_attribute_updates(seg: SegmentStore) -> None:
    _set(seg, AttributeUpdate(A, T.REPLACE, 1))
    seg.seal("s")
    with pytest.raises(SegmentSealed):
        _set(seg, AttributeUpdate(A, T.REPLACE, 2))
    assert _get(seg, A) == [1]


def test_attributes_survive_restarts_from_the_log_and_from_checkpoints(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(checkpoint_every_bytes=1)
    node.store.create("s")
    _set(node.store, AttributeUpdate(A, T.REPLACE, 7))
    node.store.append("s", b"x", attributes=[AttributeUpdate(B, T.ACCUMULATE, 3)])
    node.truncate_tier1()  # from here on, A and B come from a checkpoint
    node.store.append("s", b"y", attributes=[AttributeUpdate(B, T.ACCUMULATE, 3)])  # replayed
    _set(node.store, AttributeUpdate(A, T.ACCUMULATE, 1))
    node.restart()
    assert _get(node.store, A, B) == [8, 6]
    assert node.store.read("s", 0, 10).data == b"xy"


def test_an_append_with_attributes_round_trips_through_the_log_format() -> None:
    op = ops.Append(seq=4, segment_id=2, offset=9, data=b"hi", writer_id=W, event_number=3)
    op.attributes = {str(A): -5, str(B): 2**63 - 1}
    (back,) = ops.decode_all(ops.encode(op))
    assert back == op
    plain = ops.Append(seq=5, segment_id=2, offset=11, data=b"yo")
    assert ops.decode_all(ops.encode(plain)) == [plain]
