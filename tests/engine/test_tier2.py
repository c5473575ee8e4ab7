"""Tier 2 bindings: local folder and memory objects behave alike (positional writes, short reads)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import DataCorrupted
from engine.tier2 import ChunkStorage
from engine.tier2.local import LocalChunkStorage
from engine.tier2.memory import MemoryChunkStorage


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChunkStorage]:
    yield LocalChunkStorage(tmp_path / "t2") if request.param == "local" else MemoryChunkStorage()


def test_write_read_length_delete(storage: ChunkStorage) -> None:
    assert storage.length("c0/s.1") == 0 and storage.read("c0/s.1", 0, 10) == b""
    storage.write("c0/s.1", 0, b"hello ")
    storage.write("c0/s.1", 6, b"world")
    assert storage.length("c0/s.1") == 11
    assert storage.read("c0/s.1", 0, 100) == b"hello world"
    assert storage.read("c0/s.1", 6, 3) == b"wor"
    assert storage.read("c0/s.1", 11, 5) == b""
    storage.delete("c0/s.1")
    storage.delete("c0/s.1")  # no error when missing
    assert storage.length("c0/s.1") == 0


def test_rewrite_at_the_same_offset_is_idempotent(storage: ChunkStorage) -> None:
    storage.write("c1/x.2", 0, b"abcdef")
    storage.write("c1/x.2", 3, b"def")  # a retried flush
    assert storage.read("c1/x.2", 0, 10) == b"abcdef"


def test_local_write_past_the_end_is_data_corrupted(tmp_path: Path) -> None:
    storage = LocalChunkStorage(tmp_path)
    storage.write("c0/a.1", 0, b"abc")
    with pytest.raises(DataCorrupted):
        storage.write("c0/a.1", 5, b"x")
    assert storage.read("c0/a.1", 0, 10) == b"abc"


def test_local_keys_stay_inside_the_root(tmp_path: Path) -> None:
    storage = LocalChunkStorage(tmp_path / "root")
    with pytest.raises(AssertionError):
        storage.write("../escape", 0, b"x")
    assert not (tmp_path / "escape").exists()


def test_memory_failures_are_injected_once_per_count() -> None:
    storage = MemoryChunkStorage()
    storage.fail_writes = 1
    with pytest.raises(OSError):
        storage.write("k", 0, b"x")
    storage.write("k", 0, b"x")
    assert storage.writes == 1 and storage.read("k", 0, 5) == b"x"
