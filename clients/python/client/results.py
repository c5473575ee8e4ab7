"""What the client's calls answer (appends, reads, segment info) and the attribute updates they take."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AppendResult:
    """An append's answer: where its bytes start (``None`` for a duplicate) and the new length."""

    offset: int | None
    length: int
    duplicate: bool = False
    event_number: int | None = None


@dataclass(frozen=True)
class ReadResult:
    """Bytes read, the offset to ask for next, and the segment's state at the time of the read."""

    data: bytes
    next_offset: int
    sealed: bool
    length: int

    @property
    def at_sealed_end(self) -> bool:
        """True when nothing more will ever be readable past ``next_offset``."""
        return self.sealed and self.next_offset >= self.length


@dataclass(frozen=True)
class LiveRead:
    """Bytes a live stream delivered, and the offset that follows them."""

    data: bytes
    next_offset: int


@dataclass(frozen=True)
class SegmentInfo:
    """The JSON info of a segment."""

    name: str
    length: int
    start_offset: int
    storage_length: int
    sealed: bool
    event_count: int
    created: str
    last_modified: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SegmentInfo:
        return cls(**{field: body[field] for field in cls.__dataclass_fields__})


@dataclass(frozen=True)
class AttributeUpdate:
    """One attribute update (docs/api.md "Attributes"): ``type`` is replace, replace_if_greater,
    replace_if_equals, accumulate or none; ``expected`` is for replace_if_equals."""

    key: uuid.UUID | str
    type: str
    value: int
    expected: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": str(self.key), "type": self.type, "value": self.value}
        if self.type == "replace_if_equals":
            body["expected"] = self.expected
        return body
