"""Forks: the log operation that creates a segment holding another's bytes below an offset.

A fork names the source's flushed chunks in its own layout (seed 002: a
metadata operation, nothing copied); the rest of its bytes, still only in
Tier 1, ride on the operation (``SegmentContainer.fork`` reads them).
"""

from __future__ import annotations

import time

from engine.errors import BadOffset, SegmentTruncated
from engine.metadata import operations as ops
from engine.metadata.container_metadata import SegmentMetadata


def fork_operation(seg: SegmentMetadata, name: str, offset: int | None) -> tuple[ops.ForkSegment, int]:
    """A fork of ``seg``'s committed layout named ``name`` (its bytes not yet read), and where it ends.

    The caller holds the metadata lock.
    """
    info = seg.info()
    end = info.length if offset is None else offset
    if end < info.start_offset:
        raise SegmentTruncated(f"fork offset {end} is below the start offset", segment=info)
    if end > info.length:
        raise BadOffset(f"fork offset {end} is past the length {info.length}", segment=info)
    flushed = min(end, seg.storage_length)
    chunks = [
        c._replace(length=min(c.end, flushed) - c.start)
        for c in seg.chunks
        if c.end > info.start_offset and c.start < flushed
    ]
    op = ops.ForkSegment(
        name=name,
        created=time.time(),
        rollover_bytes=seg.rollover_bytes,
        chunks=[list(c) for c in chunks],
        length=max(flushed, info.start_offset),
        start_offset=info.start_offset,
        source=seg.name,
        source_id=seg.segment_id,
        boundaries=[b for b in seg.boundaries if info.start_offset <= b < end],
    )
    return op, end
