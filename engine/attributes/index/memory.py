"""An attribute segment in memory that keeps only the pages a live root reaches.

The in-memory twin of the Tier 2 attribute segment, for tests and the
benchmark: it counts every appended byte but stores only live pages, so a
run that would append tens of GB without compaction still fits in memory.
Reading a dropped page fails (KeyError).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine.attributes.index.tree import AttributeIndex, IndexUpdate


class LivePageStore:
    """Pages by offset, written from ``IndexUpdate``s and dropped when no root reaches them."""

    def __init__(self) -> None:
        self.pages: dict[int, bytes] = {}
        self.length = 0

    def read(self, offset: int, length: int) -> bytes:
        page = self.pages[offset]
        assert len(page) == length, (offset, length, len(page))
        return page

    def write(self, update: IndexUpdate) -> None:
        assert update.offset == self.length, (update.offset, self.length)
        data, base = update.data, update.offset
        starts = [offset for offset, _ in update.nodes]
        for start, end in zip(starts, [*starts[1:], base + len(data)], strict=True):
            self.pages[start] = data[start - base : end - base]
        self.length += len(data)

    def forget(self, offsets: Iterable[int]) -> None:
        for offset in offsets:
            del self.pages[offset]

    def apply(self, index: AttributeIndex, changes: Mapping[bytes, int | None]) -> None:
        """One batch: plan, write, commit, then drop the pages the new root no longer reaches."""
        update = index.plan(changes)
        self.write(update)
        index.commit(update)
        self.forget(update.obsolete)
