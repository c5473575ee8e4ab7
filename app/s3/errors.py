"""S3 errors: one exception, one table from S3 error code to HTTP status, one XML renderer.

Engine errors met on the S3 surface are translated here too, so every
answer of the surface is an S3 ``<Error>`` document (API.md "S3-compatible
surface"); a HEAD answer carries the status alone, as S3's does.
"""

from __future__ import annotations

import logging
import math
import uuid
from xml.sax.saxutils import escape

from flask import Response, request

from app.auth import Forbidden, Unauthorized
from app.errors import MalformedBody
from engine import (
    ConditionalCheckFailed,
    InvalidArgument,
    InvalidName,
    PayloadTooLarge,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegstoreError,
    Throttled,
)

log = logging.getLogger(__name__)

STATUS_BY_CODE: dict[str, int] = {
    "AuthorizationHeaderMalformed": 400,
    "BadDigest": 400,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "IllegalLocationConstraintException": 400,
    "IncompleteBody": 400,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPartOrder": 400,
    "InvalidRequest": 400,
    "InvalidWriteOffset": 400,
    "KeyTooLongError": 400,
    "MalformedXML": 400,
    "MetadataTooLarge": 400,
    "XAmzContentSHA256Mismatch": 400,
    "AccessDenied": 403,
    "InvalidAccessKeyId": 403,
    "RequestTimeTooSkewed": 403,
    "SignatureDoesNotMatch": 403,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "MethodNotAllowed": 405,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "OperationAborted": 409,
    "MissingContentLength": 411,
    "PreconditionFailed": 412,
    "InvalidPartNumber": 416,
    "InvalidRange": 416,
    "InternalError": 500,
    "NotImplemented": 501,
    "ServiceUnavailable": 503,
    "SlowDown": 503,
}


class S3Error(Exception):
    """An S3 error answer: ``code`` from the table, a message, and extra headers."""

    def __init__(self, code: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS_BY_CODE[code]
        self.headers = headers or {}


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
    if isinstance(err, PayloadTooLarge):
        return S3Error("EntityTooLarge", err.detail)
    if isinstance(err, MalformedBody):
        return S3Error("IncompleteBody", err.detail)
    if isinstance(err, InvalidArgument):
        return S3Error("InvalidArgument", err.detail)
    if isinstance(err, Throttled):
        retry = str(max(1, math.ceil(err.retry_after_s)))
        return S3Error("SlowDown", err.detail, headers={"Retry-After": retry})
    if err.code in ("StoreLocked", "StorageFull", "Throttled"):
        return S3Error("ServiceUnavailable", err.detail, headers={"Retry-After": "1"})
    log.error("%s: %s", err.code, err.detail)
    return S3Error("InternalError", "We encountered an internal error. Please try again.")


def render(err: S3Error) -> Response:
    """The ``<Error>`` document (no body for HEAD), with the request id S3 clients log."""
    request_id = uuid.uuid4().hex[:16].upper()
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
    log.exception("unhandled error in an S3 request", exc_info=err)
    return render(S3Error("InternalError", "We encountered an internal error. Please try again."))
