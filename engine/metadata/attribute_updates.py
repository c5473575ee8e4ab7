"""Segment attributes (seed 001 "Segment Attributes"): 16-byte keys, int64 values, update verbs.

Keys are UUIDs (kept as their canonical strings in metadata and log
operations, as 16 bytes in the attribute index). Writer ids are attributes
too: an append's writer id is the key of its last event number.

The verbs, checked against the current value (None: the key has no value):

- ``none``: set only if the key has no value.
- ``replace``: set.
- ``replace_if_greater``: set if the key has no value or the new value is greater.
- ``replace_if_equals``: set if the current value equals ``expected`` (None: no value).
- ``accumulate``: add the value to the current one (no value counts as 0).

A request's updates are resolved together into final values (``resolve``);
the log records only those, so replaying it needs no condition.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from engine.errors import ConditionalCheckFailed, InvalidArgument
from engine.types import SegmentInfo

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Keys one request may update or read at once.
ATTRIBUTES_PER_REQUEST_MAX = 1024


class AttributeUpdateType(StrEnum):
    NONE = "none"
    REPLACE = "replace"
    REPLACE_IF_GREATER = "replace_if_greater"
    REPLACE_IF_EQUALS = "replace_if_equals"
    ACCUMULATE = "accumulate"


@dataclass(frozen=True, slots=True)
class AttributeUpdate:
    """One attribute change; ``expected`` is for ``replace_if_equals`` only."""

    key: uuid.UUID
    type: AttributeUpdateType
    value: int
    expected: int | None = None

    def __post_init__(self) -> None:
        if not INT64_MIN <= self.value <= INT64_MAX:
            raise InvalidArgument(f"attribute {self.key} value {self.value} is not an int64")
        if self.expected is not None and self.type is not AttributeUpdateType.REPLACE_IF_EQUALS:
            raise InvalidArgument(f"attribute {self.key}: only replace_if_equals takes an expected value")


@dataclass(frozen=True, slots=True)
class Preloaded:
    """Values fetched from the attribute index before an operation entered the pipeline (seed 001, 1.2).

    They count only for keys the metadata does not hold, and only while no
    key of the segment was evicted since the fetch (``evictions`` then):
    a value evicted meanwhile may be newer than the fetched one.
    """

    values: dict[str, int | None]
    evictions: int


def check_request(updates: Iterable[AttributeUpdate]) -> list[AttributeUpdate]:
    """The updates of one request, refused when empty, too many, or naming a key twice."""
    updates = list(updates)
    if len(updates) > ATTRIBUTES_PER_REQUEST_MAX:
        raise InvalidArgument(f"at most {ATTRIBUTES_PER_REQUEST_MAX} attribute updates per request")
    keys = [u.key for u in updates]
    if len(set(keys)) != len(keys):
        raise InvalidArgument("an attribute key appears twice in one request")
    return updates


def resolve(
    updates: Iterable[AttributeUpdate],
    current: Callable[[str], int | None],
    segment: SegmentInfo | None = None,
) -> dict[str, int]:
    """The final values of ``updates`` given ``current(key) -> value or None``.

    Raises ConditionalCheckFailed (naming the key) if any condition fails:
    then none of the updates applies.
    """
    out: dict[str, int] = {}
    for update in updates:
        key = str(update.key)
        now = current(key)
        kind = update.type
        if kind is AttributeUpdateType.NONE and now is not None:
            _failed(key, f"has a value ({now}); 'none' sets only an absent one", segment)
        if kind is AttributeUpdateType.REPLACE_IF_GREATER and now is not None and update.value <= now:
            _failed(key, f"value {now} is not less than {update.value}", segment)
        if kind is AttributeUpdateType.REPLACE_IF_EQUALS and now != update.expected:
            _failed(key, f"value is {_show(now)}, expected {_show(update.expected)}", segment)
        value = update.value
        if kind is AttributeUpdateType.ACCUMULATE:
            value = (now or 0) + update.value
            if not INT64_MIN <= value <= INT64_MAX:
                raise InvalidArgument(f"attribute {key}: {now} + {update.value} overflows an int64")
        out[key] = value
    return out


def _show(value: int | None) -> str:
    return "absent" if value is None else str(value)


def _failed(key: str, why: str, segment: SegmentInfo | None) -> None:
    raise ConditionalCheckFailed(f"attribute {key} {why}", segment=segment)
