"""Cache: the bytes behind the read index (seed 000 "Cache"), in memory.

Blocks are keyed by (segment id, start offset) and kept in least-recently-used
order. The cache only accounts and orders; what may be evicted (only data
already in Tier 2) is the read index's decision, passed in as ``evictable``.
It has no lock of its own: its one user, the read index, calls it only while
holding the read index lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

Key = tuple[int, int]


class Cache:
    """An LRU map of blocks (bytes or a growing bytearray) with a byte budget."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[Key, bytes | bytearray] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def put(self, key: Key, data: bytes | bytearray) -> None:
        old = self._blocks.pop(key, None)
        if old is not None:
            self._size -= len(old)
        self._blocks[key] = data
        self._size += len(data)

    def extend(self, key: Key, data: bytes) -> None:
        """Grow a bytearray block in place (the tail block of a segment)."""
        block = self._blocks[key]
        assert isinstance(block, bytearray)
        block += data
        self._size += len(data)

    def get(self, key: Key) -> bytes | bytearray | None:
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
        return block

    def rekey(self, old: Key, new: Key) -> None:
        """The same block under another key (a merge moves blocks between segments)."""
        assert new not in self._blocks, new
        self._blocks[new] = self._blocks.pop(old)

    def delete(self, key: Key) -> None:
        block = self._blocks.pop(key, None)
        if block is not None:
            self._size -= len(block)

    def evict(self, evictable: Callable[[Key, int], bool]) -> list[Key]:
        """Drop least recently used blocks that ``evictable(key, size)`` allows, until within budget."""
        dropped: list[Key] = []
        if self._size <= self.max_bytes:
            return dropped
        for key in list(self._blocks):
            if self._size <= self.max_bytes:
                break
            size = len(self._blocks[key])
            if evictable(key, size):
                del self._blocks[key]
                self._size -= size
                dropped.append(key)
        return dropped
