"""Stream transactions over a bare store: all events visible at commit, none after an abort or timeout,
and what a scale does to open transactions (it waits for them; new ones wait for it)."""

from __future__ import annotations

import time

import pytest

from app.scopes import records, scaling, transactions
from app.scopes.controller import Controller
from app.scopes.errors import StreamNotFound, StreamSealed, TransactionNotOpen
from client.routing import key_hash
from engine import SegmentNotFound, SegmentStore, Throttled
from tests.scopes.conftest import frames, key_in, make_stream


def _write(ctl: Controller, txid: str, keys: list[str]) -> list[str]:
    return [transactions.write(ctl, "sc", "st", txid, key, key.encode()).segment for key in keys]


def test_a_commit_makes_every_event_visible_in_every_segment_it_touched(
    ctl: Controller, store: SegmentStore
) -> None:
    make_stream(ctl, 3)
    txn = transactions.open_transaction(ctl, "sc", "st", 30)
    assert txn.state == records.OPEN and len(txn.segments) == 3
    keys = [f"k{i}" for i in range(30)]
    segments = _write(ctl, txn.id, keys)
    assert segments == [f"sc/st/{min(2, int(key_hash(k) * 3))}" for k in keys]
    assert all(store.info(f"sc/st/{i}").length == 0 for i in range(3))  # nothing visible before the commit
    assert transactions.commit(ctl, "sc", "st", txn.id).state == records.COMMITTED
    assert transactions.commit(ctl, "sc", "st", txn.id).state == records.COMMITTED  # idempotent
    for i in range(3):
        expected = [k.encode() for k, s in zip(keys, segments, strict=True) if s == f"sc/st/{i}"]
        assert frames(store, f"sc/st/{i}") == expected
    for _, name in txn.segments:
        with pytest.raises(SegmentNotFound):
            store.info(name)  # merged away
    with pytest.raises(TransactionNotOpen):
        transactions.write(ctl, "sc", "st", txn.id, "k", b"late")
    with pytest.raises(TransactionNotOpen):
        transactions.abort(ctl, "sc", "st", txn.id)


def test_an_abort_or_a_timeout_leaves_nothing(ctl: Controller, store: SegmentStore) -> None:
    make_stream(ctl, 2)
    aborted = transactions.open_transaction(ctl, "sc", "st", None)
    _write(ctl, aborted.id, ["a", "b", "c"])
    assert transactions.abort(ctl, "sc", "st", aborted.id).state == records.ABORTED
    assert transactions.abort(ctl, "sc", "st", aborted.id).state == records.ABORTED
    with pytest.raises(TransactionNotOpen):
        transactions.commit(ctl, "sc", "st", aborted.id)
    expiring = transactions.open_transaction(ctl, "sc", "st", 1)
    _write(ctl, expiring.id, ["d", "e"])
    time.sleep(1.1)
    with pytest.raises(TransactionNotOpen, match="timeout"):
        transactions.commit(ctl, "sc", "st", expiring.id)
    assert [store.info(f"sc/st/{i}").length for i in range(2)] == [0, 0]
    for txn in (aborted, expiring):
        assert ctl.touch("sc", "st").state.transactions[txn.id].state == records.ABORTED
        for _, name in txn.segments:
            with pytest.raises(SegmentNotFound):
                store.info(name)
    with pytest.raises(StreamNotFound):
        transactions.find(ctl, "sc", "st", "0f8fad5b-d9cb-469f-a165-70867728950e")


def test_a_scale_waits_for_the_transactions_holding_what_it_seals(
    ctl: Controller, store: SegmentStore
) -> None:
    make_stream(ctl, 1)
    txn = transactions.open_transaction(ctl, "sc", "st", 30)
    key = key_in(0.0, 0.5)
    _write(ctl, txn.id, [key])
    answer = scaling.start(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    assert (answer.epoch, answer.done) == (1, False)
    state = ctl.touch("sc", "st").state
    assert state.scaling is not None and state.epoch == 0 and not store.info("sc/st/0").sealed
    _write(ctl, txn.id, [key])  # the open transaction goes on
    transactions.commit(ctl, "sc", "st", txn.id)
    state = ctl.touch("sc", "st").state
    assert state.epoch == 1 and state.scaling is None
    assert frames(store, "sc/st/0") == [key.encode(), key.encode()] and store.info("sc/st/0").sealed


def test_a_new_transaction_waits_while_a_scale_is_pending(
    ctl: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transactions, "OPEN_WAIT_S", 0.3)
    make_stream(ctl, 1)
    holder = transactions.open_transaction(ctl, "sc", "st", 30)
    scaling.start(ctl, "sc", "st", [0], [(0.0, 1.0)])
    with pytest.raises(Throttled, match="scaling"):
        transactions.open_transaction(ctl, "sc", "st", 30)
    transactions.abort(ctl, "sc", "st", holder.id)
    assert transactions.open_transaction(ctl, "sc", "st", 30).epoch == 1


def test_sealing_a_stream_aborts_its_open_transactions(ctl: Controller, store: SegmentStore) -> None:
    make_stream(ctl, 1)
    txn = transactions.open_transaction(ctl, "sc", "st", 30)
    _write(ctl, txn.id, ["a"])
    ctl.seal("sc", "st")
    assert ctl.touch("sc", "st").state.transactions[txn.id].state == records.ABORTED
    assert store.info("sc/st/0").length == 0
    with pytest.raises(StreamSealed):
        transactions.open_transaction(ctl, "sc", "st", 30)


def test_a_timeout_is_cut_to_the_maximum(ctl: Controller) -> None:
    make_stream(ctl, 1)
    limit = ctl.http.stream_transaction_timeout_max_s
    txn = transactions.open_transaction(ctl, "sc", "st", limit * 10)
    assert txn.deadline - time.time() <= limit + 1
    assert transactions.timeout_of(ctl, None) == ctl.http.stream_transaction_timeout_s
