"""Attribute index pages: how one B+Tree node is laid out in the attribute segment.

Seed 001, "B+Trees on Append-Only Storage": fixed-size entries, nodes of at
most 32 KiB, and every index entry carries the lowest page offset of its
child's subtree. Every page is one node::

    page     := header keys payload crc
    header   := magic[4] = b"SgAI"  version:u8 = 1  kind:u8  count:u16  offset:u64      (16 bytes)
    keys     := key[16] * count                       strictly increasing, compared as bytes
    payload  := leaf  (kind 0):  value:i64 * count                             (24 bytes an entry)
                index (kind 1):  child_offset:u64 * count  child_length:u32 * count
                                 child_min_offset:u64 * count                  (36 bytes an entry)
    crc      := crc32c:u32 of every byte before it

Integers are little-endian. ``offset`` is the page's own position in the
attribute segment, so a read at a wrong offset fails even when the bytes
there are a whole, valid page. Entries are stored column by column (all keys,
then all values) rather than entry by entry: a page then (de)serializes with
a few slice and array operations instead of a loop per entry.

In an index page, child ``i`` holds the keys ``k`` with
``keys[i] <= k < keys[i+1]``: a separator is never above a key of its child.
(A key below ``keys[0]`` is looked up in child 0; a batch that inserts one
there lowers ``keys[0]``, at every level on the way up.)
``child_min_offset`` is the lowest page offset in the child's subtree (a
leaf's is its own offset). Children are always appended before their
parent, so an index page's own offset is above all of them and its subtree
minimum is ``min(child_min_offset)``.
"""

from __future__ import annotations

import struct
import sys
from array import array
from functools import cache
from typing import final

import crc32c

from engine.errors import DataCorrupted

KEY_BYTES = 16
NODE_MAX_BYTES = 32 * 1024
MAGIC = b"SgAI"
VERSION = 1
LEAF = 0
INDEX = 1
HEADER = struct.Struct("<4sBBHQ")
CRC = struct.Struct("<I")
OVERHEAD_BYTES = HEADER.size + CRC.size
LEAF_ENTRY_BYTES = KEY_BYTES + 8
INDEX_ENTRY_BYTES = KEY_BYTES + 8 + 4 + 8
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Rough memory of a decoded node, for the cache's byte budget: a 16-byte bytes
# object and its list slot, plus the array items.
_KEY_MEMORY_BYTES = 57
_NODE_MEMORY_BYTES = 200
_SWAP = sys.byteorder == "big"

assert array("I").itemsize == 4 and array("q").itemsize == 8 and array("Q").itemsize == 8


def leaf_capacity(node_max_bytes: int) -> int:
    """Entries that fit in one leaf page of at most ``node_max_bytes``."""
    return (node_max_bytes - OVERHEAD_BYTES) // LEAF_ENTRY_BYTES


def index_capacity(node_max_bytes: int) -> int:
    """Children that fit in one index page of at most ``node_max_bytes``."""
    return (node_max_bytes - OVERHEAD_BYTES) // INDEX_ENTRY_BYTES


@final
class Leaf:
    """A leaf node: sorted keys and their int64 values. Never changed once built.

    ``key_bytes`` is the keys joined as stored, kept once known: a batch that
    only changes values rewrites a leaf without joining its keys again.
    """

    __slots__ = ("_key_bytes", "keys", "values")

    def __init__(self, keys: list[bytes], values: array, key_bytes: bytes | None = None) -> None:
        self.keys = keys
        self.values = values
        self._key_bytes = key_bytes

    @property
    def encoded(self) -> bool:
        """Whether this leaf's keys were already written (or read) as a page."""
        return self._key_bytes is not None

    @property
    def key_bytes(self) -> bytes:
        if self._key_bytes is None:
            self._key_bytes = b"".join(self.keys)
        return self._key_bytes

    @property
    def memory_bytes(self) -> int:
        return _NODE_MEMORY_BYTES + len(self.keys) * (_KEY_MEMORY_BYTES + KEY_BYTES + 8)


