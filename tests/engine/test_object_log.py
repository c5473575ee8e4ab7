"""ObjectDataLog: fencing by epoch, races, ghosts, late writes, corruption, unknown outcomes.

Races run on the in-memory binding, whose create is an atomic compare-and-set
(moto checks If-None-Match without a lock, so two racing creates can both
succeed there); the sequential fence also runs on moto in test_tier1_contract
and in the server tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from engine import DataCorrupted
from engine.durable_log import frames
from engine.durable_log.data_log import LogFenced
from engine.durable_log.object_log import ObjectDataLog, encode_object
from engine.naming import wal_object_name, wal_prefix
from engine.tier2.chunk_storage import ChunkInfo
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage

C = 1


def opened(storage: object) -> tuple[ObjectDataLog, list[bytes]]:
    log = ObjectDataLog(storage, C, max_frame_bytes=4096)  # type: ignore[arg-type]
    return log, [b.payload for b in log.recover() if b.payload]


def wal(storage: MemoryChunkStorage) -> list[str]:
    return sorted(storage.chunks)


def test_a_new_owner_fences_the_old_one_which_never_writes_again() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"acknowledged")
    new, payloads = opened(storage)
    assert payloads == [b"acknowledged"]
    assert new.epoch > old.epoch
    with pytest.raises(LogFenced):
        old.append(b"zombie")
    with pytest.raises(LogFenced):  # and for good, without asking the store again
        old.append(b"zombie again")
    new.append(b"new")
    assert opened(storage)[1] == [b"acknowledged", b"new"]


def _recover_at_once(storage: MemoryChunkStorage, count: int) -> list[ObjectDataLog]:
    """``count`` logs recovering at the same moment; those whose recovery was not fenced."""
    logs: list[ObjectDataLog] = []
    barrier = threading.Barrier(count)

    def start() -> None:
        log = ObjectDataLog(storage, C, max_frame_bytes=4096)
        barrier.wait()
        try:
            list(log.recover())
        except LogFenced:
            return
        logs.append(log)

    threads = [threading.Thread(target=start) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return logs


def test_racing_recoveries_leave_exactly_one_writer() -> None:
    for _ in range(30):
        storage = MemoryChunkStorage()
        first, _ = opened(storage)
        first.append(b"base")
        writers = []
        for log in _recover_at_once(storage, 3):
            try:
                log.append(b"mine")
                writers.append(log)
            except LogFenced:
                pass
        assert len(writers) == 1, len(writers)
        assert opened(storage)[1] == [b"base", b"mine"]


class StaleListing(MemoryChunkStorage):
    """Its first listing misses the ``hidden`` names: writes that landed right after it."""

    hidden: set[str] = set()
    vanish: set[str] = set()  # deleted right after the first listing names them

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        hidden, self.hidden = self.hidden, set()
        listed = [info for info in super().list(prefix) if info.name not in hidden]
        for name in self.vanish:
            self.delete(name)
        self.vanish = set()
        return iter(listed)


def test_a_write_landing_after_the_listing_is_kept_and_fenced_after() -> None:
    storage = StaleListing()
    old, _ = opened(storage)
    old.append(b"one")
    old.append(b"two, landed after the new owner listed")
    storage.hidden = {wal_object_name(C, old._next_index - 1)}
    _, payloads = opened(storage)
    assert payloads == [b"one", b"two, landed after the new owner listed"]
    with pytest.raises(LogFenced):
        old.append(b"three")


def _ghost(storage: MemoryChunkStorage, epoch: int, log: ObjectDataLog, payload: bytes) -> None:
    """A write of an older ``epoch`` where ``log`` writes next: one that lands after a fence."""
    body, _ = frames.encode_batch(payload, log._next_seq, 4096)
    storage.create(wal_object_name(C, log._next_index), encode_object(epoch, body))


def test_a_ghost_of_a_fenced_writer_is_replaced_by_the_owner() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"acknowledged")
    new, _ = opened(storage)
    _ghost(storage, old.epoch, new, b"pipelined by the old writer, never acknowledged")
    new.append(b"owner's")
    assert opened(storage)[1] == [b"acknowledged", b"owner's"]


def test_a_ghost_met_at_recovery_is_not_replayed() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"acknowledged")
    new, _ = opened(storage)
    _ghost(storage, old.epoch, new, b"ghost")
    third, payloads = opened(storage)
    assert payloads == [b"acknowledged"]
    third.append(b"third")
    assert opened(storage)[1] == [b"acknowledged", b"third"]


def test_a_missing_object_before_a_newer_writer_is_corruption() -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    log.append(b"a")
    middle = log._next_index - 1
    log.append(b"b")
    opened(storage)  # a newer writer's fence follows
    storage.delete(wal_object_name(C, middle))
    with pytest.raises(DataCorrupted, match="missing"):
        opened(storage)


def test_a_hole_at_the_tail_is_corruption_too() -> None:
    """Writes are sequential: a write after a missing one means the missing one was lost."""
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    log.append(b"acknowledged")
    log.append(b"acknowledged too")
    storage.delete(wal_object_name(C, log._next_index - 2))
    with pytest.raises(DataCorrupted, match="missing"):
        opened(storage)


def test_a_fence_in_a_hole_the_log_moved_past_is_taken_back() -> None:
    """The old writer wrote on and truncated while the new owner listed: its fence landed in a
    name the log had left behind, which it must notice rather than take the log's end for there."""
    storage = StaleListing()
    old, _ = opened(storage)
    for i in range(4):
        old.append(bytes([i]))
    stale_end = old._next_index
    for i in range(4, 8):
        old.append(bytes([i]))
    storage.hidden = {wal_object_name(C, i) for i in range(stale_end, old._next_index)}
    truncated = {wal_object_name(C, i) for i in range(stale_end + 2)}
    storage.vanish = truncated  # listed, then gone before they are read
    _, payloads = opened(storage)
    assert payloads == [bytes([i]) for i in range(6, 8)]  # writes 4 and 5 went with the truncation
    with pytest.raises(LogFenced):
        old.append(b"late")


