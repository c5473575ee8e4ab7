"""Transactions and merges (seed 000 "Transactions", MergeSegmentOperation; seed 002 "Concatenation")."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable

import pytest

from engine import (
    InvalidArgument,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegmentStore,
)
from engine.metadata import operations as ops
from engine.naming import container_for, transaction_name
from tests.engine.conftest import Node
from tests.polling import wait_until

W = uuid.UUID("00000000-0000-0000-0000-0000000000aa")


def commit(store: SegmentStore, parent: str, data: bytes) -> tuple[int, int]:
    txid = store.open_transaction(parent)
    store.append_transaction(parent, txid, data)
    result = store.commit_transaction(parent, txid)
    return result.offset, result.length


def whole(store: SegmentStore, name: str) -> bytes:
    info = store.info(name)
    parts = []
    offset = info.start_offset
    while offset < info.length:
        result = store.read(name, offset)
        parts.append(result.data)
        offset = result.next_offset
    return b"".join(parts)


# ------------------------------------------------------------------ semantics
def test_a_commit_puts_the_transaction_at_the_end_of_the_parent_at_once(store: SegmentStore) -> None:
    store.create("p")
    store.append("p", b"head", event_count=2)
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"one", event_count=3)
    store.append_transaction("p", txid, b"two")
    assert store.info("p").length == 4  # an open transaction is not readable through the parent
    assert store.transaction_info("p", txid).length == 6
    result = store.commit_transaction("p", txid)
    assert (result.offset, result.length) == (4, 6)
    assert result.info.length == 10 and result.info.event_count == 6
    assert whole(store, "p") == b"headonetwo"
    with pytest.raises(SegmentNotFound):
        store.transaction_info("p", txid)
    with pytest.raises(SegmentNotFound):
        store.append_transaction("p", txid, b"late")


def test_a_commit_retried_answers_the_first_offset(store: SegmentStore) -> None:
    store.create("p")
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"abc")
    first = store.commit_transaction("p", txid)
    store.append("p", b"more")
    again = store.commit_transaction("p", txid)
    assert (again.offset, again.length) == (first.offset, first.length) == (0, 3)
    assert whole(store, "p") == b"abcmore"


def test_an_aborted_expired_or_unknown_transaction_cannot_commit(make_node: Callable[..., Node]) -> None:
    store = make_node(transaction_timeout_s=0.2).store
    store.create("p")
    aborted = store.open_transaction("p")
    store.append_transaction("p", aborted, b"x")
    store.abort_transaction("p", aborted)
    with pytest.raises(SegmentNotFound):
        store.commit_transaction("p", aborted)
    with pytest.raises(SegmentNotFound):
        store.commit_transaction("p", uuid.uuid4())
    with pytest.raises(SegmentNotFound):
        store.abort_transaction("p", aborted)
    idle = store.open_transaction("p")
    store.append_transaction("p", idle, b"y")
    wait_until(lambda: not _exists(store, "p", idle), what="the idle transaction's abort")
    with pytest.raises(SegmentNotFound):
        store.commit_transaction("p", idle)
    assert store.info("p").length == 0


def _exists(store: SegmentStore, parent: str, txid: uuid.UUID) -> bool:
    try:
        store.transaction_info(parent, txid)
    except SegmentNotFound:
        return False
    return True


def test_appends_to_a_transaction_are_deduplicated(store: SegmentStore) -> None:
    store.create("p")
    txid = store.open_transaction("p")
    assert not store.append_transaction("p", txid, b"a", writer_id=W, event_number=1).duplicate
    retry = store.append_transaction("p", txid, b"a", writer_id=W, event_number=1)
    assert retry.duplicate and retry.event_number == 1
    store.append_transaction("p", txid, b"b", writer_id=W, event_number=2)
    store.commit_transaction("p", txid)
    assert whole(store, "p") == b"ab"
    assert store.writer_event_number("p", W) is None  # the transaction's writer state is its own


def test_transactions_are_hidden_and_go_with_their_parent(node: Node) -> None:
    store = node.store
    store.create("p")
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"bytes")
    store.flush()
    assert [i.name for i in store.list()[0]] == ["p"]
    store.delete("p")
    with pytest.raises(SegmentNotFound):
        store.transaction_info("p", txid)
    with pytest.raises(SegmentNotFound):
        store.open_transaction("p")
    store.flush()
    assert list(node.storage.list()) == []


def test_a_sealed_parent_takes_no_transaction(store: SegmentStore) -> None:
    store.create("p")
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"x")
    store.seal("p")
    with pytest.raises(SegmentSealed):
        store.open_transaction("p")
    with pytest.raises(SegmentSealed):
        store.commit_transaction("p", txid)
    assert not store.transaction_info("p", txid).sealed  # still open: it may be aborted, or appended to


def test_merge_takes_only_a_whole_sealed_other_segment(store: SegmentStore) -> None:
    store.create("t")
    store.create("s")
    store.append("s", b"source")
    with pytest.raises(SegmentNotSealed):
        store.merge("t", "s")
    store.seal("s")
    with pytest.raises(InvalidArgument):
        store.merge("s", "s")
    with pytest.raises(SegmentNotFound):
        store.merge("t", "nothing")
    store.create("cut")
    store.append("cut", b"0123")
    store.truncate("cut", 2)
    store.seal("cut")
    with pytest.raises(InvalidArgument):
        store.merge("t", "cut")
    result = store.merge("t", "s")
    assert (result.offset, result.length) == (0, 6)
    with pytest.raises(SegmentNotFound):
        store.info("s")
    assert store.merge("t", "s").offset == 0  # a retry answers the first merge
    store.seal("t")
    store.create("u")
    store.seal("u")
    with pytest.raises(SegmentSealed):
        store.merge("t", "u")


# ------------------------------------------------------------------- Tier 2
def test_a_flushed_transaction_commits_without_copying_a_byte(node: Node) -> None:
    store = node.store
    store.create("p")
    store.append("p", b"p" * 5000)
    txid = store.open_transaction("p")
    data = os.urandom(200_000)
    store.append_transaction("p", txid, data)
    store.flush()
    chunks = {c.name for c in node.layout(transaction_name("p", txid))}
    flushed = node.metric("segstore_tier2_flush_bytes_total")
    store.commit_transaction("p", txid)
    store.flush()
    assert node.metric("segstore_tier2_flush_bytes_total") == flushed
    assert node.metric("segstore_tier2_merge_bytes_total") == len(data)
    assert chunks <= {c.name for c in node.layout("p")}
    assert node.tier2_bytes("p") == b"p" * 5000 + data
    node.evict_all()
    assert whole(store, "p") == b"p" * 5000 + data


def test_unflushed_transaction_bytes_move_to_the_parent_uncopied(make_node: Callable[..., Node]) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 30)
    store = node.store
    store.create("p")
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"t" * 5000)
    index = node.container.read_index
    tid = store.transaction_info("p", txid).segment_id
    before = {start: index.cache.get((tid, start)) for start in index._segments[tid].blocks}
    store.commit_transaction("p", txid)
    pid = store.info("p").segment_id
    after = {start: index.cache.get((pid, start)) for start in index._segments[pid].blocks}
    assert before and all(after[start] is block for start, block in before.items())
    assert tid not in index._segments
    store.flush()
    assert node.tier2_bytes("p") == b"t" * 5000


def test_reads_of_a_merge_not_yet_in_the_layout_come_from_the_sources_chunks(
    make_node: Callable[..., Node],
) -> None:
    """The target's flush stalls before the merge offset; after a restart nothing is cached."""
    node = make_node(checkpoint_every_bytes=1)
    store = node.store
    store.create("p")
    store.create("s")
    data = os.urandom(50_000)
    store.append("s", data)
    store.seal("s")
    node.truncate_tier1()  # "s" is only in Tier 2 now
    node.faults.outage("create", "write")
    store.append("p", b"unflushed")
    store.merge("p", "s")
    store = node.restart().store
    assert [m.offset for m in node.container.metadata.by_name("p").pending] == [9]
    assert whole(store, "p") == b"unflushed" + data
    node.faults.end_outage()
    store.flush()
    assert node.container.metadata.by_name("p").pending == []
    assert node.tier2_bytes("p") == b"unflushed" + data
    store = node.restart().store  # the merged chunks are the target's now: not collected as garbage
    node.evict_all()
    assert whole(store, "p") == b"unflushed" + data


