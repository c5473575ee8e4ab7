"""A reader's fetch: events from the segments it is served, a long poll, segments ended, checkpoints.

``fetch`` tends the group (``Readers.tend``: the reader's generation
checked, its lease renewed, expired readers' segments given to others),
then:

- a checkpoint waiting for this reader is answered first, with no events:
  the reader's positions are what it was served so far, recorded as its
  share of the checkpoint (``checkpointed``);
- otherwise it reads whole events (length-prefixed frames) from each
  segment it is served, from where it was served to (or the committed
  position), up to ``max_bytes`` (at least one event);
- a segment committed to the end of its seal is recorded ``ended``, and
  its successors whose predecessors have all ended are opened (a merge's
  successor waits for every predecessor);
- with nothing to answer it waits for an append, up to ``wait_s``, tending
  the group every ``_TEND_EVERY_S`` (so a dead reader's segments come to it).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from app.scopes import groups, records
from app.scopes.names import segment_name
from app.scopes.readers import Live, Readers, split_name
from client.events import HEADER_BYTES
from engine import SegmentNotFound, SegmentTruncated

_TEND_EVERY_S = 0.25
_LENGTH = struct.Struct(">I").unpack_from  # a frame's length prefix (client/events.py)


@dataclass(frozen=True, slots=True)
class Event:
    segment: str
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    """Whole events of one segment as stored (length-prefixed frames), from ``offset``."""

    segment: str
    offset: int
    data: bytes

    def events(self) -> list[Event]:
        found, position = [], 0
        while position < len(self.data):
            size = int.from_bytes(self.data[position : position + HEADER_BYTES], "big")
            start = position + HEADER_BYTES
            found.append(Event(self.segment, self.offset + position, self.data[start : start + size]))
            position = start + size
        return found


@dataclass(frozen=True, slots=True)
class Fetched:
    """What a fetch answers: chunks of events, each served segment's offset after them, a checkpoint id
    or None."""

    chunks: list[Chunk]
    positions: dict[str, int]
    checkpoint: str | None

    @property
    def events(self) -> list[Event]:
        return [event for chunk in self.chunks for event in chunk.events()]


def fetch(
    readers: Readers, scope: str, group: str, reader: str, generation: int, wait_s: float, max_bytes: int
) -> Fetched:
    """Serve the reader; see the module."""
    deadline = time.monotonic() + wait_s
    while True:
        with readers.lock(scope, group):
            found = _serve(readers, scope, group, reader, generation, max_bytes)
        if isinstance(found, Fetched):
            return found
        chunks, positions, ended = found
        left = deadline - time.monotonic()
        if chunks or (left <= 0 and not ended):
            return Fetched(chunks, positions, None)
        if ended:
            continue  # its successors may be this reader's now
        _wait(readers, list(positions), positions, min(left, _TEND_EVERY_S))


def _serve(
    readers: Readers, scope: str, group: str, reader: str, generation: int, max_bytes: int
) -> Fetched | tuple[list[Chunk], dict[str, int], bool]:
    """One pass under the group's lock: the checkpoint answer, or what ``_read`` found (recorded)."""
    loaded = readers.tend(scope, group, reader, generation)
    state = loaded.state
    live = readers.fetched(scope, group, reader, generation)
    pending = state.pending
    if pending is not None and reader in pending.waiting:
        at = {
            s: max(state.positions[s], live.fetched.get(s, 0), state.releasing.get(s, 0))
            for s in state.held_by(reader)
        }  # a segment being given back was served to its releasing offset
        readers.record_checkpoint(scope, group, pending.id, reader, at)
        return Fetched([], at, pending.id)
    served = state.served_to(reader)
    if served:
        live.turn = (live.turn + 1) % len(served)
        served = served[live.turn :] + served[: live.turn]
    chunks, positions, ended = _read(readers, loaded, live, served, max_bytes, reader)
    readers.served(live, positions)
    return chunks, positions, ended


def _read(
    readers: Readers, loaded: groups.LoadedGroup, live: Live, served: list[str], max_bytes: int, reader: str
) -> tuple[list[Chunk], dict[str, int], bool]:
    """Events from the ``served`` segments, the offset after them in each, and whether one ended."""
    state = loaded.state
    ended = False
    chunks: list[Chunk] = []
    positions: dict[str, int] = {}
    budget = max_bytes
    for segment in served:
        committed = state.positions[segment]
        offset = max(committed, live.fetched.get(segment, 0))
        if budget <= 0:
            positions[segment] = offset
            continue
        try:
            chunk, at_end = _chunk_of(readers, segment, offset, budget, not chunks)
        except SegmentNotFound:
            chunk, at_end = None, True
        if chunk is not None:
            chunks.append(chunk)
            offset = chunk.offset + len(chunk.data)
            budget -= len(chunk.data)
        positions[segment] = offset
        if at_end and offset == committed:
            ended = _end(readers, loaded, segment, reader) or ended
    return chunks, positions, ended


