"""Reading and appending a reader group's record: the fold cached, appends by compare-and-set, compaction.

The record is ``#scopes/groups/<scope>/<group>`` (``names``), hashed by
``<scope>/<group>`` so a cluster sends every request of a group to one
node. Like a stream's record (``log``), a load parses only the lines it has
not seen and an append carries ``Expected-Offset`` at the length its
writer loaded (``Raced`` otherwise). Commits add a line each, so once the
lines past the record's start pass ``COMPACT_BYTES`` a ``snapshot`` line
holding the whole state is appended and the record truncated before it
(Pravega's state synchronizer compacts its segment the same way).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from app.scopes import groups
from app.scopes.errors import GroupNotFound
from app.scopes.log import Raced
from app.scopes.names import group_record
from engine import (
    AppendResult,
    AppendStep,
    ConditionalCheckFailed,
    CreateStep,
    DeleteStep,
    SegmentNotFound,
    SegmentStore,
    SegmentTruncated,
    TruncateStep,
)

COMPACT_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class LoadedGroup:
    """A group's state at one length of its record: what an append conditional on that length judged."""

    state: groups.GroupState
    record: str
    segment_id: int
    length: int
    start: int  # where the lines folded into ``state`` begin (the last snapshot's offset)


class GroupLog:
    """Loads and appends reader group records through ``store``; thread-safe."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self._cache: dict[str, LoadedGroup] = {}
        self._lock = threading.Lock()

    def load(self, scope: str, group: str) -> LoadedGroup:
        """The group's state as its record says now; GroupNotFound when there is none."""
        name = group_record(scope, group)
        try:
            info = self.store.info(name, anywhere=True)
        except SegmentNotFound:
            raise GroupNotFound(f"reader group {scope}/{group} does not exist") from None
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and (cached.segment_id, cached.length) == (info.segment_id, info.length):
            return cached
        if cached is None or cached.segment_id != info.segment_id or cached.length < info.start_offset:
            cached = None
        try:
            loaded = self._read(name, info.segment_id, info.start_offset, info.length, cached, scope, group)
        except SegmentTruncated:  # compacted meanwhile: read from the new start
            return self.load(scope, group)
        self._remember(loaded)
        return loaded

    def _read(
        self, name: str, segment_id: int, start: int, length: int, cached: LoadedGroup | None,
        scope: str, group: str,
    ) -> LoadedGroup:  # fmt: skip
        offset = cached.length if cached is not None else start
        first = offset
        pieces = []
        while offset < length:
            try:
                read = self.store.read(name, offset, length - offset, anywhere=True)
            except SegmentNotFound:
                raise GroupNotFound(f"reader group {scope}/{group} does not exist") from None
            if read.info.segment_id != segment_id:
                raise GroupNotFound(f"reader group {scope}/{group} was deleted meanwhile")
            if read.next_offset == offset:
                break
            pieces.append(read.data)
            offset = read.next_offset
        docs, used = groups.parse(b"".join(pieces))
        if cached is None:
            assert docs, f"record {name} holds no line at {start}"
            state = groups.fold(groups.first_state(scope, group, docs[0]), docs[1:])
            return LoadedGroup(state, name, segment_id, first + used, start)
        return LoadedGroup(groups.fold(cached.state, docs), name, segment_id, first + used, cached.start)

    def _remember(self, loaded: LoadedGroup) -> None:
        with self._lock:
            known = self._cache.get(loaded.record)
            if known is None or known.segment_id != loaded.segment_id or known.length < loaded.length:
                self._cache[loaded.record] = loaded

    def create(self, scope: str, group: str, first_line: bytes) -> LoadedGroup:
        """Write a new record holding ``first_line`` (``created``); SegmentExists if there is one."""
        name = group_record(scope, group)
        result = self.store.composite([CreateStep(name), AppendStep(name, first_line)], anywhere=True)[1]
        assert isinstance(result, AppendResult)
        docs, used = groups.parse(first_line)
        loaded = LoadedGroup(groups.first_state(scope, group, docs[0]), name, result.info.segment_id, used, 0)
        self._remember(loaded)
        return loaded

    def append(self, loaded: LoadedGroup, kind: str, **fields: object) -> LoadedGroup:
        """``loaded`` with one more line, appended only if the record is still at ``loaded.length``.

        Raises Raced when another writer came first (``loaded`` judged an old state).
        """
        after = self._append(loaded, groups.line(kind, **fields))
        if after.length - after.start > COMPACT_BYTES:
            with contextlib.suppress(Raced):
                after = self._compact(after)
        return after

    def _append(self, loaded: LoadedGroup, data: bytes, start: int | None = None) -> LoadedGroup:
        step = AppendStep(loaded.record, data, expected_offset=loaded.length)
        try:
            result = self.store.composite([step], anywhere=True)[0]
        except ConditionalCheckFailed:
            raise Raced(f"record {loaded.record} changed under a line") from None
        except SegmentNotFound:
            state = loaded.state
            raise GroupNotFound(f"reader group {state.scope}/{state.group} was deleted") from None
        assert isinstance(result, AppendResult) and result.info.segment_id == loaded.segment_id
        docs, used = groups.parse(data)
        after = LoadedGroup(
            groups.fold(loaded.state, docs), loaded.record, loaded.segment_id, loaded.length + used,
            loaded.start if start is None else start,
        )  # fmt: skip
        self._remember(after)
        return after

    def _compact(self, loaded: LoadedGroup) -> LoadedGroup:
        """A snapshot line of the whole state, then the record truncated before it."""
        at = loaded.length
        after = self._append(loaded, groups.line("snapshot", state=loaded.state.to_json()), start=at)
        with contextlib.suppress(SegmentNotFound):
            self.store.composite([TruncateStep(loaded.record, at)], anywhere=True)
        return after

    def delete(self, scope: str, group: str) -> None:
        """Delete the record; GroupNotFound when there is none."""
        name = group_record(scope, group)
        try:
            self.store.composite([DeleteStep(name)], anywhere=True)
        except SegmentNotFound:
            raise GroupNotFound(f"reader group {scope}/{group} does not exist") from None
        with self._lock:
            self._cache.pop(name, None)
