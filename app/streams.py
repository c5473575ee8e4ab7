"""The Durable Streams protocol under ``/v1/stream/{name}``: HTTP only.

Handlers parse the protocol's headers and query, call ``StreamStore``
(engine/streams.py) and shape its answers: status codes, ``Stream-*`` and
``Producer-*`` headers, JSON-mode bodies, long-poll and SSE tails. Every
response carries the CORS and browser security headers of the protocol.
Errors are problem+json like the rest of segstore, with the protocol's
status codes (404 missing, 410 soft-deleted, 409 conflicts and closed).
"""

from __future__ import annotations

import base64
import json
import math
import random
import re
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlparse

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.routing import BaseConverter

from app import inputs, ops
from app.errors import problem, render_segstore_error
from engine import (
    MAX_PRODUCER_EPOCH,
    MAX_PRODUCER_SEQ,
    InvalidArgument,
    Producer,
    SegmentStore,
    SegstoreError,
    StreamClosed,
    StreamRead,
    StreamStore,
    is_json,
    normalize_content_type,
    validate_expires_at,
)

if TYPE_CHECKING:
    from app.auth import AuthConfig  # app.auth imports this module

bp = Blueprint("streams", __name__)

PREFIX = "/v1/stream/"
EVENT_STREAM = "text/event-stream"
_OFFSET_PARAM = re.compile(r"^(-1|now|\d+_\d+)$")
_FORK_OFFSET = re.compile(r"^\d+_\d+$")
_DECIMAL = re.compile(r"^(0|[1-9]\d*)$")
_DIGITS = re.compile(r"^\d+$")
_MEDIA_TYPE = re.compile(r"^[\w-]+/[\w-]+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Cursors count 20-second intervals from the protocol's epoch (2024-10-09T00:00:00Z).
_CURSOR_EPOCH_S = 1728432000
_CURSOR_INTERVAL_S = 20
_MAX_JITTER_S = 3600
# Reads below the tail never change; a tail read does on the next append.
_CACHE_IMMUTABLE = "public, max-age=60, stale-while-revalidate=300"

_STATUS_BY_CODE = {
    "SegmentNotFound": 404,
    "StreamGone": 410,
    "StreamConflict": 409,
    "StreamClosed": 409,
    "InvalidArgument": 400,
    "InvalidName": 400,
    "InvalidHeader": 400,
}

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, HEAD, OPTIONS",
    "Access-Control-Allow-Headers": (
        "content-type, authorization, if-none-match, Stream-Seq, Stream-TTL, Stream-Expires-At, "
        "Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, "
        "Stream-Fork-Offset, Stream-Fork-Sub-Offset"
    ),
    "Access-Control-Expose-Headers": (
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Producer-Epoch, "
        "Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, Stream-SSE-Data-Encoding, "
        "etag, content-type, content-encoding, vary, location"
    ),
    # Browser security (protocol section 10.7).
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Resource-Policy": "cross-origin",
}


class StreamPathConverter(BaseConverter):
    """Everything after ``/v1/stream/``; the stream layer escapes it into segment names."""

    regex = r"[\s\S]+"
    part_isolating = False


bp.record_once(lambda state: state.app.url_map.converters.update(stream_path=StreamPathConverter))


def init_app(app: Flask, store: SegmentStore) -> None:
    """Build the stream layer over ``store``, start its reaper and register the routes.

    Plain appends take the WSGI shortcut (``PlainAppend``) in front of Flask.
    """
    streams = StreamStore(store, reap_interval_s=store.settings.stream_reap_interval_s)
    streams.start()
    app.extensions["streams"] = streams
    app.register_blueprint(bp)
    app.wsgi_app = PlainAppend(app, app.wsgi_app)  # type: ignore[method-assign]


def streams() -> StreamStore:
    return current_app.extensions["streams"]


@bp.after_request
def _protocol_headers(response: Response) -> Response:
    for key, value in CORS_HEADERS.items():
        response.headers.setdefault(key, value)
    return response


