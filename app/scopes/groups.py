"""A reader group's record: the JSON lines of ``#scopes/groups/<scope>/<group>`` and the state they fold into.

Seed 004's reader groups, kept like Pravega's ``ReaderGroupState`` (a log
of conditional appends) but assigned by the server (docs/design.md
"Reader groups"). Segments are named by their native names
(``<scope>/<stream>/<id>``). Each line is one JSON object, its kind in ``t``:

- ``created``: ``streams``, ``lease_s``, ``positions`` (the start: the
  segments to read, each at its offset), ``done`` (segments wholly before
  the start), ``time``.
- ``joined``: ``reader``, ``generation`` (the group's next number): a reader
  joining again fences its older generation, whose segments go back.
- ``left``: ``reader``, ``generation``, ``reason`` (``left``, ``expired``):
  its segments go back to the group at their committed positions.
- ``assigned``: ``give`` (``{segment: reader}``) and ``release``
  (``{segment: offset}``): a released segment stays its owner's, served to
  nobody, until the owner commits that offset (what it was served), then
  goes back; so a segment is taken from one reader before another gets it.
- ``committed``: ``reader``, ``generation``, ``positions``: only the
  segments the reader holds move.
- ``ended``: ``segment`` (read to the end of its seal), ``opened`` (its
  successors whose predecessors are now all ended, at offset 0).
- ``checkpoint``: ``id``, ``frontier`` (ended segments whose successors
  still wait, at their lengths); the readers of the group at that line must
  each record theirs: ``checkpointed`` (``id``, ``reader``, ``positions``).
  While one is pending no segment is given or released.
- ``reset``: ``positions``, ``done``: every reader fenced, the group starts
  again there.
- ``snapshot``: ``state``: the whole state (the record is then truncated
  before it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.scopes.errors import GroupNotFound
from app.scopes.names import group_record
from app.scopes.record_log import Loaded, RecordFormat

# Completed checkpoints a group remembers (the oldest is forgotten first).
CHECKPOINTS_KEPT = 16


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint: the readers it waits for and the positions recorded so far."""

    id: str
    waiting: frozenset[str]
    positions: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "waiting": sorted(self.waiting), "positions": dict(self.positions)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Checkpoint:
        return cls(doc["id"], frozenset(doc["waiting"]), dict(doc["positions"]))


@dataclass(frozen=True, slots=True)
class GroupState:
    """What a group's record says, folded; immutable (a new line makes a new state)."""

    scope: str
    group: str
    streams: tuple[str, ...]
    lease_s: float
    readers: Mapping[str, int] = field(default_factory=dict)  # reader -> its live generation
    next_generation: int = 1
    positions: Mapping[str, int] = field(default_factory=dict)  # segments being read -> committed offset
    owner: Mapping[str, str] = field(default_factory=dict)  # segment -> the reader that holds it
    releasing: Mapping[str, int] = field(default_factory=dict)  # segment -> offset its owner must commit
    done: frozenset[str] = frozenset()
    pending: Checkpoint | None = None
    checkpoints: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # completed: id -> positions

    def held_by(self, reader: str) -> list[str]:
        """The segments ``reader`` holds (those being released included), by name."""
        return sorted(s for s, r in self.owner.items() if r == reader)

    def served_to(self, reader: str) -> list[str]:
        """The segments ``reader`` is served: those it holds and is not giving back."""
        return [s for s in self.held_by(reader) if s not in self.releasing]

    def unassigned(self) -> list[str]:
        return sorted(s for s in self.positions if s not in self.owner)

    def live(self, reader: str, generation: int) -> bool:
        return self.readers.get(reader) == generation

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": list(self.streams),
            "lease_s": self.lease_s,
            "readers": dict(self.readers),
            "next_generation": self.next_generation,
            "positions": dict(self.positions),
            "owner": dict(self.owner),
            "releasing": dict(self.releasing),
            "done": sorted(self.done),
            "pending": None if self.pending is None else self.pending.to_json(),
            "checkpoints": {k: dict(v) for k, v in self.checkpoints.items()},
        }