def test_a_merged_segment_takes_its_own_pending_merges_along(make_node: Callable[..., Node]) -> None:
    node = make_node()
    store = node.store
    for name in ("a", "b", "c"):
        store.create(name)
    store.append("c", b"c" * 3000)
    store.seal("c")
    store.flush()
    node.faults.outage("create", "write")
    store.append("b", b"b" * 10)
    store.merge("b", "c")
    store.seal("b")
    store.append("a", b"a" * 7)
    store.merge("a", "b")
    assert [m.offset for m in node.container.metadata.by_name("a").pending] == [17]
    node.faults.end_outage()
    store.flush()
    assert node.tier2_bytes("a") == b"a" * 7 + b"b" * 10 + b"c" * 3000
    node.evict_all()
    assert whole(store, "a") == b"a" * 7 + b"b" * 10 + b"c" * 3000


def test_deleting_a_target_with_a_pending_merge_deletes_the_sources_chunks(node: Node) -> None:
    store = node.store
    store.create("t")
    store.create("s")
    store.append("s", b"s" * 2000)
    store.seal("s")
    store.flush()
    node.faults.outage("create", "write")
    store.append("t", b"t")
    store.merge("t", "s")
    store.delete("t")
    node.faults.end_outage()
    store.flush()
    assert list(node.storage.list()) == []


