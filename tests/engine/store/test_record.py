"""The store record: a data folder opens only with the container count and tiers it was created with."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from engine import ContainerNotReady, Misconfigured, SegmentStore, Settings
from engine.config import LOCAL_TIER1, LOCAL_TIER2
from engine.store.record import StoreRecord, check_in_bucket, write_in_bucket, write_in_folder
from engine.tier2.chunk_storage import ChunkHandle, ChunkStorageUnusable
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import small_settings


def record(folder: Path) -> dict[str, object]:
    return json.loads((folder / "store.json").read_text())


def started(settings: Settings) -> SegmentStore:
    store = SegmentStore(settings)
    store.start(wait=True)
    return store


def test_a_new_data_folder_records_its_tiers(tmp_path: Path) -> None:
    started(small_settings(tmp_path, container_count=2)).close()
    assert record(tmp_path) == {"container_count": 2, "tier1": LOCAL_TIER1, "tier2": LOCAL_TIER2}


def keep_bytes_in_tier2(settings: Settings) -> None:
    """Start a store, give it a segment "kept" flushed to Tier 2, stop it."""
    store = started(settings)
    store.create("kept")
    store.append("kept", b"bytes")
    store.flush()
    store.close()


def test_another_tier2_is_refused_and_names_both(tmp_path: Path) -> None:
    keep_bytes_in_tier2(small_settings(tmp_path))
    elsewhere = tmp_path.parent / f"{tmp_path.name}-other-tier2"
    with pytest.raises(Misconfigured) as refused:
        SegmentStore(small_settings(tmp_path, tier2=str(elsewhere))).start()
    assert LOCAL_TIER2 in refused.value.detail and str(elsewhere) in refused.value.detail
    assert not elsewhere.exists(), "a refused start must not touch the other Tier 2"
    assert record(tmp_path)["tier2"] == LOCAL_TIER2
    again = started(small_settings(tmp_path))  # refused, it left the folder unlocked
    assert again.read("kept", 0).data == b"bytes"
    again.close()


def test_the_default_tier2_named_explicitly_is_the_same_tier2(tmp_path: Path) -> None:
    keep_bytes_in_tier2(small_settings(tmp_path))
    again = started(small_settings(tmp_path, tier2=str(tmp_path / "tier2")))  # not refused
    assert again.read("kept", 0).data == b"bytes"
    again.close()
    assert record(tmp_path)["tier2"] == LOCAL_TIER2


def test_an_s3_tier2_on_a_folder_made_with_a_local_one_is_refused_before_s3_is_asked(tmp_path: Path) -> None:
    """The README's order: `make run`, then the moto example on the same ./data."""
    started(small_settings(tmp_path)).close()
    settings = small_settings(tmp_path, tier2="s3://segs/data", s3_endpoint="http://127.0.0.1:9")
    with pytest.raises(Misconfigured, match="s3://segs/data/"):
        SegmentStore(settings).start()


def test_a_folder_without_a_record_gets_one_and_starts(tmp_path: Path) -> None:
    store = started(small_settings(tmp_path))
    store.create("old")
    store.close()
    (tmp_path / "store.json").unlink()  # a folder from before store records
    store = started(small_settings(tmp_path))
    assert store.info("old").length == 0
    store.close()
    assert record(tmp_path)["tier2"] == LOCAL_TIER2


def test_a_record_of_the_container_count_only_is_completed(tmp_path: Path) -> None:
    started(small_settings(tmp_path)).close()
    (tmp_path / "store.json").write_text(json.dumps({"container_count": 1}))
    started(small_settings(tmp_path)).close()
    assert record(tmp_path) == {"container_count": 1, "tier1": LOCAL_TIER1, "tier2": LOCAL_TIER2}


def test_the_record_in_a_tier1_bucket_refuses_another_tier2() -> None:
    bucket = MemoryChunkStorage()

    def settings(tier2: str, count: int = 4) -> Settings:
        return Settings(tier1="s3://b/t1", tier2=tier2, container_count=count)

    first = check_in_bucket(bucket, settings("s3://b/t2"))
    assert first == StoreRecord(4, "s3://b/t1/", "s3://b/t2/")
    write_in_bucket(bucket, first)
    assert check_in_bucket(bucket, settings("s3://b/t2")) is None  # another node, the same store
    with pytest.raises(Misconfigured, match="s3://b/other/"):
        check_in_bucket(bucket, settings("s3://b/other"))
    with pytest.raises(Misconfigured, match="container_count=4"):
        check_in_bucket(bucket, settings("s3://b/t2", count=2))


def test_an_old_record_in_a_tier1_bucket_is_completed() -> None:
    bucket = MemoryChunkStorage()
    bucket.create("store.json", json.dumps({"container_count": 4}).encode())
    settings = Settings(tier1="s3://b/t1", tier2="s3://b/t2")
    missing = check_in_bucket(bucket, settings)
    assert missing is not None
    write_in_bucket(bucket, missing)
    found = StoreRecord.parse(bucket.read(bucket.open_read("store.json"), 0, 4096), "store.json")
    assert found == StoreRecord(4, "s3://b/t1/", "s3://b/t2/")



class RefusingBucket(MemoryChunkStorage):
    """A Tier 1 bucket S3 refuses us (credentials refused)."""

    def open_read(self, name: str) -> ChunkHandle:
        raise ChunkStorageUnusable("S3 head 'store.json' failed: 403")


def test_a_tier1_bucket_that_refuses_us_or_does_not_answer_is_a_one_line_refusal() -> None:
    settings = Settings(tier1="s3://b/t1", tier2="s3://b/t2")
    with pytest.raises(Misconfigured, match=r"cannot be used: .*403"):
        check_in_bucket(RefusingBucket(), settings)
    down = FaultyChunkStorage(MemoryChunkStorage())
    down.outage()
    with pytest.raises(ContainerNotReady, match="does not answer"):
        check_in_bucket(down, settings)


def test_the_processes_of_a_node_write_the_record_at_once(tmp_path: Path) -> None:
    """Each writer goes through a file of its own: none replaces another's half-written one, none fails."""
    record = StoreRecord.for_settings(Settings(data_dir=str(tmp_path)))
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(20):
                write_in_folder(tmp_path, record)
        except BaseException as exc:
            failures.append(exc)

    writers = [threading.Thread(target=write) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert failures == []
    assert StoreRecord.parse((tmp_path / "store.json").read_bytes(), "store.json") == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.json"]


def test_a_start_removes_the_temporary_record_a_crash_left_and_keeps_a_fresh_one(tmp_path: Path) -> None:
    started(small_settings(tmp_path, container_count=2)).close()
    crashed, writing = tmp_path / "store.0123abcd.tmp", tmp_path / "store.4567ef01.tmp"
    crashed.write_bytes(b"{")
    writing.write_bytes(b"{")
    os.utime(crashed, (time.time() - 3600, time.time() - 3600))  # a crash an hour ago
    started(small_settings(tmp_path, container_count=2)).close()
    assert not crashed.exists() and writing.exists()  # another process may be writing that one now
