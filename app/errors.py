"""Errors as RFC 9457 problem details: the one table from error code to HTTP status.

Every error a request can meet (an engine error, a bad header, an unknown
route, an unexpected exception) leaves as ``application/problem+json``
``{"type", "title", "status", "code", "detail"}``, plus the segment's state
headers when the error knows the segment, and ``Retry-After`` when throttled.
A true internal error is logged with its stack trace; the body only says
that it happened.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from flask import Flask, Response, json, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.http import HTTP_STATUS_CODES

from app import ops
from engine import EventNumberMismatch, InvalidArgument, SegmentInfo, SegstoreError, Throttled

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
# werkzeug's errors whose status has a code of its own.
_CODE_BY_HTTP_STATUS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    413: "PayloadTooLarge",
}
# What werkzeug's routing serves beside a rule's own methods (HEAD for GET, and
# OPTIONS): a 405 from routing does not advertise them in ``Allow``.
_IMPLICIT_METHODS = frozenset({"HEAD", "OPTIONS"})

# code -> (HTTP status, title): every code an answer can carry, and nothing else. docs/api.md
# "Errors" explains them and openapi.yaml's ProblemCode lists them (tests/app/test_problem_codes.py).
STATUS_BY_CODE: dict[str, tuple[int, str]] = {
    "InvalidName": (400, "Invalid segment name"),
    "InvalidHeader": (400, "Invalid header"),
    "InvalidArgument": (400, "Invalid argument"),
    "Unauthorized": (401, "Unauthorized"),
    "Forbidden": (403, "Forbidden"),
    "NotFound": (404, "Not found"),
    "SegmentNotFound": (404, "Segment not found"),
    "MethodNotAllowed": (405, "Method not allowed"),
    "SegmentExists": (409, "Segment exists"),
    "SegmentSealed": (409, "Segment sealed"),
    "SegmentNotSealed": (409, "Segment not sealed"),
    "SegmentTruncated": (410, "Segment truncated"),
    "ConditionalCheckFailed": (412, "Conditional check failed"),
    "PayloadTooLarge": (413, "Payload too large"),
    "OffsetOutOfRange": (416, "Offset out of range"),
    "Throttled": (503, "Throttled"),
    "StoreLocked": (503, "Store locked"),
    "StorageFull": (507, "Storage full"),
    "OutcomeUnknown": (502, "Outcome unknown"),
    "DataCorrupted": (500, "Data corrupted"),
    "Internal": (500, "Internal error"),
    # Durable Streams (app/streams.py): the protocol's own answers.
    "ProducerEpochStale": (403, "Producer epoch stale"),
    "StreamConflict": (409, "Stream conflict"),
    "StreamClosed": (409, "Stream closed"),
    "ProducerSequenceGap": (409, "Producer sequence gap"),
    "StreamGone": (410, "Stream gone"),
    # Streams (app/scopes): a stream's state refuses the request.
    "StreamSealed": (409, "Stream sealed"),
    "StreamNotSealed": (409, "Stream not sealed"),
    "ScaleConflict": (409, "Scale conflict"),
    "TransactionNotOpen": (409, "Transaction not open"),
}


class InvalidHeader(SegstoreError):
    """A request header is malformed, out of range or missing its partner.

    It lives here, not in the engine, because only HTTP knows headers.
    """

    code = "InvalidHeader"


class MalformedBody(InvalidArgument):
    """A request body the HTTP server could not decode (a broken ``Transfer-Encoding: chunked``).

    HTTP-only, like ``InvalidHeader``; a 400 ``InvalidArgument`` on the
    native surfaces, ``IncompleteBody`` on S3.
    """


def segment_headers(info: SegmentInfo) -> dict[str, str]:
    """The headers that carry a segment's state on every response that touches it."""
    return {
        "Segment-Length": str(info.length),
        "Segment-Start-Offset": str(info.start_offset),
        "Segment-Sealed": "true" if info.sealed else "false",
    }


