"""FaultyChunkStorage: each injected fault shows up as specified, and only then."""

from __future__ import annotations

import threading
import time

import pytest

from engine.tier2.chunk_storage import BadChunkOffset, ChunkExists, ChunkHandle, ChunkStorageError
from engine.tier2.faults import OPERATIONS, FaultyChunkStorage, InjectedFault
from engine.tier2.memory import MemoryChunkStorage


@pytest.fixture
def inner() -> MemoryChunkStorage:
    return MemoryChunkStorage()


@pytest.fixture
def faulty(inner: MemoryChunkStorage) -> FaultyChunkStorage:
    return FaultyChunkStorage(inner)


def test_capabilities_are_the_inner_ones() -> None:
    like_s3 = FaultyChunkStorage(MemoryChunkStorage(supports_append=False, supports_truncation=False))
    assert (like_s3.supports_append, like_s3.supports_concat, like_s3.supports_truncation) == (
        False,
        True,
        False,
    )


def test_failures_never_reach_the_inner_storage(
    faulty: FaultyChunkStorage, inner: MemoryChunkStorage
) -> None:
    faulty.fail("create", 2)
    for _ in range(2):
        with pytest.raises(InjectedFault):
            faulty.create("c", b"data")
        assert not inner.exists("c")
    faulty.create("c", b"data")
    assert inner.chunks == {"c": bytearray(b"data")}
    assert faulty.calls["create"] == 3
    assert isinstance(InjectedFault(), ChunkStorageError)


def test_failures_count_per_operation(faulty: FaultyChunkStorage) -> None:
    faulty.create("c", b"data")
    faulty.fail("read")
    assert faulty.info("c").length == 4
    with pytest.raises(InjectedFault):
        faulty.read(ChunkHandle("c", read_only=True), 0, 4)
    assert faulty.read(ChunkHandle("c", read_only=True), 0, 4) == b"data"
    assert faulty.calls == {"create": 1, "info": 1, "read": 2}


def test_a_create_that_fails_after_landing_leaves_the_chunk(
    faulty: FaultyChunkStorage, inner: MemoryChunkStorage
) -> None:
    faulty.fail_after_landing("create")
    with pytest.raises(InjectedFault):
        faulty.create("c", b"landed")
    assert inner.read(ChunkHandle("c", read_only=True), 0, 10) == b"landed"
    with pytest.raises(ChunkExists):  # what a caller retrying it sees
        faulty.create("c", b"landed")


def test_a_write_that_fails_after_landing_leaves_the_bytes(
    faulty: FaultyChunkStorage, inner: MemoryChunkStorage
) -> None:
    handle = faulty.create("c", b"ab")
    faulty.fail_after_landing("write")
    with pytest.raises(InjectedFault):
        faulty.write(handle, 2, b"cd")
    assert inner.info("c").length == 4
    with pytest.raises(BadChunkOffset):  # a retry at the same offset
        faulty.write(handle, 2, b"cd")
    assert faulty.write(handle, 4, b"ef") == 6


def test_concat_and_delete_that_fail_after_landing_took_effect(
    faulty: FaultyChunkStorage, inner: MemoryChunkStorage
) -> None:
    target = faulty.create("t", b"t")
    faulty.create("s", b"s")
    faulty.fail_after_landing("concat")
    faulty.fail_after_landing("delete")
    with pytest.raises(InjectedFault):
        faulty.concat(target, ["s"])
    assert inner.read(target, 0, 10) == b"ts"
    with pytest.raises(InjectedFault):
        faulty.delete("s")
    assert not inner.exists("s")


def test_an_outage_fails_every_call_until_it_ends(faulty: FaultyChunkStorage) -> None:
    faulty.create("c", b"x")
    faulty.fail_after_landing("exists")  # an outage does not use up other faults
    faulty.outage()
    for call in (
        lambda: faulty.create("d", b"y"),
        lambda: faulty.exists("c"),
        lambda: faulty.info("c"),
        lambda: faulty.read(ChunkHandle("c", read_only=True), 0, 1),
        lambda: faulty.delete("c"),
        lambda: faulty.list(),
    ):
        with pytest.raises(InjectedFault, match="outage"):
            call()
    faulty.end_outage()
    with pytest.raises(InjectedFault, match="took effect"):
        faulty.exists("c")
    assert faulty.exists("c") and not faulty.exists("d")


def test_an_outage_of_some_operations(faulty: FaultyChunkStorage) -> None:
    faulty.create("c", b"x")
    faulty.outage("read", "list")
    with pytest.raises(InjectedFault):
        faulty.read(ChunkHandle("c", read_only=True), 0, 1)
    with pytest.raises(InjectedFault):
        faulty.list("c")
    assert faulty.info("c").length == 1
    faulty.clear()
    assert [i.name for i in faulty.list()] == ["c"]


def test_latency_is_added_per_operation(faulty: FaultyChunkStorage) -> None:
    faulty.create("c", b"x")
    faulty.delay("read", 0.2)
    started = time.monotonic()
    assert faulty.read(ChunkHandle("c", read_only=True), 0, 1) == b"x"
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    faulty.info("c")
    assert time.monotonic() - started < 0.2
    faulty.delay("read", 0)
    started = time.monotonic()
    faulty.read(ChunkHandle("c", read_only=True), 0, 1)
    assert time.monotonic() - started < 0.2


def test_a_held_call_waits_for_its_release_and_the_calls_after_it_do_not(faulty: FaultyChunkStorage) -> None:
    faulty.create("c", b"x")
    faulty.hold("read")
    got: list[bytes] = []
    first = threading.Thread(target=lambda: got.append(faulty.read(ChunkHandle("c", read_only=True), 0, 1)))
    first.start()
    while faulty.calls["read"] == 0:
        time.sleep(0.001)
    assert faulty.read(ChunkHandle("c", read_only=True), 0, 1) == b"x"  # the next one passes
    first.join(0.2)
    assert first.is_alive() and got == []
    faulty.release("read")
    first.join(5)
    assert got == [b"x"]
    faulty.release("read")  # nothing held: nothing to do
    faulty.hold("info")
    faulty.release("info")  # released before the call came: it does not wait
    assert faulty.info("c").length == 1


def test_unknown_operations_are_refused(faulty: FaultyChunkStorage) -> None:
    for inject in (faulty.fail, faulty.fail_after_landing, faulty.outage):
        with pytest.raises(ValueError):
            inject("append")
    with pytest.raises(ValueError):
        faulty.delay("length", 1.0)
    with pytest.raises(ValueError):
        faulty.hold("length")
    assert {"create", "read", "write", "concat", "truncate", "delete", "list"} <= OPERATIONS


def test_faults_are_counted_exactly_across_threads(faulty: FaultyChunkStorage) -> None:
    faulty.create("c", b"x")
    faulty.fail("exists", 50)
    faulty.fail_after_landing("exists", 30)
    failures = []
    lock = threading.Lock()

    def run() -> None:
        for _ in range(25):
            try:
                faulty.exists("c")
            except InjectedFault as exc:
                with lock:
                    failures.append(str(exc))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert faulty.calls["exists"] == 200
    assert sum("took effect" in f for f in failures) == 30
    assert len(failures) == 80
