"""What every answer of the Durable Streams surface shares: the path, headers, cursors, read bodies."""

from __future__ import annotations

import math
import random
import time
from urllib.parse import unquote, urlparse

from app.streams.format import is_json
from app.streams.records import StreamRead

PREFIX = "/v1/stream/"
# Cursors count 20-second intervals from the protocol's epoch (2024-10-09T00:00:00Z).
_CURSOR_EPOCH_S = 1728432000
_CURSOR_INTERVAL_S = 20
_MAX_JITTER_S = 3600

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


def read_body(result: StreamRead) -> bytes:
    """A read's messages as one body: a JSON array in JSON mode, else the bytes back to back."""
    if is_json(result.content_type):
        return b"[" + b",".join(result.messages) + b"]"
    return b"".join(result.messages)


def fork_source(header: str) -> str:
    """A ``Stream-Forked-From`` value (a path or a URL of a stream) as a stream name."""
    path = unquote(urlparse(header).path or header)
    return path.removeprefix(PREFIX)
