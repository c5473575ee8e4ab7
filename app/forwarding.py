"""Forwarding a native request to the node that serves its segment's container, streamed both ways.

In a cluster (docs/cluster.md) any node answers a native segment request
(``/v1/segments/{name}...``): a node that does not serve the container of
``name`` passes the request on to the node that does, as it came (method,
raw path and query, headers, the body as it arrives), and streams the
answer back as it comes, long-polls and SSE included. Answers name the
serving node in ``Segment-Owner``. A forwarded request carries
``Segstore-Forwarded`` and is never forwarded again: the receiver answers it
itself (503 ``ContainerNotReady`` if the container moved meanwhile).

The S3 and Durable Streams surfaces are not forwarded yet: their state
lives in segments that may hash to other containers than the one named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

import requests

from engine import SegmentStore

FORWARDED = "Segstore-Forwarded"
OWNER = "Segment-Owner"
_FORWARDED_KEY = "HTTP_SEGSTORE_FORWARDED"
_PREFIX = "/v1/segments/"
# RFC 9110 7.6.1: these describe one connection and are not passed on (lengths are re-derived).
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})
_PIECE_BYTES = 64 * 1024

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Forwarding:
    """WSGI middleware: a native request for a segment served elsewhere goes to its node."""

    def __init__(self, app: WsgiApp, store: SegmentStore) -> None:
        self.app = app
        self.store = store
        self.http = requests.Session()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        owner = None if environ.get(_FORWARDED_KEY) else self._owner(environ)
        if owner is None:
            return self.app(environ, start_response)
        return self._forward(environ, start_response, *owner)

    def _owner(self, environ: dict[str, Any]) -> tuple[str, str] | None:
        if self.store.node is None:
            return None
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
        path = raw.split("?", 1)[0]
        if not path.startswith(_PREFIX):
            return None
        try:
            name = unquote_to_bytes(path[len(_PREFIX):]).decode("utf-8").partition(":")[0]
        except UnicodeDecodeError:
            return None  # refused where it is served
        if not name:
            return None
        return self.store.owner_of(name)

    def _forward(self, environ: dict[str, Any], start_response: Callable[..., Any],
                 node: str, base: str) -> Iterable[bytes]:
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
        headers = {name: value for name, value in _headers(environ) if name.lower() not in _HOP_BY_HOP}
        headers[FORWARDED] = self.store.settings.node_id
        length = environ.get("CONTENT_LENGTH")
        body: Iterable[bytes] | None = None
        if length:
            body = _Sized(_body(environ["wsgi.input"], int(length)), int(length))
        elif "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            body = _body(environ["wsgi.input"], None)  # passed on chunked, as it came
        try:
            answer = self.http.request(
                environ["REQUEST_METHOD"], base + raw, headers=headers, data=body,
                stream=True, allow_redirects=False, timeout=(5, None),
            )
        except requests.RequestException:
            # The owner is gone: this node answers (503 until the container has moved).
            return self.app(environ, start_response)
        out = [(k, v) for k, v in answer.raw.headers.items() if k.lower() not in _HOP_BY_HOP]
        if "Content-Length" in answer.raw.headers:
            out.append(("Content-Length", answer.raw.headers["Content-Length"]))
        out.append((OWNER, node))
        start_response(f"{answer.status_code} {answer.reason}", out)
        return _streamed(answer)


def _headers(environ: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            yield key[5:].replace("_", "-").title(), value
    if environ.get("CONTENT_TYPE"):
        yield "Content-Type", environ["CONTENT_TYPE"]


def _body(stream: Any, length: int | None) -> Iterator[bytes]:
    """The request body read in pieces as they arrive: ``length`` bytes, or (None) up to its end."""
    while length is None or length > 0:
        piece = stream.read(_PIECE_BYTES if length is None else min(_PIECE_BYTES, length))
        if not piece:
            return
        if length is not None:
            length -= len(piece)
        yield piece


class _Sized:
    """A body of known length streamed in pieces (requests sends it with Content-Length, not chunked)."""

    def __init__(self, pieces: Iterator[bytes], length: int) -> None:
        self._pieces = pieces
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        return self._pieces


def _streamed(answer: requests.Response) -> Iterator[bytes]:
    try:
        yield from answer.raw.stream(_PIECE_BYTES, decode_content=False)
    finally:
        answer.close()