def _chunk_of(
    readers: Readers, segment: str, offset: int, budget: int, at_least_one: bool
) -> tuple[Chunk | None, bool]:
    """Whole events of ``segment`` from ``offset`` within ``budget`` bytes (one more if ``at_least_one``),
    None for none; and whether the segment is sealed and read to its end."""
    store = readers.ctl.store
    if at_least_one:
        budget = max(budget, HEADER_BYTES)  # a budget under an event's length prefix would find none
    try:
        read = store.read(segment, offset, budget, anywhere=True)
    except SegmentTruncated:
        offset = store.info(segment, anywhere=True).start_offset
        read = store.read(segment, offset, budget, anywhere=True)
    data = read.data
    position, size = 0, len(data)
    while size - position >= HEADER_BYTES:
        end = position + HEADER_BYTES + _LENGTH(data, position)[0]
        if end > size:
            if position or not at_least_one:
                break
            data = data + _whole(readers, segment, offset + size, end - size)
            size = len(data)
        position = end
    at_end = read.info.sealed and offset + position >= read.info.length
    return (Chunk(segment, offset, data[:position]) if position else None), at_end


def _whole(readers: Readers, segment: str, offset: int, wanted: int) -> bytes:
    """The ``wanted`` bytes of an event from ``offset`` (one event larger than a fetch's budget)."""
    pieces = []
    while wanted > 0:
        read = readers.ctl.store.read(segment, offset, wanted, anywhere=True, wait_s=1.0)
        pieces.append(read.data)
        wanted -= len(read.data)
        offset = read.next_offset
    return b"".join(pieces)


def _end(readers: Readers, loaded: groups.LoadedGroup, segment: str, reader: str) -> bool:
    """Record ``segment`` ended (committed to the end of its seal), its ready successors opened; whether
    it was."""
    state = loaded.state
    stream, sid = split_name(segment)
    try:
        stream_state: records.StreamState | None = readers.ctl.touch(state.scope, stream).state
    except SegmentNotFound:
        stream_state = None  # the stream is gone: the segment ends with nothing after it
    unknown = stream_state is not None and not stream_state.sealing
    if unknown and stream_state is not None and stream_state.segments[sid].sealed_in is None:
        return False  # its scale is not recorded done yet: its successors are not known

    def judge(now_loaded: groups.LoadedGroup) -> tuple[str, dict] | None:
        now_state = now_loaded.state
        if now_state.owner.get(segment) != reader:
            return None
        opened = [] if stream_state is None else ready_after(now_state, stream_state, segment)
        return "ended", {"segment": segment, "opened": opened}

    after = readers.change(state.scope, state.group, judge)
    return segment in after.state.done


def ready_after(state: groups.GroupState, stream_state: records.StreamState, segment: str) -> list[str]:
    """The successors of ``segment`` whose every other predecessor has ended: opened when it ends."""
    stream, sid = split_name(segment)
    record = stream_state.segments.get(sid)
    if record is None:
        return []
    ready = []
    for successor in stream_state.successors(record):
        name = segment_name(state.scope, stream, successor.id)
        preds = [segment_name(state.scope, stream, p.id) for p in stream_state.predecessors(successor)]
        if (
            name not in state.positions
            and name not in state.done
            and all(p in state.done or p == segment for p in preds)
        ):
            ready.append(name)
    return ready


def _wait(readers: Readers, served: list[str], positions: dict[str, int], wait_s: float) -> None:
    """Wait up to ``wait_s`` for an append to the first served segment (or just wait, serving none)."""
    if not served:
        time.sleep(wait_s)
        return
    began = time.monotonic()
    segment = served[0]
    try:
        read = readers.ctl.store.read(segment, positions[segment], 1, anywhere=True, wait_s=wait_s)
        if read.data:
            return
    except (SegmentNotFound, SegmentTruncated):
        pass
    time.sleep(max(0.0, wait_s - (time.monotonic() - began)))  # a sealed end answers at once