@pytest.mark.parametrize("where", [2, 20], ids=["header", "frames"])
def test_a_corrupt_object_is_corruption(where: int) -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    log.append(b"payload bytes")
    storage.chunks[wal_object_name(C, log._next_index - 1)][where] ^= 0xFF
    with pytest.raises(DataCorrupted):
        opened(storage)


def test_an_answer_lost_after_the_write_landed_is_a_success() -> None:
    faulty = FaultyChunkStorage(MemoryChunkStorage())
    log, _ = opened(faulty)
    faulty.fail_after_landing("create")
    log.append(b"landed")
    log.append(b"next")
    assert opened(faulty)[1] == [b"landed", b"next"]


def test_an_unknown_outcome_breaks_the_log_until_a_restart() -> None:
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner)
    log, _ = opened(faulty)
    faulty.fail("create")
    faulty.fail("open_read")
    with pytest.raises(OSError):
        log.append(b"unknown")
    with pytest.raises(OSError, match="unusable"):
        log.append(b"refused")
    assert opened(inner)[1] == []


def test_truncation_deletes_oldest_first_and_stops_at_a_failure() -> None:
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner)
    log, _ = opened(faulty)
    addresses = [log.append(bytes([i]) * 10)[0] for i in range(6)]
    fifth = log._next_index - 2
    faulty.fail("delete")
    assert log.truncate(addresses[4]) == 0
    assert log.truncate(addresses[4]) > 0
    names = [n for n in wal(inner) if n.startswith(wal_prefix(C))]
    assert names[0] == wal_object_name(C, fifth)
    assert opened(inner)[1] == [bytes([i]) * 10 for i in (4, 5)]


class BusyOldWriter(MemoryChunkStorage):
    """After each of its first ``rounds`` listings, the old writer gets three more writes in."""

    old: ObjectDataLog | None = None
    rounds = 0
    written: list[bytes] = []

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        listed = list(super().list(prefix))
        if self.old is not None and self.rounds and prefix == wal_prefix(C):
            self.rounds -= 1
            for _ in range(3):
                payload = b"busy %d" % len(self.written)
                try:
                    self.old.append(payload)
                except LogFenced:
                    self.old = None
                    break
                self.written.append(payload)
        return iter(listed)


def test_a_busy_old_writer_is_fenced_by_aiming_further_ahead() -> None:
    storage = BusyOldWriter()
    old, _ = opened(storage)
    old.append(b"before")
    storage.old, storage.rounds, storage.written = old, 100, []  # busier than recovery is patient
    new, payloads = opened(storage)
    assert payloads == [b"before", *storage.written]  # every write the old writer got in is kept
    assert storage.old is None  # it met the fence while recovery went on
    with pytest.raises(LogFenced):
        old.append(b"after the fence")
    new.append(b"new")
    assert opened(storage)[1] == [b"before", *storage.written, b"new"]
