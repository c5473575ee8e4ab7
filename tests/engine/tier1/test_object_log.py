"""ObjectDataLog: fencing by epoch, writes in flight, holes, ghosts, repair, truncation, corruption.

Races run on the in-memory binding, whose create is an atomic compare-and-set
(moto checks If-None-Match without a lock, so two racing creates can both
succeed there); the sequential fence also runs on moto in test_tier1_contract
and in the server tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from engine import DataCorrupted
from engine.durable_log.data_log import LogFenced, PendingWrite
from engine.naming import (
    epoch_prefix,
    wal_closed_name,
    wal_closed_prefix,
    wal_object_name,
    wal_prefix,
    wal_start_prefix,
)
from engine.tier1 import object_log_recovery
from engine.tier1.object_log import ObjectDataLog
from engine.tier1.object_log_recovery import REACH
from engine.tier1.wal_object import decode_object, encode_object
from engine.tier2.chunk_storage import ChunkExists, ChunkHandle, ChunkInfo
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage

C = 1


@pytest.fixture(autouse=True)
def _no_keeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Truncation deletes at once (one test puts the wait back)."""
    monkeypatch.setattr(object_log_recovery, "KEEP_FENCE_S", 0.0)


def opened(storage: object, in_flight: int = 4) -> tuple[ObjectDataLog, list[bytes]]:
    log = ObjectDataLog(storage, C, max_frame_bytes=4096, max_writes_in_flight=in_flight)  # type: ignore[arg-type]
    return log, [b.payload for b in log.recover() if b.payload]


def wal(storage: MemoryChunkStorage) -> list[int]:
    return sorted(int(n.rpartition("/")[2]) for n in storage.chunks if n.startswith(wal_prefix(C)))


def held(log: ObjectDataLog, *payloads: bytes) -> list[PendingWrite]:
    """Writes begun together, as the durable log does with several in flight."""
    return [log.begin(p) for p in payloads]


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


def test_writes_in_flight_complete_in_any_order_and_read_back_in_order() -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    writes = held(log, b"one", b"two", b"three")
    assert [w.index for w in writes] == [writes[0].index + i for i in range(3)]
    assert [w.first_frame_seq for w in writes] == [writes[0].first_frame_seq + i for i in range(3)]
    for w in reversed(writes):
        log.write(w)
    # Each write records how much of the log was in the bucket when it was begun.
    assert {decode_object("", bytes(storage.chunks[wal_object_name(C, w.index)])).base for w in writes} == {
        writes[0].index
    }
    assert decode_object("", log.begin(b"four").data).base == writes[-1].index + 1
    assert opened(storage)[1] == [b"one", b"two", b"three"]


def test_zombie_writes_in_flight_that_had_not_landed_are_fenced_and_those_after_them_are_ghosts() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"acknowledged")
    w1, w2, w3, w4 = held(old, b"w1", b"w2", b"w3", b"w4")
    old.write(w2)  # w2 and w4 landed; w1 and w3 are still on their way
    old.write(w4)
    new, payloads = opened(storage)
    assert payloads == [b"acknowledged"]  # w2 and w4 follow a hole: never acknowledged
    for late in (w3, w1):
        with pytest.raises(LogFenced):
            old.write(late)
        old._fenced = None
    new.append(b"new")
    assert opened(storage)[1] == [b"acknowledged", b"new"]


def test_the_zombie_s_writes_that_landed_in_order_before_the_fence_are_kept() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    w1, w2, w3, w4 = held(old, b"w1", b"w2", b"w3", b"w4")
    old.write(w1)
    old.write(w2)  # w1 and w2 may be acknowledged: the new owner must have them
    old.write(w4)
    assert opened(storage)[1] == [b"w1", b"w2"]
    with pytest.raises(LogFenced):
        old.write(w3)


def test_no_write_of_the_zombie_lands_after_the_fence() -> None:
    """Every name a writer with REACH writes in flight could still create is taken by the fence."""
    storage = MemoryChunkStorage()
    old, _ = opened(storage, in_flight=REACH)
    old.append(b"acknowledged")
    pending = held(old, *[b"w%d" % i for i in range(REACH)])
    opened(storage)
    for w in reversed(pending):
        with pytest.raises(LogFenced):
            old.write(w)
        old._fenced = None  # as a writer that has not seen the others fail yet
    assert opened(storage)[1] == [b"acknowledged"]


