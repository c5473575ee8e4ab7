"""Chunked request bodies (``Transfer-Encoding: chunked``): one error for every way they go wrong.

gunicorn decodes the chunked transfer coding inside ``wsgi.input`` and
raises its own exceptions from ``read`` when a body is malformed: a size line
that is not hex (``InvalidChunkSize``), a connection closed inside a chunk or
before the last chunk (``NoMoreData``), a chunk without its CRLF or a body
without its final empty chunk (``ChunkMissingTerminator``), a bad trailer.
Unmapped, each reached a view as an unexpected 500. ``ChunkedBodies`` wraps
the input of every chunked request, whichever surface reads it, so that
they arrive as ``MalformedBody``: 400 ``InvalidArgument`` problem+json on the
native and Durable Streams routes, ``IncompleteBody`` on S3. Nothing is
stored, since every reader fails before its write is published. gunicorn
marks such a body failed and closes the connection after the answer (where
the next request would start is unknown); the worker serves on. gevent's
WSGI server, which serves a process's own address on a node of several
processes (``app/private_listener.py``), raises ``OSError`` for all of these:
mapped the same way, as is a connection that fails inside a chunked body.

A chunk may also declare more bytes than any request takes
(``max_chunk_bytes``). gunicorn would wait for all of them, so a size of
2**80 held the request until the client gave up; its size line is refused
at once instead.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator
from typing import Any

from gunicorn.http.body import Body, ChunkedReader
from gunicorn.http.errors import InvalidChunkSize, NoMoreData, ParseException

from app.errors import MalformedBody

# S3 takes at most 5 GiB in one PutObject or UploadPart, segstore's largest bodies; native and
# Durable Streams bodies stop at max_append_bytes.
S3_MAX_BODY_BYTES = 5 * 1024**3


def max_chunk_bytes(max_append_bytes: int) -> int:
    """The largest chunk a request may declare: no request takes a larger body."""
    return max(S3_MAX_BODY_BYTES, max_append_bytes)


class _BoundedChunks(ChunkedReader):
    """gunicorn's chunk decoder, refusing a size line past ``limit`` before reading the chunk."""

    def __init__(self, req: Any, unreader: Any, limit: int) -> None:
        super().__init__(req, unreader)
        self.limit = limit

    def parse_chunk_size(self, unreader: Any, data: bytes | None = None) -> tuple[int, bytes | None]:
        size, rest = super().parse_chunk_size(unreader, data)
        if size > self.limit:
            # gunicorn's own error, so that its drain of an unread body refuses the chunk too.
            raise InvalidChunkSize(f"{size} bytes, over the {self.limit} a chunk may declare")
        return size, rest


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except NoMoreData:
        raise MalformedBody(
            "the chunked request body ended before its last chunk: the connection was closed"
        ) from None
    except ParseException as err:
        raise MalformedBody(f"the chunked request body is malformed: {err}") from None
    except OSError as err:  # gevent's WSGI server's errors, or the connection's
        raise MalformedBody(f"the chunked request body is malformed or broke off: {err}") from None


class _ChunkedInput:
    """``wsgi.input`` of a chunked request, raising ``MalformedBody`` for a body gunicorn cannot decode."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def read(self, size: int | None = -1) -> bytes:
        with _mapped():
            return self.stream.read(size)

    def readline(self, size: int | None = -1) -> bytes:
        with _mapped():
            return self.stream.readline(size)

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        with _mapped():
            return self.stream.readlines(hint)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


def _bound(stream: Any, limit: int) -> None:
    """Give gunicorn's chunked body the bounded decoder, if nothing has been read from it yet."""
    reader: Any = getattr(stream, "reader", None)  # gunicorn's body reader (gunicorn ships no types)
    if (
        isinstance(stream, Body)
        and type(reader) is ChunkedReader
        and reader.parser is not None
        and inspect.getgeneratorstate(reader.parser) == inspect.GEN_CREATED
    ):
        stream.reader = _BoundedChunks(reader.req, reader.req.unreader, limit)


class ChunkedBodies:
    """WSGI layer: the input of a chunked request gets bounded chunks and ``MalformedBody`` errors."""

    def __init__(self, wsgi_app: Any, max_chunk_bytes: int) -> None:
        self.wsgi_app = wsgi_app
        self.max_chunk_bytes = max_chunk_bytes

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if "HTTP_TRANSFER_ENCODING" in environ:
            stream = environ["wsgi.input"]
            _bound(stream, self.max_chunk_bytes)
            environ["wsgi.input"] = _ChunkedInput(stream)
        return self.wsgi_app(environ, start_response)
