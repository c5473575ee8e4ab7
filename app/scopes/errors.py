"""The stream layer's errors, typed like the engine's; app/errors.py maps each code to its status."""

from __future__ import annotations

from engine import SegmentNotFound, SegstoreError


class ScopeNotFound(SegmentNotFound):
    """No such scope (404, code ``SegmentNotFound``)."""


class StreamNotFound(SegmentNotFound):
    """No such stream, epoch, segment of a stream or stream transaction (404, code ``SegmentNotFound``)."""


class StreamConflict(SegstoreError):
    """A create of an existing stream with another configuration (409)."""

    code = "StreamConflict"


class StreamSealed(SegstoreError):
    """The stream is sealed (or being sealed): no event, scale or transaction is taken (409)."""

    code = "StreamSealed"


class StreamNotSealed(SegstoreError):
    """A delete of a stream that is not sealed (409, as Pravega)."""

    code = "StreamNotSealed"


class ScaleConflict(SegstoreError):
    """Another scale is in progress, or the segments a scale names are not all current (409)."""

    code = "ScaleConflict"


class TransactionNotOpen(SegstoreError):
    """An event, commit or abort the transaction's state refuses: committed, aborted, expired (409)."""

    code = "TransactionNotOpen"
