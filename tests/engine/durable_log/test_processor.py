"""The durable log with several Tier 1 writes in flight (an object-store Tier 1).

Batches are validated on top of the batches still in flight, written at
once, and acknowledged strictly in order; a failed write fails every batch
begun after it (whether or not its own write landed), and a fence fails all
of them for good: with 503 when the new owner surely does not read their
write, else with ``OutcomeUnknown``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from engine import ContainerNotReady, OutcomeUnknown, SegmentStore
from engine.completion import Completion
from engine.container.segment_container import SegmentContainer
from engine.durable_log import processor
from engine.durable_log.metadata_updater import Outcome
from engine.metadata import operations as ops
from engine.metrics import EngineMetrics
from engine.naming import wal_prefix
from engine.tier1 import object_log_recovery
from engine.tier1.object_log import ObjectDataLog
from engine.tier2.chunk_storage import ChunkHandle, ChunkStorageError
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import small_settings
from tests.polling import wait_until

W = uuid.UUID(int=7)


class GatedWal(MemoryChunkStorage):
    """Tier 1 objects whose creates take ``delay_s``, wait at a gate while it is closed, or fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.answers = threading.Event()  # the answer of write ``held`` waits here, once it is stored
        self.held: int | None = None
        self.stored: set[int] = set()
        self.entered = 0
        self.most_at_once = 0
        self.delay_s = 0.0
        self.failing: list[int] = []  # write numbers whose next create fails (before storing), once each
        self._running = 0
        self._count_lock = threading.Lock()

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        if not name.startswith(wal_prefix(0)):
            return super().create(name, data)
        with self._count_lock:
            self.entered += 1
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        try:
            time.sleep(self.delay_s)
            self.gate.wait()
            if int(name.rpartition("/")[2]) in self.failing:
                self.failing.remove(int(name.rpartition("/")[2]))
                raise ChunkStorageError(f"injected failure of {name}")
            handle = super().create(name, data)
            index = int(name.rpartition("/")[2])
            self.stored.add(index)
            if index == self.held:
                self.answers.wait()
            return handle
        finally:
            with self._count_lock:
                self._running -= 1


class Pipelined:
    """One container whose Tier 1 is an object log on ``wal`` taking four writes at once."""

    def __init__(self, wal: GatedWal, tier2: MemoryChunkStorage | None = None) -> None:
        self.wal = wal
        self.tier2 = tier2 or MemoryChunkStorage()
        settings = small_settings(tier1_writes_in_flight=4, flush_threshold_ms=60_000)
        self.data_log = ObjectDataLog(
            wal, 0, max_frame_bytes=settings.max_frame_bytes, max_writes_in_flight=4
        )
        self.container = SegmentContainer(
            0, settings, self.data_log, self.tier2, EngineMetrics(CollectorRegistry())
        )
        self.store = SegmentStore(settings, containers=[self.container])
        self.store.start(wait=True)

    def add(self, op: ops.Operation) -> Completion[Outcome]:
        return self.container.durable_log.add(op)

    def add_in_flight(self, op: ops.Operation) -> Completion[Outcome]:
        """Queue ``op`` and wait until its Tier 1 write is at the (closed) gate."""
        entered = self.wal.entered
        future = self.add(op)
        wait_until(lambda: self.wal.entered > entered, what="the write at the gate")
        return future

    def restart(self) -> Pipelined:
        self.wal.gate.set()
        self.wal.answers.set()
        self.store.close()
        return Pipelined(self.wal, self.tier2)

    def read_after_restart(self, name: str) -> bytes:
        """What ``name`` holds once the container is recovered anew from Tier 1 and Tier 2."""
        restarted = self.restart()
        try:
            return restarted.store.read(name, 0).data
        finally:
            restarted.store.close()


@pytest.fixture
def pipelined() -> Iterator[Pipelined]:
    node = Pipelined(GatedWal())
    yield node
    node.wal.gate.set()
    node.wal.answers.set()
    node.store.close()


def append(name: str, data: bytes, **conditions: Any) -> ops.Append:
    return ops.Append(name=name, data=data, **conditions)


def test_batches_in_flight_are_validated_on_top_of_each_other(pipelined: Pipelined) -> None:
    pipelined.store.create("s")
    pipelined.wal.gate.clear()
    futures = [
        pipelined.add_in_flight(append("s", b"one", expected_offset=0)),
        pipelined.add_in_flight(append("s", b"two", expected_offset=3)),
        pipelined.add_in_flight(ops.CreateSegment(name="t", created=time.time())),
        pipelined.add_in_flight(append("t", b"new", writer_id=W, event_number=1)),
        pipelined.add(append("t", b"dup", writer_id=W, event_number=1)),  # waits for room
    ]
    time.sleep(0.05)
    assert not any(f.done() for f in futures)
    assert pipelined.wal.most_at_once == 4
    pipelined.wal.gate.set()
    outcomes = [f.result() for f in futures]
    assert outcomes[-1].duplicate_of == 1
    assert pipelined.store.read("s", 0).data == b"onetwo"
    assert pipelined.store.read("t", 0).data == b"new"
    restarted = pipelined.restart()
    assert restarted.store.read("s", 0).data == b"onetwo"
    assert restarted.store.writer_event_number("t", W) == 1
    restarted.store.close()


