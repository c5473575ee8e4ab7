"""The ChunkStorage contract, run against every binding (fsspec-style mix-ins).

``ChunkStorageContract`` holds the tests; each ``Test*`` class below mixes it
in and provides two fixtures: ``storage`` (a fresh, empty binding) and
``reopen`` (a new binding over the same bytes, to show what is durable).
A test checks the capability flags and expects either the behaviour or
ChunkNotSupported, so one suite covers bindings with and without append.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.tier2.chunk_storage import (
    BadChunkOffset,
    ChunkExists,
    ChunkHandle,
    ChunkInfo,
    ChunkNotFound,
    ChunkNotSupported,
    ChunkStorage,
)
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.local import LocalChunkStorage
from engine.tier2.memory import MemoryChunkStorage
from engine.tier2.s3 import MIN_PART_BYTES, S3ChunkStorage

MiB = 1024 * 1024
# Names the way engine.naming builds them: container, escaped segment name and id, epoch, offset, nonce.
CHUNK = "c0/scope%2Fstream%2F0.3/e0000000002-o00000000000000000000-1a2b3c4d"
UNICODE_CHUNK = "c1/%C3%A9v%C3%A9nement.7/e0000000001-o00000000000000004096-00ff00ff"


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def race_creates(storage: ChunkStorage, writers: int = 8) -> list[int]:
    """``writers`` threads create CHUNK at once; the ones told they created it (the others: ChunkExists)."""
    outcomes: dict[int, str] = {}

    def create(i: int) -> None:
        try:
            storage.create(CHUNK, b"writer %d" % i)
            outcomes[i] = "created"
        except ChunkExists:
            outcomes[i] = "exists"

    threads = [threading.Thread(target=create, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == writers, outcomes  # no other error
    return [i for i, outcome in outcomes.items() if outcome == "created"]


class ChunkStorageContract:
    """What every binding must do. Subclasses provide ``storage`` and ``reopen`` fixtures."""

    # ------------------------------------------------------------ create
    def test_capabilities_are_declared(self, storage: ChunkStorage) -> None:
        for flag in (storage.supports_append, storage.supports_concat, storage.supports_truncation):
            assert isinstance(flag, bool)

    def test_create_then_exists_info_read(self, storage: ChunkStorage) -> None:
        handle = storage.create(CHUNK, b"hello world")
        assert handle == ChunkHandle(CHUNK, read_only=False)
        assert storage.exists(CHUNK)
        assert storage.info(CHUNK) == ChunkInfo(CHUNK, 11)
        reader = storage.open_read(CHUNK)
        assert reader == ChunkHandle(CHUNK, read_only=True)
        assert storage.read(reader, 0, 11) == b"hello world"
        assert storage.read(handle, 6, 5) == b"world"

    def test_create_is_durable(self, storage: ChunkStorage, reopen: Callable[[], ChunkStorage]) -> None:
        storage.create(UNICODE_CHUNK, b"\x00\x01\xff" * 100)
        again = reopen()
        assert again.info(UNICODE_CHUNK).length == 300
        assert again.read(again.open_read(UNICODE_CHUNK), 0, 1000) == b"\x00\x01\xff" * 100

    def test_create_empty_chunk(self, storage: ChunkStorage) -> None:
        handle = storage.create(CHUNK)
        assert storage.info(CHUNK).length == 0
        assert storage.read(handle, 0, 10) == b""

    def test_create_of_an_existing_name_is_chunk_exists(self, storage: ChunkStorage) -> None:
        storage.create(CHUNK, b"first")
        with pytest.raises(ChunkExists):
            storage.create(CHUNK, b"second, longer")
        with pytest.raises(ChunkExists):
            storage.create(CHUNK)
        assert storage.read(storage.open_read(CHUNK), 0, 100) == b"first"

    def test_racing_creates_of_one_name_have_one_winner(self, storage: ChunkStorage) -> None:
        winners = race_creates(storage)
        assert len(winners) == 1
        assert storage.read(storage.open_read(CHUNK), 0, 100) == b"writer %d" % winners[0]

    # ------------------------------------------------------------ missing
    def test_a_missing_chunk_is_chunk_not_found(self, storage: ChunkStorage) -> None:
        assert not storage.exists(CHUNK)
        with pytest.raises(ChunkNotFound):
            storage.info(CHUNK)
        with pytest.raises(ChunkNotFound):
            storage.open_read(CHUNK)
        with pytest.raises(ChunkNotFound if storage.supports_append else ChunkNotSupported):
            storage.open_write(CHUNK)
        with pytest.raises(ChunkNotFound):
            storage.read(ChunkHandle(CHUNK, read_only=True), 0, 10)

    # ------------------------------------------------------------- reads
    def test_reads_at_offsets_past_the_end_and_of_zero_length(self, storage: ChunkStorage) -> None:
        data = payload(1000, seed=1)
        handle = storage.create(CHUNK, data)
        assert storage.read(handle, 0, 1000) == data
        assert storage.read(handle, 10, 100) == data[10:110]
        assert storage.read(handle, 999, 10) == data[999:]
        assert storage.read(handle, 900, 5000) == data[900:]
        assert storage.read(handle, 1000, 10) == b""
        assert storage.read(handle, 5000, 10) == b""
        assert storage.read(handle, 0, 0) == b""
        assert storage.read(handle, 500, 0) == b""
        with pytest.raises(ValueError):
            storage.read(handle, -1, 10)
        with pytest.raises(ValueError):
            storage.read(handle, 0, -1)

    def test_read_stream_gives_the_bytes_of_read_in_pieces(self, storage: ChunkStorage) -> None:
        data = payload(1000, seed=2)
        handle = storage.create(CHUNK, data)

        def pieces(offset: int, length: int, piece_bytes: int) -> list[bytes]:
            return list(storage.read_stream(handle, offset, length, piece_bytes))

        assert pieces(0, 1000, 300) == [data[0:300], data[300:600], data[600:900], data[900:]]
        assert pieces(10, 100, 1000) == [data[10:110]]
        assert b"".join(pieces(900, 5000, 64)) == data[900:]
        assert pieces(1000, 10, 64) == [] and pieces(0, 0, 64) == []
        stream = storage.read_stream(handle, 0, 1000, 100)
        assert next(stream) == data[:100]
        stream.close()  # a reader may stop early
        with pytest.raises(ChunkNotFound):
            list(storage.read_stream(ChunkHandle("no/such/chunk", read_only=True), 0, 10, 5))

    # ------------------------------------------------------------ writes
    def test_append_writes_at_the_end(
        self, storage: ChunkStorage, reopen: Callable[[], ChunkStorage]
    ) -> None:
        created = storage.create(CHUNK, b"ab")
        if not storage.supports_append:
            with pytest.raises(ChunkNotSupported):
                storage.open_write(CHUNK)
            with pytest.raises(ChunkNotSupported):
                storage.write(created, 2, b"cd")
            assert storage.read(created, 0, 10) == b"ab"
            return
        handle = storage.open_write(CHUNK)
        assert handle == ChunkHandle(CHUNK, read_only=False)
        assert storage.write(handle, 2, b"cd") == 4
        assert storage.write(created, 4, b"ef") == 6
        assert storage.write(handle, 6, b"") == 6
        assert storage.info(CHUNK).length == 6
        again = reopen()
        assert again.info(CHUNK).length == 6
        assert again.read(again.open_read(CHUNK), 0, 100) == b"abcdef"

    def test_a_write_not_at_the_end_is_bad_chunk_offset(self, storage: ChunkStorage) -> None:
        handle = storage.create(CHUNK, b"abc")
        if not storage.supports_append:
            with pytest.raises(ChunkNotSupported):
                storage.write(ChunkHandle(CHUNK, read_only=False), 3, b"x")
            assert storage.read(handle, 0, 10) == b"abc"
            return
        for offset in (0, 2, 4, 100):
            with pytest.raises(BadChunkOffset):
                storage.write(handle, offset, b"x")
        assert storage.read(handle, 0, 10) == b"abc"
        with pytest.raises(ChunkNotFound):
            storage.write(ChunkHandle("c0/missing", read_only=False), 0, b"x")

    def test_read_only_handles_refuse_changes(self, storage: ChunkStorage) -> None:
        storage.create(CHUNK, b"abc")
        storage.create("c0/other", b"def")
        reader = storage.open_read(CHUNK)
        with pytest.raises(ValueError if storage.supports_append else ChunkNotSupported):
            storage.write(reader, 3, b"x")
        with pytest.raises(ValueError if storage.supports_concat else ChunkNotSupported):
            storage.concat(reader, ["c0/other"])
        with pytest.raises(ValueError if storage.supports_truncation else ChunkNotSupported):
            storage.truncate(reader, 1)
        assert storage.read(reader, 0, 10) == b"abc"

    # ------------------------------------------------------------ concat
    def _concat_case(self, storage: ChunkStorage, target: bytes, sources: list[bytes]) -> None:
        """Concat ``sources`` onto ``target``; check the bytes, the length, and that the sources stay."""
        handle = storage.create("c0/seg.1/target", target)
        names = [f"c0/seg.1/source-{i:02d}" for i in range(len(sources))]
        for name, data in zip(names, sources, strict=True):
            storage.create(name, data)
        if not storage.supports_concat:
            with pytest.raises(ChunkNotSupported):
                storage.concat(handle, names)
            return
        expected = target + b"".join(sources)
        assert storage.concat(handle, names) == len(expected)
        assert storage.info(handle.name).length == len(expected)
        assert storage.read(handle, 0, len(expected) + 1) == expected
        for name, data in zip(names, sources, strict=True):
            assert storage.read(storage.open_read(name), 0, len(data) + 1) == data

    def test_concat_of_small_sources_of_mixed_sizes(self, storage: ChunkStorage) -> None:
        self._concat_case(storage, b"TTT", [b"a" * 10, b"", b"b", payload(1000, seed=2), b"c" * 100])

    def test_concat_into_an_empty_target(self, storage: ChunkStorage) -> None:
        self._concat_case(storage, b"", [payload(300, seed=3), b"xyz"])

    def test_concat_of_nothing_keeps_the_target(self, storage: ChunkStorage) -> None:
        self._concat_case(storage, b"abc", [])
        storage.delete("c0/seg.1/target")
        self._concat_case(storage, b"abc", [b"", b""])

    def test_concat_of_large_pieces(self, storage: ChunkStorage) -> None:
        """Pieces of 5 MiB and more (S3: copied server-side, a big one in two ranges) among small ones."""
        self._concat_case(
            storage,
            payload(MIN_PART_BYTES + MiB, seed=4),
            [
                payload(2 * MIN_PART_BYTES + MiB, seed=5),
                b"small" * 20,
                payload(MIN_PART_BYTES + MiB, seed=6),
                b"seven77",
            ],
        )

    def test_concat_with_a_missing_source_changes_nothing(self, storage: ChunkStorage) -> None:
        handle = storage.create("c0/seg.1/target", b"target")
        storage.create("c0/seg.1/a", b"aaa")
        if not storage.supports_concat:
            with pytest.raises(ChunkNotSupported):
                storage.concat(handle, ["c0/seg.1/a"])
            assert storage.read(handle, 0, 100) == b"target"
            return
        with pytest.raises(ChunkNotFound):
            storage.concat(handle, ["c0/seg.1/a", "c0/seg.1/missing"])
        assert storage.read(handle, 0, 100) == b"target"
        with pytest.raises(ChunkNotFound):
            storage.concat(ChunkHandle("c0/seg.1/none", read_only=False), ["c0/seg.1/a"])

    # ---------------------------------------------------------- truncate
    def test_truncate(self, storage: ChunkStorage, reopen: Callable[[], ChunkStorage]) -> None:
        handle = storage.create(CHUNK, b"0123456789")
        if not storage.supports_truncation:
            with pytest.raises(ChunkNotSupported):
                storage.truncate(handle, 4)
            assert storage.info(CHUNK).length == 10
            return
        storage.truncate(handle, 4)
        storage.truncate(handle, 4)
        assert storage.read(handle, 0, 100) == b"0123"
        assert reopen().info(CHUNK).length == 4
        with pytest.raises(BadChunkOffset):
            storage.truncate(handle, 5)
        if storage.supports_append:
            assert storage.write(handle, 4, b"xy") == 6
        storage.truncate(handle, 0)
        assert storage.info(CHUNK).length == 0

    # ------------------------------------------------------------ delete
    def test_delete_is_idempotent(self, storage: ChunkStorage) -> None:
        storage.create(CHUNK, b"abc")
        storage.delete(CHUNK)
        assert not storage.exists(CHUNK)
        with pytest.raises(ChunkNotFound):
            storage.info(CHUNK)
        storage.delete(CHUNK)
        storage.delete("c9/never/existed")
        storage.create(CHUNK, b"new")
        assert storage.read(storage.open_read(CHUNK), 0, 10) == b"new"

    # -------------------------------------------------------------- list
    def test_list_in_name_order_with_prefixes(self, storage: ChunkStorage) -> None:
        sizes = {
            "c1/a.1/e1": 1,
            "c0/b.2/e1": 2,
            "c0/a.1/e2": 3,
            "c0/a/e1": 7,
            "c0/a-x.3/e1": 4,  # "-" and "." sort before "/": name order is not a walk of sorted folders
            "c0/a.1/e1": 0,
            "layouts/a.json": 5,
            CHUNK: 6,
        }
        for name, size in sizes.items():
            storage.create(name, b"x" * size)
        everything = [ChunkInfo(n, sizes[n]) for n in sorted(sizes)]
        assert list(storage.list()) == everything
        assert list(storage.list("")) == everything
        assert [i.name for i in storage.list("c0/")] == sorted(n for n in sizes if n.startswith("c0/"))
        assert [i.name for i in storage.list("c0/a")] == [
            "c0/a-x.3/e1",
            "c0/a.1/e1",
            "c0/a.1/e2",
            "c0/a/e1",
        ]
        assert list(storage.list("c0/a.1/")) == [ChunkInfo("c0/a.1/e1", 0), ChunkInfo("c0/a.1/e2", 3)]
        assert list(storage.list("c0/a.1/e2")) == [ChunkInfo("c0/a.1/e2", 3)]
        assert list(storage.list("c7/")) == []
        assert list(storage.list("nothing")) == []

    def test_list_after_deletes(self, storage: ChunkStorage) -> None:
        names = [f"c0/seg.{i % 3}/e{i:04d}" for i in range(12)]
        for name in names:
            storage.create(name, b"data")
        for name in names[::2]:
            storage.delete(name)
        assert [i.name for i in storage.list("c0/")] == sorted(names[1::2])
        for name in names[1::2]:
            storage.delete(name)
        assert list(storage.list()) == []

    def test_names_with_nested_folders(self, storage: ChunkStorage) -> None:
        deep = "c3/very/deep/nested/folders/of/one.chunk"
        storage.create(deep, b"deep")
        storage.create("c3/very/shallow", b"shallow")
        assert storage.read(storage.open_read(deep), 0, 10) == b"deep"
        assert [i.name for i in storage.list("c3/very/")] == [deep, "c3/very/shallow"]
        storage.delete(deep)
        assert not storage.exists(deep)
        assert [i.name for i in storage.list("c3/")] == ["c3/very/shallow"]
        storage.create(deep, b"again")
        assert storage.info(deep).length == 5


class TestMemory(ChunkStorageContract):
    @pytest.fixture
    def storage(self) -> MemoryChunkStorage:
        return MemoryChunkStorage()

    @pytest.fixture
    def reopen(self, storage: MemoryChunkStorage) -> Callable[[], ChunkStorage]:
        return lambda: storage


class TestMemoryLikeS3(ChunkStorageContract):
    """The twin with S3's capabilities: no append, no truncation."""

    @pytest.fixture
    def storage(self) -> MemoryChunkStorage:
        return MemoryChunkStorage(supports_append=False, supports_truncation=False)

    @pytest.fixture
    def reopen(self, storage: MemoryChunkStorage) -> Callable[[], ChunkStorage]:
        return lambda: storage

    def test_capabilities_are_those_of_s3(self, storage: MemoryChunkStorage) -> None:
        assert (storage.supports_append, storage.supports_concat, storage.supports_truncation) == (
            False,
            True,
            False,
        )


