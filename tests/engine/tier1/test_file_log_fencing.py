"""A fenced FileDataLog shared by the processes of one node: a newer owner's recovery fences the older.

The older owner stands for a process paused (SIGSTOP) while it held the log:
it still has its files open and writes on once it resumes. Whatever it
writes after the newer owner's recovery is never acknowledged, and never
read by any later recovery.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path

import pytest

from engine.durable_log.data_log import LogFenced
from engine.naming import log_file_name, parse_log_file_name
from engine.tier1.file_log import EPOCH_FILE, FileDataLog, bump_epoch
from engine.tier1.group_sync import GroupSync

FRAME = 4096


def open_log(
    folder: Path, file_bytes: int = 1 << 20, group: GroupSync | None = None
) -> tuple[FileDataLog, list[bytes]]:
    log = FileDataLog(folder, file_bytes=file_bytes, max_frame_bytes=FRAME, group=group, fenced=True)
    return log, [batch.payload for batch in log.recover()]


def log_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if parse_log_file_name(p.name) is not None)


def test_each_recovery_bumps_the_epoch_and_starts_a_file_of_its_own(tmp_path: Path) -> None:
    old, _ = open_log(tmp_path)
    old.append(b"one")
    old.close()
    new, payloads = open_log(tmp_path)
    assert payloads == [b"one"]
    new.append(b"two")
    new.close()
    assert (tmp_path / EPOCH_FILE).read_text().strip().lstrip("0") == "2"
    assert log_files(tmp_path) == [log_file_name(0), log_file_name(1)]
    assert open_log(tmp_path)[1] == [b"one", b"two"]


def test_an_older_owner_is_fenced_and_its_late_writes_are_never_read(tmp_path: Path) -> None:
    old, _ = open_log(tmp_path)
    assert old.append(b"acknowledged") == (0, 1)
    new, payloads = open_log(tmp_path)
    assert payloads == [b"acknowledged"]
    with pytest.raises(LogFenced) as fenced:
        old.append(b"late")  # lands in the old file, past the point the new owner read
    assert fenced.value.errno == errno.EPERM
    with pytest.raises(LogFenced):
        old.append(b"later")  # fenced for good, without touching the disk
    assert new.append(b"new owner") == (1, 1)
    with pytest.raises(LogFenced):
        old.truncate(1)
    new.close()
    old.close()
    assert open_log(tmp_path)[1] == [b"acknowledged", b"new owner"]


def test_a_late_write_that_starts_a_file_never_replaces_the_newer_owners(tmp_path: Path) -> None:
    old, _ = open_log(tmp_path, file_bytes=1)  # every write starts a file
    old.append(b"one")
    new, _ = open_log(tmp_path)
    assert new.append(b"two") == (1, 1)  # file 1, created first by the new owner
    with pytest.raises(LogFenced):
        old.append(b"late")  # its file 1 exists: the older owner is fenced, the file kept
    new.close()
    old.close()
    assert open_log(tmp_path)[1] == [b"one", b"two"]


def test_a_file_an_older_owner_started_after_the_recovery_is_replaced(tmp_path: Path) -> None:
    old, _ = open_log(tmp_path, file_bytes=1)
    old.append(b"one")
    new, _ = open_log(tmp_path)
    with pytest.raises(LogFenced):
        old.append(b"late")  # creates file 1 first, then finds the newer epoch
    assert log_files(tmp_path) == [log_file_name(0), log_file_name(1)]
    assert new.append(b"two") == (1, 1)  # replaces the never-read file 1
    new.close()
    old.close()
    assert open_log(tmp_path)[1] == [b"one", b"two"]


def test_a_single_process_reads_a_once_shared_folder_with_its_late_writes_cut(tmp_path: Path) -> None:
    old, _ = open_log(tmp_path)
    old.append(b"one")
    new, _ = open_log(tmp_path)
    with pytest.raises(LogFenced):
        old.append(b"late")
    new.append(b"two")
    new.close()
    old.close()
    alone = FileDataLog(tmp_path, file_bytes=1 << 20, max_frame_bytes=FRAME)  # processes back at 1
    assert [batch.payload for batch in alone.recover()] == [b"one", b"two"]
    alone.close()


def test_fencing_with_sync_rounds(tmp_path: Path) -> None:
    group = GroupSync()
    try:
        old, _ = open_log(tmp_path, group=group)
        old.append(b"one")
        new, _ = open_log(tmp_path, group=group)
        with pytest.raises(LogFenced):
            old.append(b"late")
        new.append(b"two")
        new.close()
        old.close()
    finally:
        group.close()
    assert open_log(tmp_path)[1] == [b"one", b"two"]


def _bump(folder: str, out: multiprocessing.Queue) -> None:
    epochs = []
    for _ in range(50):
        epoch, fd = bump_epoch(Path(folder))
        epochs.append(epoch)
        os.close(fd)
    out.put(epochs)


def test_racing_recoveries_in_processes_each_get_an_epoch_of_their_own(tmp_path: Path) -> None:
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_bump, args=(str(tmp_path), out)) for _ in range(4)]
    for proc in procs:
        proc.start()
    epochs = [epoch for _ in procs for epoch in out.get(timeout=60)]
    for proc in procs:
        proc.join(30)
    assert sorted(epochs) == list(range(1, 201))
