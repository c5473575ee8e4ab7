"""Faults heal by themselves; a misconfiguration is told apart from an outage.

A Tier 2 that does not answer at start is waited for; one that refuses us
(no bucket, credentials refused) makes the store refuse to start. A full
disk (Tier 1 or Tier 2) answers StorageFull and heals once space is freed,
without a restart; a restart while Tier 1 is full serves reads.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import ContainerNotReady, SegmentStore, StorageFull, Throttled, naming
from engine.container import state
from engine.tier2.chunk_storage import ChunkHandle, ChunkInfo, ChunkStorageFull, ChunkStorageUnusable
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import Node, small_settings
from tests.polling import wait_until

FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node(small_settings(tier1_backlog_max_bytes=64 * 1024, max_append_bytes=8 * 1024))
    n.start()
    yield n
    n.store.close()


class RefusingStorage(MemoryChunkStorage):
    """A Tier 2 that refuses every listing, as S3 does for a missing bucket."""

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        raise ChunkStorageUnusable("S3 list 'c0/' failed: NoSuchBucket")


def test_a_tier2_outage_at_start_is_waited_out(caplog: pytest.LogCaptureFixture) -> None:
    node = Node(small_settings())
    node.faults.outage("list")
    caplog.set_level(logging.WARNING, "engine")
    node.start(wait=False)
    try:
        wait_until(lambda: node.faults.calls["list"] >= 2, what="a second try of Tier 2")
        assert node.container.state == state.RECOVERING
        assert node.store.refusal() is None
        with pytest.raises(ContainerNotReady, match="recovering"):
            node.store.create("s")
        node.faults.end_outage()
        node.store.wait_ready(15)
        node.store.create("s")
        assert node.container.state == state.RUNNING
    finally:
        node.store.close()
    retries = [r for r in caplog.records if "Tier 2 does not answer" in r.getMessage()]
    assert retries and all(r.exc_info is None for r in retries)


def test_a_tier2_that_refuses_us_at_start_is_a_refusal_not_a_retry() -> None:
    node = Node(small_settings(), storage=RefusingStorage())
    node.start(wait=False)
    try:
        refusal = node.store.wait_refusal()
        assert refusal is not None and "NoSuchBucket" in refusal and "cannot be used" in refusal
        assert node.container.state == state.FAILED
    finally:
        node.store.close()


def test_a_restart_while_tier1_is_full_serves_reads_then_heals(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"kept")
    node.restart(wait=False, hold_tier1=True)
    node.data_log.fail_error = FULL
    node.data_log.fail_writes = 10**6
    node.data_log.gate.set()
    wait_until(lambda: node.container.state == state.READ_ONLY, what="read-only")
    assert node.store.read("s", 0).data == b"kept"
    assert node.store.info("s").length == 4
    with pytest.raises(StorageFull, match="Tier 1 is full"):
        node.store.append("s", b"lost")
    refused = node.registry.get_sample_value("segstore_throttled_requests_total", {"reason": "storage_full"})
    assert refused == 1
    assert dict((i, s) for i, s, _ in node.store.container_states()) == {0: state.READ_ONLY}
    node.data_log.fail_writes = 0  # space freed
    node.store.wait_ready(10)
    assert node.store.append("s", b"+new").offset == 4
    assert node.store.read("s", 0).data == b"kept+new"
    assert node.container.state == state.RUNNING


def test_tier1_full_at_runtime_heals_without_a_restart(node: Node) -> None:
    node.store.create("s")
    node.data_log.fail_error = FULL
    node.data_log.fail_writes = 2
    for _ in range(2):
        with pytest.raises(StorageFull):
            node.store.append("s", b"lost")
    assert node.container.state == state.READ_ONLY
    assert node.store.append("s", b"ok").offset == 0  # space freed
    assert node.container.state == state.RUNNING
    assert node.store.read("s", 0).data == b"ok"


def test_tier2_full_answers_storage_full_once_the_backlog_fills_then_heals(node: Node) -> None:
    node.store.create("s")
    node.faults.outage("create", "write", "concat", full=True)
    chunk = b"x" * 8 * 1024
    node.store.append("s", chunk)
    acknowledged = 1
    wait_until(lambda: node.container.state == state.DEGRADED, what="a failed flush")
    with pytest.raises(StorageFull, match="Tier 2 is full"):
        for _ in range(100):
            node.store.append("s", chunk)
            acknowledged += 1
    assert isinstance(node.container.storage_writer.failing, ChunkStorageFull)
    assert node.container.state == state.THROTTLED
    node.faults.end_outage()  # space freed
    wait_until(lambda: node.container.state == state.RUNNING, timeout_s=15, what="Tier 2 catching up")
    node.store.append("s", b"!")
    assert node.store.read("s", 0, 10**6).data == chunk * acknowledged + b"!"


def test_a_tier2_outage_degrades_then_throttles(node: Node) -> None:
    node.store.create("s")
    node.faults.outage()
    node.store.append("s", b"a")
    wait_until(lambda: node.container.state == state.DEGRADED, what="degraded")
    with pytest.raises(Throttled) as refused:
        for _ in range(100):
            node.store.append("s", b"x" * 8 * 1024)
    assert type(refused.value) is Throttled
    assert node.container.state == state.THROTTLED
    assert "wait for Tier 2" in (node.container.state_reason or "")
    node.faults.end_outage()
    wait_until(lambda: node.container.state == state.RUNNING, timeout_s=15, what="Tier 2 catching up")


def test_a_restart_on_a_full_disk_serves_reads_from_real_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real Tier 1 files: every os.write into the data folder fails with ENOSPC until space is freed."""
    settings = small_settings(tmp_path)
    store = SegmentStore(settings)
    store.start(wait=True)
    store.create("s")
    store.append("s", b"kept")
    store.close()
    disk = {"full": True}
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if disk["full"] and os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    store = SegmentStore(settings)
    store.start()
    try:
        wait_until(lambda: store.container_states()[0][1] == state.READ_ONLY, what="read-only")
        assert store.read("s", 0).data == b"kept"
        with pytest.raises(StorageFull):
            store.append("s", b"lost")
        disk["full"] = False
        store.wait_ready(10)
        store.append("s", b"+new")
    finally:
        store.close()
    store = SegmentStore(settings)
    store.start(wait=True)
    assert store.read("s", 0).data == b"kept+new"
    store.close()


