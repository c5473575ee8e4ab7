"""Reader groups over the engine's public calls: membership, leases, assignment, commits, checkpoints.

A group's state is its record (``groups``, ``record_log``); every change is
a line appended on condition, judged again after a race, so any node can
serve the group. What is not in the record lives in this process, for the
groups it serves (a cluster sends a group's every request to the node of
its record): when each reader was last heard from (its lease), and how far
each was served (``fetched``). A process that does not know a reader starts
its lease when it first sees it, and serves from the committed positions:
leases only grow and events are served again, never skipped.

Every call on a group first ``tend``s it: readers whose lease ran out are
recorded ``left`` (expired), then unassigned segments are given and
surplus ones released (``groups.plan``). Reading is ``fetch``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.scopes import cuts, groups, records, steps
from app.scopes.controller import Controller
from app.scopes.errors import GroupConflict, GroupNotFound, ReaderFenced
from app.scopes.groups import LoadedGroup
from app.scopes.names import segment_name
from app.scopes.record_log import Raced, RecordLog, line, now
from engine import InvalidArgument, SegmentExists, SegmentNotFound

# What a change makes of a group's state: the line to append (kind, fields), or None for none.
GroupJudge = Callable[[LoadedGroup], "tuple[str, dict] | None"]


@dataclass
class Live:
    """What this process knows of a reader generation: when it was last heard from, how far it was served."""

    generation: int
    seen: float  # time.monotonic()
    fetched: dict[str, int] = field(default_factory=dict)
    turn: int = 0  # which served segment a fetch reads first (each gets its turn)


def split_name(name: str) -> tuple[str, int]:
    """(stream, id) of a data segment's name ``<scope>/<stream>/<id>``."""
    _, stream, segment_id = name.split("/")
    return stream, int(segment_id)


