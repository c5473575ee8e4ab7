"""A stream's record: the JSON lines of ``#scopes/streams/<scope>/<stream>`` and the state they fold into.

Each line is one JSON object with its kind in ``t``, appended with
``Expected-Offset`` at the length its writer read (docs/design.md
"Streams (seed 004; the `scopes` surface, the role of Pravega's Controller)"):

- ``created``: ``config``, ``incarnation``, ``time`` and the ``segments`` of
  epoch 0 (``[{"id", "lo", "hi"}]``); a transition like a scale's, ended by
- ``epoch``: ``epoch`` E, ``time``: the pending transition is done; its new
  segments are current and those it sealed are not.
- ``scaling``: ``epoch`` (the one it makes), ``seal`` (ids), ``segments``
  (the successors, ids and ranges), ``time``. One at a time.
- ``cancelled``: ``epoch``, ``reason``: a scale that could not create its
  successors (a stranger holds a name) ends with nothing sealed.
- ``sealing`` then ``sealed``; ``deleting``.
- ``truncating`` (``cut``: ``{"positions": {id: offset}}``) then ``truncated``.
- ``txn``: ``id``, ``epoch``, ``deadline`` (Unix seconds), ``segments``
  (``{data segment id: transaction segment}``); then ``committing`` and
  ``committed``, or ``aborting`` (``reason``: ``abort``, ``timeout``,
  ``sealed``) and ``aborted``, each with its ``id``.

``fold`` applies lines to a ``StreamState`` and asserts the invariants
(epochs grow by one, ids are unique, each epoch's ranges cover [0, 1)
exactly, a scale's new ranges cover exactly what it seals).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.scopes import ranges
from app.scopes.errors import StreamNotFound
from app.scopes.names import stream_record
from app.scopes.record_log import Loaded, RecordFormat, line

POLICIES = ("fixed", "events_per_s", "kbytes_per_s")
# Closed transactions a state remembers (for their GET and idempotent commits and aborts).
CLOSED_TRANSACTIONS_KEPT = 1024
OPEN, COMMITTING, COMMITTED, ABORTING, ABORTED = "open", "committing", "committed", "aborting", "aborted"


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """Seed 004's scaling policies (Pravega's ``ScalingPolicy``): fixed, by events/s or by KiB/s."""

    type: str = "fixed"
    target: float = 0.0
    factor: int = 2
    min_segments: int = 1

    def to_json(self) -> dict[str, Any]:
        fields = ("type", "target", "factor", "min_segments")
        return {name: getattr(self, name) for name in fields}


@dataclass(frozen=True, slots=True)
class StreamConfig:
    segments: int = 1
    scaling: ScalingPolicy = field(default_factory=ScalingPolicy)

    def to_json(self) -> dict[str, Any]:
        return {"segments": self.segments, "scaling": self.scaling.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StreamConfig:
        return cls(doc["segments"], ScalingPolicy(**doc["scaling"]))


@dataclass(frozen=True, slots=True)
class Segment:
    """A data segment of the stream: its key range, the epoch that made it and the one that sealed it."""

    id: int
    lo: float
    hi: float
    epoch: int
    sealed_in: int | None = None  # set by the epoch line of the scale that sealed it

    @property
    def range(self) -> ranges.Range:
        return self.lo, self.hi

    def covers(self, point: float) -> bool:
        return self.lo <= point < self.hi


@dataclass(frozen=True, slots=True)
class Epoch:
    """A completed epoch: its segments, and what the transition into it sealed and created."""

    epoch: int
    segments: tuple[int, ...]
    sealed: tuple[int, ...]
    created: tuple[int, ...]
    time: float


@dataclass(frozen=True, slots=True)
class Transition:
    """The creation (epoch 0) or a scale, recorded and not yet ended by its epoch line."""

    epoch: int
    seal: tuple[int, ...]
    new: tuple[Segment, ...]
    time: float


@dataclass(frozen=True, slots=True)
class Transaction:
    id: str
    epoch: int
    deadline: float
    segments: tuple[tuple[int, str], ...]  # (data segment id, transaction segment), by id
    state: str = OPEN
    reason: str = ""

    def holds(self, segment_ids: Iterable[int]) -> bool:
        """Whether it may still merge into any of ``segment_ids`` (open or committing)."""
        mine = {sid for sid, _ in self.segments}
        return self.state in (OPEN, COMMITTING) and not mine.isdisjoint(segment_ids)


@dataclass(frozen=True, slots=True)
class Cut:
    """A stream cut: an offset per segment, the segments covering [0, 1) at event boundaries."""

    positions: tuple[tuple[int, int], ...]  # (segment id, offset), by id

    def to_json(self) -> dict[str, Any]:
        return {"positions": {str(sid): offset for sid, offset in self.positions}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Cut:
        return cls(tuple(sorted((int(k), int(v)) for k, v in doc["positions"].items())))


@dataclass(frozen=True, slots=True)
class StreamState:
    """What a stream's record says, folded; immutable (a new line makes a new state)."""

    scope: str
    stream: str
    config: StreamConfig
    incarnation: int
    created: float
    segments: Mapping[int, Segment]
    epochs: tuple[Epoch, ...] = ()
    pending: Transition | None = None
    sealing: bool = False
    sealed: bool = False
    deleting: bool = False
    truncating: Cut | None = None
    head: Cut | None = None
    transactions: Mapping[str, Transaction] = field(default_factory=dict)
    next_id: int = 0  # ids are never given twice, a cancelled scale's included

    @property
    def epoch(self) -> int:
        """The current epoch (-1 while the creation is pending)."""
        return len(self.epochs) - 1

    @property
    def current(self) -> tuple[Segment, ...]:
        """The segments of the current epoch, by key range."""
        if not self.epochs:
            return ()
        return tuple(sorted((self.segments[i] for i in self.epochs[-1].segments), key=lambda s: s.lo))

    @property
    def scaling(self) -> Transition | None:
        """The scale in progress (not the creation), or None."""
        return self.pending if self.pending is not None and self.pending.epoch > 0 else None

    def of_epoch(self, epoch: int) -> tuple[Segment, ...]:
        return tuple(sorted((self.segments[i] for i in self.epochs[epoch].segments), key=lambda s: s.lo))

    def successors(self, segment: Segment) -> list[Segment]:
        """The segments of the epoch that sealed ``segment`` whose ranges overlap it (seed 004)."""
        if segment.sealed_in is None:
            return []
        made = self.epochs[segment.sealed_in].created
        return sorted(
            (self.segments[i] for i in made if ranges.overlaps(self.segments[i].range, segment.range)),
            key=lambda s: s.lo,
        )

    def predecessors(self, segment: Segment) -> list[Segment]:
        """The segments the scale that made ``segment`` sealed, whose ranges overlap it."""
        if segment.epoch == 0:
            return []
        sealed = self.epochs[segment.epoch].sealed
        return sorted(
            (self.segments[i] for i in sealed if ranges.overlaps(self.segments[i].range, segment.range)),
            key=lambda s: s.lo,
        )

    def unfinished_transactions(self) -> list[Transaction]:
        """Transactions not yet committed or aborted (open, committing or aborting)."""
        return [t for t in self.transactions.values() if t.state in (OPEN, COMMITTING, ABORTING)]

    def completed_scale(self, seal: Iterable[int], new: Iterable[ranges.Range]) -> Epoch | None:
        """The epoch a completed scale that sealed ``seal`` into ``new`` made, if there is one."""
        seal_set, new_list = set(seal), sorted(new)
        for epoch in self.epochs[1:]:
            made = sorted(self.segments[i].range for i in epoch.created)
            if set(epoch.sealed) == seal_set and made == new_list:
                return epoch
        return None


