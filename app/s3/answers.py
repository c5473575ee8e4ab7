"""S3 error answers: engine (and auth) errors translated, and every error rendered as S3 XML.

Every answer of the surface is an S3 ``<Error>`` document (``S3Error``); a
HEAD answer carries the status alone, as S3's does.
"""

from __future__ import annotations

import logging
import math
from xml.sax.saxutils import escape

from flask import Response, request

from app import ops
from app.auth import Forbidden, Unauthorized
from app.errors import MalformedBody
from app.s3.errors import S3Error
from engine import (
    ConditionalCheckFailed,
    InvalidArgument,
    InvalidName,
    OutcomeUnknown,
    PayloadTooLarge,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegstoreError,
    Throttled,
)

log = logging.getLogger(__name__)


def from_engine(err: SegstoreError, *, missing: str = "NoSuchKey") -> S3Error:
    """The S3 error for an engine (or auth) error; ``missing`` names what a SegmentNotFound means."""
    if isinstance(err, SegmentNotFound):
        return S3Error(missing, "The specified key does not exist." if missing == "NoSuchKey" else err.detail)
    if isinstance(err, (Unauthorized, Forbidden)):
        return S3Error("AccessDenied", err.detail)
    if isinstance(err, ConditionalCheckFailed):
        return S3Error("PreconditionFailed", err.detail)
    if isinstance(err, SegmentExists):
        return S3Error("OperationAborted", f"a conflicting operation is in progress: {err.detail}")
    if isinstance(err, SegmentSealed):
        return S3Error("InvalidRequest", f"the object is sealed and takes no appends: {err.detail}")
    if isinstance(err, InvalidName):
        return S3Error("InvalidArgument", f"the key cannot name a segment: {err.detail}")
    if isinstance(err, SegmentTruncated):  # between the object's size and its read (app/s3/reading.py)
        return S3Error("OperationAborted", f"the object was truncated while it was read: {err.detail}")
    if isinstance(err, PayloadTooLarge):
        return S3Error("EntityTooLarge", err.detail)
    if isinstance(err, MalformedBody):
        return S3Error("IncompleteBody", err.detail)
    if isinstance(err, InvalidArgument):
        return S3Error("InvalidArgument", err.detail)
    if isinstance(err, Throttled):
        retry = str(max(1, math.ceil(err.retry_after_s)))
        return S3Error("SlowDown", err.detail, headers={"Retry-After": retry})
    if isinstance(err, OutcomeUnknown):  # an S3 write is whole: resending it is safe
        return S3Error("InternalError", err.detail)
    if err.code in ("StoreLocked", "StorageFull", "Throttled"):
        return S3Error("ServiceUnavailable", err.detail, headers={"Retry-After": "1"})
    log.error("%s: %s: %s", ops.request_ref(), err.code, err.detail)
    return S3Error("InternalError", "We encountered an internal error. Please try again.")


def render(err: S3Error) -> Response:
    """The ``<Error>`` document (no body for HEAD), with the request id S3 clients log."""
    request_id = ops.request_id(request.environ)
    headers = {"x-amz-request-id": request_id, **err.headers}
    if request.method == "HEAD":
        return Response(status=err.status, headers=headers)
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{err.code}</Code><Message>{escape(err.message)}</Message>"
        f"<Resource>{escape(request.path)}</Resource><RequestId>{request_id}</RequestId></Error>"
    )
    return Response(body, status=err.status, headers=headers, content_type="application/xml")


def render_engine_error(err: SegstoreError) -> Response:
    return render(from_engine(err))


def render_unexpected(err: Exception) -> Response:
    """An error nobody raised on purpose: logged whole, answered as S3's InternalError."""
    log.exception("unhandled error in %s", ops.request_ref(), exc_info=err)
    return render(S3Error("InternalError", "We encountered an internal error. Please try again."))
