"""Log operations: every type survives encode/decode; damaged payloads raise DataCorrupted."""

from __future__ import annotations

import json
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import DataCorrupted
from engine.metadata import operations as ops

INT64 = st.integers(0, 2**63 - 1)


def round_trip(op: ops.Operation) -> ops.Operation:
    [decoded] = ops.decode_all(ops.encode(op))
    return decoded


@st.composite
def appends(draw: st.DrawFn) -> ops.Append:
    writer = draw(st.none() | st.uuids())
    return ops.Append(
        seq=draw(INT64),
        segment_id=draw(st.integers(0, 2**64 - 1)),
        offset=draw(INT64),
        timestamp=draw(st.floats(allow_nan=False)),
        writer_id=writer,
        event_number=None if writer is None else draw(INT64),
        event_count=draw(st.integers(1, 2**32 - 1)),
        data=draw(st.binary(min_size=1, max_size=3000)),
    )


@given(appends())
def test_append_round_trips(op: ops.Append) -> None:
    decoded = round_trip(op)
    assert isinstance(decoded, ops.Append)
    assert decoded == op
    assert decoded.length == len(op.data or b"")


@given(st.lists(appends(), min_size=1, max_size=5))
def test_operations_packed_back_to_back_round_trip(batch: list[ops.Append]) -> None:
    assert ops.decode_all(b"".join(ops.encode(op) for op in batch)) == batch


OTHER_OPERATIONS = [
    ops.CreateSegment(seq=1, name="s/é", segment_id=3, created=1700000000.25, rollover_bytes=None),
    ops.CreateSegment(seq=2, name="t", segment_id=4, created=0.0, rollover_bytes=2**63 - 1),
    ops.CreateSegment(
        seq=8,
        name="imported",
        segment_id=5,
        created=2.5,
        chunks=[["c0/imported.1/e0000000001-o00000000000000000004-0a1b2c3d", 4, 2**40]],
        length=2**40 + 4,
    ),
    ops.Seal(seq=3, name="s", segment_id=3),
    ops.Truncate(seq=4, name="s", segment_id=3, offset=2**40),
    ops.Delete(seq=5, name="s", segment_id=3),
    ops.UpdateAttributes(seq=6, name="s", segment_id=3, attributes={str(uuid.uuid4()): -(2**63)}),
    ops.UpdateLayout(
        seq=9,
        name="s",
        segment_id=3,
        chunks=[["c0/s.3/e0000000002-o00000000000000000000-00000000", 0, 10], ["c0/s.3/x", 10, 2**62]],
        storage_length=2**62 + 10,
    ),
    ops.UpdateLayout(seq=10, name="s", segment_id=3, chunks=[], storage_length=7, merged=[0, 2**50]),
    ops.UpdateAttributeIndex(
        seq=12,
        name="s",
        segment_id=3,
        chunks=[["c0/s%23attributes.3/e0000000001-o00000000000000000000-0a0b0c0d", 0, 90]],
        length=90,
        root=[60, 30, 0],
        persisted_seq=11,
    ),
    ops.UpdateAttributeIndex(seq=13, name="s", segment_id=3, chunks=[], length=90, root=None),
    ops.MergeSegment(
        seq=11,
        name="s",
        segment_id=3,
        source="s#transaction.1",
        source_id=4,
        offset=2**40,
        length=2**33,
        timestamp=3.5,
        record_as="s#transaction.1",
        record_created=1.25,
    ),
    ops.ForkSegment(
        seq=14,
        name="f",
        segment_id=5,
        created=2.5,
        rollover_bytes=None,
        chunks=[["c0/s.3/e0000000001-o00000000000000000000-0badcafe", 0, 70]],
        length=70,
        start_offset=10,
        source="s",
        source_id=3,
        data=b"\x00tail\xff",
        boundaries=[10, 40, 72],
    ),
    ops.MetadataCheckpoint(
        seq=7,
        snapshot={"container_id": 0, "epoch": 2, "next_segment_id": 9, "segments": [{"name": "s"}]},
    ),
    ops.Composite(
        seq=17,
        parts=[
            ops.Delete(seq=15, name="o", segment_id=3),
            ops.CreateSegment(seq=16, name="o", segment_id=6, created=2.5),
            ops.Append(seq=17, segment_id=6, offset=0, timestamp=2.5, data=b"new bytes"),
        ],
        logged=[True, True, True],
    ),
]


