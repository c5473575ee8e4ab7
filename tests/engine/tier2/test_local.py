"""LocalChunkStorage beyond the contract: names as paths, temporary files, folders, copy fallbacks."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.tier2 import local
from engine.tier2.chunk_storage import (
    ChunkExists,
    ChunkHandle,
    ChunkNotFound,
    ChunkStorageError,
    ChunkStorageFull,
    ChunkStorageUnusable,
)
from engine.tier2.local import TEMP_PREFIX, LocalChunkStorage

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def storage(tmp_path: Path) -> LocalChunkStorage:
    return LocalChunkStorage(tmp_path / "root")


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_chunk_is_a_file_holding_exactly_its_bytes(storage: LocalChunkStorage) -> None:
    storage.create("c0/seg.1/e1", b"abc")
    storage.write(storage.open_write("c0/seg.1/e1"), 3, b"def")
    assert (storage.root / "c0/seg.1/e1").read_bytes() == b"abcdef"
    assert files_under(storage.root) == ["c0", "c0/seg.1", "c0/seg.1/e1"]


@pytest.mark.parametrize(
    "name",
    ["", "/abs", "../escape", "c0/../../escape", "c0//x", "c0/./x", "c0/x/", "nul\x00", f"c0/{TEMP_PREFIX}1"],
)
def test_names_that_are_not_plain_relative_paths_are_refused(
    storage: LocalChunkStorage, tmp_path: Path, name: str
) -> None:
    with pytest.raises(ValueError):
        storage.create(name, b"x")
    for call in (storage.exists, storage.info, storage.delete):
        with pytest.raises(ValueError):
            call(name)
    with pytest.raises(ValueError):
        storage.read(ChunkHandle(name, read_only=True), 0, 1)
    assert files_under(tmp_path) == []
    with pytest.raises(ValueError):
        list(storage.list("../"))


def test_create_leaves_no_temporary_file(storage: LocalChunkStorage) -> None:
    storage.create("c0/a", b"first")
    with pytest.raises(ChunkExists):
        storage.create("c0/a", b"second")
    assert files_under(storage.root) == ["c0", "c0/a"]


def test_list_skips_temporary_files_a_crash_left(storage: LocalChunkStorage) -> None:
    storage.create("c0/a", b"x")
    (storage.root / "c0" / f"{TEMP_PREFIX}0123456789abcdef").write_bytes(b"half a chunk")
    assert [i.name for i in storage.list()] == ["c0/a"]


def test_delete_removes_the_folders_it_empties(storage: LocalChunkStorage) -> None:
    storage.create("c0/seg.1/e1", b"x")
    storage.create("c0/seg.2/e1", b"x")
    storage.delete("c0/seg.1/e1")
    assert files_under(storage.root) == ["c0", "c0/seg.2", "c0/seg.2/e1"]
    storage.delete("c0/seg.2/e1")
    assert files_under(storage.root) == []
    assert storage.root.is_dir()
    storage.create("c0/seg.1/e2", b"y")
    assert storage.info("c0/seg.1/e2").length == 1


def test_creates_race_deletes_that_empty_their_folder(storage: LocalChunkStorage) -> None:
    """A delete removing an emptied folder never makes a create in it fail."""
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            for i in range(150):
                name = f"c0/seg.1/w{worker}-{i}"
                storage.create(name, b"x")
                storage.delete(name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert list(storage.list()) == [] and files_under(storage.root) == []


def test_a_delete_never_removes_the_folder_a_create_is_about_to_use(
    storage: LocalChunkStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each time the create opens its temporary file, a delete empties the folder at that moment."""
    real_open = os.open
    deletes: list[threading.Thread] = []

    def open_as_a_delete_empties_the_folder(path: Any, flags: int, *mode: int) -> int:
        if Path(path).name.startswith(local.TEMP_PREFIX):
            (Path(path).parent / "other").write_bytes(b"x")
            delete = threading.Thread(target=storage.delete, args=("c0/seg.1/other",))
            delete.start()
            delete.join(timeout=0.2)  # with the lock, the delete waits until the file is open
            deletes.append(delete)
        return real_open(path, flags, *mode)

    monkeypatch.setattr(os, "open", open_as_a_delete_empties_the_folder)
    storage.create("c0/seg.1/e1", b"data")
    for delete in deletes:
        delete.join()
    monkeypatch.undo()
    assert len(deletes) == 1
    assert storage.read(storage.open_read("c0/seg.1/e1"), 0, 10) == b"data"
    assert [info.name for info in storage.list()] == ["c0/seg.1/e1"]