def _recover_at_once(storage: MemoryChunkStorage, count: int) -> list[ObjectDataLog]:
    """``count`` logs recovering at the same moment; those whose recovery was not fenced."""
    logs: list[ObjectDataLog] = []
    barrier = threading.Barrier(count)

    def start() -> None:
        log = ObjectDataLog(storage, C, max_frame_bytes=4096, max_writes_in_flight=4)
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
            try:  # a losing recovery's empty claims in the winner's way cost it a failed write
                append_through_failures(log, b"mine")
                writers.append(log)
            except LogFenced:
                pass
        assert len(writers) == 1, len(writers)
        assert opened(storage)[1] == [b"base", b"mine"]


class StaleListing(MemoryChunkStorage):
    """Its next listing of the log's writes once an epoch is claimed (the fence's, not recovery's early
    read) misses the ``hidden`` names (writes that landed right after it); ``after`` runs right after
    that listing."""

    hidden: set[str] = set()
    after: Callable[[], None] | None = None
    claimed = False

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        handle = super().create(name, data)
        if name.startswith(epoch_prefix(C)):
            self.claimed = True
        return handle

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        if prefix != wal_prefix(C) or not self.claimed:
            return super().list(prefix)
        self.claimed = False
        hidden, self.hidden = self.hidden, set()
        listed = [info for info in super().list(prefix) if info.name not in hidden]
        after, self.after = self.after, None
        if after is not None:
            after()
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


def test_a_fence_in_names_a_truncation_freed_is_taken_again() -> None:
    """The old writer wrote on, past the new owner's fence, and truncated while the new owner
    fenced: the names the new owner took below the log's new start are no fence, which it must
    notice (else the old writer's next write would land unseen)."""
    storage = StaleListing()
    old, _ = opened(storage, in_flight=1)
    for i in range(4):
        old.append(bytes([i]))
    count = 4 + 2 * REACH

    def write_on_and_truncate() -> None:
        addresses = [old.append(bytes([i]))[0] for i in range(4, count)]
        old.truncate(addresses[-2])  # records the new start, then deletes the names below it

    storage.after = write_on_and_truncate
    new, payloads = opened(storage)
    assert payloads == [bytes([count - 2]), bytes([count - 1])]
    assert [i for i in wal(storage) if i < new._log_start], "the first fence's names below the start stay"
    with pytest.raises(LogFenced):
        old.append(b"late")
    new.append(b"new")
    assert opened(storage)[1] == [bytes([count - 2]), bytes([count - 1]), b"new"]


def test_a_writer_that_moved_on_during_the_fence_is_fenced_past_where_it_got() -> None:
    storage = StaleListing()
    old, _ = opened(storage, in_flight=REACH)
    old.append(b"listed")
    pending: list[PendingWrite] = []

    def move_on() -> None:
        old.append(b"landed during the fence")
        old.append(b"this one too")
        pending.extend(held(old, *[b"in flight %d" % i for i in range(REACH)]))

    storage.after = move_on
    new, payloads = opened(storage)
    assert payloads == [b"listed", b"landed during the fence", b"this one too"]
    for late in reversed(pending):  # each lands in a name the fence took (the highest first)
        with pytest.raises(LogFenced):
            old.write(late)
        old._fenced = None  # as a writer that has not seen the others fail yet
    new.append(b"new")
    assert opened(storage)[1] == [*payloads, b"new"]


def test_a_missing_object_followed_by_a_write_begun_after_it_landed_is_corruption() -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    log.append(b"a")
    middle = log._next_index - 1
    log.append(b"b")
    opened(storage)  # a newer writer's fence follows
    del storage.chunks[wal_object_name(C, middle)]
    with pytest.raises(DataCorrupted, match="missing"):
        opened(storage)


def test_a_hole_filled_right_after_the_listing_is_no_corruption() -> None:
    """A racing recovery claims a name just after our listing missed it, and names above it with a
    base past it: that hole is in the bucket when we judge it, so we look again instead of failing."""
    storage = StaleListing()
    log, _ = opened(storage)
    log.append(b"a")
    middle = log._next_index - 1
    log.append(b"b")
    storage.hidden = {wal_object_name(C, middle)}  # the fence's listing misses it: filled just after
    new, payloads = opened(storage)
    assert payloads == [b"a", b"b"]
    new.append(b"c")
    assert opened(storage)[1] == [b"a", b"b", b"c"]


