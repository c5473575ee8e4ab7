"""Each segment's attribute index in Tier 2 (seed 001 "Attribute Index"): look up and write.

The B+Tree (``engine.attributes.index``) plans pages; this module stores them in
the segment's *attribute segment*: chunks named for ``<name>#attributes``,
written through the chunked storage and head-truncated below the lowest live
page, so obsolete pages leave Tier 2 a whole chunk at a time. The attribute
segment's layout, length and root are segment metadata, changed only by an
``UpdateAttributeIndex`` log operation (like a data layout): after a crash
between writing pages and logging the operation, the old root is still the
index, and the next write starts at the old length again.

The storage writer calls ``write`` with the latest value of each key changed
since its last write (seed 001: only the latest value per key per flush).
Requests call ``lookup`` (the Tier 2 bindings make its reads cooperative) for values the
metadata does not hold, before their operation enters the pipeline.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterable

from engine import naming
from engine.attributes.index import AttributeIndex, IndexUpdate, NodeCache, RootPointer
from engine.errors import SegmentNotFound
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage

# Attribute chunks roll over at this size; head truncation frees whole chunks.
ATTRIBUTE_ROLLOVER_BYTES = 4 * 1024 * 1024


class SegmentAttributes:
    """One container's attribute indexes, built from metadata on first use and shared by threads."""

    def __init__(
        self, metadata: ContainerMetadata, chunked: ChunkedSegmentStorage, node_cache_bytes: int
    ) -> None:
        self.metadata = metadata
        self.chunked = chunked
        self.cache = NodeCache(node_cache_bytes)
        self._indexes: dict[int, AttributeIndex] = {}
        self._lock = threading.Lock()

    def _index(self, segment_id: int) -> AttributeIndex:
        with self._lock:
            index = self._indexes.get(segment_id)
            if index is not None:
                return index
        with self.metadata.lock:
            seg = self.metadata.segments.get(segment_id)
            if seg is None:
                raise SegmentNotFound(f"segment id {segment_id} is gone")
            root = RootPointer(*seg.attribute_root) if seg.attribute_root is not None else None
            length = seg.attribute_length
        index = AttributeIndex(functools.partial(self._read, segment_id), root, length, cache=self.cache)
        with self._lock:
            return self._indexes.setdefault(segment_id, index)

    def _read(self, segment_id: int, offset: int, length: int) -> bytes:
        with self.metadata.lock:
            seg = self.metadata.segments.get(segment_id)
            if seg is None:
                raise SegmentNotFound(f"segment id {segment_id} is gone")
            chunks = list(seg.attribute_chunks)
        if not chunks or offset < chunks[0].start or offset + length > chunks[-1].end:
            raise SegmentNotFound(f"attribute pages [{offset}, {offset + length}) are not in Tier 2")
        return self.chunked.read(chunks, offset, length)

    def lookup(self, segment_id: int, keys: Iterable[str]) -> dict[str, int | None]:
        """The index's values of ``keys`` (None: absent). Blocks on Tier 2 for uncached pages."""
        keys = list(keys)
        found = self._index(segment_id).get(uuid.UUID(k).bytes for k in keys)
        return {k: found.get(uuid.UUID(k).bytes) for k in keys}

    def items(self, segment_id: int) -> dict[str, int]:
        """Every key and value in the index, as of its root now. Blocks on Tier 2 for uncached pages."""
        return {str(uuid.UUID(bytes=k)): v for k, v in self._index(segment_id).items()}

    def write(
        self,
        segment_id: int,
        changes: dict[str, int],
        persisted_seq: int,
        commit: Callable[[ops.UpdateAttributeIndex, int], bool],
    ) -> list[str]:
        """Write ``changes`` to the index; returns the chunk names to delete afterwards.

        ``commit(op, bytes written)`` makes the ``UpdateAttributeIndex`` durable (False: the
        segment went meanwhile; then the chunks written here are returned
        for deletion instead).
        """
        index = self._index(segment_id)
        with self.metadata.lock:
            seg = self.metadata.segments.get(segment_id)
            if seg is None:
                return []
            name, old = seg.name, list(seg.attribute_chunks)
            assert seg.attribute_length == index.length, (seg.attribute_length, index.length)
        update: IndexUpdate = index.plan({uuid.UUID(k).bytes: v for k, v in changes.items()})
        end = update.offset + len(update.data)
        layout = old
        if update.data:
            layout = self.chunked.write(
                naming.attribute_segment_name(name),
                segment_id,
                old,
                update.offset,
                update.data,
                ATTRIBUTE_ROLLOVER_BYTES,
            )
        kept, removed = self.chunked.truncate(layout, update.root.min_offset if update.root else end)
        op = ops.UpdateAttributeIndex(
            name=name,
            segment_id=segment_id,
            chunks=[list(c) for c in kept],
            length=end,
            root=[update.root.offset, update.root.length, update.root.min_offset] if update.root else None,
            persisted_seq=persisted_seq,
        )
        if not commit(op, len(update.data)):
            known = {c.name for c in old}
            return [c.name for c in layout if c.name not in known]
        index.commit(update)
        return removed

    def forget(self, segment_id: int) -> None:
        """Drop a deleted or merged segment's index and its cached pages."""
        with self._lock:
            index = self._indexes.pop(segment_id, None)
        if index is not None:
            index.close()