def problem(code: str, detail: str, *, headers: dict[str, str] | None = None) -> Response:
    """Render one problem+json response for ``code``: status and title from the table.

    A code outside the table is a bug here (a client's SDK would not know
    it): ``KeyError``, which ends as a logged 500 ``Internal``.
    """
    status, title = STATUS_BY_CODE[code]
    body = {
        "type": f"urn:segstore:problem:{code}",
        "title": title,
        "status": status,
        "code": code,
        "detail": detail,
    }
    # Names in the detail stay readable: UTF-8, not \\u escapes.
    response = Response(json.dumps(body, ensure_ascii=False), status=status, content_type=PROBLEM_JSON)
    response.headers.update(headers or {})
    return response


def render_segstore_error(err: SegstoreError) -> Response:
    """Map an engine (or HTTP-layer) error to its status, with segment and retry headers."""
    headers: dict[str, str] = {}
    code = err.code if err.code in STATUS_BY_CODE else "Internal"
    status = STATUS_BY_CODE[code][0]
    if err.segment is not None:
        headers.update(segment_headers(err.segment))
        if status == 416:
            headers["Content-Range"] = f"bytes */{err.segment.length}"
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(err, Throttled):
        headers["Retry-After"] = str(max(0, math.ceil(err.retry_after_s)))
    if isinstance(err, EventNumberMismatch) and err.stored is not None:
        headers["Writer-Event-Number"] = str(err.stored)
    if status >= 500 and code not in ("Throttled", "StoreLocked", "StorageFull", "OutcomeUnknown"):
        log.error("%s: %s: %s", ops.request_ref(), err.code, err.detail)
    return problem(code, err.detail, headers=headers)


def method_not_allowed(allowed: Iterable[str]) -> Response:
    """405 ``MethodNotAllowed`` whose ``Allow`` names ``allowed``: the path's methods in openapi.yaml."""
    allow = ", ".join(sorted(allowed))
    detail = f"{request.method} is not allowed on {request.path}; allowed: {allow}"
    return problem("MethodNotAllowed", detail, headers={"Allow": allow})


def render_http_exception(err: HTTPException) -> Response:
    """Routing and protocol errors from werkzeug (404, 405, ...) as problems.

    Each becomes a code of the table: the one of its status where there is
    one (``_CODE_BY_HTTP_STATUS``), else 400 ``InvalidArgument`` for a
    client error and 500 ``Internal`` for a server error.
    """
    status = err.code or 500
    if isinstance(err, MethodNotAllowed):
        return method_not_allowed(m for m in err.valid_methods or () if m not in _IMPLICIT_METHODS)
    detail = err.description or HTTP_STATUS_CODES.get(status, "Error")
    if isinstance(err, NotFound) and detail == NotFound.description:
        detail = f"no resource at {request.path}"
    code = _CODE_BY_HTTP_STATUS.get(status, "InvalidArgument" if status < 500 else "Internal")
    return problem(code, detail)


def render_unexpected(err: Exception) -> Response:
    """Anything not raised on purpose: log it whole, answer 500 without internals."""
    log.exception("unhandled error in %s", ops.request_ref(), exc_info=err)
    request_id = ops.request_id(request.environ)
    return problem("Internal", f"internal server error; the server log has request {request_id}")


def register_error_handlers(app: Flask) -> None:
    """Install the three handlers: engine errors, werkzeug HTTP errors, everything else."""
    app.register_error_handler(SegstoreError, render_segstore_error)
    app.register_error_handler(HTTPException, render_http_exception)
    app.register_error_handler(Exception, render_unexpected)


def rendered_in_flask(app: Flask, environ: dict[str, Any], start_response: Any, err: SegstoreError) -> Any:
    """Answer ``err`` of a request a WSGI shortcut served, as Flask's handlers would have.

    The answer starts inside the request context, as in Flask, so the request
    metrics see the route Flask matched (a refusal before any view names one).
    """
    with app.request_context(environ):
        response = app.make_response(app.handle_user_exception(err))
        response = app.process_response(response)
        return response(environ, start_response)