def test_a_container_closed_during_its_recovery_does_not_wait_for_it(node: Node) -> None:
    node.store.create("s")
    node.store.append("s", b"kept")
    node.restart(wait=False, hold_tier1=True)  # recovery waits to write the new epoch's checkpoint
    wait_until(lambda: node.data_log.writes and not node.data_log.gate.is_set(), what="recovery under way")
    node.store.close()  # returns although the recovery still waits
    assert node.container.state == state.STOPPED
    written = len(node.data_log.writes)
    node.data_log.gate.set()
    assert node.container.wait_started(5)
    assert not node.container.ready and node.container.failure is None
    assert len(node.data_log.writes) <= written + 1  # at most the epoch's checkpoint: nothing started


def test_tier2_is_listed_while_tier1_is_recovered(node: Node) -> None:
    """The listing that collects Tier 2's garbage does not wait for the replay and the epoch's checkpoint."""
    node.store.create("s")
    node.store.append("s", b"kept")
    node.store.flush()
    orphan = naming.chunk_name(node.container_id, "s", 1, node.container.metadata.epoch, 4)
    node.storage.create(orphan, b"a flush whose layout update was lost")
    listed = node.faults.calls["list"]
    node.restart(wait=False, hold_tier1=True)  # recovery waits to write the new epoch's checkpoint
    wait_until(lambda: node.data_log.writes and not node.data_log.gate.is_set(), what="recovery under way")
    wait_until(lambda: node.faults.calls["list"] > listed, what="Tier 2 listed before the epoch's checkpoint")
    node.data_log.gate.set()
    node.store.wait_ready(10)
    assert node.faults.calls["list"] == listed + 1
    assert not node.storage.exists(orphan)
    assert node.store.read("s", 0, 4).data == b"kept"


class HeldWrites(MemoryChunkStorage):
    """A Tier 2 whose chunk writes wait at a gate once ``hold`` is set (a slow bucket's PUT)."""

    def __init__(self, *, supports_append: bool) -> None:
        super().__init__(supports_append=supports_append)
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def _wait(self) -> None:
        if self.hold.is_set():
            self.entered.set()
            self.gate.wait(30)

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        if data:
            self._wait()
        return super().create(name, data)

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        self._wait()
        return super().write(handle, offset, data)


@pytest.mark.parametrize("supports_append", [False, True], ids=["objects", "appends"])
def test_a_stop_waits_for_a_tier2_write_only_where_the_next_owner_could_read_it(
    supports_append: bool,
) -> None:
    """A hand-over closes the log without waiting for a flush under way on S3; all data is recovered.

    On a binding that appends, the write may extend a chunk the next epoch
    reads and joins: the stop waits for it, as before.
    """
    storage = HeldWrites(supports_append=supports_append)
    node = Node(small_settings(), storage=storage).start()
    try:
        node.store.create("s")
        node.store.append("s", b"a" * 100)
        node.store.flush()
        storage.hold.set()
        node.store.append("s", b"b" * 100)
        assert storage.entered.wait(10), "the storage writer's flush did not begin"
        opener = threading.Timer(1.5, storage.gate.set)
        opener.start()
        began = time.monotonic()
        node.store.close()
        took = time.monotonic() - began
        if supports_append:
            assert took >= 1.0, f"the stop did not wait for the write under way ({took:.2f} s)"
        else:
            assert took < 1.0, f"the stop waited {took:.2f} s for a Tier 2 write"
        opener.join()
        storage.hold.clear()
        node.restart()
        assert node.store.read("s", 0, 200).data == b"a" * 100 + b"b" * 100
        node.store.flush()
        assert node.tier2_bytes("s") == b"a" * 100 + b"b" * 100
    finally:
        storage.gate.set()
        node.close()
