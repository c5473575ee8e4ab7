"""A stream's record folded (app/scopes/records.py): epochs, successors, transactions, and the invariants."""

from __future__ import annotations

import json

import pytest

from app.scopes import records
from engine import InvalidArgument

State = records.StreamState


def _docs(*lines: bytes) -> list[dict]:
    return [json.loads(line) for line in lines]


def _created(segments: int = 1) -> records.StreamState:
    first = records.created_line(records.StreamConfig(segments), incarnation=7, now=1.0)
    return records.first_state("sc", "st", json.loads(first))


def _scaling(epoch: int, seal: list[int], new: list[tuple[int, float, float]]) -> bytes:
    made = [{"id": i, "lo": lo, "hi": hi} for i, lo, hi in new]
    return records.line("scaling", epoch=epoch, seal=seal, segments=made, time=2.0)


def _scale(state: records.StreamState, seal: list[int], new: list[tuple[float, float]]) -> State:
    """``state`` after a completed scale."""
    epoch, first = state.epoch + 1, state.next_id
    made = [(first + i, lo, hi) for i, (lo, hi) in enumerate(new)]
    lines = _docs(_scaling(epoch, seal, made), records.line("epoch", epoch=epoch, time=3.0))
    return records.fold(state, lines)


def test_creation_is_pending_until_its_epoch_line() -> None:
    state = _created(2)
    assert state.epoch == -1 and state.current == () and state.pending is not None
    state = records.fold(state, _docs(records.line("epoch", epoch=0, time=1.5)))
    assert state.epoch == 0 and state.pending is None
    assert [(s.id, s.lo, s.hi) for s in state.current] == [(0, 0.0, 0.5), (1, 0.5, 1.0)]


def test_splits_and_merges_give_successors_and_predecessors() -> None:
    state = records.fold(_created(2), _docs(records.line("epoch", epoch=0, time=1.5)))
    state = _scale(state, [0], [(0.0, 0.25), (0.25, 0.5)])  # 2, 3
    state = _scale(state, [3, 1], [(0.25, 1.0)])  # 4
    assert state.epoch == 2
    assert [s.id for s in state.current] == [2, 4]
    assert [s.id for s in state.successors(state.segments[0])] == [2, 3]
    assert [s.id for s in state.successors(state.segments[1])] == [4]
    assert [s.id for s in state.predecessors(state.segments[4])] == [3, 1]  # by key range
    assert state.successors(state.segments[4]) == [] and state.predecessors(state.segments[0]) == []
    assert state.segments[3].sealed_in == 2 and state.segments[2].sealed_in is None
    assert state.completed_scale([3, 1], [(0.25, 1.0)]) is state.epochs[2]
    assert state.completed_scale([3, 1], [(0.25, 0.5), (0.5, 1.0)]) is None


def test_the_fold_refuses_what_breaks_an_invariant() -> None:
    state = records.fold(_created(2), _docs(records.line("epoch", epoch=0, time=1.5)))
    bad = [
        _scaling(2, [0], [(2, 0.0, 0.5)]),  # an epoch skipped
        _scaling(1, [0], [(1, 0.0, 0.5)]),  # an id taken
        _scaling(1, [0], [(2, 0.0, 0.4)]),  # keys left out
        _scaling(1, [5], [(2, 0.0, 0.5)]),  # no such segment
        records.line("epoch", epoch=1, time=2),  # no scale pending
    ]
    for line in bad:
        with pytest.raises((AssertionError, InvalidArgument)):
            records.fold(state, _docs(line))
    pending = records.fold(state, _docs(_scaling(1, [0], [(2, 0.0, 0.5)])))
    with pytest.raises(AssertionError):  # one scale at a time
        records.fold(pending, _docs(_scaling(2, [1], [(3, 0.5, 1.0)])))
    cancelled = records.fold(pending, _docs(records.line("cancelled", epoch=1, reason="taken")))
    assert cancelled.pending is None and 2 not in cancelled.segments and cancelled.next_id == 3


def test_transactions_move_one_way_and_closed_ones_are_bounded() -> None:
    state = records.fold(_created(1), _docs(records.line("epoch", epoch=0, time=1.5)))
    lines = []
    for i in range(records.CLOSED_TRANSACTIONS_KEPT + 5):
        segments = {"0": f"#scopes/txns/{i}"}
        lines.append(records.line("txn", id=f"t{i}", epoch=0, deadline=9.0, segments=segments))
        lines.append(records.line("aborting" if i % 2 else "committing", id=f"t{i}", reason="abort"))
        lines.append(records.line("aborted" if i % 2 else "committed", id=f"t{i}"))
    lines.append(records.line("txn", id="open", epoch=0, deadline=9.0, segments={"0": "#scopes/txns/x"}))
    state = records.fold(state, _docs(*lines))
    assert len(state.transactions) == records.CLOSED_TRANSACTIONS_KEPT + 1
    assert "t0" not in state.transactions and state.transactions["open"].state == records.OPEN
    assert state.transactions["open"].holds([0]) and not state.transactions["t1027"].holds([0])
    for wrong in ("committed", "aborted"):
        with pytest.raises(AssertionError):
            records.fold(state, _docs(records.line(wrong, id="open")))
