"""The Durable Streams routes under ``/v1/stream/{name}``: HTTP only.

Handlers parse the protocol's headers and query, call ``StreamStore``
(``store``) and shape its answers: status codes, ``Stream-*`` and
``Producer-*`` headers, JSON-mode bodies, long-poll and SSE tails. Every
response carries the CORS and browser security headers of the protocol.
Errors are problem+json like the rest of segstore, with the protocol's
status codes (404 missing, 410 soft-deleted, 409 conflicts and closed).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.routing import BaseConverter

from app import auth, inputs
from app.errors import problem, render_segstore_error
from app.settings import HttpSettings
from app.streams.append_shortcut import StreamAppendShortcut
from app.streams.errors import StreamClosed
from app.streams.format import is_json, validate_expires_at
from app.streams.producers import MAX_PRODUCER_EPOCH, MAX_PRODUCER_SEQ, Producer
from app.streams.protocol import CORS_HEADERS, PREFIX, fork_source, read_body, response_cursor
from app.streams.records import StreamRead
from app.streams.sse import event_stream
from app.streams.store import StreamStore
from engine import InvalidArgument, SegmentStore, SegstoreError

bp = Blueprint("streams", __name__)

_OFFSET_PARAM = re.compile(r"^(-1|now|\d+_\d+)$")
_FORK_OFFSET = re.compile(r"^\d+_\d+$")
# Numbers of the protocol's headers are JavaScript's safe integers (at most 2^53 - 1, 16 digits).
_MAX_SAFE_INTEGER = 2**53 - 1
_DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,15})$")
_DIGITS = re.compile(r"^[0-9]{1,16}$")
# RFC 3339 date-times, as the protocol's clients send them (``Date.toISOString()``).
_DATE_TIME = re.compile(
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
_MEDIA_TYPE = re.compile(r"^[\w-]+/[\w-]+")
# Reads below the tail never change; a tail read does on the next append.
_CACHE_IMMUTABLE = "public, max-age=60, stale-while-revalidate=300"

# Errors answered without segment headers (the stream's segments are not the client's).
_PROTOCOL_CODES = frozenset(
    {"SegmentNotFound", "StreamGone", "StreamConflict", "StreamClosed"}
    | {"InvalidArgument", "InvalidName", "InvalidHeader"}
)


class StreamPathConverter(BaseConverter):
    """Everything after ``/v1/stream/``; the stream layer escapes it into segment names."""

    regex = r"[\s\S]+"
    part_isolating = False


bp.record_once(lambda state: state.app.url_map.converters.update(stream_path=StreamPathConverter))


def init_app(app: Flask, store: SegmentStore) -> None:
    """Build the stream layer over ``store``, start its reaper and register the routes.

    Plain appends take the WSGI shortcut (``StreamAppendShortcut``) in front of Flask.
    """
    http: HttpSettings = app.extensions["segstore.http"]
    streams = StreamStore(store, reap_interval_s=http.stream_reap_interval_s)
    streams.start()
    app.extensions["streams"] = streams
    app.register_blueprint(bp)
    auth.add_touches(app, PREFIX, _fork_touches)
    app.wsgi_app = StreamAppendShortcut(app, app.wsgi_app)  # type: ignore[method-assign]


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
    if err.code not in _PROTOCOL_CODES:
        return render_segstore_error(err)
    headers = {}
    if isinstance(err, StreamClosed):
        headers = {"Stream-Closed": "true", "Stream-Next-Offset": err.next_offset}
    return problem(err.code, err.detail, headers=headers)


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


def _etag(name: str, start: str, result: StreamRead) -> str:
    tag = base64.b64encode(name.encode()).decode()
    return f'"{tag}:{start}:{result.next_offset}{":c" if result.closed else ""}"'


def _long_poll_s() -> float:
    http: HttpSettings = current_app.extensions["segstore.http"]
    return min(http.stream_long_poll_s, current_app.extensions["segstore"].settings.tail_wait_max_s)


# --------------------------------------------------------------- handlers
def preflight(name: str) -> Response:
    return Response(status=204)


def create(name: str) -> Response:
    """PUT: create (201 with Location), confirm (200), or 409 for another configuration."""
    forked_from = _header("Stream-Forked-From")
    if forked_from is not None and not forked_from.strip(" \t"):
        raise _bad("Stream-Forked-From must name the stream to fork")
    content_type = _header("Content-Type")
    if not content_type or not _MEDIA_TYPE.match(content_type.strip()):
        content_type = None  # the default, or for a fork the source's
    ttl = _header("Stream-TTL")
    expires_at = _header("Stream-Expires-At")
    if ttl is not None and expires_at is not None:
        raise _bad("Stream-TTL and Stream-Expires-At exclude each other")
    if ttl is not None and not (_DECIMAL.match(ttl) and int(ttl) <= _MAX_SAFE_INTEGER):
        raise _bad(f"Stream-TTL must be a whole number of seconds from 0 to {_MAX_SAFE_INTEGER}, got {ttl!r}")
    if expires_at is not None:
        if not _DATE_TIME.match(expires_at):
            raise _bad(f"Stream-Expires-At must be an RFC 3339 date-time, got {expires_at!r}")
        validate_expires_at(expires_at)
    fork_offset = _header("Stream-Fork-Offset")
    if fork_offset is not None and not _FORK_OFFSET.match(fork_offset):
        raise _bad(f"Stream-Fork-Offset {fork_offset!r} is not an offset")
    sub_offset_text = _header("Stream-Fork-Sub-Offset")
    sub_offset = 0
    if sub_offset_text is not None:
        if forked_from is None:
            raise _bad("Stream-Fork-Sub-Offset needs Stream-Forked-From")
        if not (_DECIMAL.match(sub_offset_text) and int(sub_offset_text) <= _MAX_SAFE_INTEGER):
            raise _bad(f"Stream-Fork-Sub-Offset must be an integer from 0 to {_MAX_SAFE_INTEGER}")
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
    if live not in (None, "long-poll", "sse"):
        raise _bad(f"live must be long-poll or sse, got {live!r}")
    cursor = request.args.get("cursor")
    if live in ("long-poll", "sse") and offset is None:
        raise _bad(f"live={live} needs an offset parameter")
    start = None if offset in (None, "-1") else offset
    if live == "sse":
        return event_stream(
            current_app.extensions["segstore"], streams(), name, start, cursor, _long_poll_s()
        )
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
    response = Response(read_body(result), status=200, content_type=result.content_type)
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
    if pid is None or epoch is None or seq is None:
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
    )


def _fork_touches(
    environ: dict[str, Any], method: str, name: str, custom: str
) -> Iterable[tuple[auth.Access, str, str]]:
    """A fork needs read access to its source as well."""
    forked_from = environ.get("HTTP_STREAM_FORKED_FROM")
    if method == "PUT" and forked_from is not None:
        source = fork_source(forked_from)
        yield auth.Access.READ, source, f"fork {source!r}"
