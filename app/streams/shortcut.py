"""The stream append shortcut: plain appends answered in WSGI, in front of Flask.

A plain append (a POST with a body and a Content-Length, and nothing else)
is the hot path of the protocol; this layer serves it without Flask's
request, context, routing and response.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import Flask

from app import inputs, ops
from app.auth import AuthConfig
from app.errors import rendered_in_flask
from app.streams.protocol import CORS_HEADERS, PREFIX
from app.streams.store import StreamStore
from engine import SegstoreError

_ROUTE = "/v1/stream/<stream_path:name>"
# Headers that make an append more than a plain one: Flask serves those.
_NOT_PLAIN = (
    "HTTP_PRODUCER_ID",
    "HTTP_PRODUCER_EPOCH",
    "HTTP_PRODUCER_SEQ",
    "HTTP_STREAM_SEQ",
    "HTTP_STREAM_CLOSED",
)
_APPENDED_HEADERS = list(CORS_HEADERS.items())


class PlainAppend:
    """WSGI shortcut for the hot path: a POST with a body and a Content-Length, and nothing else.

    It answers what ``append`` would (204 with ``Stream-Next-Offset`` and the
    protocol headers) without building Flask's request, context, routing and
    response: on the append path those cost more than the append itself
    (measured: 1.6k req/s under Flask, 4.7k for plain WSGI).
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
        length = inputs.plain_body_length(environ, self.max_bytes)
        return None if length is None else (path[len(PREFIX) :].encode("latin-1").decode("utf-8"), length)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        plain = self._plain(environ)
        if plain is None:
            return self.wsgi_app(environ, start_response)
        name, length = plain
        environ[ops.ROUTE_KEY] = _ROUTE
        try:
            body = inputs.exact_body(environ, length)
            outcome = self.streams.append(name, body, content_type=environ["CONTENT_TYPE"])
        except SegstoreError as err:
            return rendered_in_flask(self.app, environ, start_response, err)
        start_response("204 NO CONTENT", [("Stream-Next-Offset", outcome.next_offset), *_APPENDED_HEADERS])
        return []
