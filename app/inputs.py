"""Request input every surface shares: UTF-8 paths and bounded bodies.

Each surface parses its own headers and parameters (``app/params.py`` for the
native and stream APIs, ``app/s3``, ``app/streams``); these two rules hold
for all of them.
"""

from __future__ import annotations

from typing import IO, Any

from flask import request

from engine import InvalidArgument, InvalidName, PayloadTooLarge, SegstoreError

_READ_PIECE_BYTES = 64 * 1024
# A refused body declared up to this size is read and dropped before the answer, so the client, still
# sending, reads the 413 instead of a reset; gunicorn would drain it only within its keep-alive
# timeout (2 s), which a slow sender misses. A larger one is refused with the connection closed.
_DRAIN_MAX_BYTES = 64 * 1024 * 1024


def path_is_utf8(environ: dict[str, Any]) -> bool:
    """True when the request path's bytes (``PATH_INFO``, decoded as latin-1 by WSGI) are UTF-8."""
    try:
        environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8")
    except UnicodeError:
        return False
    return True


def require_utf8_path() -> None:
    """Before every request: names (segments, streams, S3 keys) are UTF-8, so the path must be.

    werkzeug decodes a path with replacement characters, which would make
    ``a%FF`` and ``a%FE`` one name; such a path is ``InvalidName`` (400) on
    every surface instead.
    """
    if not path_is_utf8(request.environ):
        raise InvalidName("the request path is not valid UTF-8 (names are UTF-8, percent-encoded in URLs)")


def read_body(
    stream: IO[bytes],
    content_length: int | None,
    max_bytes: int,
    what: str,
    too_large: type[SegstoreError] = PayloadTooLarge,
) -> bytes:
    """Read a request body of at most ``max_bytes`` without ever holding more than that.

    A declared ``Content-Length`` over the limit is refused without keeping
    any of it (read and dropped first, up to ``_DRAIN_MAX_BYTES``); a chunked
    body, whose end nobody knows, is read in pieces and refused as soon as it
    passes the limit. ``too_large`` is the error raised then (413 for
    appends, the only bodies docs/api.md "Appends" lets be large).
    """
    if content_length is not None and content_length > max_bytes:
        _drain(stream, content_length)
        raise too_large(f"{what} is {content_length} bytes; the limit is {max_bytes} bytes")
    pieces: list[bytes] = []
    total = 0
    while total <= max_bytes:
        piece = stream.read(min(_READ_PIECE_BYTES, max_bytes + 1 - total))
        if not piece:
            break
        pieces.append(piece)
        total += len(piece)
    if total > max_bytes:
        raise too_large(f"{what} is over the limit of {max_bytes} bytes")
    return b"".join(pieces)


def _drain(stream: IO[bytes], content_length: int) -> None:
    """Read and drop a refused body of a declared length, unless it is larger than the cap."""
    if content_length > _DRAIN_MAX_BYTES:
        return
    while stream.read(_READ_PIECE_BYTES):
        pass


def plain_body_length(environ: dict[str, Any], max_bytes: int) -> int | None:
    """The Content-Length of a body a WSGI shortcut may read whole (1 to ``max_bytes``), else None.

    None as well for a chunked body or a path that is not UTF-8: Flask's views judge those.
    """
    length = environ.get("CONTENT_LENGTH", "")
    if "HTTP_TRANSFER_ENCODING" in environ or not length.isdigit() or not path_is_utf8(environ):
        return None
    return int(length) if 0 < int(length) <= max_bytes else None


def exact_body(environ: dict[str, Any], length: int) -> bytes:
    """The ``length`` bytes of a request body (InvalidArgument when it ends early)."""
    body = environ["wsgi.input"].read(length)
    if len(body) != length:
        raise InvalidArgument(f"the body ended after {len(body)} of its {length} bytes")
    return body
