"""The attribute index's node cache: decoded B+Tree nodes in least-recently-used order.

Seed 001 keeps the upper levels of the tree in memory so that a lookup on a
warm index needs at most one Tier 2 read. Nodes are kept decoded (a page is
decoded once, not on every lookup) and charged by their approximate memory.
One cache may serve many indexes: each index keys its nodes by a namespace of
its own plus the page offset. Thread-safe: every method takes the cache's lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from engine.attributes.index.page import Node

DEFAULT_CACHE_MAX_BYTES = 64 * 1024 * 1024


class NodeCache:
    """An LRU map of (namespace, page offset) to decoded nodes, bounded in bytes."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        self.max_bytes = max_bytes
        self._nodes: OrderedDict[tuple[Hashable, int], Node] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, namespace: Hashable, offset: int) -> Node | None:
        key = (namespace, offset)
        with self._lock:
            node = self._nodes.get(key)
            if node is None:
                return None
            self._nodes.move_to_end(key)
            return node

    def put(self, namespace: Hashable, offset: int, node: Node) -> None:
        """Keep ``node`` (most recently used), evicting the least recently used beyond the budget."""
        size = node.memory_bytes
        key = (namespace, offset)
        with self._lock:
            old = self._nodes.pop(key, None)
            if old is not None:
                self._bytes -= old.memory_bytes
            if size > self.max_bytes:
                return
            self._nodes[key] = node
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._nodes.popitem(last=False)
                self._bytes -= evicted.memory_bytes

    def discard(self, namespace: Hashable, offsets: list[int] | tuple[int, ...]) -> None:
        """Forget the nodes at ``offsets`` (pages no live root reaches any more)."""
        with self._lock:
            for offset in offsets:
                old = self._nodes.pop((namespace, offset), None)
                if old is not None:
                    self._bytes -= old.memory_bytes

    def clear(self, namespace: Hashable) -> None:
        """Forget every node of one namespace (an index that is closed or reopened)."""
        with self._lock:
            for key in [k for k in self._nodes if k[0] == namespace]:
                self._bytes -= self._nodes.pop(key).memory_bytes