def test_many_writers_share_writes_in_flight_and_are_answered_in_order(pipelined: Pipelined) -> None:
    store = pipelined.store
    store.create("s")
    pipelined.wal.delay_s = 0.005  # an object store's latency, scaled down
    answers: dict[bytes, int] = {}
    lock = threading.Lock()

    def writer(i: int) -> None:
        for n in range(20):
            data = b"<%02d:%02d>" % (i, n)
            offset = store.append("s", data, writer_id=uuid.UUID(int=i + 1), event_number=n).offset
            with lock:
                answers[data] = offset

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    content = store.read("s", 0).data
    assert len(content) == 7 * len(answers) == 7 * 16 * 20
    for data, offset in answers.items():
        assert content[offset : offset + 7] == data
    assert pipelined.wal.most_at_once > 1
    assert pipelined.read_after_restart("s") == content


def test_a_failed_write_fails_the_batches_begun_after_it_even_if_theirs_landed(pipelined: Pipelined) -> None:
    pipelined.store.create("s")
    pipelined.store.append("s", b"kept")
    pipelined.wal.gate.clear()
    first = pipelined.add_in_flight(append("s", b"one"))
    pipelined.wal.failing = [pipelined.data_log._next_index]
    failed = pipelined.add_in_flight(append("s", b"two"))
    behind = pipelined.add_in_flight(append("s", b"three"))
    pipelined.wal.gate.set()
    assert first.result().logged
    for future in (failed, behind):
        with pytest.raises(ContainerNotReady, match="Tier 1 write failed"):
            future.result()
    assert pipelined.store.read("s", 0).data == b"keptone"
    assert pipelined.store.append("s", b"four", expected_offset=7).offset == 7
    assert pipelined.read_after_restart("s") == b"keptonefour"


def test_a_failed_write_whose_name_cannot_be_taken_back_is_an_unknown_outcome(pipelined: Pipelined) -> None:
    """Its create may still land, so its caller must not be told to resend blindly (503)."""
    pipelined.store.create("s")
    index = pipelined.data_log._next_index
    pipelined.wal.failing = [index, index]  # its create, then the repair's claim of its name
    failed = pipelined.add(append("s", b"one"))
    with pytest.raises(OutcomeUnknown, match="may still be in the log"):
        failed.result()
    assert pipelined.store.append("s", b"two", expected_offset=0).offset == 0  # repaired first
    assert pipelined.read_after_restart("s") == b"two"


def test_a_processor_failure_answers_an_unknown_outcome_for_writes_it_began(
    pipelined: Pipelined, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while committing: the write is in Tier 1 (a restart replays it), so no 503 for it."""
    pipelined.store.create("s")
    log = pipelined.container.durable_log

    def broken(logged: list[ops.Operation], outcomes: list[Outcome]) -> None:
        raise RuntimeError("a bug while applying")

    monkeypatch.setattr(log.processor, "commit", broken)
    with pytest.raises(OutcomeUnknown, match="processor failed"):
        pipelined.store.append("s", b"written")
    with pytest.raises(ContainerNotReady, match="processor failed"):
        pipelined.store.append("s", b"refused")
    monkeypatch.undo()
    assert pipelined.read_after_restart("s") == b"written"


def test_closing_answers_the_writes_still_in_flight_once_it_stops_waiting(
    pipelined: Pipelined, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Tier 1 write that outlasts closing: its caller gets an unknown outcome, not silence."""
    monkeypatch.setattr(processor, "CLOSE_WAIT_S", 0.2)
    pipelined.store.create("s")
    pipelined.wal.gate.clear()
    future = pipelined.add_in_flight(append("s", b"stuck"))
    pipelined.container.durable_log.close()
    assert future.done()
    with pytest.raises(OutcomeUnknown, match="stopped before its Tier 1 write completed"):
        future.result()


def test_a_fence_fails_every_batch_in_flight_and_stops_the_container(pipelined: Pipelined) -> None:
    pipelined.store.create("s")
    pipelined.store.append("s", b"kept")
    pipelined.wal.gate.clear()
    in_flight = [pipelined.add_in_flight(append("s", b"x%d" % i)) for i in range(3)]
    new_owner = ObjectDataLog(pipelined.wal, 0, max_frame_bytes=4096)
    batches: list = []
    recovered = threading.Thread(target=lambda: batches.extend(new_owner.recover()))
    recovered.start()
    wait_until(lambda: new_owner.epoch > 0, what="the new owner's epoch")
    time.sleep(0.05)
    pipelined.wal.gate.set()
    recovered.join(10)
    read = appended(batches)
    answered = []
    for i, future in enumerate(in_flight):
        try:
            future.result()
            answered.append(True)
            assert b"x%d" % i in read  # acknowledged: in the new owner's log
        except OutcomeUnknown as exc:
            assert "fenced" in str(exc)
            answered.append(None)
        except ContainerNotReady as exc:
            assert "fenced" in str(exc)
            answered.append(False)
            assert b"x%d" % i not in read  # told to resend: surely not in it
    assert answered[: answered.count(True)] == [True] * answered.count(True)  # in order: a prefix at most
    with pytest.raises(ContainerNotReady, match="fenced"):
        pipelined.store.append("s", b"late")


def test_a_fenced_log_stops_the_tier2_flushes_quietly(
    pipelined: Pipelined, caplog: pytest.LogCaptureFixture
) -> None:
    """A flush whose layout commit meets the fence ends the storage writer: no warning, no retries."""
    pipelined.store.create("s")
    pipelined.store.append("s", b"kept")
    list(ObjectDataLog(pipelined.wal, 0, max_frame_bytes=4096).recover())  # a new owner fences
    with pytest.raises((ContainerNotReady, OutcomeUnknown), match="fenced"):
        pipelined.store.append("s", b"late")
    caplog.set_level(logging.INFO, "engine")
    writer = pipelined.container.storage_writer
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        writer.flush(10)
    assert time.monotonic() - began < 5, "the flush waited for a writer that had stopped"
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("engine")]
    assert any("Tier 2 flushes stop" in m and "fenced" in m for m in messages), messages
    assert not any("Tier 2 flush failed" in m for m in messages), messages
    assert writer.failing is None


