"""The local hop's frames: a request handed to its owner on the same machine, and its answer.

A node passes a request to an owner on the same machine over a Unix socket
(``app/hop.py``, docs/cluster.md "The local hop") instead of HTTP. One
connection carries one exchange at a time, each a sequence of frames:

- forwarder to owner: a request head (``Q``), the body as data frames
  (``D``), an end frame (``E``); or, in place of the end frame, a broken
  body frame (``B``, its payload the error's detail) when the body broke
  off while it was read from the client (a malformed chunked body): the
  owner's readers then fail with ``MalformedBody`` as they would on a body
  of its own, and it answers as it would (``app/http_chunked.py``);
- owner to forwarder: an answer head (``A``), the body as data frames as the
  owner's app yields them (a long-poll's or an SSE stream's pieces when they
  come), an end frame.

A frame is a kind byte, its payload's length (4 bytes, big-endian) and the
payload. Heads are JSON: the request's WSGI variables as the forwarder's
server parsed them (method, path, query, raw URI, headers as ``HTTP_*``,
remote address), so the owner parses no HTTP again; the answer's status line
and headers. A head may hold at most ``HEAD_LIMIT`` bytes, a data frame
``DATA_LIMIT``; a larger length is refused before its payload is read, and
a connection that ends inside a frame is a torn frame. Either way the
connection is closed: where the next frame starts is unknown.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

REQUEST = b"Q"
ANSWER = b"A"
DATA = b"D"
END = b"E"
BROKEN = b"B"
_KINDS = frozenset({REQUEST, ANSWER, DATA, END, BROKEN})
_PREFIX = struct.Struct(">cI")
# gunicorn takes at most 100 header fields of 8190 bytes: every head it parsed fits.
HEAD_LIMIT = 1024 * 1024
DATA_LIMIT = 1024 * 1024
# The WSGI variables a request head carries besides its HTTP_* headers.
_VARIABLES = frozenset({
    "REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "RAW_URI", "REQUEST_URI",
    "SERVER_NAME", "SERVER_PORT", "SERVER_PROTOCOL", "REMOTE_ADDR", "REMOTE_PORT",
    "CONTENT_TYPE", "CONTENT_LENGTH",
})


class FrameError(Exception):
    """The peer sent something that is not the next frame of an exchange: the connection is dropped."""


class TornFrame(FrameError):
    """The connection ended inside a frame, or where a frame was due."""


class FrameTooLarge(FrameError):
    """A frame declared more bytes than its kind may hold."""


def is_variable(key: str) -> bool:
    """Whether a WSGI environ key travels in a request head (the request's own, not the server's)."""
    return key in _VARIABLES or key.startswith("HTTP_")


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request as the forwarder's WSGI server parsed it: its variables and its URL scheme."""

    variables: dict[str, str]
    scheme: str = "http"

    def encode(self) -> bytes:
        return frame(REQUEST, json.dumps([self.variables, self.scheme], separators=(",", ":")).encode())

    @classmethod
    def decode(cls, payload: bytes) -> RequestHead:
        doc = _pair(payload)
        if not (isinstance(doc[0], dict) and isinstance(doc[1], str)):
            raise FrameError("a request head is [variables, scheme]")
        variables: dict[str, Any] = doc[0]
        if not all(isinstance(v, str) and is_variable(k) for k, v in variables.items()):
            raise FrameError("a request head holds WSGI variables (strings) only")
        if "REQUEST_METHOD" not in variables or "PATH_INFO" not in variables:
            raise FrameError("a request head names its method and path")
        return cls(variables, doc[1])


@dataclass(frozen=True, slots=True)
class AnswerHead:
    """An answer's status line (``200 OK``) and its headers, as the owner's app gave them."""

    status: str
    headers: list[tuple[str, str]]

    def encode(self) -> bytes:
        return frame(ANSWER, json.dumps([self.status, self.headers], separators=(",", ":")).encode())

    @classmethod
    def decode(cls, payload: bytes) -> AnswerHead:
        doc = _pair(payload)
        if not (isinstance(doc[0], str) and isinstance(doc[1], list)):
            raise FrameError("an answer head is [status, headers]")
        headers = doc[1]
        if not all(isinstance(h, list) and len(h) == 2 and all(isinstance(p, str) for p in h)
                   for h in headers):
            raise FrameError("an answer's headers are [name, value] pairs of strings")
        return cls(doc[0], [(name, value) for name, value in headers])


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame: ``kind``, the payload's length, the payload."""
    assert kind in _KINDS and len(payload) <= _limit(kind), (kind, len(payload))
    return _PREFIX.pack(kind, len(payload)) + payload


def data_frames(piece: bytes) -> Iterator[bytes]:
    """``piece`` as data frames of at most ``DATA_LIMIT`` bytes (none for an empty piece)."""
    view = memoryview(piece)
    for start in range(0, len(piece), DATA_LIMIT):
        yield frame(DATA, bytes(view[start:start + DATA_LIMIT]))


def broken_frame(detail: str) -> bytes:
    """The frame that ends a body broken off at the client, carrying why (cut to ``DATA_LIMIT`` bytes)."""
    return frame(BROKEN, detail.encode()[:DATA_LIMIT])


def read_frame(stream: BinaryIO) -> tuple[bytes, bytes] | None:
    """The next frame's (kind, payload), or None if the connection ended cleanly before it."""
    prefix = stream.read(_PREFIX.size)
    if not prefix:
        return None
    if len(prefix) < _PREFIX.size:
        raise TornFrame(f"the connection ended inside a frame's prefix ({len(prefix)} bytes)")
    kind, length = _PREFIX.unpack(prefix)
    if kind not in _KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    if length > _limit(kind):
        raise FrameTooLarge(f"a {kind.decode()} frame of {length} bytes, over its {_limit(kind)}")
    payload = stream.read(length) if length else b""
    if len(payload) < length:
        raise TornFrame(f"the connection ended inside a frame ({len(payload)} of {length} bytes)")
    return kind, payload


def expect_frame(stream: BinaryIO) -> tuple[bytes, bytes]:
    """The next frame, which the exchange needs: a connection ended before it is a torn frame."""
    found = read_frame(stream)
    if found is None:
        raise TornFrame("the connection ended where a frame was due")
    return found


def _limit(kind: bytes) -> int:
    if kind == END:
        return 0
    return HEAD_LIMIT if kind in (REQUEST, ANSWER) else DATA_LIMIT


def _pair(payload: bytes) -> list[Any]:
    """A head's JSON: a list of two items."""
    try:
        doc = json.loads(payload)
    except ValueError:
        raise FrameError("a head that is not JSON") from None
    if not isinstance(doc, list) or len(doc) != 2:
        raise FrameError("a head is a JSON list of two items")
    return doc
