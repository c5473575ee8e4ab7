"""Typed exceptions, one per problem ``code`` of the HTTP contract (docs/api.md "Errors").

``error_from_response`` turns any non-2xx ``application/problem+json`` answer
into the matching class; an unknown code or a body that is not a problem
still becomes a ``SegstoreClientError`` carrying the status.
"""

from __future__ import annotations

from collections.abc import Mapping

import requests


class SegstoreClientError(Exception):
    """An error answer: HTTP status, problem ``code``, ``detail`` and the ``Segment-*`` headers."""

    def __init__(self, status: int, code: str, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})


class InvalidName(SegstoreClientError):
    """400: the segment name breaks the naming rules."""


class InvalidHeader(SegstoreClientError):
    """400: a request header is malformed."""


class InvalidArgument(SegstoreClientError):
    """400: a query parameter or body is malformed."""


class Unauthorized(SegstoreClientError):
    """401: auth is enabled and the token is missing or wrong."""


class Forbidden(SegstoreClientError):
    """403: the token is not allowed this request."""


class SegmentNotFound(SegstoreClientError):
    """404: no such segment (or transaction)."""


class SegmentExists(SegstoreClientError):
    """409: create of an existing name."""


class SegmentSealed(SegstoreClientError):
    """409: append or truncate past the length on a sealed segment."""


class SegmentNotSealed(SegstoreClientError):
    """409: the operation needs a sealed segment (e.g. the source of a merge)."""


class SegmentTruncated(SegstoreClientError):
    """410: read below the start offset."""


class ConditionalCheckFailed(SegstoreClientError):
    """412: ``Expected-Offset`` differs from the length, ``Previous-Event-Number`` from the writer's
    stored number (``headers["Writer-Event-Number"]``, absent when none), or an attribute condition failed."""

    @property
    def writer_event_number(self) -> int | None:
        """On a ``Previous-Event-Number`` mismatch, the writer's stored number (None: none stored)."""
        value = self.headers.get("Writer-Event-Number")
        return None if value is None else int(value)


class PayloadTooLarge(SegstoreClientError):
    """413: append over the server's ``max_append_bytes``."""


class OffsetOutOfRange(SegstoreClientError):
    """416: read offset beyond the length."""


class DataCorrupted(SegstoreClientError):
    """Stored data failed its checksum."""


class Throttled(SegstoreClientError):
    """503: back-pressure or recovery; retry after ``Retry-After`` seconds."""


class StorageFull(SegstoreClientError):
    """507: Tier 1 cannot take more bytes; nothing acknowledged is lost."""


class OutcomeUnknown(SegstoreClientError):
    """502: the node serving a forwarded request failed during it; it may have been applied."""


class StreamConflict(SegstoreClientError):
    """409: a stream created again with another configuration (or a Durable Streams conflict)."""


class StreamSealed(SegstoreClientError):
    """409: an event, scale or transaction on a sealed stream."""


class StreamNotSealed(SegstoreClientError):
    """409: a delete of a stream that is not sealed."""


class ScaleConflict(SegstoreClientError):
    """409: another scale is pending, or the segments named are not all current."""


class TransactionNotOpen(SegstoreClientError):
    """409: an event, commit or abort the stream transaction's state refuses."""


ERRORS_BY_CODE: dict[str, type[SegstoreClientError]] = {
    cls.__name__: cls
    for cls in (
        InvalidName,
        InvalidHeader,
        InvalidArgument,
        Unauthorized,
        Forbidden,
        SegmentNotFound,
        SegmentExists,
        SegmentSealed,
        SegmentNotSealed,
        SegmentTruncated,
        ConditionalCheckFailed,
        PayloadTooLarge,
        OffsetOutOfRange,
        DataCorrupted,
        Throttled,
        StorageFull,
        OutcomeUnknown,
        StreamConflict,
        StreamSealed,
        StreamNotSealed,
        ScaleConflict,
        TransactionNotOpen,
    )
}


def error_from_response(response: requests.Response) -> SegstoreClientError:
    """Build the exception for an error response from its problem+json body and headers."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("code") or response.reason or "Error")
    detail = str(body.get("detail") or body.get("title") or response.text[:200])
    headers = {
        k: v
        for k, v in response.headers.items()
        if k.lower().startswith("segment-") or k.lower() in ("retry-after", "writer-event-number")
    }
    return ERRORS_BY_CODE.get(code, SegstoreClientError)(response.status_code, code, detail, headers)