def appended(batches: list) -> list[bytes]:
    """The data of the appends in recovered Tier 1 batches."""
    return [op.data for b in batches for op in ops.decode_all(b.payload) if isinstance(op, ops.Append)]


def test_a_write_that_landed_before_a_fence_is_an_unknown_outcome_not_a_refusal(
    pipelined: Pipelined, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner paused with its write stored but not answered; the new owner read it, flushed and
    truncated past it. The old owner learns it was fenced below the log's start: its caller must not
    be told to resend (503), as the append is in the new owner's segment."""
    pipelined.store.create("s")
    pipelined.wal.held = index = pipelined.data_log._next_index
    landed = pipelined.add(append("s", b"landed", expected_offset=0))
    wait_until(lambda: index in pipelined.wal.stored, what="the write stored")
    new_owner = ObjectDataLog(pipelined.wal, 0, max_frame_bytes=4096)
    assert b"landed" in appended(list(new_owner.recover()))
    address, _ = new_owner.append(b"the new owner writes on")
    new_owner.truncate(address)
    monkeypatch.setattr(object_log_recovery, "CONFIRM_S", 0.0)  # the pause outlasted it: the old owner looks
    pipelined.wal.answers.set()
    with pytest.raises(OutcomeUnknown, match="fenced"):
        landed.result()


def test_small_appends_wait_for_half_a_write_s_latency_before_another_write(pipelined: Pipelined) -> None:
    """Each write is a request: while one is in flight, another begins only once it carries 1 MiB of
    appends or its oldest request has waited half a write's latency (here: ten seconds)."""
    pipelined.store.create("s")
    pipelined.wal.gate.clear()
    first = pipelined.add_in_flight(append("s", b"first"))
    entered = pipelined.wal.entered
    pipelined.container.durable_log.processor._write_seconds = 20.0
    small = pipelined.add(append("s", b"small"))
    time.sleep(0.1)
    assert pipelined.wal.entered == entered  # the small one waits
    big = pipelined.add(append("s", b"B" * (1 << 20)))
    wait_until(lambda: pipelined.wal.entered == entered + 1, what="a write carrying 1 MiB")
    pipelined.wal.gate.set()
    assert [f.result().logged for f in (first, small, big)] == [True, True, True]
    assert pipelined.store.info("s").length == 10 + (1 << 20)


def test_a_checkpoint_falling_due_after_a_batch_was_let_begin_waits_for_one_that_begins_alone(
    pipelined: Pipelined, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint due by time can turn due between the processor's check and its begin."""
    pipelined.store.create("s")
    proc = pipelined.container.durable_log.processor
    due = {"now": False}
    take = proc._take

    def take_then_fall_due() -> list[Any]:
        if proc._batches:  # the second batch passed the check: the checkpoint's seconds run out now
            due["now"] = True
        return take()

    monkeypatch.setattr(proc, "_checkpoint_due", lambda: due["now"])
    monkeypatch.setattr(proc, "_take", take_then_fall_due)
    pipelined.wal.gate.clear()
    first = pipelined.add_in_flight(append("s", b"one"))
    second = pipelined.add_in_flight(append("s", b"two"))
    pipelined.wal.gate.set()
    assert first.result().logged and second.result().logged
    assert proc.failure is None
    pipelined.store.append("s", b"three")  # begins alone: the checkpoint goes with it
    assert pipelined.read_after_restart("s") == b"onetwothree"