def test_a_hole_below_the_last_write_is_corruption_too() -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    log.append(b"acknowledged")
    log.append(b"acknowledged too")
    del storage.chunks[wal_object_name(C, log._next_index - 2)]
    with pytest.raises(DataCorrupted, match="missing"):
        opened(storage)


def test_the_object_the_log_starts_at_must_be_there() -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage, in_flight=1)
    addresses = [log.append(bytes([i]) * 10)[0] for i in range(4)]
    log.truncate(addresses[2])
    [start] = [n for n in storage.chunks if n.startswith(wal_start_prefix(C))]
    del storage.chunks[wal_object_name(C, int(start.rpartition("/")[2]))]
    with pytest.raises(DataCorrupted, match="where the log starts"):
        opened(storage)


@pytest.mark.parametrize("where", [2, 40], ids=["header", "frames"])
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
    faulty.fail("info")
    with pytest.raises(OSError):
        log.append(b"unknown")
    with pytest.raises(OSError, match="unusable"):
        log.append(b"refused")
    assert opened(inner)[1] == []


def test_after_a_failed_write_the_writes_that_landed_behind_it_read_as_ghosts() -> None:
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner)
    log, _ = opened(faulty)
    log.append(b"kept")
    w1, w2 = held(log, b"failed", b"landed behind it")
    log.write(w2)
    faulty.fail("create")
    with pytest.raises(OSError):
        log.write(w1)
    log.abandon(w1)
    after = log.begin(b"after")  # a new generation takes the failed write's name first
    assert after.first_frame_seq == w1.first_frame_seq and after.index > w2.index
    log.write(after)
    assert opened(inner)[1] == [b"kept", b"after"]


def test_a_repair_that_fails_is_tried_again_by_the_next_write() -> None:
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner)
    log, _ = opened(faulty)
    w1, w2 = held(log, b"failed", b"landed")
    log.write(w2)
    faulty.fail("create")
    with pytest.raises(OSError):
        log.write(w1)
    faulty.outage("create")
    with pytest.raises(OSError, match="repair"):
        log.abandon(w1)  # repairs at once: the caller learns the failed writes may still land
    with pytest.raises(OSError, match="repair"):
        log.begin(b"not yet")
    faulty.end_outage()
    log.append(b"after the outage")
    assert opened(inner)[1] == [b"after the outage"]


def failed_write(payload: bytes) -> tuple[MemoryChunkStorage, ObjectDataLog, PendingWrite]:
    """A log whose write of ``payload`` failed (its create raised, nothing stored); not abandoned yet."""
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner)
    log, _ = opened(faulty)
    pending = log.begin(payload)
    faulty.fail("create")
    with pytest.raises(OSError):
        log.write(pending)
    return inner, log, pending


def test_a_write_taken_for_failed_that_landed_after_all_breaks_the_log() -> None:
    inner, log, w1 = failed_write(b"late")
    inner.create(wal_object_name(C, w1.index), w1.data)  # the request landed after its error
    with pytest.raises(OSError, match="landed after all"):
        log.abandon(w1)  # found before the write's caller is answered
    with pytest.raises(OSError, match="unusable"):
        log.begin(b"next")


def test_abandoning_a_failed_write_takes_its_name_so_a_late_landing_cannot_happen() -> None:
    inner, log, w1 = failed_write(b"late")
    log.abandon(w1)
    with pytest.raises(ChunkExists):
        inner.create(wal_object_name(C, w1.index), w1.data)  # the request arriving after all
    assert opened(inner)[1] == []


def test_a_writer_that_did_not_look_for_a_newer_owner_lately_does_before_it_acknowledges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"acknowledged")
    ObjectDataLog(storage, C)._new_epoch()  # a new owner claimed its epoch, and is slow to fence
    old.append(b"within CONFIRM_S of the last look")
    monkeypatch.setattr(object_log_recovery, "CONFIRM_S", 0.0)
    old.append(b"landed where the new owner will read it: it stands")
    with pytest.raises(LogFenced):  # but the writer stops
        old.append(b"refused")