# ------------------------------------------------------------------ recovery
def test_a_crash_between_seal_and_merge_leaves_the_transaction_whole(node: Node) -> None:
    store = node.store
    store.create("p")
    txid = store.open_transaction("p")
    store.append_transaction("p", txid, b"all or nothing")
    node.container.durable_log.add(ops.Seal(name=transaction_name("p", txid))).result()
    store = node.restart().store
    assert store.info("p").length == 0
    assert store.transaction_info("p", txid).sealed
    assert store.commit_transaction("p", txid).length == 14
    assert whole(store, "p") == b"all or nothing"


@pytest.mark.parametrize("flushed", [False, True])
def test_a_crash_after_the_merge_keeps_all_of_it(make_node: Callable[..., Node], flushed: bool) -> None:
    node = make_node()
    store = node.store
    store.create("p")
    store.append("p", b"<")
    txid = store.open_transaction("p")
    data = os.urandom(30_000)
    store.append_transaction("p", txid, data)
    if flushed:
        store.flush()
    node.faults.outage("create", "write")
    store.commit_transaction("p", txid)
    node.restart()
    assert whole(node.store, "p") == b"<" + data
    assert node.store.commit_transaction("p", txid).offset == 1
    node.faults.end_outage()
    node.store.flush()
    assert node.tier2_bytes("p") == b"<" + data


