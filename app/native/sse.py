"""Live tail of a segment as Server-Sent Events (docs/api.md "Reads", live stream).

Each read's bytes become one ``event: data`` whose ``id`` is the next offset
(so ``Last-Event-ID`` resumes exactly) and whose ``data`` is the base64 of the
bytes. The end of a sealed segment sends ``event: sealed`` and closes. While
nothing arrives, a comment line every ``sse_keepalive_s`` (at most
``tail_wait_max_s``) keeps proxies and clients from timing out. The
generator parks in ``store.read(wait_s=...)``, which under gevent parks a
greenlet, not a thread.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator

from flask import Request, Response

from app.errors import segment_headers
from engine import ReadResult, SegmentNotFound, SegmentStore, SegstoreError, Throttled

log = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
KEEPALIVE = b": keepalive\n\n"


def wants_event_stream(request: Request) -> bool:
    """True when the client prefers ``text/event-stream`` over raw bytes."""
    best = request.accept_mimetypes.best_match(["application/octet-stream", EVENT_STREAM])
    return best == EVENT_STREAM


def data_event(result: ReadResult) -> bytes:
    """One SSE ``data`` event for a read's bytes."""
    payload = base64.b64encode(result.data)
    return b"event: data\nid: %d\ndata: %s\n\n" % (result.next_offset, payload)


def sealed_event(length: int) -> bytes:
    """The last event of a sealed segment (with a data line, or browsers would drop it)."""
    body = json.dumps({"length": length}).encode()
    return b"event: sealed\nid: %d\ndata: %s\n\n" % (length, body)


def _at_sealed_end(result: ReadResult) -> bool:
    return not result.pieces and result.info.sealed and result.next_offset >= result.info.length


def events(store: SegmentStore, name: str, first: ReadResult, keepalive_s: float) -> Iterator[bytes]:
    """Yield events from ``first`` on until the segment is sealed, deleted or the store closes.

    The first chunk goes out at once (data, sealed, or a keep-alive), so the
    response headers reach the client without waiting for an append.
    """
    result = first
    while True:
        if result.pieces:
            yield data_event(result)
        elif _at_sealed_end(result):
            yield sealed_event(result.info.length)
            return
        elif store.draining:
            return  # the server is shutting down; the client resumes with Last-Event-ID
        else:
            yield KEEPALIVE
        try:
            result = store.read(name, result.next_offset, wait_s=keepalive_s)
        except (SegmentNotFound, Throttled) as err:
            log.debug("event stream of %s ends: %s", name, err.detail)
            return
        except SegstoreError as err:
            log.info("event stream of %s ends: %s %s", name, err.code, err.detail)
            return


def event_stream_response(store: SegmentStore, name: str, first: ReadResult, keepalive_s: float) -> Response:
    """The streaming response; errors before it (404, 410, 416) were raised by the first read."""
    headers = segment_headers(first.info)
    headers["Cache-Control"] = "no-cache, no-transform"
    headers["X-Accel-Buffering"] = "no"
    return Response(events(store, name, first, keepalive_s), headers=headers, mimetype=EVENT_STREAM)
