"""Chunked segment storage (seed 002, PDP-34 "Simplified Tier 2").

A segment in Tier 2 is a list of non-overlapping, contiguous chunks: its
*layout*, a list of ``ChunkRef(name, start, length)``. This module turns
segment-level requests into chunk operations and returns the new layout;
it never changes metadata itself. The caller (the storage writer) makes a
new layout durable through Tier 1 (an ``UpdateLayout`` log operation) before
it acts on it, so after a crash the layout names exactly the chunks and
lengths that hold the segment's bytes. Bytes a chunk holds past its recorded
length, and chunks no layout names, are ignored and collected.

- Write: append to the last chunk when the binding can append, this epoch
  created that chunk and it is below the segment's rollover size; otherwise
  start a new chunk (always, on S3). The binding appends only at a chunk's
  current end, so a segment whose layout names fewer bytes of the chunk than
  it holds (a fork's share of a chunk its source wrote on, a write whose
  layout never committed and was not cut back) is refused and starts a new
  chunk: bytes a layout names never change. A write whose layout never
  committed (its segment was merged or deleted meanwhile) is cut back to
  the recorded length where the binding can truncate (``cut_back``). A new epoch never writes to a chunk an
  older epoch created (seed 002 "Segment Store Failover").
- Truncate: chunks wholly below the new start offset leave the layout.
- Concat (merge): the source's chunks join the target's layout, shifted to
  the target's end; no byte is copied (seed 002 "Concatenation").
- Defrag: runs of small consecutive chunks are joined with the binding's
  native concat into one chunk owned by the current epoch ("Defrag"). Concat
  joins whole chunks, so a chunk holding more bytes than the layout names
  (a fork's share of a chunk its source kept writing, or a write whose layout
  never committed) is left out.
- A fork's layout names chunks of its source (seed 002's metadata-only
  operations): a chunk may belong to several layouts (of one container, one
  writer thread), and the caller deletes it only when none names it any more.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from engine import naming
from engine.errors import DataCorrupted
from engine.tier2.chunk_storage import (
    BadChunkOffset,
    ChunkHandle,
    ChunkNotFound,
    ChunkStorage,
    ChunkStorageError,
    Pieces,
)

log = logging.getLogger(__name__)


class ChunkRef(NamedTuple):
    """One chunk of a layout: ``length`` bytes of the segment from ``start``."""

    name: str
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


Layout = list[ChunkRef]


def check_layout(chunks: Sequence[ChunkRef], storage_length: int, start_offset: int) -> None:
    """Assert a layout's invariants: contiguous, non-empty chunks ending at the storage length."""
    for before, after in itertools.pairwise(chunks):
        assert before.end == after.start, f"layout gap or overlap: {before} then {after}"
    for chunk in chunks:
        assert chunk.length > 0, f"empty chunk in layout: {chunk}"
    if chunks:
        assert chunks[-1].end == storage_length, (chunks[-1], storage_length)
        assert chunks[0].start <= start_offset, (chunks[0], start_offset)
    else:
        assert storage_length <= start_offset, f"no chunk holds [{start_offset}, {storage_length})"


def layout_from_json(raw: Iterable[Sequence[object]]) -> Layout:
    return [ChunkRef(str(n), int(s), int(length)) for n, s, length in raw]  # type: ignore[call-overload]


def contiguous_run(chunks: Sequence[ChunkRef], offset: int) -> tuple[int, int] | None:
    """[start, end) of the run of back-to-back chunks that holds ``offset``, or None.

    ``chunks`` are in order and may have gaps (a layout, then pending merges).
    """
    index = bisect.bisect_right([c.start for c in chunks], offset) - 1
    if index < 0 or chunks[index].end <= offset:
        return None
    first = last = index
    while first > 0 and chunks[first - 1].end == chunks[first].start:
        first -= 1
    while last + 1 < len(chunks) and chunks[last].end == chunks[last + 1].start:
        last += 1
    return chunks[first].start, chunks[last].end


def concat_layouts(target: Sequence[ChunkRef], target_length: int, source: Sequence[ChunkRef]) -> Layout:
    """The target's layout with the source's chunks appended at ``target_length``.

    The source must start at offset 0 and be contiguous (a whole segment).
    """
    assert not target or target[-1].end == target_length, (target[-1:], target_length)
    assert not source or source[0].start == 0, source[:1]
    return [*target, *(ChunkRef(c.name, target_length + c.start, c.length) for c in source)]