@pytest.mark.parametrize("op", OTHER_OPERATIONS, ids=lambda op: f"{type(op).__name__}-{op.seq}")
def test_every_other_operation_type_round_trips(op: ops.Operation) -> None:
    decoded = round_trip(op)
    assert type(decoded) is type(op)
    assert decoded == op


def test_every_operation_type_is_covered() -> None:
    covered = {type(op) for op in OTHER_OPERATIONS} | {ops.Append}
    assert covered == set(ops._TYPES)


def test_a_composite_serializes_only_the_parts_that_changed_something() -> None:
    seal = ops.Seal(name="s", segment_id=3)  # of a sealed segment: nothing to log
    append = ops.Append(seq=5, segment_id=3, offset=7, timestamp=1.0, data=b"x")
    composite = ops.Composite(seq=5, parts=[seal, append], logged=[False, True])
    decoded = round_trip(composite)
    assert isinstance(decoded, ops.Composite)
    assert decoded.parts == [append]


@pytest.mark.parametrize("parts", [[], [8]], ids=["no part", "another sequence number"])
def test_a_composite_that_does_not_end_with_its_sequence_number_is_corrupt(parts: list[int]) -> None:
    body = b"".join(ops.encode(ops.Seal(seq=seq, name="s", segment_id=1)) for seq in parts)
    with pytest.raises(DataCorrupted):
        ops.decode_all(_header(ops.OpType.COMPOSITE, 9, body))


def test_a_composite_holds_segment_operations_only() -> None:
    checkpoint = ops.encode(ops.MetadataCheckpoint(seq=9, snapshot={}))
    with pytest.raises(DataCorrupted):
        ops.decode_all(_header(ops.OpType.COMPOSITE, 9, checkpoint))


def test_encoding_needs_a_sequence_number() -> None:
    with pytest.raises(AssertionError):
        ops.encode(ops.Seal(name="s", segment_id=1))


def _sealed(seq: int = 9) -> bytes:
    return ops.encode(ops.Seal(seq=seq, name="s", segment_id=1))


def _header(kind: int, seq: int, body: bytes) -> bytes:
    return struct.pack(">BQI", kind, seq, len(body)) + body


DAMAGED = {
    "header cut short": _sealed()[:5],
    "body cut short": _sealed()[:-1],
    "second operation cut short": _sealed(1) + _sealed(2)[:-3],
    "unknown type": _header(99, 1, b"{}"),
    "body not JSON": _header(ops.OpType.SEAL, 1, b"\xff{not json"),
    "JSON without its fields": _header(ops.OpType.TRUNCATE, 1, json.dumps({"name": "s"}).encode()),
    "layout without its storage length": _header(
        ops.OpType.LAYOUT, 1, json.dumps({"name": "s", "segment_id": 1, "chunks": []}).encode()
    ),
    "append body shorter than its fields": _header(ops.OpType.APPEND, 1, b"\x00" * 10),
    "fork data shorter than it says": _header(
        ops.OpType.FORK, 1, ops.encode(ops.ForkSegment(seq=1, name="f", data=b"abc"))[13:-1]
    ),
    "append writer id cut short": _header(
        ops.OpType.APPEND, 1, struct.pack(">QQdqIB", 1, 0, 0.0, 5, 1, 1) + b"\x01" * 7
    ),
}


@pytest.mark.parametrize("payload", DAMAGED.values(), ids=DAMAGED.keys())
def test_damaged_payload_raises_data_corrupted(payload: bytes) -> None:
    with pytest.raises(DataCorrupted):
        ops.decode_all(payload)
