"""One contract for every Tier 1 binding: local files, memory, and objects (memory and S3 on moto).

A binding keeps whole writes in order across reopening, continues the frame
sequence, truncates only whole writes below an address, and leaves the log
as it was after a failed write. Writes begun together (as many as the log
takes in flight) may complete in any order and come back in begin order;
after a failed one, it and those begun after it are gone. Object logs add
empty fence writes at each recovery; the contract reads the payloads that
hold operations.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import InvalidArgument, SegmentStore, Settings
from engine.durable_log.data_log import DurableDataLog
from engine.tier1.file_log import FileDataLog
from engine.tier1.memory_log import MemoryDataLog
from engine.tier1.object_log import ObjectDataLog
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage

FRAME = 4096
Opener = Callable[[], DurableDataLog]


@pytest.fixture(
    params=["file", "memory", "objects-memory", pytest.param("objects-s3", marks=pytest.mark.process)]
)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """A function that opens the same log again, as a restarted process would."""
    kind = request.param
    if kind == "file":
        yield lambda: FileDataLog(tmp_path / "t1", file_bytes=3 * FRAME, max_frame_bytes=FRAME)
    elif kind == "memory":
        first = MemoryDataLog(max_frame_bytes=FRAME)
        yield first.reopen
    elif kind == "objects-memory":
        storage = MemoryChunkStorage()
        yield lambda: ObjectDataLog(storage, 3, max_frame_bytes=FRAME, max_writes_in_flight=4)
    else:
        from engine.tier2.s3 import S3ChunkStorage

        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = request.getfixturevalue("s3_bucket")
        storage = S3ChunkStorage(bucket, f"t1-{uuid.uuid4().hex[:8]}/", endpoint_url=endpoint)
        yield lambda: ObjectDataLog(storage, 3, max_frame_bytes=FRAME, max_writes_in_flight=4)


def recovered(log: DurableDataLog) -> list[bytes]:
    return [batch.payload for batch in log.recover() if batch.payload]


def test_empty_log_recovers_empty(opener: Opener) -> None:
    log = opener()
    assert recovered(log) == []
    first, count = log.append(b"first")
    assert count == 1
    log.close()
    again = opener()
    assert recovered(again) == [b"first"]
    assert again.append(b"second")[0] > first


def test_writes_come_back_in_order_across_reopens(opener: Opener) -> None:
    log = opener()
    recovered(log)
    big = os.urandom(3 * FRAME)
    addresses = [log.append(b"one"), log.append(big), log.append(b"three")]
    assert addresses[1][1] == 4  # a payload of three frames' room takes four frames
    assert [a[0] for a in addresses] == sorted({a[0] for a in addresses})
    assert addresses[1][0] == addresses[0][0] + 1 and addresses[2][0] == addresses[1][0] + 4
    log.close()
    again = opener()
    assert recovered(again) == [b"one", big, b"three"]
    again.append(b"four")
    again.close()
    assert recovered(opener()) == [b"one", big, b"three", b"four"]


def test_truncate_drops_whole_writes_below_the_address_only(opener: Opener) -> None:
    log = opener()
    recovered(log)
    payloads = [bytes([i]) * 3000 for i in range(8)]
    addresses = [log.append(p)[0] for p in payloads]
    log.truncate(addresses[5])
    log.close()
    kept = recovered(opener())
    assert kept == payloads[len(payloads) - len(kept) :]  # a suffix of the writes, oldest dropped first
    assert payloads[5:] == kept[-3:] and len(kept) < len(payloads)


def test_a_failed_write_leaves_the_log_as_it_was(opener: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    log = opener()
    recovered(log)
    log.append(b"kept")
    _fail_next_write(log, monkeypatch)
    with pytest.raises(OSError):
        log.append(b"lost")
    log.append(b"after")
    log.close()
    assert recovered(opener()) == [b"kept", b"after"]


def test_writes_in_flight_come_back_in_begin_order(opener: Opener) -> None:
    log = opener()
    recovered(log)
    payloads = [b"w%d" % i for i in range(3)]
    addresses: list[tuple[int, int]] = []
    while len(addresses) < len(payloads):  # as many at once as the log takes, written last first
        begun = [log.begin(p) for p in payloads[len(addresses) : len(addresses) + log.max_writes_in_flight]]
        for pending in reversed(begun):
            log.write(pending)
        addresses += [(p.first_frame_seq, p.frame_count) for p in begun]
    assert [a[0] for a in addresses] == [addresses[0][0] + i for i in range(3)]
    log.close()
    assert recovered(opener()) == payloads


def test_a_failed_write_takes_the_writes_begun_after_it_along(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = opener()
    recovered(log)
    log.append(b"kept")
    failed = log.begin(b"failed")
    later = log.begin(b"begun after it") if log.max_writes_in_flight > 1 else None
    if later is not None:
        log.write(later)  # lands, but is never to be acknowledged
    _fail_next_write(log, monkeypatch)
    with pytest.raises(OSError):
        log.write(failed)
    log.abandon(failed)
    assert log.append(b"after")[0] == failed.first_frame_seq
    log.close()
    assert recovered(opener()) == [b"kept", b"after"]


def _fail_next_write(log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if isinstance(log, MemoryDataLog):
        log.fail_writes = 1
    elif isinstance(log, FileDataLog):
        real = os.fdatasync
        calls = iter([True])

        def failing(fd: int) -> None:
            if next(calls, False):
                raise OSError(5, "injected fdatasync failure")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", failing)
    else:
        faulty = FaultyChunkStorage(log.storage)
        faulty.fail("create")
        log.storage = faulty


def test_the_container_count_is_pinned_in_the_bucket(
    moto_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:

    def settings(count: int, folder: str) -> Settings:
        return Settings(
            data_dir=str(tmp_path / folder),
            tier1=f"s3://{s3_bucket}/t1",
            tier2=f"s3://{s3_bucket}/t2",
            s3_endpoint=moto_endpoint,
            container_count=count,
        )

    for folder in ("a", "b"):  # a new node, the same count
        store = SegmentStore(settings(4, folder))
        store.start(wait=True)
        store.close()
    with pytest.raises(InvalidArgument, match="container_count=4"):
        SegmentStore(settings(2, "c")).start()


def test_a_new_node_takes_the_epoch_from_the_bucket_not_its_folder(
    moto_endpoint: str, s3_bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    """Tier 2 chunk names carry the epoch: a fresh data folder must still start above every earlier one."""

    def node(folder: str) -> SegmentStore:
        store = SegmentStore(
            Settings(
                data_dir=str(tmp_path / folder),
                tier1=f"s3://{s3_bucket}/t1",
                tier2=f"s3://{s3_bucket}/t2",
                s3_endpoint=moto_endpoint,
                container_count=1,
            )
        )
        store.start(wait=True)
        return store

    first = node("a")
    first.create("s")
    first.append("s", b"flushed by the first node")
    first.flush()
    epoch = first._containers[0].metadata.epoch
    first.close()
    second = node("b")
    try:
        assert second._containers[0].metadata.epoch > epoch
        assert second.read("s", 0).data == b"flushed by the first node"
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists(), "nothing is kept locally"
    finally:
        second.close()
    chunks = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="t2/")["Contents"]]
    assert any(f"/e{epoch:010d}-" in key for key in chunks), chunks