def test_a_folder_is_not_a_chunk(storage: LocalChunkStorage) -> None:
    storage.create("c0/seg.1/e1", b"x")
    assert not storage.exists("c0/seg.1")
    with pytest.raises(ChunkNotFound):
        storage.info("c0/seg.1")
    with pytest.raises(ChunkNotFound):
        storage.read(ChunkHandle("c0/seg.1", read_only=True), 0, 1)
    with pytest.raises(ChunkNotFound):
        storage.open_write("c0/seg.1")


def test_concat_without_copy_file_range(storage: LocalChunkStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(*_: Any) -> int:
        raise OSError(errno.EXDEV, "cross-device copy")

    monkeypatch.setattr(local, "COPY_BLOCK_BYTES", 7)
    monkeypatch.setattr(os, "copy_file_range", unsupported)
    handle = storage.create("t", b"target:")
    storage.create("a", b"0123456789" * 3)
    storage.create("b", b"!")
    assert storage.concat(handle, ["a", "b"]) == 38
    assert storage.read(handle, 0, 100) == b"target:" + b"0123456789" * 3 + b"!"


def test_a_failed_concat_cuts_the_target_back(
    storage: LocalChunkStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = local._copy
    calls = []

    def copy_then_fail(src: int, dst: int, count: int, dst_offset: int) -> None:
        calls.append(count)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        copy(src, dst, count, dst_offset)

    monkeypatch.setattr(local, "_copy", copy_then_fail)
    handle = storage.create("t", b"target")
    storage.create("a", b"aaa")
    storage.create("b", b"bbb")
    with pytest.raises(ChunkStorageError, match="No space"):
        storage.concat(handle, ["a", "b"])
    assert storage.read(handle, 0, 100) == b"target"


GEVENT_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()

    import sys

    from engine.tier2.local import LocalChunkStorage

    storage = LocalChunkStorage(sys.argv[1])
    handle = storage.create("c0/s.1/e1", b"abc")
    storage.write(handle, 3, b"def")
    storage.create("c0/s.1/e2", b"ghi")
    storage.concat(handle, ["c0/s.1/e2"])
    storage.truncate(handle, 8)
    print(storage.read(handle, 0, 100).decode(), [i.name for i in storage.list("c0/")])
    """
)


@pytest.mark.process
def test_works_under_gevent(tmp_path: Path) -> None:
    """Under monkey-patching every disk call goes through gevent's thread pool, and still works."""
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_SCRIPT, str(tmp_path / "root")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "abcdefgh ['c0/s.1/e1', 'c0/s.1/e2']"


def test_a_full_disk_and_a_folder_we_may_not_write_are_told_apart(
    storage: LocalChunkStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC heals once space is freed (ChunkStorageFull); EACCES is a misconfiguration."""
    handle = storage.create("c", b"x")
    real_pwrite = os.pwrite
    for code, raised in ((errno.ENOSPC, ChunkStorageFull), (errno.EACCES, ChunkStorageUnusable)):

        def refuse(fd: int, data: Any, offset: int, code: int = code) -> int:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "pwrite", refuse)
        with pytest.raises(raised):
            storage.write(handle, 1, b"y")
        monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert storage.write(handle, 1, b"y") == 2