# ----------------------------------------------------------------- lines
def segments_json(new: Iterable[Segment]) -> list[dict[str, Any]]:
    return [{"id": s.id, "lo": s.lo, "hi": s.hi} for s in new]


def created_line(config: StreamConfig, incarnation: int, now: float) -> bytes:
    first = ranges.split(0.0, 1.0, config.segments)
    new = [Segment(i, lo, hi, 0) for i, (lo, hi) in enumerate(first)]
    return line(
        "created", config=config.to_json(), incarnation=incarnation, time=now, segments=segments_json(new)
    )


def first_state(scope: str, stream: str, doc: Mapping[str, Any]) -> StreamState:
    """The state a ``created`` line starts."""
    assert doc["t"] == "created", doc
    new = tuple(Segment(s["id"], s["lo"], s["hi"], 0) for s in doc["segments"])
    ranges.check_partition([s.range for s in new], "epoch 0")
    return StreamState(
        scope=scope,
        stream=stream,
        config=StreamConfig.from_json(doc["config"]),
        incarnation=doc["incarnation"],
        created=doc["time"],
        segments={s.id: s for s in new},
        pending=Transition(0, (), new, doc["time"]),
        next_id=len(new),
    )


def fold(state: StreamState, docs: Iterable[Mapping[str, Any]]) -> StreamState:
    """``state`` with the lines ``docs`` applied, in order."""
    for doc in docs:
        state = _apply(state, doc)
    return state