def from_json(scope: str, group: str, doc: Mapping[str, Any]) -> GroupState:
    """The state a ``snapshot`` line holds."""
    pending = doc["pending"]
    return GroupState(
        scope=scope,
        group=group,
        streams=tuple(doc["streams"]),
        lease_s=doc["lease_s"],
        readers=dict(doc["readers"]),
        next_generation=doc["next_generation"],
        positions=dict(doc["positions"]),
        owner=dict(doc["owner"]),
        releasing=dict(doc["releasing"]),
        done=frozenset(doc["done"]),
        pending=None if pending is None else Checkpoint.from_json(pending),
        checkpoints={k: dict(v) for k, v in doc["checkpoints"].items()},
    )


# ----------------------------------------------------------------- lines
def first_state(scope: str, group: str, doc: Mapping[str, Any]) -> GroupState:
    """The state a record's first line (``created``, or ``snapshot`` after a compaction) starts."""
    if doc["t"] == "snapshot":
        return from_json(scope, group, doc["state"])
    assert doc["t"] == "created", doc
    return GroupState(
        scope=scope,
        group=group,
        streams=tuple(doc["streams"]),
        lease_s=doc["lease_s"],
        positions=dict(doc["positions"]),
        done=frozenset(doc["done"]),
    )


def fold(state: GroupState, docs: Iterable[Mapping[str, Any]]) -> GroupState:
    """``state`` with the lines ``docs`` applied, in order."""
    for doc in docs:
        state = _apply(state, doc)
    return state


# Compacted: a ``snapshot`` line holds the whole state (``GroupState.to_json``).
FORMAT = RecordFormat("reader group", GroupNotFound, group_record, first_state, fold, GroupState.to_json)
LoadedGroup = Loaded[GroupState]


def _apply(state: GroupState, doc: Mapping[str, Any]) -> GroupState:
    kind = doc["t"]
    if kind == "joined":
        old = _without_reader(state, doc["reader"])
        generation = doc["generation"]
        assert generation >= state.next_generation, (state.next_generation, doc)
        return replace(
            old, readers={**old.readers, doc["reader"]: generation}, next_generation=generation + 1
        )
    if kind == "left":
        return (
            _without_reader(state, doc["reader"]) if state.live(doc["reader"], doc["generation"]) else state
        )
    if kind == "assigned":
        return _assigned(state, doc["give"], doc["release"])
    if kind == "committed":
        return _committed(state, doc)
    if kind == "ended":
        return _ended(state, doc["segment"], doc["opened"])
    if kind == "checkpoint":
        return _checkpoint(state, doc["id"], doc["frontier"])
    if kind == "checkpointed":
        pending = state.pending
        if pending is None or pending.id != doc["id"] or doc["reader"] not in pending.waiting:
            return state
        return _record(state, doc["reader"], doc["positions"])
    if kind == "reset":
        return replace(
            state, readers={}, positions=dict(doc["positions"]), owner={}, releasing={},
            done=frozenset(doc["done"]), pending=None,
        )  # fmt: skip
    if kind == "snapshot":
        return from_json(state.scope, state.group, doc["state"])
    raise AssertionError(f"unknown reader group line {doc!r}")


def _without_reader(state: GroupState, reader: str) -> GroupState:
    """The reader gone: its segments back at their committed positions, its checkpoint share recorded."""
    if reader not in state.readers:
        return state
    if state.pending is not None and reader in state.pending.waiting:
        state = _record(state, reader, {s: state.positions[s] for s in state.held_by(reader)})
    held = set(state.held_by(reader))
    readers = {r: g for r, g in state.readers.items() if r != reader}
    owner = {s: r for s, r in state.owner.items() if s not in held}
    releasing = {s: o for s, o in state.releasing.items() if s not in held}
    return replace(state, readers=readers, owner=owner, releasing=releasing)


