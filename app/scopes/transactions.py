"""Stream transactions (seed 004): events written apart, made visible together by a commit, or never.

Open: a ``txn`` line names, for every segment of the current epoch, a
transaction segment in that segment's container (``names``), then those
segments are created; the answer comes after both. While a scale is
pending, an open waits for it (up to ``OPEN_WAIT_S``, then 503: try again);
the scale itself waits for the open transactions holding a segment it
seals (``steps``), which end by commit, abort or their deadline.

An event goes, framed, to the transaction segment of the segment its key
routes to in the transaction's epoch. A commit records ``committing``,
then ``steps.finish`` merges each transaction segment into its data
segment (seal + merge, one composite each, idempotent) and records
``committed``: a crash after ``committing`` leaves a commit the next touch
completes. An abort, or the deadline passing, records ``aborting`` and
deletes the transaction segments: nothing of it is ever read. An event
racing a commit lands before the transaction segment is sealed (and is
committed) or is refused (409 ``TransactionNotOpen``).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from app.scopes import records
from app.scopes.controller import Controller
from app.scopes.errors import StreamNotFound, StreamSealed, TransactionNotOpen
from app.scopes.names import segment_name, transaction_segment
from app.scopes.record_log import now
from client.events import frame
from client.routing import key_hash
from engine import (
    AppendResult,
    AppendStep,
    CreateStep,
    InvalidArgument,
    SegmentNotFound,
    SegmentSealed,
    Throttled,
)

# How long an open waits for a pending scale before it answers 503 with Retry-After.
OPEN_WAIT_S = 5.0
_POLL_S = 0.1
_FINAL = (records.COMMITTED, records.ABORTED)


@dataclass(frozen=True, slots=True)
class TxnEvent:
    """Where a transaction's event will be visible once committed, and the append's answer."""

    segment: str
    result: AppendResult


def timeout_of(ctl: Controller, asked: float | None) -> float:
    """The timeout a transaction gets: ``asked`` (at least 1 s), at most the server's maximum."""
    settings = ctl.http
    if asked is None:
        return settings.stream_transaction_timeout_s
    if asked < 1:
        raise InvalidArgument(f"a transaction's timeout_s is at least 1, got {asked}")
    return min(asked, settings.stream_transaction_timeout_max_s)


def open_transaction(
    ctl: Controller, scope: str, stream: str, timeout_s: float | None
) -> records.Transaction:
    """Open a transaction on the current epoch; see the module."""
    timeout = timeout_of(ctl, timeout_s)
    txid = str(uuid.uuid4())
    deadline = time.monotonic() + OPEN_WAIT_S
    chosen: dict[int, str] = {}

    def judge(loaded: records.LoadedStream) -> tuple[str, dict] | None:
        state = loaded.state
        if state.sealing:
            raise StreamSealed(f"stream {scope}/{stream} is sealed")
        if state.pending is not None:
            raise _ScalePending
        for segment in state.current:
            if segment.id not in chosen:
                chosen[segment.id] = transaction_segment(ctl.store, segment_name(scope, stream, segment.id))
        names = {str(s.id): chosen[s.id] for s in state.current}
        return "txn", {"id": txid, "epoch": state.epoch, "deadline": now() + timeout, "segments": names}

    while True:
        try:
            loaded = ctl.change(scope, stream, judge)
            break
        except _ScalePending:
            if time.monotonic() >= deadline:
                raise Throttled(
                    f"stream {scope}/{stream} is scaling (it waits for open transactions); "
                    "a transaction opens once the scale is done",
                    retry_after_s=1.0,
                ) from None
            time.sleep(_POLL_S)
    txn = loaded.state.transactions[txid]
    by_container: dict[int, list[CreateStep]] = defaultdict(list)
    for _, name in txn.segments:
        by_container[ctl.store.container_of(name)].append(CreateStep(name))
    for creates in by_container.values():
        ctl.store.composite(creates, anywhere=True)
    return txn


class _ScalePending(Exception):
    """The stream is scaling: an open waits (never answered)."""


def find(
    ctl: Controller, scope: str, stream: str, txid: str
) -> tuple[records.LoadedStream, records.Transaction]:
    """The stream and its transaction ``txid`` (StreamNotFound when it has none such)."""
    loaded = ctl.touch(scope, stream)
    txn = loaded.state.transactions.get(txid)
    if txn is None:
        raise StreamNotFound(f"stream {scope}/{stream} has no transaction {txid} (or forgot it: long closed)")
    return loaded, txn


def write(
    ctl: Controller,
    scope: str,
    stream: str,
    txid: str,
    key: str,
    payload: bytes,
    writer_id: uuid.UUID | None = None,
    event_number: int | None = None,
) -> TxnEvent:
    """Append one event to the transaction; TransactionNotOpen unless it is open."""
    loaded, txn = find(ctl, scope, stream, txid)
    _require_open(txn)
    state = loaded.state
    point = key_hash(key)
    segment = next(s for s in state.of_epoch(txn.epoch) if s.covers(point))
    name = dict(txn.segments)[segment.id]
    step = AppendStep(name, frame(payload), writer_id=writer_id, event_number=event_number)
    try:
        result = ctl.store.composite([step], anywhere=True)[0]
    except (SegmentNotFound, SegmentSealed):
        raise TransactionNotOpen(f"transaction {txid} is committing or closed") from None
    assert isinstance(result, AppendResult)
    return TxnEvent(segment_name(scope, stream, segment.id), result)


def commit(ctl: Controller, scope: str, stream: str, txid: str) -> records.Transaction:
    """Commit: every event of the transaction made visible; idempotent."""
    return _close(ctl, scope, stream, txid, records.COMMITTING, {"id": txid})


def abort(ctl: Controller, scope: str, stream: str, txid: str) -> records.Transaction:
    """Abort: nothing of the transaction is ever read; idempotent."""
    return _close(ctl, scope, stream, txid, records.ABORTING, {"id": txid, "reason": "abort"})


def _close(
    ctl: Controller, scope: str, stream: str, txid: str, kind: str, fields: dict
) -> records.Transaction:
    wanted = records.COMMITTED if kind == records.COMMITTING else records.ABORTED

    def judge(loaded: records.LoadedStream) -> tuple[str, dict] | None:
        txn = loaded.state.transactions.get(txid)
        if txn is None:
            raise StreamNotFound(f"stream {scope}/{stream} has no transaction {txid}")
        if txn.state in (kind, wanted):
            return None
        if txn.state != records.OPEN:
            raise TransactionNotOpen(f"transaction {txid} is {txn.state} ({txn.reason or 'by request'})")
        return kind, fields

    txn = ctl.change(scope, stream, judge).state.transactions.get(txid)
    if txn is None or txn.state != wanted:  # forgotten at once: more than CLOSED_TRANSACTIONS_KEPT closed
        raise Throttled(f"transaction {txid}: ask again for its outcome", retry_after_s=1.0)
    return txn


def _require_open(txn: records.Transaction) -> None:
    if txn.state != records.OPEN or txn.deadline <= now():
        state = "expired" if txn.state == records.OPEN else txn.state
        raise TransactionNotOpen(f"transaction {txn.id} is {state}; events go only to an open one")