FORMAT = RecordFormat("stream", StreamNotFound, stream_record, first_state, fold)
LoadedStream = Loaded[StreamState]


def _apply(state: StreamState, doc: Mapping[str, Any]) -> StreamState:
    kind = doc["t"]
    if kind == "scaling":
        return _scaling(state, doc)
    if kind == "epoch":
        return _end_transition(state, doc)
    if kind == "cancelled":
        cancelled = state.pending
        assert cancelled is not None and cancelled.epoch == doc["epoch"] > 0, (cancelled, doc)
        kept = {i: s for i, s in state.segments.items() if s not in cancelled.new}
        return replace(state, segments=kept, pending=None)
    if kind == "sealing":
        return replace(state, sealing=True)
    if kind == "sealed":
        return replace(state, sealed=True)
    if kind == "deleting":
        return replace(state, deleting=True)
    if kind == "truncating":
        return replace(state, truncating=Cut.from_json(doc["cut"]))
    if kind == "truncated":
        assert state.truncating is not None, doc
        return replace(state, head=state.truncating, truncating=None)
    if kind == "txn":
        assert doc["id"] not in state.transactions, doc
        held = tuple(sorted((int(k), v) for k, v in doc["segments"].items()))
        txn = Transaction(doc["id"], doc["epoch"], doc["deadline"], held)
        return replace(state, transactions={**state.transactions, txn.id: txn})
    if kind in (COMMITTING, COMMITTED, ABORTING, ABORTED):
        return _transaction_moves(state, doc)
    raise AssertionError(f"unknown record line {doc!r}")


def _scaling(state: StreamState, doc: Mapping[str, Any]) -> StreamState:
    assert state.pending is None and not state.sealing, (state.pending, doc)
    assert doc["epoch"] == state.epoch + 1, (state.epoch, doc)
    new = tuple(Segment(s["id"], s["lo"], s["hi"], doc["epoch"]) for s in doc["segments"])
    assert all(s.id >= state.next_id for s in new) and len({s.id for s in new}) == len(new), doc
    current = {s.id for s in state.current}
    assert set(doc["seal"]) <= current, (current, doc)
    ranges.check_replacement([state.segments[i].range for i in doc["seal"]], [s.range for s in new])
    segments = {**state.segments, **{s.id: s for s in new}}
    pending = Transition(doc["epoch"], tuple(doc["seal"]), new, doc["time"])
    return replace(state, segments=segments, pending=pending, next_id=max(s.id for s in new) + 1)


def _end_transition(state: StreamState, doc: Mapping[str, Any]) -> StreamState:
    pending = state.pending
    assert pending is not None and pending.epoch == doc["epoch"] == state.epoch + 1, (state.epoch, doc)
    segments = dict(state.segments)
    for sid in pending.seal:
        segments[sid] = replace(segments[sid], sealed_in=pending.epoch)
    before = set(state.epochs[-1].segments) if state.epochs else set()
    current = tuple(sorted((before - set(pending.seal)) | {s.id for s in pending.new}))
    ranges.check_partition([segments[i].range for i in current], f"epoch {pending.epoch}")
    epoch = Epoch(pending.epoch, current, pending.seal, tuple(s.id for s in pending.new), doc["time"])
    return replace(state, segments=segments, epochs=(*state.epochs, epoch), pending=None)


def _transaction_moves(state: StreamState, doc: Mapping[str, Any]) -> StreamState:
    kind = doc["t"]
    txn = state.transactions[doc["id"]]
    allowed = {COMMITTING: OPEN, COMMITTED: COMMITTING, ABORTING: OPEN, ABORTED: ABORTING}[kind]
    assert txn.state == allowed, (txn, doc)
    transactions = dict(state.transactions)
    transactions[txn.id] = replace(txn, state=kind, reason=doc.get("reason", txn.reason))
    closed = [t for t in transactions.values() if t.state in (COMMITTED, ABORTED)]
    for old in closed[: max(0, len(closed) - CLOSED_TRANSACTIONS_KEPT)]:
        del transactions[old.id]
    return replace(state, transactions=transactions)
