"""A read's answer, and the native read shortcut: plain reads and long-polls answered in WSGI.

A tail reader long-polls ``GET /v1/segments/{name}?offset=N&wait=S`` once per
batch of appends it follows, so its path is as hot as the append's.
``NativeReadShortcut`` (an ``app.shortcut``) serves the plain form in front of Flask;
its parameters are parsed by the view's functions, its answer built by the
same ``read_answer``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import Flask

from app import inputs, params
from app.errors import segment_headers
from app.shortcut import WsgiShortcut
from engine import ReadResult, SegmentStore, validate_segment_name

ROUTE = "/v1/segments/{name}"
_PREFIX = "/v1/segments/"
_PARAMS = ("offset", "wait")
# Accept values that cannot prefer an event stream (Accept: text/event-stream asks for SSE).
_PLAIN_ACCEPT = (None, "*/*", "application/octet-stream")
# Headers that change a read's meaning (a byte range, a revalidation, an SSE resume): Flask's view.
_VIEW_HEADERS = ("HTTP_RANGE", "HTTP_IF_NONE_MATCH", "HTTP_LAST_EVENT_ID")


def etag(result: ReadResult) -> str:
    """Bytes below the length never change: segment id + range names them for good."""
    return f"{result.info.segment_id}-{result.offset}-{result.next_offset}"


def read_answer(result: ReadResult) -> tuple[int, dict[str, str]]:
    """Status and headers of a plain read's answer (200 with the bytes, 204 with none)."""
    headers = segment_headers(result.info)
    headers["Segment-Next-Offset"] = str(result.next_offset)
    if result.next_offset == result.offset:
        return 204, headers
    headers["ETag"] = f'"{etag(result)}"'
    headers["Accept-Ranges"] = "bytes"
    headers["Content-Length"] = str(result.next_offset - result.offset)
    return 200, headers


class NativeReadShortcut(WsgiShortcut[tuple[str, dict[str, str]]]):
    """WSGI shortcut for ``GET /v1/segments/{name}`` with at most ``offset`` and ``wait``.

    Anything else (a custom method such as ``:info``, another parameter, a
    repeated or percent-encoded one, ``Range``, ``If-None-Match``, an SSE
    request, a path that is not UTF-8) goes to Flask untouched; a bearer
    token is judged here, as before the view.
    """

    route = ROUTE

    def __init__(self, app: Flask, wsgi_app: Any) -> None:
        super().__init__(app, wsgi_app)
        self.store: SegmentStore = app.extensions["segstore"]
        self.wait_max_s: float = self.store.settings.tail_wait_max_s

    def plain(self, environ: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
        """(segment name, query parameters) of a plain read, else None."""
        if environ["REQUEST_METHOD"] != "GET":
            return None
        path: str = environ.get("PATH_INFO", "")
        if not path.startswith(_PREFIX) or len(path) == len(_PREFIX) or ":" in path:
            return None
        if environ.get("HTTP_ACCEPT") not in _PLAIN_ACCEPT or any(h in environ for h in _VIEW_HEADERS):
            return None
        query: dict[str, str] = {}
        raw_query: str = environ.get("QUERY_STRING", "")
        for part in raw_query.split("&") if raw_query else ():
            key, _, value = part.partition("=")
            if key not in _PARAMS or key in query or "%" in part or "+" in part:
                return None
            query[key] = value
        if not inputs.path_is_utf8(environ):
            return None
        return path[len(_PREFIX) :].encode("latin-1").decode("utf-8"), query

    def serve(
        self, environ: dict[str, Any], start_response: Any, plain: tuple[str, dict[str, str]]
    ) -> Iterable[bytes]:
        name, query = plain
        validate_segment_name(name)
        offset = None if "offset" not in query else params.int_value(query["offset"], "offset")
        wait_s = 0.0
        if "wait" in query:
            wait_s = params.seconds_value(query["wait"], "wait", maximum=self.wait_max_s)
        result = self.store.read(name, offset, None, wait_s=wait_s)
        status, headers = read_answer(result)
        if status == 204:
            start_response("204 No Content", list(headers.items()))
            return []
        start_response("200 OK", [*headers.items(), ("Content-Type", "application/octet-stream")])
        return result.pieces