def _assigned(state: GroupState, give: Mapping[str, str], release: Mapping[str, int]) -> GroupState:
    owner = dict(state.owner)
    releasing = dict(state.releasing)
    for segment, reader in give.items():
        if segment in state.positions and segment not in owner and reader in state.readers:
            owner[segment] = reader
    for segment, offset in release.items():
        if segment not in owner or segment in releasing:
            continue
        if state.positions[segment] >= offset:
            del owner[segment]
        else:
            releasing[segment] = offset
    return replace(state, owner=owner, releasing=releasing)


def _committed(state: GroupState, doc: Mapping[str, Any]) -> GroupState:
    reader = doc["reader"]
    if not state.live(reader, doc["generation"]):
        return state
    positions = dict(state.positions)
    owner = dict(state.owner)
    releasing = dict(state.releasing)
    for segment, offset in doc["positions"].items():
        if state.owner.get(segment) != reader:
            continue
        positions[segment] = max(positions[segment], offset)
        if segment in releasing and positions[segment] >= releasing[segment]:
            del releasing[segment]
            del owner[segment]
    return replace(state, positions=positions, owner=owner, releasing=releasing)


def _ended(state: GroupState, segment: str, opened: Iterable[str]) -> GroupState:
    if segment not in state.positions:
        return state
    positions = {s: o for s, o in state.positions.items() if s != segment}
    positions.update({s: 0 for s in opened if s not in state.done})
    owner = {s: r for s, r in state.owner.items() if s != segment}
    releasing = {s: o for s, o in state.releasing.items() if s != segment}
    return replace(state, positions=positions, owner=owner, releasing=releasing, done=state.done | {segment})


def _checkpoint(state: GroupState, checkpoint_id: str, frontier: Mapping[str, int]) -> GroupState:
    """A checkpoint started: the unassigned segments at their positions, then each live reader's."""
    assert state.pending is None, (state.pending, checkpoint_id)
    recorded = {**frontier, **{s: state.positions[s] for s in state.unassigned()}}
    pending = Checkpoint(checkpoint_id, frozenset(state.readers), recorded)
    return _complete_if_done(replace(state, pending=pending))


def _record(state: GroupState, reader: str, positions: Mapping[str, int]) -> GroupState:
    pending = state.pending
    assert pending is not None
    recorded = Checkpoint(pending.id, pending.waiting - {reader}, {**pending.positions, **positions})
    return _complete_if_done(replace(state, pending=recorded))


def _complete_if_done(state: GroupState) -> GroupState:
    pending = state.pending
    if pending is None or pending.waiting:
        return state
    kept = dict(state.checkpoints)
    kept[pending.id] = dict(pending.positions)
    for old in list(kept)[: max(0, len(kept) - CHECKPOINTS_KEPT)]:
        del kept[old]
    return replace(state, pending=None, checkpoints=kept)


def plan(state: GroupState) -> tuple[dict[str, str], dict[str, int]] | None:
    """What to give and what to release so the readers' counts differ by at most one; None when nothing.

    Unassigned segments go to the readers holding fewest; then a reader
    holding two more than another gives one back (``release``, at the
    offset ``served`` says it was served to, filled in by the caller as 0
    here). Nothing moves while a checkpoint is pending.
    """
    if state.pending is not None or not state.readers:
        return None
    counts = {reader: len(state.served_to(reader)) for reader in state.readers}
    give: dict[str, str] = {}
    for segment in state.unassigned():
        reader = min(counts, key=lambda r: (counts[r], r))
        give[segment] = reader
        counts[reader] += 1
    release: dict[str, int] = {}
    while max(counts.values()) - min(counts.values()) > 1:
        reader = max(counts, key=lambda r: (counts[r], r))
        segment = next(s for s in reversed(state.served_to(reader)) if s not in release)
        release[segment] = 0
        counts[reader] -= 1
    if not give and not release:
        return None
    return give, release