def test_a_paused_writer_never_acknowledges_a_write_in_a_name_a_truncation_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"acknowledged")
    paused = old.begin(b"begun before the pause")
    new, _ = opened(storage)  # fences, writes on and truncates while the old writer is paused
    addresses = [new.append(bytes([i]))[0] for i in range(3)]
    new.truncate(addresses[-1])
    for name in [n for n in storage.chunks if n.startswith(wal_prefix(C))]:
        if int(name.rpartition("/")[2]) < new._log_start:
            del storage.chunks[name]  # KEEP_FENCE_S later: the fence's names are gone too
    monkeypatch.setattr(object_log_recovery, "CONFIRM_S", 0.0)  # the pause outlasted CONFIRM_S
    with pytest.raises(LogFenced):
        old.write(paused)  # its create succeeds, in a freed name
    assert opened(storage)[1] == [bytes([2])]


def test_truncation_records_the_start_then_deletes_below_it() -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage, in_flight=1)
    addresses = [log.append(bytes([i]) * 10)[0] for i in range(6)]
    assert log.truncate(addresses[4]) > 0
    [start] = [int(n.rpartition("/")[2]) for n in storage.chunks if n.startswith(wal_start_prefix(C))]
    assert wal(storage)[0] == start
    assert opened(storage)[1] == [bytes([i]) * 10 for i in (4, 5)]


def test_objects_below_the_start_are_no_part_of_the_log() -> None:
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner)
    log, _ = opened(faulty, in_flight=1)
    addresses = [log.append(bytes([i]) * 10)[0] for i in range(6)]
    faulty.fail("delete", 100)
    assert log.truncate(addresses[4]) == 0  # the start moved; nothing could be deleted
    assert opened(inner)[1] == [bytes([i]) * 10 for i in (4, 5)]
    faulty.clear()
    log, _ = opened(inner)
    log.truncate(0)  # the next truncation (of anything) collects what lies below the start
    assert wal(inner)[0] >= addresses[4]


def test_names_the_fence_covered_stay_until_keep_fence_s_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage, in_flight=1)
    monkeypatch.setattr(object_log_recovery, "KEEP_FENCE_S", 3600.0)
    log, _ = opened(storage, in_flight=1)
    fenced = wal(storage)
    addresses = [log.append(bytes([i]) * 10)[0] for i in range(4)]
    log.truncate(addresses[3])
    assert set(fenced) <= set(wal(storage)), "fence names deleted within KEEP_FENCE_S"
    assert opened(storage)[1] == [bytes([3]) * 10]


def test_epochs_grow_and_only_the_newest_claim_stays_once_the_log_truncates() -> None:
    storage = MemoryChunkStorage()
    logs = [opened(storage)[0] for _ in range(3)]
    epochs = [log.epoch for log in logs]
    assert epochs == sorted(set(epochs))
    logs[-1].append(b"one")
    logs[-1].truncate(logs[-1].append(b"two")[0])  # the older claims go with the log's garbage
    claims = [n for n in storage.chunks if n.startswith(epoch_prefix(C))]
    assert claims == [f"{epoch_prefix(C)}{epochs[-1]:020d}"]


class BusyOldWriter(MemoryChunkStorage):
    """After each of its first ``rounds`` listings of the log, the old writer gets ``burst`` writes in.

    One old writer, whichever thread lists (recovery lists from two: its early read and its fence):
    its bursts go one after another, so ``written`` is in the log's order.
    """

    old: ObjectDataLog | None = None
    rounds = 0
    burst = 3
    written: list[bytes] = []
    one_writer = threading.Lock()

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        listed = list(super().list(prefix))
        if prefix == wal_prefix(C):
            with self.one_writer:
                self._burst()
        return iter(listed)

    def _burst(self) -> None:
        if self.old is not None and self.rounds:
            self.rounds -= 1
            for _ in range(self.burst):
                payload = b"busy %d" % len(self.written)
                try:
                    self.old.append(payload)
                except LogFenced:
                    self.old = None
                    break
                self.written.append(payload)


@pytest.mark.parametrize("burst", [3, 40])
def test_a_busy_old_writer_is_fenced_by_aiming_further_ahead(burst: int) -> None:
    storage = BusyOldWriter()
    old, _ = opened(storage, in_flight=1)
    old.append(b"before")
    storage.old, storage.rounds, storage.burst, storage.written = old, 100, burst, []
    new, payloads = opened(storage)  # the old writer is busier than recovery is patient
    assert payloads == [b"before", *storage.written]  # every write the old writer got in is kept
    assert storage.old is None  # it met the fence while recovery went on
    with pytest.raises(LogFenced):
        old.append(b"after the fence")
    new.append(b"new")
    assert opened(storage)[1] == [b"before", *storage.written, b"new"]