class Readers:
    """The reader groups served by this process, over ``ctl``'s store; thread-safe."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.log: RecordLog[groups.GroupState] = RecordLog(ctl.store, groups.FORMAT)
        self._live: dict[str, dict[str, Live]] = {}
        self._lock = threading.Lock()
        self._group_locks: dict[str, threading.RLock] = {}

    def lock(self, scope: str, group: str) -> threading.RLock:
        """The group's lock in this process: held by a fetch from choosing what to serve to recording
        what it served, and by ``tend``, so a segment is never taken back on an old idea of how far
        its reader was served (a fetch's reads may wait on another node)."""
        with self._lock:
            return self._group_locks.setdefault(_record_key(scope, group), threading.RLock())

    # ------------------------------------------------------------ the group
    def create(
        self, scope: str, group: str, streams: list[str], start: str | Mapping[str, Any], lease_s: float
    ) -> tuple[LoadedGroup, bool]:
        """Create the group (True), or confirm one with the same streams and lease (False).

        ``start``: ``head``, ``tail``, or ``{stream: {"positions": {id: offset}}}``
        (a stream it does not name starts at its head).
        """
        self.ctl.require_scope(scope)
        _check_named(start, streams, f"reader group {scope}/{group}")
        positions: dict[str, int] = {}
        done: list[str] = []
        for stream in streams:
            cut_positions, before = self._start_of(scope, stream, start)
            positions.update(cut_positions)
            done.extend(before)
        first = line("created", streams=streams, lease_s=lease_s, positions=positions, done=done, time=now())
        try:
            return self.log.create(scope, group, first), True
        except SegmentExists:
            loaded = self.log.load(scope, group)
        if list(loaded.state.streams) != streams or loaded.state.lease_s != lease_s:
            raise GroupConflict(
                f"reader group {scope}/{group} exists over {list(loaded.state.streams)} "
                f"with a lease of {loaded.state.lease_s:g} s"
            )
        return loaded, False

    def _start_of(
        self, scope: str, stream: str, start: str | Mapping[str, Any]
    ) -> tuple[dict[str, int], list[str]]:
        """The positions a stream starts at (segment names), and its segments wholly before them."""
        state = self.ctl.touch(scope, stream).state
        if start == "tail":
            cut = cuts.tail(self.ctl, state)
        elif isinstance(start, Mapping) and stream in start:
            doc = start[stream]
            if not isinstance(doc, Mapping) or not isinstance(doc.get("positions"), Mapping):
                raise InvalidArgument(
                    f'the start of stream {stream} is a cut {{"positions": {{id: offset}}}}'
                )
            cut = cuts.parse(state, doc["positions"])
        else:
            cut = cuts.head(state)
        positions = {segment_name(scope, stream, sid): offset for sid, offset in cut.positions}
        before = [segment_name(scope, stream, s.id) for s in steps.before(state, cut)]
        return positions, before

    def delete(self, scope: str, group: str) -> None:
        self.log.delete(scope, group)
        with self._lock:
            self._live.pop(_record_key(scope, group), None)

    def describe(self, scope: str, group: str) -> dict[str, Any]:
        """The group's state for its GET: readers, their segments, positions and lag; what waits."""
        state = self.tend(scope, group).state
        readers = []
        for reader, generation in sorted(state.readers.items()):
            held = state.held_by(reader)
            lag = sum(max(0, self._length(s) - state.positions[s]) for s in held)
            readers.append({
                "reader": reader, "generation": generation,
                "segments": {s: state.positions[s] for s in held},
                "releasing": [s for s in held if s in state.releasing], "lag_bytes": lag,
            })  # fmt: skip
        return {
            "scope": scope, "group": group, "streams": list(state.streams), "lease_s": state.lease_s,
            "readers": readers, "unassigned": {s: state.positions[s] for s in state.unassigned()},
            "waiting": self._waiting(state),
            "checkpoint": None if state.pending is None else state.pending.id,
        }  # fmt: skip

    def _length(self, segment: str) -> int:
        try:
            return self.ctl.store.info(segment, anywhere=True).length
        except SegmentNotFound:
            return 0

    def _waiting(self, state: groups.GroupState) -> list[dict[str, Any]]:
        """Successors of ended segments still waiting for other predecessors, with those predecessors."""
        found = []
        for stream in state.streams:
            try:
                stream_state = self.ctl.touch(state.scope, stream).state
            except SegmentNotFound:
                continue
            for segment, unread in _waiting_in(state, stream_state):
                found.append({"segment": segment, "predecessors": unread})
        return found

    # ------------------------------------------------------------ changes
    def change(self, scope: str, group: str, judge: GroupJudge) -> LoadedGroup:
        """Append the line ``judge`` makes of the group's state, judging again after a race."""
        while True:
            loaded = self.log.load(scope, group)
            line = judge(loaded)
            if line is None:
                return loaded
            kind, fields = line
            try:
                return self.log.append(loaded, kind, **fields)
            except Raced:
                continue

    def tend(
        self, scope: str, group: str, reader: str | None = None, generation: int | None = None
    ) -> LoadedGroup:
        """The group with expired readers recorded and segments given and released; then, for ``reader``,
        its generation checked (ReaderFenced) and its lease renewed."""
        with self.lock(scope, group):
            return self._tend(scope, group, reader, generation)

    def _tend(self, scope: str, group: str, reader: str | None, generation: int | None) -> LoadedGroup:
        record = _record_key(scope, group)
        while True:
            loaded = self.log.load(scope, group)
            state = loaded.state
            if reader is not None and not state.live(reader, generation or 0):
                raise ReaderFenced(
                    f"reader {reader} of {scope}/{group} holds no live generation {generation}"
                )
            line = self._expiry(record, state) or self._assignment(record, state)
            if line is None:
                if reader is not None:
                    self._renew(record, reader, generation or 0)
                return loaded
            kind, fields = line
            try:
                self.log.append(loaded, kind, **fields)
            except Raced:
                continue
            if kind == "assigned":
                self._forget_fetched(record, fields["give"])

    def _expiry(self, record: str, state: groups.GroupState) -> tuple[str, dict] | None:
        at = time.monotonic()
        with self._lock:
            known = self._live.setdefault(record, {})
            for reader, generation in sorted(state.readers.items()):
                live = known.get(reader)
                if live is None or live.generation != generation:
                    known[reader] = Live(generation, at)
                elif at - live.seen > state.lease_s:
                    return "left", {"reader": reader, "generation": generation, "reason": "expired"}
        return None

    def _assignment(self, record: str, state: groups.GroupState) -> tuple[str, dict] | None:
        planned = groups.plan(state)
        if planned is None:
            return None
        give, release = planned
        with self._lock:
            known = self._live.get(record, {})
            for segment in release:
                live = known.get(state.owner[segment])
                release[segment] = max(state.positions[segment], live.fetched.get(segment, 0) if live else 0)
        return "assigned", {"give": give, "release": release}

    def _renew(self, record: str, reader: str, generation: int) -> None:
        with self._lock:
            known = self._live.setdefault(record, {})
            live = known.get(reader)
            if live is None or live.generation != generation:
                known[reader] = Live(generation, time.monotonic())
            else:
                live.seen = time.monotonic()

    def _forget_fetched(self, record: str, given: Iterable[str]) -> None:
        """A segment given anew is served from its committed position, whatever its reader fetched before."""
        with self._lock:
            for live in self._live.get(record, {}).values():
                for segment in given:
                    live.fetched.pop(segment, None)

    def fetched(self, scope: str, group: str, reader: str, generation: int) -> Live:
        """This process's knowledge of the reader generation (made when missing)."""
        with self._lock:
            known = self._live.setdefault(_record_key(scope, group), {})
            live = known.get(reader)
            if live is None or live.generation != generation:
                live = known[reader] = Live(generation, time.monotonic())
            return live

    def served(self, live: Live, positions: Mapping[str, int]) -> None:
        """Remember how far a reader generation was served (only the segments of this fetch)."""
        with self._lock:
            live.fetched = dict(positions)

    # ------------------------------------------------------------ readers
    def join(self, scope: str, group: str, reader: str) -> tuple[int, float]:
        """Join ``reader`` (fencing an older generation of it); returns (generation, lease_s)."""

        def judge(loaded: LoadedGroup) -> tuple[str, dict]:
            return "joined", {"reader": reader, "generation": loaded.state.next_generation}

        state = self.change(scope, group, judge).state
        generation = state.readers[reader]
        self._renew(_record_key(scope, group), reader, generation)
        self.tend(scope, group)
        return generation, state.lease_s

    def leave(self, scope: str, group: str, reader: str, generation: int | None) -> None:
        """The reader leaves (its segments go back at their committed positions)."""

        def judge(loaded: LoadedGroup) -> tuple[str, dict]:
            live = loaded.state.readers.get(reader)
            if live is None:
                raise GroupNotFound(f"reader group {scope}/{group} has no reader {reader}")
            if generation is not None and generation != live:
                raise ReaderFenced(
                    f"reader {reader} of {scope}/{group} is at generation {live}, not {generation}"
                )
            return "left", {"reader": reader, "generation": live, "reason": "left"}

        self.change(scope, group, judge)
        self.tend(scope, group)

    def commit(
        self, scope: str, group: str, reader: str, generation: int, positions: Mapping[str, int]
    ) -> None:
        """Commit the reader's positions (of segments it holds; others stay); ReaderFenced if stale."""
        self.tend(scope, group, reader, generation)
        live = self.fetched(scope, group, reader, generation)

        def judge(loaded: LoadedGroup) -> tuple[str, dict] | None:
            state = loaded.state
            if not state.live(reader, generation):
                raise ReaderFenced(
                    f"reader {reader} of {scope}/{group} holds no live generation {generation}"
                )
            moved = {}
            for segment, offset in positions.items():
                if state.owner.get(segment) != reader:
                    continue
                served = max(live.fetched.get(segment, offset), state.positions[segment])
                if min(offset, served) > state.positions[segment]:
                    moved[segment] = min(offset, served)
            if not moved:
                return None
            return "committed", {"reader": reader, "generation": generation, "positions": moved}

        self.change(scope, group, judge)

    # ------------------------------------------------------------ checkpoints
    def start_checkpoint(self, scope: str, group: str) -> tuple[str, bool]:
        """Start a checkpoint (True), or name the one pending (False); returns its id."""
        checkpoint_id = str(uuid.uuid4())
        self.tend(scope, group)

        def judge(loaded: LoadedGroup) -> tuple[str, dict] | None:
            state = loaded.state
            if state.pending is not None:
                return None
            return "checkpoint", {"id": checkpoint_id, "frontier": self._frontier(state)}

        state = self.change(scope, group, judge).state
        if state.pending is not None:
            return state.pending.id, state.pending.id == checkpoint_id
        return checkpoint_id, checkpoint_id in state.checkpoints

    def _frontier(self, state: groups.GroupState) -> dict[str, int]:
        """Ended segments whose successors wait for other predecessors, at their lengths (a cut covers
        their keys with them)."""
        found: dict[str, int] = {}
        for stream in state.streams:
            stream_state = self.ctl.touch(state.scope, stream).state
            for _, unread in _waiting_in(state, stream_state, ended=True):
                for name in unread:
                    found[name] = self._length(name)
        return found

    def record_checkpoint(self, scope: str, group: str, checkpoint_id: str, reader: str,
                          positions: Mapping[str, int]) -> None:  # fmt: skip
        """The reader's positions at the checkpoint (what it was served before it)."""
        line = {"id": checkpoint_id, "reader": reader, "positions": dict(positions)}
        self.change(scope, group, lambda _: ("checkpointed", line))

    def checkpoint(self, scope: str, group: str, checkpoint_id: str) -> tuple[bool, dict[str, records.Cut]]:
        """(complete, the cut of each stream once complete); GroupNotFound for an unknown id."""
        state = self.tend(scope, group).state
        if state.pending is not None and state.pending.id == checkpoint_id:
            return False, {}
        if checkpoint_id not in state.checkpoints:
            raise GroupNotFound(f"reader group {scope}/{group} has no checkpoint {checkpoint_id}")
        by_stream: dict[str, list[tuple[int, int]]] = {}
        for name, offset in state.checkpoints[checkpoint_id].items():
            stream, sid = split_name(name)
            by_stream.setdefault(stream, []).append((sid, offset))
        return True, {stream: records.Cut(tuple(sorted(p))) for stream, p in by_stream.items()}

    def reset(self, scope: str, group: str, start: str | Mapping[str, Any]) -> None:
        """Fence every reader and start the group again at ``start`` (as ``create`` takes it)."""
        state = self.log.load(scope, group).state
        _check_named(start, state.streams, f"reader group {scope}/{group}")
        positions: dict[str, int] = {}
        done: list[str] = []
        for stream in state.streams:
            cut_positions, before = self._start_of(scope, stream, start)
            positions.update(cut_positions)
            done.extend(before)
        self.change(scope, group, lambda _: ("reset", {"positions": positions, "done": done}))
        with self._lock:
            self._live.pop(_record_key(scope, group), None)


def _check_named(start: str | Mapping[str, Any], streams: Iterable[str], what: str) -> None:
    """A start given as cuts names only streams the group reads (404 otherwise: no such stream in it)."""
    unknown = sorted(set(start) - set(streams)) if isinstance(start, Mapping) else []
    if unknown:
        raise GroupNotFound(f"{what} reads no stream {unknown}")


def _record_key(scope: str, group: str) -> str:
    return f"{scope}/{group}"


def _waiting_in(
    state: groups.GroupState, stream_state: records.StreamState, *, ended: bool = False
) -> list[tuple[str, list[str]]]:
    """Each successor of an ended segment not yet opened: (its name, its predecessors not yet ended, or,
    with ``ended``, those ended)."""
    scope, stream = stream_state.scope, stream_state.stream
    found = []
    seen: set[int] = set()
    for name in sorted(state.done):
        owner_stream, sid = split_name(name)
        segment = stream_state.segments.get(sid)
        if owner_stream != stream or segment is None:
            continue
        for successor in stream_state.successors(segment):
            succ_name = segment_name(scope, stream, successor.id)
            if successor.id in seen or succ_name in state.positions or succ_name in state.done:
                continue
            seen.add(successor.id)
            preds = [segment_name(scope, stream, p.id) for p in stream_state.predecessors(successor)]
            found.append((succ_name, [p for p in preds if (p in state.done) == ended]))
    return found
