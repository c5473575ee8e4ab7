"""MemoryChunkStorage: Tier 2 in memory for tests, with injectable failures."""

from __future__ import annotations

import threading


class MemoryChunkStorage:
    supports_append = True

    def __init__(self) -> None:
        self.objects: dict[str, bytearray] = {}
        self.fail_writes = 0  # the next N writes raise OSError
        self.writes = 0
        self._lock = threading.Lock()

    def write(self, key: str, offset: int, data: bytes) -> None:
        with self._lock:
            if self.fail_writes:
                self.fail_writes -= 1
                raise OSError(5, "injected Tier 2 write failure")
            obj = self.objects.setdefault(key, bytearray())
            assert len(obj) >= offset, (key, len(obj), offset)
            obj[offset : offset + len(data)] = data
            self.writes += 1

    def read(self, key: str, offset: int, length: int) -> bytes:
        with self._lock:
            return bytes(self.objects.get(key, b"")[offset : offset + length])

    def length(self, key: str) -> int:
        with self._lock:
            return len(self.objects.get(key, b""))

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)