class PausedAfterEpoch(MemoryChunkStorage):
    """Runs ``meanwhile`` right after the next claim of an epoch (that recovery pauses there)."""

    meanwhile: Callable[[], None] | None = None

    def create(self, name: str, data: bytes) -> None:
        super().create(name, data)
        if name.startswith(epoch_prefix(C)) and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()


def test_a_recovery_fencing_after_the_winner_recovered_is_fenced_and_the_winner_writes_past_it() -> None:
    """Recovery A claims its epoch, then pauses while B claims a newer one and recovers entirely;
    A then lists B's objects and claims names past them, where B's first writes go. A is fenced
    (B's epoch is newer); B must not find its log unusable: A's empty objects there are no writes
    and read as nothing, so B writes past them."""
    storage = PausedAfterEpoch()
    first, _ = opened(storage)
    first.append(b"base")
    winner: list[ObjectDataLog] = []
    storage.meanwhile = lambda: winner.append(opened(storage)[0])
    loser = ObjectDataLog(storage, C, max_frame_bytes=4096, max_writes_in_flight=4)
    with pytest.raises(LogFenced):
        list(loser.recover())
    (log,) = winner
    assert log.epoch > loser.epoch
    taken_by_loser = [i for i in wal(storage) if i >= log._next_index]
    assert taken_by_loser, "the losing recovery claimed names where the winner writes next"
    failures = sum(append_through_failures(log, payload) for payload in (b"one", b"two", b"three"))
    assert failures == 1  # the write that met A's claims; its repair goes past all of them
    assert opened(storage)[1] == [b"base", b"one", b"two", b"three"]


def append_through_failures(log: ObjectDataLog, payload: bytes) -> int:
    """Append as the durable log does (a failed write, not a fence, abandoned and sent again): failures."""
    for failures in range(4 * REACH):
        try:
            log.append(payload)
            return failures
        except LogFenced:
            raise
        except OSError:
            continue
    raise AssertionError("the write never landed")


def test_claims_of_a_losing_recovery_past_the_fence_with_gaps_between_end_the_log_at_the_first_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recovery that lost (older epoch) claims its farthest name first: the winner may list it with
    free names below it, past its own fence. That is no missing write: the log ends at the gap."""
    storage = MemoryChunkStorage()
    first, _ = opened(storage)
    first.append(b"base")
    read_log = ObjectDataLog._read_log

    def claimed_meanwhile(self: ObjectDataLog, cache: dict[int, object]) -> list[object]:
        far = self._fence_top + 2 * REACH
        storage.create(wal_object_name(C, far), encode_object((self.epoch - 1, 0), 0, b""))
        return read_log(self, cache)  # type: ignore[arg-type]

    monkeypatch.setattr(ObjectDataLog, "_read_log", claimed_meanwhile)
    log, payloads = opened(storage)
    monkeypatch.undo()
    assert payloads == [b"base"]
    failures = sum(append_through_failures(log, payload) for payload in (b"one", b"two"))
    assert failures <= 1
    assert opened(storage)[1] == [b"base", b"one", b"two"]


def closes(storage: MemoryChunkStorage) -> list[str]:
    return sorted(n for n in storage.chunks if n.startswith(wal_closed_prefix(C)))


def test_a_log_closed_cleanly_is_taken_over_without_a_fence_and_its_writer_never_writes_again() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"one")
    old.append(b"two")
    old.close()
    assert closes(storage) == [wal_closed_name(C, old.epoch, old._next_index)]
    names = wal(storage)
    new, payloads = opened(storage)
    assert payloads == [b"one", b"two"]
    assert wal(storage) == names  # no fence: not one name claimed
    assert new.epoch == old.epoch + 1
    with pytest.raises(OSError, match="closed"):
        old.append(b"zombie")
    new.append(b"three")
    assert wal(storage) == [*names, names[-1] + 1]
    _, payloads = opened(storage)  # the new owner did not close: fenced as after a crash
    assert payloads == [b"one", b"two", b"three"]
    assert len(wal(storage)) > len(names) + 1
    with pytest.raises(LogFenced):
        new.append(b"zombie")


def test_a_clean_close_counts_only_for_the_epoch_right_after_its_writer_s() -> None:
    """A writer whose clean close is recorded late (paused between its stop and its record) while a
    newer owner already writes: the next recovery must fence that newer owner."""
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"one")
    new, _ = opened(storage)
    new.append(b"two")
    old.close()  # old was fenced without knowing it: it records a clean close of its epoch
    assert closes(storage)
    third, payloads = opened(storage)
    assert payloads == [b"one", b"two"]
    with pytest.raises(LogFenced):
        new.append(b"zombie")
    third.append(b"three")
    assert opened(storage)[1] == [b"one", b"two", b"three"]


def test_a_claimed_epoch_between_the_clean_close_and_the_next_recovery_means_a_fence() -> None:
    storage = MemoryChunkStorage()
    old, _ = opened(storage)
    old.append(b"one")
    old.close()
    ObjectDataLog(storage, C)._new_epoch()  # a recovery that claimed its epoch and is slow to fence
    names = wal(storage)
    assert opened(storage)[1] == [b"one"]
    assert len(wal(storage)) > len(names)


@pytest.mark.parametrize("state", ["write out", "failed write", "fenced"])
def test_a_log_not_settled_records_no_clean_close(state: str) -> None:
    storage = MemoryChunkStorage()
    log, _ = opened(storage)
    log.append(b"one")
    if state == "write out":
        pending = log.begin(b"two")
    elif state == "failed write":
        log._repair_from = log._next_index  # as after a failed write not repaired yet
    else:
        opened(storage)
        with pytest.raises(LogFenced):
            log.append(b"two")
    log.close()
    assert closes(storage) == []
    if state == "write out":
        with pytest.raises(OSError, match="closed"):
            log.write(pending)
    assert opened(storage)[1] == [b"one"]


class CountedReads(MemoryChunkStorage):
    """Counts the reads of each WAL object; its next epoch claim waits (up to 5 s) for one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[str, int] = {}
        self.read_once = threading.Event()
        self.claim_waits = False
        self.read_before_claim: bool | None = None

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        if handle.name.startswith(wal_prefix(C)):
            self.reads[handle.name] = self.reads.get(handle.name, 0) + 1
            self.read_once.set()
        return super().read(handle, offset, length)

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        if self.claim_waits and name.startswith(epoch_prefix(C)):
            self.claim_waits = False
            self.read_before_claim = self.read_once.wait(5)
        return super().create(name, data)


