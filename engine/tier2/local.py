"""LocalChunkStorage: Tier 2 in a local folder, one file per key.

Writes are positional (``pwrite``) followed by ``fdatasync``, so a retried
flush rewrites the same bytes at the same place instead of appending twice.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import DataCorrupted


class LocalChunkStorage:
    supports_append = True

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = self.root / key
        assert ".." not in Path(key).parts and self.root in path.parents, key
        return path

    def write(self, key: str, offset: int, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < offset:
                raise DataCorrupted(f"Tier 2 object {key} has {size} bytes, a write expected {offset}")
            view = memoryview(data)
            pos = offset
            while view:
                written = os.pwrite(fd, view, pos)
                view = view[written:]
                pos += written
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if created:  # the new file's directory entry must survive a power loss too
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def read(self, key: str, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            return b""
        try:
            parts = []
            while length > 0:
                piece = os.pread(fd, length, offset)
                if not piece:
                    break
                parts.append(piece)
                offset += len(piece)
                length -= len(piece)
            return b"".join(parts)
        finally:
            os.close(fd)

    def length(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return 0

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
