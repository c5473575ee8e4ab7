"""Log operations: the closed set the durable log records, and their one serializer.

Seed 000 "Log Operations". Layout of one serialized operation (big-endian):

    type u8 | sequence number u64 | body length u32 | body

The append body is binary (it is the hot path and carries raw bytes):

    segment id u64 | offset u64 | timestamp f64 | event number i64 (-1: none)
    | event count u32 | flags u8 | [writer id 16 bytes] | [attributes] | data

flags: 1 = a writer id follows, 2 = attributes follow, as
``count u16 | (key 16 bytes | value i64) * count``.

A fork's body is ``JSON length u32 | JSON of its fields | data`` (its tail
bytes, raw). A composite's body is its logged parts, each serialized as
above, back to back; its own sequence number is its last part's. Every
other body is UTF-8 JSON of the operation's fields.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from engine.errors import DataCorrupted
from engine.metadata.attribute_updates import AttributeUpdate, Preloaded
from engine.types import SegmentInfo

_HEADER = struct.Struct(">BQI")
_APPEND = struct.Struct(">QQdqIB")
_ATTRIBUTE = struct.Struct(">16sq")
_COUNT = struct.Struct(">H")
_JSON_LENGTH = struct.Struct(">I")
_HAS_WRITER, _HAS_ATTRIBUTES = 1, 2


class OpType(IntEnum):
    CREATE = 1
    APPEND = 2
    SEAL = 3
    TRUNCATE = 4
    DELETE = 5
    ATTRIBUTES = 6
    CHECKPOINT = 7
    LAYOUT = 8
    MERGE = 9
    ATTRIBUTE_INDEX = 10
    FORK = 11
    COMPOSITE = 12


@dataclass(slots=True, kw_only=True)
class Operation:
    """Base of every log operation; ``seq`` is assigned by the operation processor."""

    seq: int = -1


@dataclass(slots=True, kw_only=True)
class SegmentOperation(Operation):
    """An operation on one segment. Requests name it; the processor resolves the id.

    An operation that already carries an id (the storage writer's) applies
    only to that segment: if the name now means another one, it is refused.
    ``state`` is the segment's state right after the operation committed
    (None for a delete, and before the commit): what its caller is answered
    with, never read afterwards.
    """

    name: str = ""
    segment_id: int = -1
    state: SegmentInfo | None = field(default=None, compare=False)


@dataclass(slots=True, kw_only=True)
class CreateSegment(SegmentOperation):
    """Map a new name to a new segment id (StreamSegmentMapOperation).

    An imported segment (seed 002 "Backup and Restore") starts with the
    Tier 2 ``chunks`` of an exported layout, its ``length`` and ``start_offset``.
    """

    created: float = 0.0
    rollover_bytes: int | None = None
    chunks: list[list[Any]] = field(default_factory=list)
    length: int = 0
    start_offset: int = 0


@dataclass(slots=True, kw_only=True)
class ForkSegment(CreateSegment):
    """Create a segment holding a prefix of ``source`` (seed 002: a metadata operation on chunks).

    ``chunks`` name the source's Tier 2 chunks that hold the prefix up to
    ``length`` (the new segment's storage length); no byte of them is copied.
    ``data`` are the prefix's bytes past that, not yet in Tier 2, carried in
    the log as an append would; it is dropped (None) once they are in the read
    index, and ``data_length`` stays. The processor refuses the fork
    (LayoutChanged) if the source's layout no longer names those chunks.
    ``boundaries`` are the source's append boundaries within the prefix.
    """

    source: str = ""
    source_id: int = -1
    data: bytes | None = None
    data_length: int = 0
    boundaries: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.data is not None:
            self.data_length = len(self.data)


@dataclass(slots=True, kw_only=True)
class Append(SegmentOperation):
    """Append bytes; with a writer id, the event number is stored atomically with them.

    ``expected_offset``, ``previous_event_number`` and ``attribute_updates``
    are the request's conditions and are not serialized: the log keeps the
    resolved ``attributes``.
    ``data`` is dropped (None) once the bytes are in the read index; ``length`` stays.
    In a composite, ``render`` may give the bytes instead: the processor calls
    it with the state of any segment as the composite's earlier parts left it
    (e.g. to name the id of a segment they created).
    """

    data: bytes | None = None
    length: int = 0
    offset: int = -1
    timestamp: float = 0.0
    writer_id: uuid.UUID | None = None
    event_number: int | None = None
    event_count: int = 1
    # Attribute values set atomically with the bytes (resolved from ``attribute_updates``).
    attributes: dict[str, int] = field(default_factory=dict)
    expected_offset: int | None = field(default=None, compare=False)
    previous_event_number: int | None = field(default=None, compare=False)
    attribute_updates: tuple[AttributeUpdate, ...] = field(default=(), compare=False)
    preloaded: Preloaded | None = field(default=None, compare=False)
    render: Render | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.data is not None:
            self.length = len(self.data)


# What a rendered append is given: the state of a segment, by name, as a composite's parts left it.
StateOf = Callable[[str], SegmentInfo]
Render = Callable[[StateOf], bytes]


@dataclass(slots=True, kw_only=True)
class Seal(SegmentOperation):
    pass


@dataclass(slots=True, kw_only=True)
class Truncate(SegmentOperation):
    offset: int = 0


@dataclass(slots=True, kw_only=True)
class Delete(SegmentOperation):
    pass


@dataclass(slots=True, kw_only=True)
class UpdateAttributes(SegmentOperation):
    """Set attributes (UUID string -> int64), resolved from the request's ``updates``."""

    attributes: dict[str, int] = field(default_factory=dict)
    updates: tuple[AttributeUpdate, ...] = field(default=(), compare=False)
    preloaded: Preloaded | None = field(default=None, compare=False)


@dataclass(slots=True, kw_only=True)
class UpdateLayout(SegmentOperation):
    """The segment's Tier 2 layout after the storage writer changed it (seed 002).

    ``chunks`` is the whole new layout as [name, start, length] lists;
    ``storage_length`` is how many of the segment's bytes Tier 2 now holds.
    ``merged`` are the offsets of pending merges whose chunks the layout now
    names (seed 002 "Concatenation": the Tier 2 half of a merge).
    """

    chunks: list[list[Any]] = field(default_factory=list)
    storage_length: int = 0
    merged: list[int] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class UpdateAttributeIndex(SegmentOperation):
    """The segment's attribute index after the storage writer wrote a batch to it (seed 001).

    ``chunks`` is the attribute segment's Tier 2 layout (head-truncated below
    the lowest live page), ``length`` its length, ``root`` the B+Tree root as
    [offset, length, lowest live page offset] (None: empty). Every attribute
    change up to sequence number ``persisted_seq`` is in the index.
    """

    chunks: list[list[Any]] = field(default_factory=list)
    length: int = 0
    root: list[int] | None = None
    persisted_seq: int = 0


@dataclass(slots=True, kw_only=True)
class MergeSegment(SegmentOperation):
    """Append all of the sealed ``source`` to this segment at once (MergeSegmentOperation, seed 000).

    One log operation, so recovery sees the whole merge or none of it. The
    processor fills ``source_id``, ``offset`` (where the source's bytes start
    in the target) and ``length``. ``record_as``/``record_created`` name the
    segment the merge is remembered under for an idempotent retry (the source
    itself, or the segment a cross-container merge copied from).
    """

    source: str = ""
    source_id: int = -1
    offset: int = -1
    length: int = 0
    timestamp: float = 0.0
    record_as: str = ""
    record_created: float = 0.0


@dataclass(slots=True, kw_only=True)
class Composite(Operation):
    """Several operations of one container as one log entry: judged, applied and answered together.

    Every part's conditions hold or none is applied (the processor judges
    them on a scratch view it keeps only if all pass); the parts go into one
    Tier 1 write, so recovery sees all of them or none; they are applied
    together, under the metadata lock, so a reader sees the state before
    or after, never between. ``logged`` says, per part, whether it changed
    anything (a seal of a sealed segment does not): only those are serialized.
    """

    parts: list[SegmentOperation] = field(default_factory=list)
    logged: list[bool] = field(default_factory=list, compare=False)

    def logged_parts(self) -> list[SegmentOperation]:
        return [part for part, logged in zip(self.parts, self.logged, strict=True) if logged]


@dataclass(slots=True, kw_only=True)
class MetadataCheckpoint(Operation):
    """A snapshot of the container metadata; recovery may start here."""

    snapshot: dict[str, Any] = field(default_factory=dict)


_TYPES: dict[type[Operation], OpType] = {
    CreateSegment: OpType.CREATE,
    Append: OpType.APPEND,
    Seal: OpType.SEAL,
    Truncate: OpType.TRUNCATE,
    Delete: OpType.DELETE,
    UpdateAttributes: OpType.ATTRIBUTES,
    MetadataCheckpoint: OpType.CHECKPOINT,
    UpdateLayout: OpType.LAYOUT,
    MergeSegment: OpType.MERGE,
    UpdateAttributeIndex: OpType.ATTRIBUTE_INDEX,
    ForkSegment: OpType.FORK,
    Composite: OpType.COMPOSITE,
}
_JSON_FIELDS: dict[OpType, tuple[type[Operation], tuple[str, ...]]] = {
    OpType.CREATE: (
        CreateSegment,
        ("name", "segment_id", "created", "rollover_bytes", "chunks", "length", "start_offset"),
    ),
    OpType.SEAL: (Seal, ("name", "segment_id")),
    OpType.TRUNCATE: (Truncate, ("name", "segment_id", "offset")),
    OpType.DELETE: (Delete, ("name", "segment_id")),
    OpType.ATTRIBUTES: (UpdateAttributes, ("name", "segment_id", "attributes")),
    OpType.CHECKPOINT: (MetadataCheckpoint, ("snapshot",)),
    OpType.LAYOUT: (UpdateLayout, ("name", "segment_id", "chunks", "storage_length", "merged")),
    OpType.ATTRIBUTE_INDEX: (
        UpdateAttributeIndex,
        ("name", "segment_id", "chunks", "length", "root", "persisted_seq"),
    ),
    OpType.FORK: (
        ForkSegment,
        (
            "name",
            "segment_id",
            "created",
            "rollover_bytes",
            "chunks",
            "length",
            "start_offset",
            "source",
            "source_id",
            "data_length",
            "boundaries",
        ),
    ),
    OpType.MERGE: (
        MergeSegment,
        (
            "name",
            "segment_id",
            "source",
            "source_id",
            "offset",
            "length",
            "timestamp",
            "record_as",
            "record_created",
        ),
    ),
}


def encode(op: Operation) -> bytes:
    """Serialize one operation (its sequence number must be assigned)."""
    assert op.seq >= 0, f"operation {op!r} has no sequence number"
    kind = _TYPES[type(op)]
    if kind is OpType.APPEND:
        assert isinstance(op, Append) and op.data is not None and op.offset >= 0
        writer = op.writer_id.bytes if op.writer_id is not None else b""
        flags = (_HAS_WRITER if writer else 0) | (_HAS_ATTRIBUTES if op.attributes else 0)
        attributes = b""
        if op.attributes:
            attributes = _COUNT.pack(len(op.attributes)) + b"".join(
                _ATTRIBUTE.pack(uuid.UUID(key).bytes, value) for key, value in op.attributes.items()
            )
        event = -1 if op.event_number is None else op.event_number
        head = _APPEND.pack(op.segment_id, op.offset, op.timestamp, event, op.event_count, flags)
        body_len = len(head) + len(writer) + len(attributes) + len(op.data)
        return b"".join((_HEADER.pack(kind, op.seq, body_len), head, writer, attributes, op.data))
    if kind is OpType.COMPOSITE:
        assert isinstance(op, Composite)
        parts = op.logged_parts()
        assert parts and op.seq == parts[-1].seq, op
        body = b"".join(encode(part) for part in parts)
        return _HEADER.pack(kind, op.seq, len(body)) + body
    fields_ = _JSON_FIELDS[kind][1]
    body = json.dumps({f: getattr(op, f) for f in fields_}, separators=(",", ":")).encode()
    if kind is OpType.FORK:
        assert isinstance(op, ForkSegment) and op.data is not None and len(op.data) == op.data_length
        head = _JSON_LENGTH.pack(len(body))
        body_len = len(head) + len(body) + len(op.data)
        return b"".join((_HEADER.pack(kind, op.seq, body_len), head, body, op.data))
    return _HEADER.pack(kind, op.seq, len(body)) + body


def decode_all(payload: bytes | memoryview) -> list[Operation]:
    """Parse the operations packed back to back in ``payload`` (one Tier 1 write)."""
    view = memoryview(payload)
    ops: list[Operation] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < _HEADER.size:
            raise DataCorrupted(f"truncated operation header at byte {pos}")
        kind_raw, seq, body_len = _HEADER.unpack_from(view, pos)
        pos += _HEADER.size
        body = view[pos : pos + body_len]
        if len(body) != body_len:
            raise DataCorrupted(f"operation {seq} is cut short")
        pos += body_len
        try:
            kind = OpType(kind_raw)
        except ValueError:
            raise DataCorrupted(f"unknown operation type {kind_raw}") from None
        try:
            ops.append(_decode_body(kind, seq, body))
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise DataCorrupted(f"operation {seq}: {exc}") from None
    return ops


def _decode_body(kind: OpType, seq: int, body: memoryview) -> Operation:
    if kind is OpType.COMPOSITE:
        decoded = decode_all(body)
        parts = [p for p in decoded if isinstance(p, SegmentOperation)]
        if len(parts) != len(decoded):
            raise ValueError("a composite holds segment operations only")
        if not parts or parts[-1].seq != seq:
            raise ValueError("a composite must end with its own sequence number")
        return Composite(seq=seq, parts=parts, logged=[True] * len(parts))
    if kind is OpType.APPEND:
        seg, offset, ts, event, count, flags = _APPEND.unpack_from(body, 0)
        if flags & ~(_HAS_WRITER | _HAS_ATTRIBUTES):
            raise ValueError(f"unknown append flags {flags}")
        pos = _APPEND.size
        writer = None
        if flags & _HAS_WRITER:
            writer = uuid.UUID(bytes=bytes(body[pos : pos + 16]))
            pos += 16
        attributes: dict[str, int] = {}
        if flags & _HAS_ATTRIBUTES:
            (n,) = _COUNT.unpack_from(body, pos)
            pos += _COUNT.size
            for _ in range(n):
                key, value = _ATTRIBUTE.unpack_from(body, pos)
                attributes[str(uuid.UUID(bytes=key))] = value
                pos += _ATTRIBUTE.size
        return Append(
            seq=seq,
            segment_id=seg,
            offset=offset,
            timestamp=ts,
            event_number=None if event < 0 else event,
            event_count=count,
            writer_id=writer,
            attributes=attributes,
            data=bytes(body[pos:]),
        )
    cls, fields_ = _JSON_FIELDS[kind]
    data = None
    if kind is OpType.FORK:
        (json_length,) = _JSON_LENGTH.unpack_from(body, 0)
        data = bytes(body[_JSON_LENGTH.size + json_length :])
        body = body[_JSON_LENGTH.size : _JSON_LENGTH.size + json_length]
    values = json.loads(bytes(body))
    op = cls(seq=seq, **{f: values[f] for f in fields_})
    if isinstance(op, ForkSegment):
        if len(data or b"") != op.data_length:
            raise ValueError(f"fork carries {len(data or b'')} bytes, says {op.data_length}")
        op.data = data
    return op
