"""``live=sse`` reads of a stream as Server-Sent Events: data events, each followed by a control event."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator

from flask import Response

from app.streams.format import normalize_content_type
from app.streams.protocol import read_body, response_cursor
from app.streams.records import StreamRead
from app.streams.store import StreamStore
from engine import SegmentStore, SegstoreError

EVENT_STREAM = "text/event-stream"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _sse_event(kind: str, payload: str) -> bytes:
    """One event; each line of the payload gets its own ``data:`` (no CR/LF injection)."""
    lines = "\n".join(f"data:{line}" for line in _LINE_BREAK.split(payload))
    return f"event: {kind}\n{lines}\n\n".encode()


def _sse_data(result: StreamRead, binary: bool) -> bytes:
    if binary:
        return _sse_event("data", base64.b64encode(b"".join(result.messages)).decode())
    return _sse_event("data", read_body(result).decode("utf-8", "replace"))


def _sse_control(result: StreamRead, cursor: str | None) -> bytes:
    control: dict[str, object] = {"streamNextOffset": result.next_offset}
    if result.closed:
        control["streamClosed"] = True
    else:
        control["streamCursor"] = response_cursor(cursor)
        if result.up_to_date:
            control["upToDate"] = True
    return _sse_event("control", json.dumps(control, separators=(",", ":")))


def event_stream(
    store: SegmentStore, layer: StreamStore, name: str, start: str | None, cursor: str | None, wait_s: float
) -> Response:
    """``live=sse``: data events (base64 unless text or JSON), each followed by a control event.

    The first read happens before the response starts, so 404 and 410 are
    answered as such; the stream ends after ``streamClosed``. Each wait at
    the tail lasts at most ``wait_s``.
    """
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
