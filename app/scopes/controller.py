"""The stream layer over one ``SegmentStore`` (the role of Pravega's Controller): scopes and streams.

``Controller`` creates, describes, seals and deletes scopes and streams,
and loads a stream for the other modules (``touch``: its record folded, and
whatever a crash or a concurrent request left pending finished first, see
``steps``). Scaling (``scaling``), events (``events``), transactions
(``transactions``) and cuts (``cuts``) are functions over it. Flask-free.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable, Iterator

from app.scopes import records, steps
from app.scopes.errors import ScopeNotFound, StreamConflict, StreamNotFound, StreamNotSealed
from app.scopes.names import SCOPE_MARKERS, STREAM_RECORDS, scope_marker, stream_of_record
from app.scopes.record_log import Raced, RecordLog, now
from app.settings import HttpSettings
from engine import CreateStep, SealStep, SegmentExists, SegmentNotFound, SegmentStore

# What a change makes of a stream's state: the line to append (kind, fields), or None for none.
Judge = Callable[[records.LoadedStream], "tuple[str, dict] | None"]


class Controller:
    """Scopes and streams over ``store`` (``http``: the stream settings); one per process, shared by
    the routes and the keeper."""

    def __init__(self, store: SegmentStore, http: HttpSettings) -> None:
        self.store = store
        self.http = http
        self.log: RecordLog[records.StreamState] = RecordLog(store, records.FORMAT)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    # ------------------------------------------------------------ scopes
    def create_scope(self, scope: str) -> bool:
        """Create the scope; False when it exists already."""
        marker = scope_marker(scope)
        try:
            self.store.composite([CreateStep(marker), SealStep(marker)], anywhere=True)
        except SegmentExists:
            return False
        return True

    def require_scope(self, scope: str) -> None:
        try:
            self.store.info(scope_marker(scope), anywhere=True)
        except SegmentNotFound:
            raise ScopeNotFound(f"scope {scope} does not exist") from None

    def scopes(self) -> list[str]:
        return [info.name.removeprefix(SCOPE_MARKERS) for info in self.store.scan(SCOPE_MARKERS)]

    def stream_names(self, scope: str) -> list[str]:
        """The streams of ``scope`` (those whose record exists; one being deleted included)."""
        self.require_scope(scope)
        prefix = f"{STREAM_RECORDS}{scope}/"
        return [stream_of_record(info.name)[1] for info in self.store.scan(prefix)]

    # ----------------------------------------------------------- streams
    def create_stream(
        self, scope: str, stream: str, config: records.StreamConfig
    ) -> tuple[records.LoadedStream, bool]:
        """Create the stream (True) or confirm one with the same configuration (False).

        StreamConflict for another configuration; SegmentExists when a name
        one of its segments needs is taken (the stream is then not created).
        """
        self.require_scope(scope)
        try:
            loaded = self.log.create(scope, stream, records.created_line(config, secrets.randbits(63), now()))
            created = True
        except SegmentExists:
            loaded, created = self.log.load(scope, stream), False
        if loaded.state.config != config:
            raise StreamConflict(
                f"stream {scope}/{stream} exists with another configuration: "
                f"{json.dumps(loaded.state.config.to_json())}"
            )
        return self.finish(loaded), created

    def touch(self, scope: str, stream: str) -> records.LoadedStream:
        """The stream, loaded, with what its record left pending finished (as far as it can go now)."""
        return self.finish(self.log.load(scope, stream))

    def finish(self, loaded: records.LoadedStream) -> records.LoadedStream:
        """``steps.finish`` under the stream's lock (one finisher per stream in this process)."""
        if not steps.has_work(loaded.state, now()):
            return loaded
        state = loaded.state
        with self._lock(loaded.record):
            finished = steps.finish(self, self.log.load(state.scope, state.stream))
        if finished is None:
            raise StreamNotFound(f"stream {state.scope}/{state.stream} was deleted")
        return finished

    def append_or_reload(
        self, loaded: records.LoadedStream, kind: str, **fields: object
    ) -> records.LoadedStream:
        """``loaded`` with a line appended, or, when another writer came first, the record as it is now."""
        try:
            return self.log.append(loaded, kind, **fields)
        except Raced:
            return self.log.load(loaded.state.scope, loaded.state.stream)

    def change(self, scope: str, stream: str, judge: Judge) -> records.LoadedStream:
        """Append the line ``judge`` makes of the stream's current state, judging again after a race.

        ``judge(loaded)`` returns ``(kind, fields)``, or None when nothing is
        to be written (a retry of a change already made), or raises.
        """
        while True:
            loaded = self.touch(scope, stream)
            line = judge(loaded)
            if line is None:
                return loaded
            kind, fields = line
            try:
                return self.finish(self.log.append(loaded, kind, **fields))
            except Raced:
                continue

    def seal(self, scope: str, stream: str) -> records.LoadedStream:
        """Seal the stream: open transactions aborted, a pending scale completed, every segment sealed."""

        def judge(loaded: records.LoadedStream) -> tuple[str, dict] | None:
            return None if loaded.state.sealing else ("sealing", {"time": now()})

        return self.change(scope, stream, judge)

    def delete(self, scope: str, stream: str) -> None:
        """Delete a sealed stream, its segments and its record (StreamNotSealed otherwise)."""

        def judge(loaded: records.LoadedStream) -> tuple[str, dict] | None:
            if not loaded.state.sealed:
                raise StreamNotSealed(f"stream {scope}/{stream} is not sealed; seal it first")
            return "deleting", {"time": now()}

        self.log.load(scope, stream)  # StreamNotFound when there is none
        try:
            self.change(scope, stream, judge)
        except StreamNotFound:
            return  # deleted by this request's own finish (or by a concurrent one)

    def streams_served_here(self) -> Iterator[tuple[str, str]]:
        """(scope, stream) of every stream whose record this process serves (the keeper's work)."""
        for info in self.store.scan(STREAM_RECORDS, here=True):
            yield stream_of_record(info.name)

    # ----------------------------------------------------------- helpers
    def owned_id(self, state: records.StreamState, name: str) -> int | None:
        """The id of segment ``name`` if it carries the stream's incarnation; None if absent or a stranger."""
        try:
            info = self.store.info(name, anywhere=True)
            mark = self.store.writer_event_number(name, steps.INCARNATION_KEY, anywhere=True)
        except SegmentNotFound:
            return None
        return info.segment_id if mark == state.incarnation else None

    def _lock(self, record: str) -> threading.Lock:
        with self._locks_lock:
            lock = self._locks.get(record)
            if lock is None:
                lock = self._locks[record] = threading.Lock()
            return lock
