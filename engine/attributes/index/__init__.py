"""The attribute index of seed 001: a B+Tree on an append-only attribute segment.

``page`` holds the byte layout of a node, ``node_cache`` the LRU of decoded nodes,
``tree`` the index itself (lookups, and update batches planned as bytes to
append, with progressive compaction). The index does no IO of its own: the
caller reads pages for it and writes what ``plan`` returns.
"""

from engine.attributes.index.node_cache import DEFAULT_CACHE_MAX_BYTES, NodeCache
from engine.attributes.index.page import KEY_BYTES, NODE_MAX_BYTES
from engine.attributes.index.tree import AttributeIndex, IndexUpdate, RootPointer

__all__ = [
    "DEFAULT_CACHE_MAX_BYTES",
    "KEY_BYTES",
    "NODE_MAX_BYTES",
    "AttributeIndex",
    "IndexUpdate",
    "NodeCache",
    "RootPointer",
]
