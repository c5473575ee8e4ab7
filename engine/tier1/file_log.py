"""FileDataLog: Tier 1 on local files (seed 000 "Durable Data Log", local file system).

The log is a folder of files named after their first frame sequence number
(see ``engine.naming``). A write goes to the newest file, then waits for the
node's next sync round (``GroupSync``: one ``syncfs`` for every container's
files), or for its own ``fdatasync`` without one; a new file is started once the current one passes
``file_bytes`` (a write never spans files). Truncation deletes whole files.
On recovery a torn or corrupt write at the end of the newest file is cut off;
anything wrong before that is corruption and stops the container.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from engine.durable_log import frames
from engine.durable_log.data_log import PendingWrite, write_one
from engine.errors import DataCorrupted
from engine.naming import log_file_name, parse_log_file_name
from engine.tier1.group_sync import GroupSync

log = logging.getLogger(__name__)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileDataLog:
    """A folder of append-only log files; blocking, single writer, one write in flight."""

    max_writes_in_flight = 1
    cooperative = False

    def __init__(
        self, folder: Path, *, file_bytes: int, max_frame_bytes: int = 1 << 20, group: GroupSync | None = None
    ) -> None:
        self.folder = Path(folder)
        self._group = group
        self.file_bytes = file_bytes
        self.max_frame_bytes = max_frame_bytes
        self._files: list[tuple[int, Path]] = []  # (first frame seq, path), oldest first
        self._fd: int | None = None
        self._size = 0  # of the newest file
        self._older_bytes = 0  # of the files before it
        self._next_seq = 0
        self._broken: str | None = None

    def _scan(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        found = []
        for entry in self.folder.iterdir():
            seq = parse_log_file_name(entry.name)
            if seq is not None:
                found.append((seq, entry))
        self._files = sorted(found)

    def recover(self) -> Iterator[frames.Batch]:
        self._scan()
        expected: int | None = None
        for index, (first_seq, path) in enumerate(self._files):
            newest = index == len(self._files) - 1
            if expected is not None and first_seq != expected:
                raise DataCorrupted(f"{path.name}: starts at frame {first_seq}, expected {expected}")
            data = path.read_bytes()
            end = 0
            expected = first_seq
            try:
                for batch in frames.iter_batches(data, first_seq):
                    end = batch.end
                    expected = batch.first_frame_seq + batch.frame_count
                    yield batch
            except frames.TornTail as torn:
                if not newest:
                    raise DataCorrupted(f"{path.name}: {torn} (not the newest log file)") from None
                if frames.valid_frame_after(data, torn.position, expected, self.max_frame_bytes):
                    raise DataCorrupted(f"{path.name}: {torn}, followed by whole writes") from None
                log.warning("%s: cutting off a torn write (%s)", path, torn)
                with open(path, "r+b") as fh:
                    fh.truncate(torn.position)
                    os.fdatasync(fh.fileno())
                end = torn.position
            if newest:
                self._size = end
            else:
                self._older_bytes += len(data)
        self._next_seq = expected if expected is not None else 0

    def _open_current(self, first_seq: int) -> None:
        if not self._files or self._size >= self.file_bytes:
            path = self.folder / log_file_name(first_seq)
            self._close_fd()
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            _fsync_dir(self.folder)
            if self._files:
                self._older_bytes += self._size
            self._files.append((first_seq, path))
            self._size = 0
        elif self._fd is None:
            self._fd = os.open(self._files[-1][1], os.O_WRONLY)
            os.lseek(self._fd, self._size, os.SEEK_SET)

    def begin(self, payload: bytes) -> PendingWrite:
        if self._broken:
            raise OSError(f"Tier 1 log is unusable: {self._broken}")
        first = self._next_seq
        buf, count = frames.encode_batch(payload, first, self.max_frame_bytes)
        self._next_seq += count
        return PendingWrite(first, count, buf)

    @property
    def cooperative_write(self) -> bool:
        """With sync rounds, ``write`` only waits: the round thread does its disk calls."""
        return self._group is not None

    def write(self, pending: PendingWrite) -> None:
        """Write the frames at the end of the newest file and make them durable.

        With sync rounds the writing and the sync run on the round thread (one
        sync for every container's writes); without, here, with an fdatasync.
        """
        start = self._size if self._files and self._size < self.file_bytes else 0
        if self._group is not None:
            self._group.write(lambda: self._store(pending), lambda: self._undo(start), self)
        else:
            try:
                os.fdatasync(self._store(pending))
            except OSError:
                self._undo(start)
                raise
        assert self._size == start
        self._size += len(pending.data)

    def _store(self, pending: PendingWrite) -> int:
        """Write ``pending``'s frames at the end of the newest file (or a new one); returns its fd."""
        self._open_current(pending.first_frame_seq)
        assert self._fd is not None
        view = memoryview(pending.data)
        while view:
            view = view[os.write(self._fd, view) :]
        return self._fd

    def abandon(self, pending: PendingWrite) -> None:
        """The failed write was cut off already (``_undo``); its frame numbers are free again.

        If it could not be cut off, it may be read back: OSError.
        """
        self._next_seq = pending.first_frame_seq
        if self._broken:
            raise OSError(errno.EIO, f"Tier 1 is unusable: {self._broken}")

    def append(self, payload: bytes) -> tuple[int, int]:
        return write_one(self, payload)

    def _undo(self, start: int) -> None:
        """Cut a failed write off so the log stays a sequence of whole writes."""
        if self._fd is None:
            return  # it failed before its file was open: nothing was written
        try:
            os.ftruncate(self._fd, start)
            os.lseek(self._fd, start, os.SEEK_SET)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._broken = f"a failed write could not be undone: {exc}"
            log.error("Tier 1 %s: %s", self.folder, self._broken)

    def truncate(self, frame_seq: int) -> int:
        freed = 0
        while len(self._files) > 1 and self._files[1][0] <= frame_seq:
            _, path = self._files.pop(0)
            freed += path.stat().st_size
            path.unlink()
        if freed:
            _fsync_dir(self.folder)
        self._older_bytes = max(self._older_bytes - freed, 0)
        return freed

    def disk_usage(self) -> tuple[int, int]:
        """(files, bytes) the log holds on disk now, as tracked by its writes (no disk call)."""
        return len(self._files), self._older_bytes + self._size

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close_fd()