@final
class Branch:
    """An index node: separator keys and, per child, its page offset, length and subtree minimum."""

    __slots__ = ("keys", "lengths", "mins", "offsets")

    def __init__(self, keys: list[bytes], offsets: array, lengths: array, mins: array) -> None:
        self.keys = keys
        self.offsets = offsets
        self.lengths = lengths
        self.mins = mins

    @property
    def key_bytes(self) -> bytes:
        return b"".join(self.keys)

    @property
    def memory_bytes(self) -> int:
        return _NODE_MEMORY_BYTES + len(self.keys) * (_KEY_MEMORY_BYTES + 20)


Node = Leaf | Branch


def encode_leaf(leaf: Leaf, offset: int) -> bytes:
    """The page of ``leaf`` written at ``offset``."""
    values = leaf.values
    if _SWAP:
        values = array("q", values)
        values.byteswap()
    return _seal(HEADER.pack(MAGIC, VERSION, LEAF, len(leaf.keys), offset), leaf.key_bytes, values)


def encode_branch(branch: Branch, offset: int) -> bytes:
    """The page of ``branch`` written at ``offset``."""
    columns: tuple[array, ...] = (branch.offsets, branch.lengths, branch.mins)
    if _SWAP:
        columns = tuple(_swapped(c) for c in columns)
    return _seal(HEADER.pack(MAGIC, VERSION, INDEX, len(branch.keys), offset), branch.key_bytes, *columns)


def _swapped(column: array) -> array:
    copy = array(column.typecode, column)
    copy.byteswap()
    return copy


def _seal(header: bytes, key_bytes: bytes, *columns: array) -> bytes:
    body = b"".join((header, key_bytes, *(c.tobytes() for c in columns)))
    return body + CRC.pack(crc32c.crc32c(body))


def decode(data: bytes, offset: int) -> Node:
    """The node of a page read at ``offset``; DataCorrupted if the bytes are not that page, whole."""
    size = len(data)
    if size < OVERHEAD_BYTES:
        raise DataCorrupted(f"attribute page at {offset}: {size} bytes, shorter than a header")
    magic, version, kind, count, own = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or kind not in (LEAF, INDEX):
        raise DataCorrupted(f"attribute page at {offset}: bad magic, version or kind")
    entry = LEAF_ENTRY_BYTES if kind == LEAF else INDEX_ENTRY_BYTES
    if size != OVERHEAD_BYTES + count * entry or count == 0:
        raise DataCorrupted(f"attribute page at {offset}: {size} bytes do not hold {count} entries")
    (crc,) = CRC.unpack_from(data, size - CRC.size)
    if crc32c.crc32c(memoryview(data)[: size - CRC.size]) != crc:
        raise DataCorrupted(f"attribute page at {offset}: checksum mismatch")
    if own != offset:
        raise DataCorrupted(f"attribute page at {offset} says it was written at {own}")
    keys = list(_keys_struct(count).unpack_from(data, HEADER.size))
    # Order only: that keys are unique too is asserted when a page is written.
    if count > 1 and keys != sorted(keys):
        raise DataCorrupted(f"attribute page at {offset}: keys out of order")
    at = HEADER.size + count * KEY_BYTES
    if kind == LEAF:
        return Leaf(keys, _column("q", data, at, count), data[HEADER.size : at])
    offsets = _column("Q", data, at, count)
    lengths = _column("I", data, at + 8 * count, count)
    mins = _column("Q", data, at + 12 * count, count)
    if max(offsets) >= offset or any(m > o for m, o in zip(mins, offsets, strict=True)):
        raise DataCorrupted(f"attribute page at {offset}: a child pointer is not below it")
    return Branch(keys, offsets, lengths, mins)


def _column(typecode: str, data: bytes, at: int, count: int) -> array:
    column = array(typecode)
    column.frombytes(memoryview(data)[at : at + count * column.itemsize])
    if _SWAP:
        column.byteswap()
    return column


def strictly_sorted(keys: list[bytes]) -> bool:
    """True when ``keys`` are in increasing order without repeats (an invariant of every node)."""
    return keys == sorted(keys) and len(set(keys)) == len(keys)


@cache
def _keys_struct(count: int) -> struct.Struct:
    return struct.Struct(f"{KEY_BYTES}s" * count)
