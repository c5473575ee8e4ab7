"""A record log: a JSON-lines record segment, its fold cached, appends by compare-and-set, compaction.

A stream's record (``#scopes/streams/<scope>/<stream>``, ``records``) and
a reader group's (``#scopes/groups/<scope>/<group>``, ``groups``) are both
such a log; a ``RecordFormat`` says how each folds. A load reads the
record's length and parses only the lines it has not seen (the state is
cached per record name, segment id and length); an append carries
``Expected-Offset`` at the length its writer loaded, so of two writers that
judged the same state one wins and the other gets ``Raced``, loads again
and judges again. Every call reaches the record's container wherever it is
(``anywhere``): a cluster node serves the records it holds, and a listing
reads the others.

A format that can snapshot its state (a group's: commits add a line each)
is compacted: once the lines past the record's start pass
``COMPACT_BYTES``, a ``snapshot`` line holding the whole state is appended
and the record truncated before it (Pravega's state synchronizer compacts
its segment the same way); its ``first_state`` starts from such a line.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from engine import (
    AppendResult,
    AppendStep,
    ConditionalCheckFailed,
    CreateStep,
    DeleteStep,
    SegmentNotFound,
    SegmentStore,
    SegmentTruncated,
    SegstoreError,
    TruncateStep,
)

COMPACT_BYTES = 256 * 1024

S = TypeVar("S")


class Raced(SegstoreError):
    """Another writer appended to the record first: load again and judge again (never answered)."""


def now() -> float:
    """Wall-clock seconds: record times and transaction deadlines (shared by every node)."""
    return time.time()


def line(kind: str, **fields: Any) -> bytes:
    """One record line, as appended."""
    return (json.dumps({"t": kind, **fields}, separators=(",", ":")) + "\n").encode()


def parse(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The whole lines of ``data`` and how many bytes they take (a torn tail is left for later)."""
    end = data.rfind(b"\n") + 1
    return [json.loads(raw) for raw in data[:end].splitlines() if raw], end


@dataclass(frozen=True, slots=True)
class RecordFormat(Generic[S]):
    """What one kind of record is: its name, its fold, and the error that says it is missing."""

    what: str  # how errors name it: "stream", "reader group"
    missing: type[SegmentNotFound]
    record: Callable[[str, str], str]  # (scope, name) -> the record segment's name
    first_state: Callable[[str, str, Mapping[str, Any]], S]  # (scope, name, first line)
    fold: Callable[[S, Iterable[Mapping[str, Any]]], S]
    snapshot: Callable[[S], dict[str, Any]] | None = None  # the whole state, for compaction


@dataclass(frozen=True, slots=True)
class Loaded(Generic[S]):
    """A record's state at one length: what an append conditional on that length judged."""

    state: S
    scope: str
    name: str
    record: str
    segment_id: int
    length: int
    start: int = 0  # where the lines folded into ``state`` begin (the last snapshot's offset)


