"""The ChunkStorage protocol (seed 002 "ChunkStorage"): what Tier 2 must do.

Blocking calls; the engine reaches them through ``run_blocking``. Keys come
from ``engine.naming``. ``supports_append`` tells whether ``write`` may
extend an existing object (local files: yes; S3: no).
"""

from __future__ import annotations

from typing import Protocol


class ChunkStorage(Protocol):
    supports_append: bool

    def write(self, key: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` (the object's current length) and make it durable."""
        ...

    def read(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; fewer only at the object's end."""
        ...

    def length(self, key: str) -> int:
        """The object's length; 0 if it does not exist."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; no error if it does not exist."""
        ...
