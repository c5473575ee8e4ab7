"""MemoryChunkStorage: the in-memory twin of the Tier 2 bindings, for tests.

Chunks are bytearrays in a dict under one lock. Every capability is on by
default; the constructor turns them off one by one, so chunked segment
storage can be tested against a twin that behaves like S3
(``MemoryChunkStorage(supports_append=False, supports_truncation=False)``).
Faults and latency are injected by wrapping it in
``engine.tier2.faults.FaultyChunkStorage``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from engine.tier2.chunk_storage import (
    BadChunkOffset,
    ChunkExists,
    ChunkHandle,
    ChunkInfo,
    ChunkNotFound,
    ChunkNotSupported,
    Pieces,
    pieces_of,
)


class MemoryChunkStorage:
    """Chunks in a dict; capabilities configurable to mimic any binding."""

    def __init__(
        self,
        *,
        supports_append: bool = True,
        supports_concat: bool = True,
        supports_truncation: bool = True,
    ) -> None:
        self.supports_append = supports_append
        self.supports_concat = supports_concat
        self.supports_truncation = supports_truncation
        self.chunks: dict[str, bytearray] = {}
        self._lock = threading.Lock()

    def _get(self, name: str) -> bytearray:
        try:
            return self.chunks[name]
        except KeyError:
            raise ChunkNotFound(f"no chunk {name!r}") from None

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        """Store ``data`` under a new name; ChunkExists if the name is taken."""
        if not name:
            raise ValueError("empty chunk name")
        with self._lock:
            if name in self.chunks:
                raise ChunkExists(f"chunk {name!r} exists")
            self.chunks[name] = bytearray(data)
        return ChunkHandle(name, read_only=False)

    def exists(self, name: str) -> bool:
        with self._lock:
            return name in self.chunks

    def open_read(self, name: str) -> ChunkHandle:
        with self._lock:
            self._get(name)
        return ChunkHandle(name, read_only=True)

    def open_write(self, name: str) -> ChunkHandle:
        if not self.supports_append:
            raise ChunkNotSupported("this storage cannot write to an existing chunk")
        with self._lock:
            self._get(name)
        return ChunkHandle(name, read_only=False)

    def info(self, name: str) -> ChunkInfo:
        with self._lock:
            return ChunkInfo(name, len(self._get(name)))

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; b"" past the end or for length 0."""
        _check_range(offset, length)
        if length == 0:
            return b""
        with self._lock:
            return bytes(self._get(handle.name)[offset : offset + length])

    def read_stream(self, handle: ChunkHandle, offset: int, length: int, piece_bytes: int) -> Pieces:
        return pieces_of(self.read, handle, offset, length, piece_bytes)

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """Append ``data`` at ``offset`` (the chunk's length); returns the new length."""
        if not self.supports_append:
            raise ChunkNotSupported("this storage cannot write to an existing chunk")
        _check_writable(handle)
        with self._lock:
            chunk = self._get(handle.name)
            if offset != len(chunk):
                raise BadChunkOffset(
                    f"chunk {handle.name!r} has {len(chunk)} bytes, a write expected {offset}"
                )
            chunk += data
            return len(chunk)

    def concat(self, target: ChunkHandle, sources: Sequence[str]) -> int:
        """Append the sources' bytes to ``target``; nothing changes if one is missing."""
        if not self.supports_concat:
            raise ChunkNotSupported("this storage cannot concatenate chunks")
        _check_writable(target)
        with self._lock:
            chunk = self._get(target.name)
            tail = b"".join(bytes(self._get(name)) for name in sources)
            chunk += tail
            return len(chunk)

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        """Cut the chunk to ``length``; BadChunkOffset if it is shorter than that."""
        if not self.supports_truncation:
            raise ChunkNotSupported("this storage cannot truncate chunks")
        _check_writable(handle)
        with self._lock:
            chunk = self._get(handle.name)
            if not 0 <= length <= len(chunk):
                raise BadChunkOffset(f"chunk {handle.name!r} has {len(chunk)} bytes, cannot cut to {length}")
            del chunk[length:]

    def delete(self, name: str) -> None:
        with self._lock:
            self.chunks.pop(name, None)

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        """A snapshot of the chunks under ``prefix``, in name order."""
        with self._lock:
            found = [ChunkInfo(n, len(c)) for n, c in self.chunks.items() if n.startswith(prefix)]
        return iter(sorted(found, key=lambda info: info.name))


def _check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise ValueError(f"bad read range: offset {offset}, length {length}")


def _check_writable(handle: ChunkHandle) -> None:
    if handle.read_only:
        raise ValueError(f"chunk handle {handle.name!r} is read-only")
