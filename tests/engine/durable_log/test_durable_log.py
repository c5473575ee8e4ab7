"""Durable log: group commit, rollback of failed Tier 1 writes, sequence numbers, checkpoints."""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from engine import ContainerNotReady, SegmentNotFound, StorageFull, Throttled
from engine.durable_log.frames import iter_batches
from engine.durable_log.operation_log import OperationLog
from engine.metadata import operations as ops
from tests.engine.conftest import HeldProcessor, Node, logged_operations

W = uuid.UUID(int=7)


def test_concurrent_appends_share_tier1_writes(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    store = node.store
    store.create("s")
    count0 = node.metric("segstore_tier1_write_operations_count")
    sum0 = node.metric("segstore_tier1_write_operations_sum")
    writes0 = len(node.data_log.writes)
    payloads = {f"a{i}": os.urandom(1 + i * 37 % 300) for i in range(32)}
    held = HeldProcessor(node, monkeypatch)
    keys = list(payloads)
    held.hold(keys[0], lambda: store.append("s", payloads[keys[0]]))
    for key in keys[1:]:
        held.submit(key, lambda key=key: store.append("s", payloads[key]))
    held.wait_queued(len(keys) - 1)
    results = held.release()
    assert len(node.data_log.writes) - writes0 == 2  # the held write, then everything queued behind it
    assert node.metric("segstore_tier1_write_operations_count") - count0 == 2
    assert node.metric("segstore_tier1_write_operations_sum") - sum0 == len(keys)
    offsets = sorted((results[key].offset, key) for key in keys)
    position = 0
    for offset, key in offsets:
        assert offset == position  # appends are laid end to end, never interleaved
        assert store.read("s", offset, len(payloads[key])).data == payloads[key]
        position += len(payloads[key])
    assert store.info("s").length == position


def test_append_larger_than_a_frame_is_one_multi_frame_write(node: Node) -> None:
    node.store.create("s")
    data = os.urandom(3 * node.settings.max_frame_bytes)
    writes = len(node.data_log.writes)
    node.store.append("s", data)
    assert len(node.data_log.writes) == writes + 1
    assert node.metric("segstore_tier1_frame_bytes_count") >= 4
    node.restart()
    assert node.store.read("s", 0).data == data


@pytest.mark.parametrize(
    ("error", "raised"),
    [(OSError(errno.EIO, "I/O error"), ContainerNotReady), (OSError(errno.ENOSPC, "No space"), StorageFull)],
    ids=["EIO", "ENOSPC"],
)
def test_failed_tier1_write_is_rolled_back(node: Node, error: OSError, raised: type[Exception]) -> None:
    store = node.store
    store.create("s")
    store.append("s", b"keep", writer_id=W, event_number=1)
    node.data_log.fail_error = error
    node.data_log.fail_writes = 1
    with pytest.raises(raised) as info:
        store.append("s", b"lost", writer_id=W, event_number=2)
    if raised is ContainerNotReady:
        assert isinstance(info.value, Throttled) and info.value.retry_after_s > 0
    info_after = store.info("s")
    assert (info_after.length, info_after.event_count) == (4, 1)
    assert store.writer_event_number("s", W) == 1
    assert store.read("s", 0).data == b"keep"
    assert store.read("s", 4).data == b""
    retried = store.append("s", b"next", writer_id=W, event_number=2)
    assert (retried.offset, retried.duplicate) == (4, False)
    assert store.read("s", 0).data == b"keepnext"
    assert not any(
        isinstance(op, ops.Append) and op.data == b"lost" for op in logged_operations(node.data_log)
    )
    node.restart()
    assert node.store.read("s", 0).data == b"keepnext"


def test_failed_write_rolls_back_creates_and_seals(node: Node) -> None:
    node.store.create("s")
    node.data_log.fail_writes = 2
    with pytest.raises(ContainerNotReady):
        node.store.create("t")
    with pytest.raises(ContainerNotReady):
        node.store.seal("s")
    with pytest.raises(SegmentNotFound):
        node.store.info("t")
    assert not node.store.info("s").sealed
    assert node.store.create("t").segment_id == 2


def test_duplicate_in_a_failed_batch_is_not_reported_as_duplicate(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = node.store
    store.create("s")
    store.create("t")
    store.append("s", b"one", writer_id=W, event_number=1)
    held = HeldProcessor(node, monkeypatch)
    node.data_log.fail_writes = 2
    held.hold("first", lambda: store.append("t", b"held"))
    held.submit("dup", lambda: store.append("s", b"one", writer_id=W, event_number=1))
    held.submit("other", lambda: store.append("s", b"two"))
    held.wait_queued(2)
    results = held.release()
    assert isinstance(results["first"], ContainerNotReady)
    assert isinstance(results["other"], ContainerNotReady)
    assert isinstance(results["dup"], ContainerNotReady)  # its batch was not durable
    again = store.append("s", b"one", writer_id=W, event_number=1)
    assert again.duplicate and again.event_number == 1


def test_duplicate_alone_needs_no_write(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"one", writer_id=W, event_number=1)
    writes = len(node.data_log.writes)
    node.data_log.fail_writes = 1
    assert node.store.append("s", b"one", writer_id=W, event_number=0).duplicate
    assert len(node.data_log.writes) == writes and node.data_log.fail_writes == 1


def test_duplicates_are_counted(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"one", writer_id=W, event_number=1)
    node.store.append("s", b"one", writer_id=W, event_number=1)
    assert node.metric("segstore_append_duplicates_total") == 1


def test_sequence_numbers_are_not_reused_after_a_failed_write(node: Node) -> None:
    store = node.store
    store.create("s")
    store.append("s", b"a")
    before = node.container.metadata.seq
    node.data_log.fail_writes = 1
    with pytest.raises(ContainerNotReady):
        store.append("s", b"b")
    assert node.container.metadata.seq > before
    store.append("s", b"c")
    seqs = [op.seq for op in logged_operations(node.data_log)]
    assert seqs == sorted(set(seqs))
    assert before + 1 not in seqs and seqs[-1] > before + 1


def test_checkpoint_at_start_and_every_checkpoint_bytes(make_node: Callable[..., Node]) -> None:
    node = make_node(checkpoint_every_bytes=1000, flush_threshold_ms=60_000)  # no Tier 1 truncation
    [start] = logged_operations(node.data_log)
    assert isinstance(start, ops.MetadataCheckpoint) and start.snapshot["epoch"] == 1
    node.store.create("s")
    for _ in range(40):
        node.store.append("s", b"x" * 60)  # about 110 logged bytes per write
    leads = [
        isinstance(ops.decode_all(batch.payload)[0], ops.MetadataCheckpoint)
        for buf in node.data_log.writes
        for batch in iter_batches(buf)
    ]
    checkpoints = [i for i, lead in enumerate(leads) if lead]
    assert len(checkpoints) >= 3  # the start one, then one per 1000 bytes or so
    gaps = [b - a for a, b in itertools.pairwise(checkpoints)]
    assert min(gaps) >= 4, leads  # not one in every write once the first 1000 bytes are logged


def _checkpoint_leads(node: Node) -> list[bool]:
    return [
        isinstance(ops.decode_all(batch.payload)[0], ops.MetadataCheckpoint)
        for buf in node.data_log.writes
        for batch in iter_batches(buf)
    ]


def test_checkpoint_every_checkpoint_operations(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(checkpoint_every_operations=5)
    monkeypatch.setattr(node.data_log, "truncate", lambda frame_seq: 0)  # keep every write to look at
    node.store.create("s")
    for _ in range(30):
        node.store.append("s", b"x")  # one operation per write, a few bytes
    checkpoints = [i for i, lead in enumerate(_checkpoint_leads(node)) if lead]
    assert len(checkpoints) >= 6, checkpoints  # the start one, then one per 5 operations
    assert all(b - a <= 6 for a, b in itertools.pairwise(checkpoints)), checkpoints


def test_checkpoint_every_checkpoint_seconds_only_once_something_was_logged(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(checkpoint_every_s=0.0)
    monkeypatch.setattr(node.data_log, "truncate", lambda frame_seq: 0)  # keep every write to look at
    node.store.create("s")
    for _ in range(3):
        node.store.append("s", b"x")
    assert _checkpoint_leads(node) == [True, False, True, True, True]  # each write after one that logged


def test_backlog_limit_throttles_appends(make_node: Callable[..., Node]) -> None:
    node = make_node(tier1_backlog_max_bytes=1000, flush_threshold_ms=60_000, flush_threshold_bytes=1 << 20)
    node.store.create("s")
    node.store.append("s", b"x" * 600)
    with pytest.raises(Throttled) as info:
        node.store.append("s", b"y" * 600)
    assert not isinstance(info.value, ContainerNotReady)
    node.store.flush()
    node.store.append("s", b"y" * 600)
    assert node.store.info("s").length == 1200


def _reader_woken_by(log: OperationLog, added: list[ops.Operation]) -> bool:
    """Whether ``add(added)`` wakes a reader waiting on an empty log (before its 5 s timeout)."""
    got: list[list[ops.Operation]] = []
    reader = threading.Thread(target=lambda: got.append(log.read(0, 10, 5)))
    reader.start()
    time.sleep(0.05)  # parked
    log.add(added)
    reader.join(0.5)
    woken = not reader.is_alive()
    log.add([ops.Seal(seq=added[-1].seq + 1)])
    reader.join(5)
    assert got and got[0][0] is added[0]
    return woken


def test_small_appends_do_not_wake_the_writer_but_enough_bytes_or_other_operations_do() -> None:
    def appended(seq: int, length: int) -> ops.Append:
        return ops.Append(seq=seq, offset=0, length=length)

    assert not _reader_woken_by(OperationLog(wake_bytes=1000), [appended(1, 400), appended(2, 400)])
    assert _reader_woken_by(OperationLog(wake_bytes=1000), [appended(1, 400), appended(2, 600)])
    assert _reader_woken_by(OperationLog(wake_bytes=1000), [appended(1, 10), ops.Truncate(seq=2)])


def test_memory_log_releases_what_the_writer_consumed() -> None:
    log = OperationLog()
    log.add([ops.Seal(seq=1), ops.Seal(seq=2)])
    log.add([ops.Seal(seq=4)])
    assert [op.seq for op in log.read(0, 10, 0)] == [1, 2, 4]
    assert [op.seq for op in log.read(1, 1, 0)] == [2]
    assert [op.seq for op in log.read(2, 10, 0)] == [4]
    with pytest.raises(AssertionError):
        log.add([ops.Seal(seq=3)])  # sequence numbers only grow
    started = time.monotonic()
    assert log.read(4, 10, 0.05) == []
    assert time.monotonic() - started >= 0.05
    log.close()
    assert log.read(4, 10, 10) == []  # closed: no waiting
