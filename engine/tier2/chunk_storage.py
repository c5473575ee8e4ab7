"""The ChunkStorage protocol (seed 002 "Tier-2 storage providers operate only at chunk level").

A chunk is one named object (a file, an S3 object) holding a contiguous run
of one segment's bytes. Chunked segment storage (``engine.tier2.chunked_segment_storage``)
builds segments out of chunks; a binding only stores chunks. Names come from
``engine.naming`` and are opaque here: a binding maps them to its own keys
without interpreting them.

Capabilities differ per binding and are declared, never guessed:

- ``supports_append``: ``write`` may extend an existing chunk at its end
  (local files: yes; S3: no, every write is a new object).
- ``supports_concat``: ``concat`` is native (local: append in place; S3:
  multipart upload with UploadPartCopy).
- ``supports_truncation``: ``truncate`` may cut a chunk short.

Bindings are blocking from the caller's point of view and safe to call from
several threads. A binding that does disk I/O runs it through
``engine.blocking.run_blocking`` itself; socket-based bindings (S3 through
boto3) are cooperative under gevent and call directly.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class ChunkStorageError(Exception):
    """A chunk operation failed; the caller may retry it."""


class ChunkStorageUnusable(ChunkStorageError):
    """The storage refuses us as configured (no such bucket, credentials refused, no permission).

    Retrying does not help; at start this is a misconfiguration, not an outage.
    """


class ChunkStorageFull(ChunkStorageError):
    """The storage has no room (a full disk or quota); retried, it works once space is freed."""


class ChunkNotFound(ChunkStorageError):
    """No chunk of that name."""


class ChunkExists(ChunkStorageError):
    """``create`` of a name that is already taken."""


class ChunkNotSupported(ChunkStorageError):
    """The binding does not have the capability the call needs."""


class BadChunkOffset(ChunkStorageError):
    """A write not at the chunk's current end (someone else wrote, or a retry raced)."""


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    name: str
    length: int


@dataclass(frozen=True, slots=True)
class ChunkHandle:
    """An opened chunk; ``read_only`` handles refuse writes."""

    name: str
    read_only: bool


# A chunk's bytes as they arrive, piece by piece; closing it early releases what it holds (an S3 body).
Pieces = Generator[bytes, None, None]


class ChunkStorage(Protocol):
    supports_append: bool
    supports_concat: bool
    supports_truncation: bool

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        """Create chunk ``name`` holding ``data``, durably; ChunkExists if the name is taken.

        Atomic: afterwards the chunk exists with exactly ``data`` or not at all
        (S3: a conditional PutObject with ``If-None-Match: *``).
        """
        ...

    def exists(self, name: str) -> bool: ...

    def open_read(self, name: str) -> ChunkHandle:
        """A read-only handle; ChunkNotFound if there is no such chunk."""
        ...

    def open_write(self, name: str) -> ChunkHandle:
        """A writable handle; ChunkNotFound if absent, ChunkNotSupported without append."""
        ...

    def info(self, name: str) -> ChunkInfo:
        """Name and current length; ChunkNotFound if absent."""
        ...

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; fewer only at the chunk's end."""
        ...

    def read_stream(self, handle: ChunkHandle, offset: int, length: int, piece_bytes: int) -> Pieces:
        """The bytes of ``read(handle, offset, length)`` as pieces of ``piece_bytes`` (the last shorter).

        For sequential readers: S3 answers it with one streamed GetObject
        instead of one request per piece. Closing the iterator early ends it.
        """
        ...

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """Append ``data`` at ``offset``, which must be the current length (else BadChunkOffset).

        Durable on return; returns the new length. ChunkNotSupported without append.
        """
        ...

    def concat(self, target: ChunkHandle, sources: Sequence[str]) -> int:
        """Append the bytes of ``sources`` (in order) to ``target``; returns its new length.

        The sources are left in place (the caller deletes them once its
        metadata no longer names them). ChunkNotSupported without concat.
        """
        ...

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        """Cut the chunk to ``length`` bytes; ChunkNotSupported without truncation."""
        ...

    def delete(self, name: str) -> None:
        """Remove the chunk; no error if it is already gone."""
        ...

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        """Every chunk whose name starts with ``prefix``, in name order."""
        ...


def pieces_of(
    read: Callable[[ChunkHandle, int, int], bytes],
    handle: ChunkHandle,
    offset: int,
    length: int,
    piece_bytes: int,
) -> Pieces:
    """``read_stream`` for bindings where a read costs little: one ``read`` per piece."""
    if piece_bytes <= 0:
        raise ValueError(f"piece_bytes must be positive, not {piece_bytes}")
    end = offset + length
    while offset < end:
        piece = read(handle, offset, min(piece_bytes, end - offset))
        if not piece:
            return
        yield piece
        offset += len(piece)
