"""One object of a Tier 1 log on an object store: its header and frames (docs/tier1-on-s3.md).

    magic "SGW2" | epoch u64 | generation u32 | base u64 | CRC32C u32 of the header | frames

``(epoch, generation)`` names the writer; ``base``: every write below it was
in the bucket when this one was begun. A header that is short or fails its
CRC is corruption, never skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from engine.errors import DataCorrupted

MAGIC = b"SGW2"
_HEADER = struct.Struct(">4sQIQI")
HEADER_BYTES = _HEADER.size

Writer = tuple[int, int]  # (epoch, generation), compared as a tuple


@dataclass(frozen=True, slots=True)
class WalObject:
    writer: Writer
    base: int
    body: bytes  # frames; none in a fence or a filled hole


def encode_object(writer: Writer, base: int, body: bytes) -> bytes:
    head = _HEADER.pack(MAGIC, writer[0], writer[1], base, 0)[:-4]
    return head + crc32c.crc32c(head).to_bytes(4, "big") + body


def decode_object(name: str, data: bytes) -> WalObject:
    """The writer, base and frames of a WAL object; DataCorrupted if its header is not whole."""
    if len(data) < _HEADER.size:
        raise DataCorrupted(f"Tier 1 object {name}: {len(data)} bytes, shorter than its header")
    magic, epoch, generation, base, crc = _HEADER.unpack_from(data)
    if magic != MAGIC or crc32c.crc32c(data[: _HEADER.size - 4]) != crc:
        raise DataCorrupted(f"Tier 1 object {name}: bad header")
    return WalObject((epoch, generation), base, data[_HEADER.size :])
