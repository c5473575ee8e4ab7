"""Typed engine errors.

Every error the engine raises on purpose is a ``SegstoreError`` subclass with
a stable ``code`` (the problem ``code`` of docs/api.md "Errors"). The HTTP
layer maps each code to one status in one table; nothing here knows about
HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.types import SegmentInfo


class SegstoreError(Exception):
    """Base of every engine error; ``segment`` is the segment's state when known.

    ``step``: in a composite operation, the index of the part that was refused.
    """

    code = "Internal"

    def __init__(self, detail: str, *, segment: SegmentInfo | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.segment = segment
        self.step: int | None = None


class InvalidName(SegstoreError):
    code = "InvalidName"


class InvalidArgument(SegstoreError):
    code = "InvalidArgument"


class SegmentNotFound(SegstoreError):
    code = "SegmentNotFound"


class SegmentExists(SegstoreError):
    code = "SegmentExists"


class SegmentSealed(SegstoreError):
    code = "SegmentSealed"


class SegmentNotSealed(SegstoreError):
    """A merge's source must be sealed first."""

    code = "SegmentNotSealed"


class SegmentTruncated(SegstoreError):
    code = "SegmentTruncated"


class ConditionalCheckFailed(SegstoreError):
    code = "ConditionalCheckFailed"


class EventNumberMismatch(ConditionalCheckFailed):
    """A conditional append (seed 001): the writer's last stored event number is not the one named.

    ``stored`` is the number stored for the writer on the segment (None: none yet).
    """

    def __init__(self, detail: str, *, stored: int | None, segment: SegmentInfo | None = None) -> None:
        super().__init__(detail, segment=segment)
        self.stored = stored


class PayloadTooLarge(SegstoreError):
    code = "PayloadTooLarge"


class BadOffset(SegstoreError):
    """A read or truncate offset beyond the segment's length."""

    code = "OffsetOutOfRange"


class Throttled(SegstoreError):
    """Back-pressure: the caller should retry after ``retry_after_s``."""

    code = "Throttled"

    def __init__(
        self, detail: str, *, retry_after_s: float = 1.0, segment: SegmentInfo | None = None
    ) -> None:
        super().__init__(detail, segment=segment)
        self.retry_after_s = retry_after_s


class AttributesNotLoaded(Throttled):
    """An operation needs attribute values the metadata does not hold: fetch them, then retry.

    The container retries on its own; a caller sees it only if retries run out.
    """


class LayoutChanged(Throttled):
    """A fork named chunks its source's Tier 2 layout no longer holds (defrag or truncation came first).

    The container takes the layout again and retries on its own.
    """


class ContainerNotReady(Throttled):
    """The container is recovering, stopped, or its Tier 1 log failed."""


class OutcomeUnknown(SegstoreError):
    """The request may or may not have been applied: it must not be resent blindly.

    A node that lost its container (fenced by the next owner) while the
    request's Tier 1 write was in flight, or a forwarded request whose node
    failed while it ran. The client reads back, or resends with a writer id or
    ``Expected-Offset``, which make a second attempt safe.
    """

    code = "OutcomeUnknown"


class StorageFull(SegstoreError):
    """Tier 1 has no room for more bytes; nothing acknowledged is lost."""

    code = "StorageFull"


class DataCorrupted(SegstoreError):
    """Stored data contradicts itself (a bad frame inside the log, a short Tier 2 file)."""

    code = "DataCorrupted"


class StoreLocked(SegstoreError):
    """Another process owns the data directory."""

    code = "StoreLocked"


class Misconfigured(InvalidArgument):
    """The settings cannot work, whatever is retried: another Tier 2 than the data folder was
    created with, a missing bucket, refused credentials. The server refuses to start."""

    @classmethod
    def unusable(cls, where: str, why: Exception) -> Misconfigured:
        """A tier that refuses us (``where``: "Tier 2 at s3://b/p", say): the one wording of that refusal."""
        return cls(f"{where} cannot be used: {why}")
