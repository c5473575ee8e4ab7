"""The Durable Streams errors, typed like the engine's; ``routes`` maps each to its status."""

from __future__ import annotations

from engine import SegmentNotFound, SegstoreError


class StreamNotFound(SegmentNotFound):
    """No such stream (or it expired); its code stays ``SegmentNotFound`` (404)."""


class StreamGone(SegstoreError):
    """The stream was deleted or expired, but forks still read its bytes (410)."""

    code = "StreamGone"


class StreamConflict(SegstoreError):
    """The request contradicts the stream: other configuration, content type, ``Stream-Seq`` (409)."""

    code = "StreamConflict"


class StreamClosed(SegstoreError):
    """An append to a closed stream (409 with ``Stream-Closed``); ``next_offset`` is its tail."""

    code = "StreamClosed"

    def __init__(self, detail: str, next_offset: str) -> None:
        super().__init__(detail)
        self.next_offset = next_offset