# --------------------------------------------------------------- concurrency
def test_transactions_commit_contiguously_among_plain_appends(make_node: Callable[..., Node]) -> None:
    node = make_node(flush_threshold_bytes=16 * 1024)
    store = node.store
    store.create("p")
    committed: dict[bytes, int] = {}
    appended: dict[bytes, int] = {}
    errors: list[BaseException] = []

    def transactions(worker: int) -> None:
        try:
            for i in range(15):
                body = f"<t{worker}.{i}:".encode() + os.urandom(100 + 700 * i) + b">"
                offset, length = commit(store, "p", body)
                assert length == len(body)
                committed[body] = offset
        except BaseException as exc:
            errors.append(exc)

    def plain(worker: int) -> None:
        try:
            for i in range(60):
                body = f"[a{worker}.{i}]".encode()
                result = store.append("p", body)
                assert result.offset is not None
                appended[body] = result.offset
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=transactions, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=plain, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    content = whole(store, "p")
    assert len(content) == sum(map(len, committed)) + sum(map(len, appended))
    for body, offset in {**committed, **appended}.items():
        assert content[offset : offset + len(body)] == body
    store.flush()
    node.evict_all()
    assert whole(store, "p") == content == node.tier2_bytes("p")


# ------------------------------------------------------------ across containers
def test_a_merge_across_containers_copies_then_merges_at_once(file_store: SegmentStore) -> None:
    store = file_store
    target = "t"
    source = next(f"s{i}" for i in range(100) if container_for(f"s{i}", 4) != container_for(target, 4))
    store.create(target)
    store.append(target, b"T")
    store.create(source)
    data = os.urandom(300_000)
    store.append(source, data[:100_000])
    store.append(source, data[100_000:])
    store.seal(source)
    result = store.merge(target, source)
    assert (result.offset, result.length) == (1, len(data))
    assert whole(store, target) == b"T" + data
    with pytest.raises(SegmentNotFound):
        store.info(source)
    assert store.merge(target, source).offset == 1
    assert [i.name for i in store.list()[0]] == [target]


def test_a_merge_across_containers_into_a_missing_or_sealed_target_copies_nothing(
    file_store: SegmentStore,
) -> None:
    store = file_store
    source = next(f"s{i}" for i in range(100) if container_for(f"s{i}", 4) != container_for("t", 4))
    store.create(source)
    store.append(source, b"kept")
    store.seal(source)
    with pytest.raises(SegmentNotFound):
        store.merge("t", source)
    store.create("t")
    store.seal("t")
    with pytest.raises(SegmentSealed):
        store.merge("t", source)
    assert whole(store, source) == b"kept"
    container = store._containers[container_for("t", 4)]
    assert list(container.metadata.names) == ["t"]  # no staging segment left behind


def test_a_source_merged_while_the_writer_flushes_it_keeps_its_bytes_in_tier1(
    make_node: Callable[..., Node],
) -> None:
    """The source's flush loses the race with the merge; Tier 1 must keep its bytes for the target."""
    node = make_node(checkpoint_every_bytes=1, flush_threshold_ms=60_000, flush_threshold_bytes=1 << 30)
    store = node.store
    store.create("p")
    txid = store.open_transaction("p")
    data = os.urandom(20_000)
    store.append_transaction("p", txid, data)
    node.faults.delay("create", 0.3)
    node.container.durable_log.add(ops.Seal(name=transaction_name("p", txid))).result()
    wait_until(lambda: node.faults.calls["create"] >= 1, what="the writer to flush the sealed transaction")
    store.commit_transaction("p", txid)
    store.append("p", b"!")  # more batches, each led by a checkpoint: Tier 1 truncates what it may
    wait_until(lambda: node.faults.calls["delete"] >= 1, what="the refused flush's chunk to go")
    store.append("p", b"!")
    store = node.restart().store
    assert whole(store, "p") == data + b"!!"


def test_the_parent_writes_on_into_a_merged_chunk_when_the_binding_appends(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(flush_threshold_ms=60_000, flush_threshold_bytes=1 << 30)
    store = node.store
    assert node.storage.supports_append
    store.create("t")
    store.create("s")
    store.append("s", b"s" * 100)
    store.seal("s")
    store.flush()
    store.merge("t", "s")
    store.append("t", b"t" * 50)
    store.flush()
    assert [c.length for c in node.layout("t")] == [150]  # one chunk: the source's, grown
    assert node.tier2_bytes("t") == b"s" * 100 + b"t" * 50