class TestLocal(ChunkStorageContract):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> LocalChunkStorage:
        return LocalChunkStorage(tmp_path / "tier2")

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Callable[[], ChunkStorage]:
        return lambda: LocalChunkStorage(tmp_path / "tier2")


class TestS3(ChunkStorageContract):
    """Against moto in server mode, with the smallest multipart parts S3 allows."""

    @pytest.fixture
    def storage(self, s3_bucket: str, s3_client: Any) -> S3ChunkStorage:
        return S3ChunkStorage(s3_bucket, "segstore", client=s3_client, multipart_part_bytes=MIN_PART_BYTES)

    @pytest.fixture
    def reopen(self, s3_bucket: str, s3_client: Any) -> Callable[[], ChunkStorage]:
        return lambda: S3ChunkStorage(s3_bucket, "segstore/", client=s3_client)

    def test_racing_creates_of_one_name_have_one_winner(self, storage: ChunkStorage) -> None:
        """One winner is S3's promise for a conditional PutObject, not the binding's.

        moto checks ``If-None-Match`` and stores the object in two steps, so
        racing creates there may both win. What the binding owes: each create
        wins or is ChunkExists, and the chunk holds a winner's bytes.
        """
        winners = race_creates(storage)
        assert winners
        assert storage.read(storage.open_read(CHUNK), 0, 100) in {b"writer %d" % i for i in winners}


class TestFaultyMemory(ChunkStorageContract):
    """The fault wrapper with no fault set changes nothing."""

    @pytest.fixture
    def storage(self) -> FaultyChunkStorage:
        return FaultyChunkStorage(MemoryChunkStorage())

    @pytest.fixture
    def reopen(self, storage: FaultyChunkStorage) -> Callable[[], ChunkStorage]:
        return lambda: storage
