"""One event to a stream (``POST .../events``): routed by its key, framed, deduplicated across scalings.

The event is stored as one length-prefixed frame (docs/api.md "Appends":
4-byte big-endian length, then the payload; the client's ``events`` module
frames and reads them) in the current segment covering its key's hash (the
client's ``routing`` module). With ``Writer-Id`` and ``Event-Number`` the
append is deduplicated by the segment's writer state, and, on a segment born of a
scale, first checked against the writer's numbers on the sealed
predecessors along the key's lineage: a number at or above the event's
means it was stored there before the seal, and it is answered as a
duplicate, never stored again in a successor. A sealed segment's numbers
never change, so each is looked up once (``WriterNumbers``).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from app.scopes import records
from app.scopes.controller import Controller
from app.scopes.errors import StreamSealed
from app.scopes.names import segment_name
from client.events import frame
from client.routing import key_hash
from engine import AppendResult, AppendStep, SegmentInfo, SegmentNotFound, SegmentSealed, SegmentStore

# Sealed segments' writer numbers remembered (about 200 bytes each).
REMEMBERED_MAX = 65536
# A segment sealed under an event is the stream scaling: the event follows it this many times.
_SEALED_TRIES = 8


@dataclass(frozen=True, slots=True)
class EventAnswer:
    """Where the event went: its segment, and its offset there (None for a duplicate)."""

    segment: str
    offset: int | None
    duplicate: bool
    event_number: int | None
    info: SegmentInfo | None


class WriterNumbers:
    """Writers' final event numbers on sealed segments, remembered (LRU): they never change."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self._known: OrderedDict[tuple[int, str, uuid.UUID], int | None] = OrderedDict()
        self._lock = threading.Lock()

    def on_sealed(self, incarnation: int, name: str, writer_id: uuid.UUID) -> int | None:
        key = (incarnation, name, writer_id)
        with self._lock:
            if key in self._known:
                self._known.move_to_end(key)
                return self._known[key]
        try:
            number = self.store.writer_event_number(name, writer_id, anywhere=True)
        except SegmentNotFound:
            number = None  # truncated away: nothing of it can come back
        with self._lock:
            self._known[key] = number
            while len(self._known) > REMEMBERED_MAX:
                self._known.popitem(last=False)
        return number

    def stored_before(
        self,
        state: records.StreamState,
        segment: records.Segment,
        point: float,
        writer_id: uuid.UUID,
        number: int,
    ) -> tuple[str, int] | None:
        """A sealed predecessor of ``segment`` along ``point``'s lineage holding ``number`` for the writer.

        Returns (its name, the writer's number there), or None when no
        predecessor holds the event.
        """
        while True:
            back = [p for p in state.predecessors(segment) if p.covers(point)]
            if not back:
                return None
            segment = back[0]
            name = segment_name(state.scope, state.stream, segment.id)
            stored = self.on_sealed(state.incarnation, name, writer_id)
            if stored is not None and stored >= number:
                return name, stored


def write(
    ctl: Controller,
    numbers: WriterNumbers,
    scope: str,
    stream: str,
    key: str,
    payload: bytes,
    writer_id: uuid.UUID | None = None,
    event_number: int | None = None,
) -> EventAnswer:
    """Append one event to the segment its key routes to; see the module."""
    point = key_hash(key)
    data = frame(payload)
    for _ in range(_SEALED_TRIES):
        state = ctl.touch(scope, stream).state
        if state.sealing:
            raise StreamSealed(f"stream {scope}/{stream} is sealed")
        segment = next(s for s in state.current if s.covers(point))
        name = segment_name(scope, stream, segment.id)
        if writer_id is not None and event_number is not None:
            found = numbers.stored_before(state, segment, point, writer_id, event_number)
            if found is not None:
                return EventAnswer(found[0], None, True, found[1], None)
        step = AppendStep(name, data, writer_id=writer_id, event_number=event_number)
        try:
            result = ctl.store.composite([step], anywhere=True)[0]
        except SegmentSealed:
            continue  # a scale sealed it: the next touch finishes the scale, and the event follows
        assert isinstance(result, AppendResult)
        return EventAnswer(name, result.offset, result.duplicate, result.event_number, result.info)
    raise SegmentSealed(f"the segment of {scope}/{stream} covering the key stays sealed, with no successor")
