"""An append's answer, and the native append shortcut: plain appends answered in WSGI, in front of Flask.

An append (``POST /v1/segments/{name}`` with a body and a Content-Length) is
the hot path of the native API. ``NativeAppendShortcut`` (an ``app.shortcut``) serves
it in front of Flask. Its conditions (``Expected-Offset``, ``Writer-Id`` +
``Event-Number``, ``Event-Count``) are read by the same parser as the view's,
its answer is rendered by the same ``append_answer``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Flask

from app import inputs, params
from app.errors import segment_headers
from app.shortcut import WsgiShortcut
from engine import AppendResult, SegmentNotFound, SegmentStore, validate_segment_name

ROUTE = "/v1/segments/{name}"
_PREFIX = "/v1/segments/"


def append_answer(result: AppendResult) -> tuple[dict[str, str], bytes]:
    """The headers and JSON body of an append's answer (200), for the view and the shortcut."""
    headers = segment_headers(result.info)
    if result.duplicate:
        headers["Segment-Duplicate"] = "true"
        body = {"duplicate": True, "event_number": result.event_number, "length": result.info.length}
    else:
        headers["Segment-Offset"] = str(result.offset)
        body = {"offset": result.offset, "length": result.info.length}
    return headers, json.dumps(body, separators=(",", ":")).encode()


@contextlib.contextmanager
def create_it_first(name: str) -> Iterator[None]:
    """An append to a missing segment: its 404 says how to make one (appends never create)."""
    try:
        yield
    except SegmentNotFound as err:
        raise SegmentNotFound(
            f"{err.detail}; create it first: PUT /v1/segments/{name}", segment=err.segment
        ) from None


class NativeAppendShortcut(WsgiShortcut[tuple[str, int]]):
    """WSGI shortcut for ``POST /v1/segments/{name}`` with a Content-Length body and no query.

    Anything else (custom methods such as ``:seal``, a query string, chunked
    bodies, paths that are not UTF-8) goes to Flask untouched; a bearer token
    is judged here, as before the view.
    """

    route = ROUTE

    def __init__(self, app: Flask, wsgi_app: Any) -> None:
        super().__init__(app, wsgi_app)
        self.store: SegmentStore = app.extensions["segstore"]
        self.max_bytes: int = self.store.settings.max_append_bytes

    def plain(self, environ: dict[str, Any]) -> tuple[str, int] | None:
        """(segment name, body length) of a plain append, else None."""
        if environ["REQUEST_METHOD"] != "POST" or environ.get("QUERY_STRING"):
            return None
        path: str = environ.get("PATH_INFO", "")
        if not path.startswith(_PREFIX) or len(path) == len(_PREFIX) or ":" in path:
            return None
        length = inputs.plain_body_length(environ, self.max_bytes)
        return None if length is None else (path[len(_PREFIX) :].encode("latin-1").decode("utf-8"), length)

    def serve(self, environ: dict[str, Any], start_response: Any, plain: tuple[str, int]) -> Iterable[bytes]:
        name, length = plain
        validate_segment_name(name)
        conditions = params.append_conditions(environ)
        with create_it_first(name):
            result = self.store.append(name, inputs.exact_body(environ, length), **conditions.as_kwargs())
        headers, answer = append_answer(result)
        start_response(
            "200 OK",
            [*headers.items(), ("Content-Type", "application/json"), ("Content-Length", str(len(answer)))],
        )
        return [answer]
