"""Reading and appending a stream's record: the fold cached per record, appends by compare-and-set.

The record is ``#scopes/streams/<scope>/<stream>`` (``names``). A load
reads its length and parses only the lines it has not seen (the state is
cached per record name, segment id and length); an append carries
``Expected-Offset`` at the length its writer loaded, so of two writers that
judged the same state one wins and the other gets ``Raced``, loads again and
judges again. Every call reaches the record's container wherever it is
(``anywhere``): a cluster node serves the streams whose records it holds,
and a listing reads the others.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

from app.scopes import records
from app.scopes.errors import StreamNotFound
from app.scopes.names import stream_record
from engine import (
    AppendResult,
    AppendStep,
    ConditionalCheckFailed,
    CreateStep,
    DeleteStep,
    SegmentNotFound,
    SegmentStore,
    SegstoreError,
)


class Raced(SegstoreError):
    """Another writer appended to the record first: load again and judge again (never answered)."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """A record's state at one length: what an append conditional on that length judged."""

    state: records.StreamState
    record: str
    segment_id: int
    length: int


class RecordLog:
    """Loads and appends stream records through ``store``; thread-safe."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self._cache: dict[str, Loaded] = {}
        self._lock = threading.Lock()

    def load(self, scope: str, stream: str) -> Loaded:
        """The stream's state as its record says now; StreamNotFound when there is none."""
        name = stream_record(scope, stream)
        try:
            info = self.store.info(name, anywhere=True)
        except SegmentNotFound:
            raise StreamNotFound(f"stream {scope}/{stream} does not exist") from None
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and cached.segment_id == info.segment_id and cached.length == info.length:
            return cached
        if cached is None or cached.segment_id != info.segment_id or cached.length > info.length:
            cached = None
        loaded = self._read_on(name, info.segment_id, info.length, cached, scope, stream)
        with self._lock:
            known = self._cache.get(name)
            if known is None or known.segment_id != loaded.segment_id or known.length < loaded.length:
                self._cache[name] = loaded
        return loaded

    def _read_on(
        self, name: str, segment_id: int, length: int, cached: Loaded | None, scope: str, stream: str
    ) -> Loaded:
        offset = cached.length if cached is not None else 0
        pieces = []
        while offset < length:
            try:
                read = self.store.read(name, offset, length - offset, anywhere=True)
            except SegmentNotFound:
                raise StreamNotFound(f"stream {scope}/{stream} does not exist") from None
            if read.info.segment_id != segment_id:
                raise StreamNotFound(f"stream {scope}/{stream} was deleted meanwhile")
            if read.next_offset == offset:
                break
            pieces.append(read.data)
            offset = read.next_offset
        docs, used = records.parse(b"".join(pieces))
        start = cached.length if cached is not None else 0
        if cached is None:
            assert docs, f"record {name} holds no line"
            state = records.fold(records.first_state(scope, stream, docs[0]), docs[1:])
        else:
            state = records.fold(cached.state, docs)
        return Loaded(state, name, segment_id, start + used)

    def create(self, scope: str, stream: str, first_line: bytes) -> Loaded:
        """Write a new record holding ``first_line`` (``created``); SegmentExists if there is one."""
        name = stream_record(scope, stream)
        result = self.store.composite([CreateStep(name), AppendStep(name, first_line)], anywhere=True)[1]
        assert isinstance(result, AppendResult)
        info = result.info
        docs, used = records.parse(first_line)
        loaded = Loaded(records.first_state(scope, stream, docs[0]), name, info.segment_id, used)
        with self._lock:
            self._cache[name] = loaded
        return loaded

    def append(self, loaded: Loaded, kind: str, **fields: object) -> Loaded:
        """``loaded`` with one more line, appended only if the record is still at ``loaded.length``.

        Raises Raced when another writer came first (``loaded`` judged an old state).
        """
        data = records.line(kind, **fields)
        step = AppendStep(loaded.record, data, expected_offset=loaded.length)
        try:
            result = self.store.composite([step], anywhere=True)[0]
        except ConditionalCheckFailed:
            raise Raced(f"record {loaded.record} changed under a {kind} line") from None
        except SegmentNotFound:
            raise StreamNotFound(f"stream {loaded.state.scope}/{loaded.state.stream} was deleted") from None
        docs, used = records.parse(data)
        state = records.fold(loaded.state, docs)
        after = Loaded(state, loaded.record, loaded.segment_id, loaded.length + used)
        assert isinstance(result, AppendResult) and result.info.segment_id == loaded.segment_id
        with self._lock:
            known = self._cache.get(loaded.record)
            if known is None or known.segment_id != after.segment_id or known.length < after.length:
                self._cache[loaded.record] = after
        return after

    def delete(self, loaded: Loaded) -> None:
        """Delete the record (the last step of a stream's delete), if it is still the one loaded."""
        with contextlib.suppress(SegmentNotFound):
            self.store.composite([DeleteStep(loaded.record, loaded.segment_id)], anywhere=True)
        with self._lock:
            self._cache.pop(loaded.record, None)


def now() -> float:
    """Wall-clock seconds: record times and transaction deadlines (shared by every node)."""
    return time.time()