class RecordLog(Generic[S]):
    """Loads and appends the records of one format through ``store``; thread-safe."""

    def __init__(self, store: SegmentStore, form: RecordFormat[S]) -> None:
        self.store = store
        self.form = form
        self._cache: dict[str, Loaded[S]] = {}
        self._lock = threading.Lock()

    def _missing(self, scope: str, name: str, how: str = "does not exist") -> SegmentNotFound:
        return self.form.missing(f"{self.form.what} {scope}/{name} {how}")

    def load(self, scope: str, name: str) -> Loaded[S]:
        """The state as the record says now; the format's ``missing`` error when there is none."""
        record = self.form.record(scope, name)
        try:
            info = self.store.info(record, anywhere=True)
        except SegmentNotFound:
            raise self._missing(scope, name) from None
        with self._lock:
            cached = self._cache.get(record)
        if cached is not None and (cached.segment_id, cached.length) == (info.segment_id, info.length):
            return cached
        if cached is not None and (
            cached.segment_id != info.segment_id or not info.start_offset <= cached.length <= info.length
        ):
            cached = None
        try:
            loaded = self._read(scope, name, record, info.segment_id, info.start_offset, info.length, cached)
        except SegmentTruncated:  # compacted meanwhile: read from the new start
            return self.load(scope, name)
        self._remember(loaded)
        return loaded

    def _read(
        self, scope: str, name: str, record: str, segment_id: int, start: int, length: int,
        cached: Loaded[S] | None,
    ) -> Loaded[S]:  # fmt: skip
        first = cached.length if cached is not None else start
        offset = first
        pieces = []
        while offset < length:
            try:
                read = self.store.read(record, offset, length - offset, anywhere=True)
            except SegmentNotFound:
                raise self._missing(scope, name) from None
            if read.info.segment_id != segment_id:
                raise self._missing(scope, name, "was deleted meanwhile")
            if read.next_offset == offset:
                break
            pieces.append(read.data)
            offset = read.next_offset
        docs, used = parse(b"".join(pieces))
        if cached is None:
            assert docs, f"record {record} holds no line at {start}"
            state = self.form.fold(self.form.first_state(scope, name, docs[0]), docs[1:])
            return Loaded(state, scope, name, record, segment_id, first + used, start)
        state = self.form.fold(cached.state, docs)
        return Loaded(state, scope, name, record, segment_id, first + used, cached.start)

    def _remember(self, loaded: Loaded[S]) -> None:
        with self._lock:
            known = self._cache.get(loaded.record)
            if known is None or known.segment_id != loaded.segment_id or known.length < loaded.length:
                self._cache[loaded.record] = loaded

    def create(self, scope: str, name: str, first_line: bytes) -> Loaded[S]:
        """Write a new record holding ``first_line`` (``created``); SegmentExists if there is one."""
        record = self.form.record(scope, name)
        result = self.store.composite([CreateStep(record), AppendStep(record, first_line)], anywhere=True)[1]
        assert isinstance(result, AppendResult)
        docs, used = parse(first_line)
        state = self.form.first_state(scope, name, docs[0])
        loaded = Loaded(state, scope, name, record, result.info.segment_id, used)
        self._remember(loaded)
        return loaded

    def append(self, loaded: Loaded[S], kind: str, **fields: object) -> Loaded[S]:
        """``loaded`` with one more line, appended only if the record is still at ``loaded.length``.

        Raises Raced when another writer came first (``loaded`` judged an old state).
        """
        after = self._append(loaded, kind, line(kind, **fields))
        if self.form.snapshot is not None and after.length - after.start > COMPACT_BYTES:
            with contextlib.suppress(Raced):
                after = self._compact(after, self.form.snapshot)
        return after

    def _append(self, loaded: Loaded[S], kind: str, data: bytes, start: int | None = None) -> Loaded[S]:
        step = AppendStep(loaded.record, data, expected_offset=loaded.length)
        try:
            result = self.store.composite([step], anywhere=True)[0]
        except ConditionalCheckFailed:
            raise Raced(f"record {loaded.record} changed under a {kind} line") from None
        except SegmentNotFound:
            raise self._missing(loaded.scope, loaded.name, "was deleted") from None
        assert isinstance(result, AppendResult) and result.info.segment_id == loaded.segment_id
        docs, used = parse(data)
        after = Loaded(
            self.form.fold(loaded.state, docs), loaded.scope, loaded.name, loaded.record, loaded.segment_id,
            loaded.length + used, loaded.start if start is None else start,
        )  # fmt: skip
        self._remember(after)
        return after

    def _compact(self, loaded: Loaded[S], snapshot: Callable[[S], dict[str, Any]]) -> Loaded[S]:
        """A snapshot line of the whole state, then the record truncated before it."""
        at = loaded.length
        after = self._append(loaded, "snapshot", line("snapshot", state=snapshot(loaded.state)), start=at)
        with contextlib.suppress(SegmentNotFound):
            self.store.composite([TruncateStep(loaded.record, at)], anywhere=True)
        return after

    def delete(self, scope: str, name: str, segment_id: int | None = None) -> None:
        """Delete the record (with ``segment_id``, only if it is still that one); ``missing`` if none."""
        record = self.form.record(scope, name)
        try:
            self.store.composite([DeleteStep(record, segment_id)], anywhere=True)
        except SegmentNotFound:
            raise self._missing(scope, name) from None
        finally:
            with self._lock:
                self._cache.pop(record, None)
