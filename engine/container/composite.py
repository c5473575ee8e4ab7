"""Composite operations: several changes to segments of one container as one (docs/design.md).

Seed 000's operation processor already puts many operations into one Tier 1
write. A composite makes a group of them one unit: its steps are judged
together against the metadata (every condition holds, or none is applied
and the error names the refused ``step``), written as one log entry,
applied together (a reader sees the state before or after, never between)
and answered once, each step with the state its own change produced.
A crash leaves all of it or none of it.

The steps are the public face of the log operations: what a surface may
ask for, validated here as the single-operation calls validate them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import InvalidArgument, PayloadTooLarge
from engine.metadata import operations as ops
from engine.metadata.attribute_updates import AttributeUpdate, check_request
from engine.types import AppendResult, MergeResult, SegmentInfo

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class CreateStep:
    """Create an empty segment (SegmentExists if the name is taken)."""

    name: str
    rollover_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class AppendStep:
    """Append ``data`` with the conditions of ``SegmentStore.append``.

    ``data`` may be a function given the state of any segment, by name, as
    the earlier steps left it (``ops.StateOf``); it returns the bytes. It
    runs in the operation processor, so it must be small and quick: e.g. a
    record naming the id of a segment an earlier step created.
    """

    name: str
    data: bytes | ops.Render
    expected_offset: int | None = None
    writer_id: uuid.UUID | None = None
    event_number: int | None = None
    event_count: int = 1
    attributes: Sequence[AttributeUpdate] = ()


@dataclass(frozen=True, slots=True)
class SealStep:
    name: str


@dataclass(frozen=True, slots=True)
class TruncateStep:
    name: str
    offset: int


@dataclass(frozen=True, slots=True)
class DeleteStep:
    """Delete a segment; with ``segment_id``, only if the name still means that segment."""

    name: str
    segment_id: int | None = None


@dataclass(frozen=True, slots=True)
class MergeStep:
    """Append all of the sealed ``source`` to ``target`` (seed 000 MergeSegmentOperation)."""

    target: str
    source: str


@dataclass(frozen=True, slots=True)
class UpdateAttributesStep:
    name: str
    updates: Sequence[AttributeUpdate]


Step = CreateStep | AppendStep | SealStep | TruncateStep | DeleteStep | MergeStep | UpdateAttributesStep
# A step's answer: the segment's state (Create, Seal, Truncate), an AppendResult,
# a MergeResult, the attribute values set (UpdateAttributes), None for a Delete.
StepResult = SegmentInfo | AppendResult | MergeResult | dict[uuid.UUID, int] | None


def names_of(step: Step) -> tuple[str, ...]:
    """The segments a step touches (all of a composite's must live in one container)."""
    if isinstance(step, MergeStep):
        return step.target, step.source
    return (step.name,)


def check_append(
    data_length: int,
    max_append_bytes: int,
    *,
    expected_offset: int | None,
    writer_id: uuid.UUID | None,
    event_number: int | None,
    event_count: int,
) -> None:
    """An append's arguments, refused (InvalidArgument, PayloadTooLarge) before it is queued."""
    if data_length == 0:
        raise InvalidArgument("an append needs at least one byte")
    if data_length > max_append_bytes:
        raise PayloadTooLarge(f"append of {data_length} bytes is over max_append_bytes={max_append_bytes}")
    if (writer_id is None) != (event_number is None):
        raise InvalidArgument("Writer-Id and Event-Number go together")
    if event_number is not None and not 0 <= event_number <= _INT64_MAX:
        raise InvalidArgument(f"event number must be an int64 >= 0, got {event_number}")
    if not 1 <= event_count <= 2**32 - 1:
        raise InvalidArgument(f"event count must be from 1 to 2^32-1, got {event_count}")
    if expected_offset is not None and not 0 <= expected_offset <= _INT64_MAX:
        raise InvalidArgument(f"expected offset must be an int64 >= 0, got {expected_offset}")


def check_rollover(rollover_bytes: int | None) -> None:
    if rollover_bytes is not None and not 0 < rollover_bytes <= _INT64_MAX:
        raise InvalidArgument(f"rollover_bytes must be a positive int64, got {rollover_bytes}")


def check_truncate(offset: int) -> None:
    if not 0 <= offset <= _INT64_MAX:
        raise InvalidArgument(f"truncate offset must be an int64 >= 0, got {offset}")


def to_operation(step: Step, max_append_bytes: int, now: float) -> ops.SegmentOperation:
    """The log operation of one step, its arguments checked."""
    if isinstance(step, CreateStep):
        check_rollover(step.rollover_bytes)
        return ops.CreateSegment(name=step.name, created=now, rollover_bytes=step.rollover_bytes)
    if isinstance(step, AppendStep):
        data, render = (step.data, None) if isinstance(step.data, bytes) else (None, step.data)
        if data is not None:
            check_append(
                len(data), max_append_bytes, expected_offset=step.expected_offset,
                writer_id=step.writer_id, event_number=step.event_number, event_count=step.event_count,
            )  # fmt: skip
        return ops.Append(
            name=step.name,
            data=data,
            render=render,
            expected_offset=step.expected_offset,
            writer_id=step.writer_id,
            event_number=step.event_number,
            event_count=step.event_count,
            attribute_updates=tuple(check_request(step.attributes)),
        )
    if isinstance(step, SealStep):
        return ops.Seal(name=step.name)
    if isinstance(step, TruncateStep):
        check_truncate(step.offset)
        return ops.Truncate(name=step.name, offset=step.offset)
    if isinstance(step, DeleteStep):
        return ops.Delete(name=step.name, segment_id=-1 if step.segment_id is None else step.segment_id)
    if isinstance(step, MergeStep):
        return ops.MergeSegment(name=step.target, source=step.source)
    updates = check_request(step.updates)
    if not updates:
        raise InvalidArgument("an attribute update needs at least one update")
    return ops.UpdateAttributes(name=step.name, updates=tuple(updates))


def result_of(op: ops.SegmentOperation, outcome_duplicate_of: int | None) -> StepResult:
    """A committed step's answer, from the state its operation recorded at commit."""
    if isinstance(op, ops.Delete):
        return None
    state = op.state
    assert state is not None, f"{op!r} committed without its state"
    if isinstance(op, ops.Append):
        if outcome_duplicate_of is not None:
            return AppendResult(None, True, outcome_duplicate_of, state)
        return AppendResult(op.offset, False, op.event_number, state)
    if isinstance(op, ops.MergeSegment):
        return MergeResult(op.offset, op.length, state)
    if isinstance(op, ops.UpdateAttributes):
        return {uuid.UUID(key): value for key, value in op.attributes.items()}
    return state