class ChunkedSegmentStorage:
    """One container's segments on a ChunkStorage; ``epoch`` fences chunk ownership."""

    def __init__(self, storage: ChunkStorage, container_id: int) -> None:
        self.storage = storage
        self.container_id = container_id
        self.epoch = 0
        # Chunks of this epoch that hold bytes past their recorded length
        # (a write whose layout update never committed): never append to them.
        self._abandoned: set[str] = set()

    def cut_back(self, chunks: Iterable[ChunkRef]) -> None:
        """Cut each chunk back to the length its layout records (a write that never committed).

        Then no chunk holds bytes its layout does not name, and the next write
        appends where the layout says the chunk ends. A chunk the binding
        cannot cut (no truncation, or the cut failed) is never appended to again.
        """
        for chunk in chunks:
            if self.storage.supports_truncation:
                try:
                    self.storage.truncate(self.storage.open_write(chunk.name), chunk.length)
                    continue
                except (ChunkStorageError, OSError) as exc:
                    log.warning(
                        "chunk %s not cut back to %d bytes (%s); left alone", chunk.name, chunk.length, exc
                    )
            self._abandoned.add(chunk.name)

    def owned(self, chunk: ChunkRef) -> bool:
        """True if the current epoch created ``chunk`` (only then may it write to it)."""
        parts = naming.parse_chunk_name(chunk.name)
        return parts is not None and parts.epoch == self.epoch and chunk.name not in self._abandoned

    # ------------------------------------------------------------------ write
    def write(
        self,
        segment_name: str,
        segment_id: int,
        chunks: Sequence[ChunkRef],
        offset: int,
        data: bytes,
        rollover_bytes: int,
    ) -> Layout:
        """Store ``data`` at ``offset`` (the layout's end); returns the new layout."""
        layout = list(chunks)
        assert not layout or layout[-1].end == offset, (layout[-1], offset)
        assert rollover_bytes > 0
        view = memoryview(data)
        while view:
            last = layout[-1] if layout else None
            if (
                last is not None
                and self.storage.supports_append
                and self.owned(last)
                and last.length < rollover_bytes
            ):
                piece = bytes(view[: rollover_bytes - last.length])
                try:
                    handle = self.storage.open_write(last.name)
                    self.storage.write(handle, last.length, piece)
                except BadChunkOffset:
                    log.info("chunk %s holds unrecorded bytes; starting a new chunk", last.name)
                    self._abandoned.add(last.name)
                    continue
                layout[-1] = last._replace(length=last.length + len(piece))
            else:
                piece = bytes(view[:rollover_bytes])
                name = naming.chunk_name(self.container_id, segment_name, segment_id, self.epoch, offset)
                self.storage.create(name, piece)
                layout.append(ChunkRef(name, offset, len(piece)))
            view = view[len(piece) :]
            offset += len(piece)
        return layout

    # ------------------------------------------------------------------- read
    def read(self, chunks: Sequence[ChunkRef], offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset``; the range must lie within the layout."""
        index = bisect.bisect_right([c.start for c in chunks], offset) - 1
        assert index >= 0, (offset, chunks[:1])
        parts: list[bytes] = []
        while length > 0:
            chunk = chunks[index]
            within = offset - chunk.start
            count = min(length, chunk.length - within)
            assert count > 0, (chunk, offset)
            piece = self.storage.read(ChunkHandle(chunk.name, read_only=True), within, count)
            if len(piece) != count:
                raise DataCorrupted(
                    f"chunk {chunk.name} returned {len(piece)} bytes at {within}, its layout says {count}"
                )
            parts.append(piece)
            offset += count
            length -= count
            index += 1
        return b"".join(parts)

    def stream(self, chunk: ChunkRef, offset: int, length: int, piece_bytes: int) -> Pieces:
        """``length`` bytes of one chunk from segment offset ``offset``, as they arrive, in pieces."""
        assert chunk.start <= offset and offset + length <= chunk.end, (chunk, offset, length)
        handle = ChunkHandle(chunk.name, read_only=True)
        return self.storage.read_stream(handle, offset - chunk.start, length, piece_bytes)

    # --------------------------------------------------------- layout changes
    @staticmethod
    def truncate(chunks: Sequence[ChunkRef], start_offset: int) -> tuple[Layout, list[str]]:
        """Split a layout at ``start_offset``: the chunks to keep, and the names of those wholly below."""
        kept = [c for c in chunks if c.end > start_offset]
        removed = [c.name for c in chunks if c.end <= start_offset]
        return kept, removed

    def defrag(
        self,
        segment_name: str,
        segment_id: int,
        chunks: Sequence[ChunkRef],
        *,
        small_bytes: int,
        min_run: int,
        max_bytes: int,
    ) -> tuple[Layout, list[str]] | None:
        """Join the first run of at least ``min_run`` small chunks; None if there is none.

        Returns the new layout and the chunks it no longer names (to delete
        once the layout is durable). The joined chunk is a new one owned by
        this epoch, so no other epoch's chunk is ever written.
        """
        if not self.storage.supports_concat:
            return None
        longer: set[str] = set()
        while True:
            run = self._small_run(chunks, small_bytes, min_run, max_bytes, longer)
            if run is None:
                return None
            first, count = run
            joined = chunks[first : first + count]
            found = {c.name for c in joined if self.storage.info(c.name).length != c.length}
            if not found:
                break
            longer |= found
        name = naming.chunk_name(self.container_id, segment_name, segment_id, self.epoch, joined[0].start)
        handle = self.storage.create(name, b"")
        length = self.storage.concat(handle, [c.name for c in joined])
        expected = sum(c.length for c in joined)
        if length != expected:
            self.storage.delete(name)
            raise DataCorrupted(f"defrag of {segment_name!r} produced {length} bytes, expected {expected}")
        new = ChunkRef(name, joined[0].start, expected)
        layout = [*chunks[:first], new, *chunks[first + count :]]
        return layout, [c.name for c in joined]

    @staticmethod
    def _small_run(
        chunks: Sequence[ChunkRef], small_bytes: int, min_run: int, max_bytes: int, left_out: set[str]
    ) -> tuple[int, int] | None:
        # The last chunk may still grow (append bindings); leave it out.
        candidates = chunks[:-1]
        start = 0
        while start < len(candidates):
            end, total = start, 0
            while (
                end < len(candidates)
                and candidates[end].length < small_bytes
                and candidates[end].name not in left_out
                and total + candidates[end].length <= max_bytes
            ):
                total += candidates[end].length
                end += 1
            if end - start >= min_run:
                return start, end - start
            start = max(end, start + 1)
        return None

    # ------------------------------------------------------------- clean-up
    def delete_chunks(self, names: Iterable[str]) -> None:
        for name in names:
            self.storage.delete(name)

    def chunk_names(self) -> list[str]:
        """The names of this container's chunks in Tier 2 now: what ``collect_garbage`` looks through."""
        return [info.name for info in self.storage.list(naming.container_chunk_prefix(self.container_id))]

    def collect_garbage(self, referenced: set[str], names: Iterable[str]) -> list[str]:
        """Delete the chunks of ``names`` (``chunk_names``) from older epochs that no layout names.

        Run at start, before this epoch writes: such chunks are writes whose
        layout update never became durable, or deletions a crash interrupted.
        ``names`` may be listed while Tier 1 is recovered, before ``referenced``
        is known: a chunk of an older epoch that is not in Tier 1's layouts by
        the end of that recovery never will be (the older writer is fenced),
        and one created after the listing is left for the next epoch's start.
        """
        deleted = []
        for name in names:
            parts = naming.parse_chunk_name(name)
            if parts is None or parts.epoch >= self.epoch or name in referenced:
                continue
            self.storage.delete(name)
            deleted.append(name)
        return deleted

    # ------------------------------------------------------ backup / restore
    def export_layout(
        self, segment_name: str, chunks: Sequence[ChunkRef], length: int, start_offset: int | None = None
    ) -> str:
        """Write the layout to a small object (seed 002 "Backup and Restore"); returns its name.

        ``start_offset`` (default: where the first chunk starts) keeps a
        truncation that fell inside the first chunk.
        """
        key = naming.layout_key(segment_name)
        if start_offset is None:
            start_offset = chunks[0].start if chunks else length
        check_layout(chunks, length, start_offset)
        body = json.dumps(
            {
                "version": 1,
                "name": segment_name,
                "length": length,
                "start_offset": start_offset,
                "chunks": [list(c) for c in chunks],
            }
        ).encode()
        self.storage.delete(key)
        self.storage.create(key, body)
        return key

    def import_layout(self, segment_name: str) -> tuple[Layout, int, int]:
        """Read an exported layout back: its chunks, length and start offset, checked against Tier 2."""
        key = naming.layout_key(segment_name)
        try:
            handle = self.storage.open_read(key)
            raw = json.loads(self.storage.read(handle, 0, self.storage.info(key).length))
        except ChunkNotFound:
            raise ChunkNotFound(f"no exported layout for {segment_name!r} at {key}") from None
        if raw.get("version") != 1 or raw.get("name") != segment_name:
            raise DataCorrupted(f"{key} is not a layout of {segment_name!r}")
        chunks = layout_from_json(raw["chunks"])
        length = int(raw["length"])
        start = int(raw.get("start_offset", chunks[0].start if chunks else length))
        check_layout(chunks, length, start)
        for chunk in chunks:
            if self.storage.info(chunk.name).length < chunk.length:
                raise DataCorrupted(f"chunk {chunk.name} is shorter than the layout says")
        return chunks, length, start