@pytest.mark.parametrize("clean", [True, False], ids=["after a clean close", "fenced"])
def test_recovery_reads_the_log_while_it_claims_its_epoch_and_reads_no_object_twice(clean: bool) -> None:
    storage = CountedReads()
    old, _ = opened(storage)
    payloads = [b"write %d" % i for i in range(40)]
    for payload in payloads:
        old.append(payload)
    if clean:
        old.close()
    storage.reads.clear()
    storage.claim_waits = True
    _, read = opened(storage)
    assert read == payloads
    assert storage.read_before_claim, "the log's objects were read only after the epoch was claimed"
    assert storage.reads and max(storage.reads.values()) == 1, storage.reads


class TimedListings(MemoryChunkStorage):
    """Once an epoch is claimed, each listing of the epochs or the WAL takes 0.2 s and is timed."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed = False
        self.epochs: list[tuple[float, float]] = []
        self.wal: list[tuple[float, float]] = []

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        handle = super().create(name, data)
        self.claimed = self.claimed or name.startswith(epoch_prefix(C))
        return handle

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        timed = {epoch_prefix(C): self.epochs, wal_prefix(C): self.wal}.get(prefix)
        if not self.claimed or timed is None:
            return super().list(prefix)
        began = time.monotonic()
        time.sleep(0.2)
        listed = [*super().list(prefix)]
        timed.append((began, time.monotonic()))
        return iter(listed)


@pytest.mark.parametrize("clean", [True, False], ids=["after a clean close", "fenced"])
def test_recovery_looks_for_a_newer_epoch_while_it_lists_the_log_to_read_it(clean: bool) -> None:
    storage = TimedListings()
    old, _ = opened(storage)
    for i in range(5):
        old.append(b"write %d" % i)
    if clean:
        old.close()
    storage.claimed = False
    storage.epochs.clear()
    storage.wal.clear()
    _, read = opened(storage)
    assert read == [b"write %d" % i for i in range(5)]
    (check,) = storage.epochs  # the epoch's claim listed them before it was claimed: not timed
    assert any(check[0] < end and start < check[1] for start, end in storage.wal), (check, storage.wal)
