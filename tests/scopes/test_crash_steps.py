"""A crash at every step of a stream's create, scale, commit, abort, truncate, seal and delete.

Each procedure runs on a fresh data folder, cut short after 0, 1, 2, ...
changes of the store (tests/crashing.py: the store is closed as a crash
leaves it, every acknowledged change durable and nothing after). After each
cut the store is opened again and the stream touched, as any request would:
the operation completed, or it never happened, and everything acknowledged
before it is still there; then the same request, sent again, completes it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from app.scopes import cuts, events, records, scaling, transactions
from app.scopes.controller import Controller
from app.scopes.errors import StreamNotFound
from app.settings import HttpSettings
from engine import SegmentNotFound, SegmentStore, Settings
from tests.crashing import crash_everywhere
from tests.scopes.conftest import frames

WRITER = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
KEYS = [f"key-{i}" for i in range(12)]
Check = Callable[[Controller, bool], None]


def _settings(path: Path) -> Settings:
    return Settings(data_dir=str(path), container_count=3, flush_threshold_ms=50)


def _events(ctl: Controller, first: int = 1) -> None:
    numbers = events.WriterNumbers(ctl.store)
    for i, key in enumerate(KEYS):
        events.write(ctl, numbers, "sc", "st", key, key.encode(), WRITER, first + i)


def _all_events(ctl: Controller) -> list[bytes]:
    state = ctl.touch("sc", "st").state
    found = []
    for segment in state.segments.values():
        with contextlib.suppress(SegmentNotFound):  # truncated away
            found.extend(frames(ctl.store, f"sc/st/{segment.id}"))
    return sorted(found)


def crash_at_every_step(
    tmp_path: Path,
    build: Callable[[Controller], object],
    procedure: Callable[[Controller], object],
    check: Check,
) -> int:
    """Cut ``procedure`` after each change in turn; ``check(ctl, done)`` after each restart and retry."""

    def built(store: SegmentStore) -> None:
        ctl = Controller(store, HttpSettings())
        ctl.create_scope("sc")
        build(ctl)

    return crash_everywhere(
        tmp_path,
        _settings,
        built,
        lambda store: procedure(Controller(store, HttpSettings())),
        lambda store: check(Controller(store, HttpSettings()), True),
        lambda store, done: check(Controller(store, HttpSettings()), done),
    )


def test_a_create_cut_short_is_whole_or_absent(tmp_path: Path) -> None:
    def procedure(ctl: Controller) -> None:
        ctl.create_stream("sc", "st", records.StreamConfig(3))

    def check(ctl: Controller, done: bool) -> None:
        try:
            state = ctl.touch("sc", "st").state
        except StreamNotFound:
            assert not done
            assert [i.name for i in ctl.store.scan("sc/")] == []
            return
        assert state.epoch == 0 and len(state.current) == 3
        assert all(ctl.store.info(f"sc/st/{i}").length == 0 for i in range(3))

    assert crash_at_every_step(tmp_path, lambda ctl: None, procedure, check) >= 3


def test_a_scale_cut_short_completes_or_never_began(tmp_path: Path) -> None:
    def build(ctl: Controller) -> None:
        ctl.create_stream("sc", "st", records.StreamConfig(2))
        _events(ctl)

    def procedure(ctl: Controller) -> None:
        scaling.scale(ctl, "sc", "st", [0, 1], [(0.0, 0.3), (0.3, 0.7), (0.7, 1.0)])

    def check(ctl: Controller, done: bool) -> None:
        state = ctl.touch("sc", "st").state
        assert state.pending is None
        assert _all_events(ctl) == sorted(k.encode() for k in KEYS)
        if state.epoch == 0:
            assert not done
            for sid in (2, 3, 4):
                with pytest.raises(SegmentNotFound):
                    ctl.store.info(f"sc/st/{sid}")
            assert not ctl.store.info("sc/st/0").sealed
        else:
            assert state.epoch == 1 and [s.id for s in state.current] == [2, 3, 4]
            assert ctl.store.info("sc/st/0").sealed and ctl.store.info("sc/st/1").sealed
            _events(ctl)  # the same events again: every one a duplicate, across the scale
            assert _all_events(ctl) == sorted(k.encode() for k in KEYS)

    assert crash_at_every_step(tmp_path, build, procedure, check) >= 5


def _open_with_events(ctl: Controller) -> None:
    ctl.create_stream("sc", "st", records.StreamConfig(3))
    txid = transactions.open_transaction(ctl, "sc", "st", 600).id
    for key in KEYS:
        transactions.write(ctl, "sc", "st", txid, key, key.encode())


def _only_transaction(ctl: Controller) -> records.Transaction:
    (txn,) = ctl.touch("sc", "st").state.transactions.values()
    return txn


def test_a_commit_cut_short_completes_or_never_began(tmp_path: Path) -> None:
    def procedure(ctl: Controller) -> None:
        transactions.commit(ctl, "sc", "st", _only_transaction(ctl).id)

    def check(ctl: Controller, done: bool) -> None:
        txn = _only_transaction(ctl)
        if txn.state == records.OPEN:
            assert not done and _all_events(ctl) == []
        else:
            assert txn.state == records.COMMITTED
            assert _all_events(ctl) == sorted(k.encode() for k in KEYS)

    assert crash_at_every_step(tmp_path, _open_with_events, procedure, check) >= 4


def test_an_abort_cut_short_leaves_nothing(tmp_path: Path) -> None:
    def procedure(ctl: Controller) -> None:
        transactions.abort(ctl, "sc", "st", _only_transaction(ctl).id)

    def check(ctl: Controller, done: bool) -> None:
        txn = _only_transaction(ctl)
        assert _all_events(ctl) == []
        assert txn.state == (records.ABORTED if done else txn.state)
        if txn.state == records.ABORTED:
            for _, name in txn.segments:
                with pytest.raises(SegmentNotFound):
                    ctl.store.info(name)

    crash_at_every_step(tmp_path, _open_with_events, procedure, check)


def test_a_truncation_seal_and_delete_cut_short_complete_or_never_began(tmp_path: Path) -> None:
    def build(ctl: Controller) -> None:
        ctl.create_stream("sc", "st", records.StreamConfig(1))
        _events(ctl)
        scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
        _events(ctl, first=100)

    def procedure(ctl: Controller) -> None:
        try:
            state = ctl.touch("sc", "st").state
        except StreamNotFound:
            return  # deleted: a delete sent again is a 404
        if not state.sealing:
            tail = cuts.tail(ctl, state)
            cuts.truncate(ctl, "sc", "st", {str(k): v for k, v in tail.positions})
            ctl.seal("sc", "st")
        ctl.delete("sc", "st")

    def check(ctl: Controller, done: bool) -> None:
        try:
            state = ctl.touch("sc", "st").state
        except StreamNotFound:
            assert [i.name for i in ctl.store.scan("sc/")] == []
            return
        assert not done and state.pending is None and state.truncating is None
        if state.head is not None:  # truncated: segment 0 is gone, the others are empty from the head
            with pytest.raises(SegmentNotFound):
                ctl.store.info("sc/st/0")
        if state.sealing:
            assert state.sealed and ctl.store.info("sc/st/1").sealed

    assert crash_at_every_step(tmp_path, build, procedure, check) >= 6
