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

import base64
import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidArgument, PayloadTooLarge
from engine.metadata import operations as ops
from engine.metadata.attribute_updates import AttributeUpdate, AttributeUpdateType, check_request
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
    previous_event_number: int | None = None


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
    previous_event_number: int | None = None,
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
    if previous_event_number is not None:
        if event_number is None:
            raise InvalidArgument("a previous event number needs a writer id and an event number")
        if not 0 <= previous_event_number < event_number:
            raise InvalidArgument(
                f"the previous event number must be from 0 to the event number less one, "
                f"got {previous_event_number} before {event_number}"
            )


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
                previous_event_number=step.previous_event_number,
            )  # fmt: skip
        return ops.Append(
            name=step.name,
            data=data,
            render=render,
            expected_offset=step.expected_offset,
            writer_id=step.writer_id,
            event_number=step.event_number,
            event_count=step.event_count,
            previous_event_number=step.previous_event_number,
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


# ------------------------------------------------------------ over the wire
_KINDS: dict[str, type[Step]] = {
    "create": CreateStep,
    "append": AppendStep,
    "seal": SealStep,
    "truncate": TruncateStep,
    "delete": DeleteStep,
    "merge": MergeStep,
    "update_attributes": UpdateAttributesStep,
}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


def steps_to_json(steps: Sequence[Step]) -> list[dict[str, Any]]:
    """Steps as JSON, for a composite a cluster node sends to the node serving its container.

    A rendered append is not sent: it runs only where its container is.
    """
    docs = []
    for step in steps:
        doc: dict[str, Any] = {"step": _KIND_OF[type(step)]}
        for field in dataclasses.fields(step):
            value = getattr(step, field.name)
            if field.name == "data":
                if not isinstance(value, bytes):
                    raise InvalidArgument("a rendered append runs only on the node serving its container")
                value = base64.b64encode(value).decode("ascii")
            elif field.name == "writer_id" and value is not None:
                value = str(value)
            elif field.name in ("attributes", "updates"):
                value = [[str(u.key), u.type.value, u.value, u.expected] for u in value]
            doc[field.name] = value
        docs.append(doc)
    return docs


def steps_from_json(docs: list[dict[str, Any]]) -> list[Step]:
    steps: list[Step] = []
    for raw in docs:
        doc = dict(raw)
        cls = _KINDS[doc.pop("step")]
        if "data" in doc:
            doc["data"] = base64.b64decode(doc["data"])
        if doc.get("writer_id") is not None:
            doc["writer_id"] = uuid.UUID(doc["writer_id"])
        for name in ("attributes", "updates"):
            if name in doc:
                doc[name] = tuple(
                    AttributeUpdate(uuid.UUID(k), AttributeUpdateType(t), v, e) for k, t, v, e in doc[name]
                )
        steps.append(cls(**doc))
    return steps


def results_to_json(results: Sequence[StepResult]) -> list[Any]:
    docs: list[Any] = []
    for result in results:
        if isinstance(result, SegmentInfo):
            docs.append({"info": dataclasses.asdict(result)})
        elif isinstance(result, AppendResult | MergeResult):
            doc = dataclasses.asdict(result)
            docs.append({"append" if isinstance(result, AppendResult) else "merge": doc})
        elif isinstance(result, dict):
            docs.append({"attributes": {str(k): v for k, v in result.items()}})
        else:
            docs.append(None)
    return docs


def results_from_json(docs: list[Any]) -> list[StepResult]:
    results: list[StepResult] = []
    for doc in docs:
        if doc is None:
            results.append(None)
        elif "info" in doc:
            results.append(SegmentInfo(**doc["info"]))
        elif "append" in doc:
            results.append(AppendResult(**{**doc["append"], "info": SegmentInfo(**doc["append"]["info"])}))
        elif "merge" in doc:
            results.append(MergeResult(**{**doc["merge"], "info": SegmentInfo(**doc["merge"]["info"])}))
        else:
            results.append({uuid.UUID(k): v for k, v in doc["attributes"].items()})
    return results
