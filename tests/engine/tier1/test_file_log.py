"""FileDataLog: append and recover, rolling files, truncation, torn tails, corruption, failed syncs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine import DataCorrupted
from engine.durable_log.frames import HEADER, iter_batches
from engine.naming import log_file_name, parse_log_file_name
from engine.tier1.file_log import FileDataLog

FRAME = 4096


def open_log(folder: Path, file_bytes: int = 1 << 20) -> tuple[FileDataLog, list[bytes]]:
    """A recovered log and the payloads it gave back."""
    log = FileDataLog(folder, file_bytes=file_bytes, max_frame_bytes=FRAME)
    return log, [batch.payload for batch in log.recover()]


def log_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if parse_log_file_name(p.name) is not None)


def test_empty_folder_recovers_empty_and_starts_at_frame_zero(tmp_path: Path) -> None:
    log, payloads = open_log(tmp_path / "t1")
    assert payloads == []
    assert log.append(b"first") == (0, 1)
    log.close()
    assert [p.name for p in log_files(tmp_path / "t1")] == [log_file_name(0)]


def test_append_then_recover(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    big = os.urandom(3 * FRAME)
    assert log.append(b"one") == (0, 1)
    first, count = log.append(big)
    assert first == 1 and count == 4
    assert log.append(b"three") == (5, 1)
    log.close()
    again, payloads = open_log(tmp_path)
    assert payloads == [b"one", big, b"three"]
    assert again.append(b"four") == (6, 1)
    again.close()
    assert open_log(tmp_path)[1] == [b"one", big, b"three", b"four"]


def test_files_roll_at_file_bytes_and_writes_never_span_files(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=300)
    payloads = [bytes([i]) * (50 + 40 * i) for i in range(10)]
    for payload in payloads:
        log.append(payload)
    log.close()
    files = log_files(tmp_path)
    assert len(files) > 3
    for path in files:
        data = path.read_bytes()
        batches = list(iter_batches(data, parse_log_file_name(path.name)))
        # whole writes only; a file is rolled only once it reached file_bytes
        assert batches and batches[-1].end == len(data)
        if path != files[-1]:
            assert len(data) >= 300
            assert len(data) - (HEADER.size + len(batches[-1].payload)) < 300
    assert open_log(tmp_path, file_bytes=300)[1] == payloads


def test_truncate_deletes_only_whole_files_below_the_address(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=1)
    for i in range(4):
        assert log.append(bytes([i]) * 10) == (i, 1)  # one write, one frame, one file each
    assert [parse_log_file_name(p.name) for p in log_files(tmp_path)] == [0, 1, 2, 3]
    assert log.truncate(0) == 0
    size = (tmp_path / log_file_name(0)).stat().st_size
    assert log.truncate(1) == size
    assert [parse_log_file_name(p.name) for p in log_files(tmp_path)] == [1, 2, 3]
    log.truncate(99)  # never the newest file
    assert [parse_log_file_name(p.name) for p in log_files(tmp_path)] == [3]
    log.append(b"more")
    log.close()
    assert open_log(tmp_path, file_bytes=1)[1] == [b"\x03" * 10, b"more"]


def test_truncate_keeps_a_file_holding_the_address(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=2 * (HEADER.size + 10))
    for i in range(6):
        log.append(bytes([i]) * 10)  # files start at frames 0, 2, 4
    assert [parse_log_file_name(p.name) for p in log_files(tmp_path)] == [0, 2, 4]
    log.truncate(3)
    assert [parse_log_file_name(p.name) for p in log_files(tmp_path)] == [2, 4]
    log.close()


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00\x00",  # partial header
        HEADER.pack(100, 0, 3, 1) + b"x" * 10,  # partial frame
        "missing last frame",
        "crc mismatch",
    ],
    ids=["partial header", "partial frame", "missing last frame", "crc mismatch"],
)
def test_torn_tail_is_cut_off_and_the_log_continues(tmp_path: Path, tail: bytes | str) -> None:
    log, _ = open_log(tmp_path)
    for payload in (b"a", b"b", b"c"):
        log.append(payload)
    log.close()
    path = log_files(tmp_path)[-1]
    whole = path.stat().st_size
    if tail == "missing last frame":
        torn, _ = open_log(tmp_path)
        size = 2 * FRAME
        torn.append(os.urandom(size))
        torn.close()
        last_frame = HEADER.size + size % (FRAME - HEADER.size)
        os.truncate(path, path.stat().st_size - last_frame)
    elif tail == "crc mismatch":
        torn, _ = open_log(tmp_path)
        torn.append(b"d" * 50)
        torn.close()
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(data)
    else:
        assert isinstance(tail, bytes)
        with open(path, "ab") as fh:
            fh.write(tail)
    log, payloads = open_log(tmp_path)
    assert payloads == [b"a", b"b", b"c"]
    assert path.stat().st_size == whole  # physically cut off
    assert log.append(b"d") == (3, 1)
    log.close()
    assert open_log(tmp_path)[1] == [b"a", b"b", b"c", b"d"]
    assert path.stat().st_size == whole + HEADER.size + 1


def test_torn_first_write_of_the_newest_file(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=1)
    log.append(b"a")
    log.append(b"b")
    log.close()
    newest = log_files(tmp_path)[-1]
    os.truncate(newest, 5)
    log, payloads = open_log(tmp_path, file_bytes=1)
    assert payloads == [b"a"] and newest.stat().st_size == 0
    assert log.append(b"c") == (1, 1)
    log.close()
    assert open_log(tmp_path, file_bytes=1)[1] == [b"a", b"c"]


def test_corrupt_frame_in_an_older_file_is_data_corrupted(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=1)
    for payload in (b"older", b"newer", b"newest"):
        log.append(payload)
    log.close()
    oldest = log_files(tmp_path)[0]
    data = bytearray(oldest.read_bytes())
    data[-1] ^= 0x01
    oldest.write_bytes(data)
    with pytest.raises(DataCorrupted):
        open_log(tmp_path, file_bytes=1)
    assert oldest.read_bytes() == data  # nothing cut off


def test_torn_tail_in_an_older_file_is_data_corrupted(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=1)
    log.append(b"a")
    log.append(b"b")
    log.close()
    with open(log_files(tmp_path)[0], "ab") as fh:
        fh.write(b"\x00\x01")
    with pytest.raises(DataCorrupted):
        open_log(tmp_path, file_bytes=1)


def test_missing_file_in_the_middle_is_data_corrupted(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, file_bytes=1)
    for payload in (b"a", b"b", b"c"):
        log.append(payload)
    log.close()
    log_files(tmp_path)[1].unlink()
    with pytest.raises(DataCorrupted):
        open_log(tmp_path, file_bytes=1)


def test_corrupt_write_followed_by_whole_writes_is_data_corrupted(tmp_path: Path) -> None:
    """Only the last write can be torn by a crash: damage before acknowledged writes is corruption."""
    log, _ = open_log(tmp_path)
    for payload in (b"a" * 20, b"b" * 20, b"c" * 20):
        log.append(payload)
    log.close()
    path = log_files(tmp_path)[-1]
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0x01  # inside the first write's payload
    path.write_bytes(data)
    with pytest.raises(DataCorrupted):
        open_log(tmp_path)
    assert path.read_bytes() == data  # acknowledged writes are not cut off


def test_failed_fdatasync_leaves_whole_writes_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _ = open_log(tmp_path)
    log.append(b"before")
    real = os.fdatasync
    failures = [OSError(5, "injected fdatasync failure")]

    def fdatasync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(OSError, match="injected"):
        log.append(b"lost" * 100)
    assert log_files(tmp_path)[-1].stat().st_size == HEADER.size + len(b"before")
    assert log.append(b"after") == (1, 1)
    log.close()
    assert open_log(tmp_path)[1] == [b"before", b"after"]


def test_log_refuses_writes_after_a_failed_undo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _ = open_log(tmp_path)
    log.append(b"before")

    def fdatasync(fd: int) -> None:
        raise OSError(5, "injected fdatasync failure")

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(OSError, match="injected"):
        log.append(b"lost")
    monkeypatch.undo()
    with pytest.raises(OSError, match="unusable"):
        log.append(b"refused")
    log.close()
    assert open_log(tmp_path)[1] == [b"before"]