@bp.errorhandler(SegstoreError)
def _render_error(err: SegstoreError) -> Response:
    """Engine errors with the protocol's status codes (409 closed carries the tail offset)."""
    status = _STATUS_BY_CODE.get(err.code)
    if status is None:
        return render_segstore_error(err)
    headers = {}
    if isinstance(err, StreamClosed):
        headers = {"Stream-Closed": "true", "Stream-Next-Offset": err.next_offset}
    return problem(err.code, err.detail, headers=headers, status=status)


@bp.route(
    "/v1/stream/<stream_path:name>",
    methods=["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"],
    provide_automatic_options=False,
)
def stream(name: str) -> Response:
    handler = {
        "GET": read,
        "HEAD": head,
        "PUT": create,
        "POST": append,
        "DELETE": delete,
        "OPTIONS": preflight,
    }[request.method]
    return handler(name)


# ---------------------------------------------------------------- helpers
def _header(name: str) -> str | None:
    return request.headers.get(name)


def _bad(detail: str) -> InvalidArgument:
    return InvalidArgument(detail)


def response_cursor(client_cursor: str | None, now_s: float | None = None) -> str:
    """The ``Stream-Cursor`` for a live answer (protocol section 8.1).

    The current interval number; when the client already holds it (or a
    later one), a later one with random jitter, so CDN-collapsed requests move on.
    """
    now_s = time.time() if now_s is None else now_s
    current = int((now_s - _CURSOR_EPOCH_S) // _CURSOR_INTERVAL_S)
    try:
        client = int(client_cursor) if client_cursor else None
    except ValueError:
        client = None
    if client is None or client < current:
        return str(current)
    jitter_s = random.randint(1, _MAX_JITTER_S)
    return str(client + max(1, math.ceil(jitter_s / _CURSOR_INTERVAL_S)))


def _body(result: StreamRead) -> bytes:
    if is_json(result.content_type):
        return b"[" + b",".join(result.messages) + b"]"
    return b"".join(result.messages)


def _etag(name: str, start: str, result: StreamRead) -> str:
    tag = base64.b64encode(name.encode()).decode()
    return f'"{tag}:{start}:{result.next_offset}{":c" if result.closed else ""}"'


def fork_source(header: str) -> str:
    """A ``Stream-Forked-From`` value (a path or a URL of a stream) as a stream name."""
    path = unquote(urlparse(header).path or header)
    return path.removeprefix(PREFIX)


def _long_poll_s() -> float:
    settings = current_app.extensions["segstore"].settings
    return min(settings.stream_long_poll_s, settings.tail_wait_max_s)


# --------------------------------------------------------------- handlers
def preflight(name: str) -> Response:
    return Response(status=204)


def create(name: str) -> Response:
    """PUT: create (201 with Location), confirm (200), or 409 for another configuration."""
    forked_from = _header("Stream-Forked-From")
    content_type = _header("Content-Type")
    if not content_type or not _MEDIA_TYPE.match(content_type.strip()):
        content_type = None  # the default, or for a fork the source's
    ttl = _header("Stream-TTL")
    expires_at = _header("Stream-Expires-At")
    if ttl is not None and expires_at is not None:
        raise _bad("Stream-TTL and Stream-Expires-At exclude each other")
    if ttl is not None and not _DECIMAL.match(ttl):
        raise _bad(f"Stream-TTL must be a decimal number of seconds, got {ttl!r}")
    if expires_at is not None:
        validate_expires_at(expires_at)
    fork_offset = _header("Stream-Fork-Offset")
    if fork_offset is not None and not _FORK_OFFSET.match(fork_offset):
        raise _bad(f"Stream-Fork-Offset {fork_offset!r} is not an offset")
    sub_offset_text = _header("Stream-Fork-Sub-Offset")
    sub_offset = 0
    if sub_offset_text is not None:
        if forked_from is None:
            raise _bad("Stream-Fork-Sub-Offset needs Stream-Forked-From")
        if not _DECIMAL.match(sub_offset_text):
            raise _bad(f"Stream-Fork-Sub-Offset {sub_offset_text!r} is not a non-negative integer")
        sub_offset = int(sub_offset_text)
    body = inputs.read_body(
        request.stream,
        request.content_length,
        current_app.extensions["segstore"].settings.max_append_bytes,
        "body",
    )
    info, created = streams().create(
        name,
        content_type=content_type,
        ttl_s=int(ttl) if ttl is not None else None,
        expires_at=expires_at,
        closed=_header("Stream-Closed") == "true",
        body=body,
        forked_from=fork_source(forked_from) if forked_from is not None else None,
        fork_offset=fork_offset,
        fork_sub_offset=sub_offset,
    )
    response = Response(status=201 if created else 200, content_type=info.content_type)
    response.headers["Stream-Next-Offset"] = info.next_offset
    if created:
        response.headers["Location"] = request.host_url.rstrip("/") + quote(request.path)
    if info.closed:
        response.headers["Stream-Closed"] = "true"
    return response


def head(name: str) -> Response:
    """HEAD: the tail offset and configuration; never cached, not an access for TTL."""
    info = streams().info(name)
    response = Response(status=200, content_type=info.content_type)
    response.headers["Stream-Next-Offset"] = info.next_offset
    response.headers["Cache-Control"] = "no-store"
    if info.closed:
        response.headers["Stream-Closed"] = "true"
    if info.ttl_s is not None:
        response.headers["Stream-TTL"] = str(info.ttl_s)
    if info.expires_at is not None:
        response.headers["Stream-Expires-At"] = info.expires_at
    tag = base64.b64encode(name.encode()).decode()
    response.headers["ETag"] = f'"{tag}:-1:{info.next_offset}{":c" if info.closed else ""}"'
    return response


def delete(name: str) -> Response:
    streams().delete(name)
    return Response(status=204)


def _offset_param() -> str | None:
    offsets = request.args.getlist("offset")
    if len(offsets) > 1:
        raise _bad("give one offset parameter, not several")
    if not offsets:
        return None
    offset = offsets[0]
    if not _OFFSET_PARAM.match(offset):
        raise _bad(f"offset {offset!r} is not -1, now or an offset this server gave")
    return offset


def read(name: str) -> Response:
    """GET: catch-up read, ``offset=now``, ``live=long-poll`` or ``live=sse``."""
    offset = _offset_param()
    live = request.args.get("live")
    cursor = request.args.get("cursor")
    if live in ("long-poll", "sse") and offset is None:
        raise _bad(f"live={live} needs an offset parameter")
    start = None if offset in (None, "-1") else offset
    if live == "sse":
        return _event_stream(name, start, cursor)
    if offset == "now" and live != "long-poll":
        result = streams().read(name, "now")
        response = Response(b"[]" if is_json(result.content_type) else b"", content_type=result.content_type)
        response.headers.update({"Stream-Next-Offset": result.next_offset, "Stream-Up-To-Date": "true"})
        response.headers["Cache-Control"] = "no-store"
        if result.closed:
            response.headers["Stream-Closed"] = "true"
        return response
    result = streams().read(name, start)
    if live == "long-poll" and not result.messages and result.up_to_date:
        if not result.closed:
            result = streams().read(name, result.next_offset, wait_s=_long_poll_s())
        if not result.messages:
            response = Response(status=204)
            response.headers.update(
                {
                    "Stream-Next-Offset": result.next_offset,
                    "Stream-Up-To-Date": "true",
                    "Stream-Cursor": response_cursor(cursor),
                }
            )
            if result.closed:
                response.headers["Stream-Closed"] = "true"
            return response
    etag = _etag(name, offset or "-1", result)
    if request.headers.get("If-None-Match") == etag:
        response = Response(status=304)
        response.headers["ETag"] = etag
        return response
    response = Response(_body(result), status=200, content_type=result.content_type)
    response.headers["Stream-Next-Offset"] = result.next_offset
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = "no-store" if result.up_to_date else _CACHE_IMMUTABLE
    if live == "long-poll":
        response.headers["Stream-Cursor"] = response_cursor(cursor)
    if result.up_to_date:
        response.headers["Stream-Up-To-Date"] = "true"
    if result.closed:
        response.headers["Stream-Closed"] = "true"
    return response


def _producer() -> Producer | None:
    """The idempotent producer headers: all three or none, integers without sign or exponent."""
    pid, epoch, seq = (_header(h) for h in ("Producer-Id", "Producer-Epoch", "Producer-Seq"))
    given = [v is not None for v in (pid, epoch, seq)]
    if not any(given):
        return None
    if not all(given):
        raise _bad("Producer-Id, Producer-Epoch and Producer-Seq go together")
    if pid == "":
        raise _bad("Producer-Id must not be empty")
    if not _DIGITS.match(epoch) or int(epoch) > MAX_PRODUCER_EPOCH:
        raise _bad(f"Producer-Epoch must be an integer from 0 to {MAX_PRODUCER_EPOCH}, got {epoch!r}")
    if not _DIGITS.match(seq) or int(seq) > MAX_PRODUCER_SEQ:
        raise _bad(f"Producer-Seq must be an integer from 0 to {MAX_PRODUCER_SEQ}, got {seq!r}")
    return Producer(pid, int(epoch), int(seq))


def append(name: str) -> Response:
    """POST: append a message, close the stream (``Stream-Closed: true``), or both."""
    producer = _producer()
    close = _header("Stream-Closed") == "true"
    content_type = _header("Content-Type")
    body = inputs.read_body(
        request.stream,
        request.content_length,
        current_app.extensions["segstore"].settings.max_append_bytes,
        "body",
    )
    if not body and not close:
        raise _bad("an append needs a body (or Stream-Closed: true to close)")
    if body and not content_type:
        raise _bad("an append needs a Content-Type")
    outcome = streams().append(
        name,
        body,
        content_type=content_type if body else None,
        seq=_header("Stream-Seq"),
        producer=producer,
        close=close,
    )
    headers: dict[str, str] = {}
    if outcome.status == "appended":
        status = 200 if producer is not None and body else 204
        headers["Stream-Next-Offset"] = outcome.next_offset
        if producer is not None:
            headers.update({"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(producer.seq)})
        if outcome.closed:
            headers["Stream-Closed"] = "true"
        return Response(status=status, headers=headers)
    assert producer is not None
    if outcome.status == "duplicate":
        headers = {"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(outcome.last_seq)}
        if outcome.closed:
            headers.update({"Stream-Closed": "true", "Stream-Next-Offset": outcome.next_offset})
        return Response(status=204, headers=headers)
    if outcome.status == "stale_epoch":
        return problem(
            "ProducerEpochStale",
            f"producer epoch {producer.epoch} is older than {outcome.current_epoch}",
            headers={"Producer-Epoch": str(outcome.current_epoch)},
            status=403,
        )
    if outcome.status == "invalid_epoch_seq":
        raise _bad("a new producer epoch starts at Producer-Seq 0")
    return problem(
        "ProducerSequenceGap",
        f"producer sequence gap: expected {outcome.expected_seq}, got {producer.seq}",
        headers={
            "Producer-Expected-Seq": str(outcome.expected_seq),
            "Producer-Received-Seq": str(producer.seq),
        },
        status=409,
    )


# ------------------------------------------------------------ the shortcut
_ROUTE = "/v1/stream/<stream_path:name>"
# Headers that make an append more than a plain one: Flask serves those.
_NOT_PLAIN = (
    "HTTP_PRODUCER_ID",
    "HTTP_PRODUCER_EPOCH",
    "HTTP_PRODUCER_SEQ",
    "HTTP_STREAM_SEQ",
    "HTTP_STREAM_CLOSED",
    "HTTP_TRANSFER_ENCODING",
)
_APPENDED_HEADERS = list(CORS_HEADERS.items())


class PlainAppend:
    """WSGI shortcut for the hot path: a POST with a body and a Content-Length, and nothing else.

    It answers what ``append`` would (204 with ``Stream-Next-Offset`` and the
    protocol headers) without building Flask's request, context, routing and
    response: on the append path those cost more than the append itself
    (DESIGN.md "Facts measured": 1.6k req/s under Flask, 4.7k for plain WSGI).
    Anything else (producers, ``Stream-Seq``, closing, chunked bodies,
    native auth, paths Flask would redirect) goes to Flask untouched, and an
    error of the append is rendered by the blueprint's own handler. No other
    Flask hook runs for it: a ``before_request`` added for stream routes
    must be added here too.
    """

    def __init__(self, app: Flask, wsgi_app: Any) -> None:
        self.app = app
        self.wsgi_app = wsgi_app
        self.streams: StreamStore = app.extensions["streams"]
        self.max_bytes: int = app.extensions["segstore"].settings.max_append_bytes
        self.auth: AuthConfig = app.extensions["segstore.auth"]

    def _plain(self, environ: dict[str, Any]) -> tuple[str, int] | None:
        """(stream name, body length) of a plain append, else None."""
        if environ["REQUEST_METHOD"] != "POST" or self.auth.native_enabled:
            return None
        path: str = environ.get("PATH_INFO", "")
        if not path.startswith(PREFIX) or len(path) == len(PREFIX) or "//" in path:
            return None
        if not environ.get("CONTENT_TYPE") or any(key in environ for key in _NOT_PLAIN):
            return None
        length = environ.get("CONTENT_LENGTH", "")
        if not length.isdigit() or not 0 < int(length) <= self.max_bytes or not inputs.path_is_utf8(environ):
            return None
        return path[len(PREFIX) :].encode("latin-1").decode("utf-8"), int(length)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        plain = self._plain(environ)
        if plain is None:
            return self.wsgi_app(environ, start_response)
        name, length = plain
        environ[ops.ROUTE_KEY] = _ROUTE
        try:
            body = environ["wsgi.input"].read(length)
            if len(body) != length:
                raise InvalidArgument(f"the body ended after {len(body)} of its {length} bytes")
            outcome = self.streams.append(name, body, content_type=environ["CONTENT_TYPE"])
        except SegstoreError as err:
            with self.app.request_context(environ):
                response = self.app.make_response(self.app.handle_user_exception(err))
                response = self.app.process_response(response)
            return response(environ, start_response)
        start_response("204 NO CONTENT", [("Stream-Next-Offset", outcome.next_offset), *_APPENDED_HEADERS])
        return []


# --------------------------------------------------------------------- SSE
def _sse_event(kind: str, payload: str) -> bytes:
    """One event; each line of the payload gets its own ``data:`` (no CR/LF injection)."""
    lines = "\n".join(f"data:{line}" for line in _LINE_BREAK.split(payload))
    return f"event: {kind}\n{lines}\n\n".encode()


def _sse_data(result: StreamRead, binary: bool) -> bytes:
    if binary:
        return _sse_event("data", base64.b64encode(b"".join(result.messages)).decode())
    return _sse_event("data", _body(result).decode("utf-8", "replace"))


def _sse_control(result: StreamRead, cursor: str | None) -> bytes:
    control: dict[str, object] = {"streamNextOffset": result.next_offset}
    if result.closed:
        control["streamClosed"] = True
    else:
        control["streamCursor"] = response_cursor(cursor)
        if result.up_to_date:
            control["upToDate"] = True
    return _sse_event("control", json.dumps(control, separators=(",", ":")))


def _event_stream(name: str, start: str | None, cursor: str | None) -> Response:
    """``live=sse``: data events (base64 unless text or JSON), each followed by a control event.

    The first read happens before the response starts, so 404 and 410 are
    answered as such; the stream ends after ``streamClosed``.
    """
    store = current_app.extensions["segstore"]
    layer = streams()
    wait_s = _long_poll_s()
    first = layer.read(name, start)
    media = normalize_content_type(first.content_type)
    binary = not (media.startswith("text/") or media == "application/json")

    def events() -> Iterator[bytes]:
        result = first
        while True:
            # One write for both, so a reader never sees data without its control event.
            data = _sse_data(result, binary) if result.messages else b""
            yield data + _sse_control(result, cursor)
            if result.closed or store.draining:
                return
            try:
                result = layer.read(name, result.next_offset, wait_s=wait_s if result.up_to_date else 0.0)
            except SegstoreError:
                return

    response = Response(events(), status=200, content_type=EVENT_STREAM)
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    if binary:
        response.headers["Stream-SSE-Data-Encoding"] = "base64"
    return response
