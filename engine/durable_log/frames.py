"""Data frames: how one Tier 1 write is laid out on the log (seed 000 "Data Frames").

A write carries the serialized operations of one processor batch. Its payload
is cut into frames of at most ``max_frame_bytes``; each frame is

    payload length u32 | CRC32C u32 | frame sequence number u64 | flags u8 | payload

The CRC covers sequence number, flags and payload. Frame sequence numbers
grow by one across the whole log. The last frame of a write has the LAST
flag: recovery only accepts whole writes, so a write torn by a crash (never
acknowledged, since acknowledgement follows fdatasync) is dropped entirely.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

HEADER = struct.Struct(">IIQB")
LAST = 0x01


@dataclass(frozen=True, slots=True)
class Batch:
    """One whole write read back: its first frame number, frame count and payload."""

    first_frame_seq: int
    frame_count: int
    payload: bytes
    end: int  # byte position just after the batch in its buffer


def frame_payload_sizes(payload_bytes: int, max_frame_bytes: int) -> list[int]:
    """Payload bytes in each frame of a write of ``payload_bytes``."""
    room = max_frame_bytes - HEADER.size
    assert room > 0 and payload_bytes > 0
    sizes = [room] * (payload_bytes // room)
    if payload_bytes % room:
        sizes.append(payload_bytes % room)
    return sizes


def encode_batch(payload: bytes, first_frame_seq: int, max_frame_bytes: int) -> tuple[bytes, int]:
    """Frame ``payload``; returns the bytes to write and the number of frames."""
    view = memoryview(payload)
    parts: list[bytes | memoryview] = []
    sizes = frame_payload_sizes(len(payload), max_frame_bytes)
    pos = 0
    for i, size in enumerate(sizes):
        chunk = view[pos : pos + size]
        pos += size
        seq = first_frame_seq + i
        flags = LAST if i == len(sizes) - 1 else 0
        tail = struct.pack(">QB", seq, flags)
        crc = crc32c.crc32c(chunk, crc32c.crc32c(tail))
        parts.append(HEADER.pack(size, crc, seq, flags))
        parts.append(chunk)
    return b"".join(parts), len(sizes)


class TornTail(Exception):
    """The buffer ends in a partial or corrupt write at ``position``."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"{reason} at byte {position}")
        self.position = position
        self.reason = reason


def iter_batches(buf: bytes, expected_seq: int | None = None) -> Iterator[Batch]:
    """Yield whole writes from ``buf``; raise TornTail where the valid data ends.

    ``expected_seq`` is the frame number the buffer must start with (None: any).
    """
    view = memoryview(buf)
    pos = 0
    batch_start = 0
    batch_first: int | None = None
    chunks: list[bytes] = []
    while pos < len(view):
        if len(view) - pos < HEADER.size:
            raise TornTail(batch_start, "partial frame header")
        size, crc, seq, flags = HEADER.unpack_from(view, pos)
        body = view[pos + HEADER.size : pos + HEADER.size + size]
        if len(body) != size:
            raise TornTail(batch_start, "partial frame")
        if crc32c.crc32c(body, crc32c.crc32c(view[pos + 8 : pos + HEADER.size])) != crc:
            raise TornTail(batch_start, f"CRC mismatch in frame {seq}")
        if expected_seq is not None and seq != expected_seq:
            raise TornTail(batch_start, f"frame {seq} where {expected_seq} was expected")
        if batch_first is None:
            batch_first = seq
        chunks.append(bytes(body))
        pos += HEADER.size + size
        expected_seq = seq + 1
        if flags & LAST:
            yield Batch(batch_first, seq - batch_first + 1, b"".join(chunks), pos)
            batch_start, batch_first, chunks = pos, None, []
    if chunks:
        raise TornTail(batch_start, "write without its last frame")


def valid_frame_after(buf: bytes, position: int, first_seq: int, max_frame_bytes: int) -> bool:
    """Whether a valid frame after a tear at ``position`` cannot belong to the torn write itself."""
    view = memoryview(buf)
    last_seq = None
    for pos in range(position + 1, len(view) - HEADER.size + 1):
        size, crc, seq, flags = HEADER.unpack_from(view, pos)
        if seq < first_seq or pos + HEADER.size + size > len(view):
            continue
        body = view[pos + HEADER.size : pos + HEADER.size + size]
        if crc32c.crc32c(body, crc32c.crc32c(view[pos + 8 : pos + HEADER.size])) != crc:
            continue
        if pos - position != (seq - first_seq) * max_frame_bytes:
            return True
        if last_seq is not None and seq > last_seq:
            return True
        if flags & LAST:
            last_seq = seq
    return False
