"""FileDataLog: Tier 1 on local files (seed 000 "Durable Data Log", local file system).

The log is a folder of files named after their first frame sequence number
(see ``engine.naming``). A write goes to the newest file, then waits for the
node's next sync round (``GroupSync``: one ``syncfs`` for every container's
files), or for its own ``fdatasync`` without one; a new file is started once the current one passes
``file_bytes`` (a write never spans files). Truncation deletes whole files.
On recovery a torn or corrupt write at the end of the newest file is cut off;
anything wrong before that is corruption and stops the container.

Shared by the processes of one node (``fenced``): an owner that lost its
container may be paused, not dead, and still hold the log's files open. So
each recovery first bumps the log's epoch (``EPOCH``, written in place and
synced), and a writer reads the epoch after each write has landed in its
file: a changed epoch means a newer owner, which read the log after its bump
and so either has the write or never will, and the writer stops for good
(``LogFenced``) without acknowledging or cutting it off. A fenced log never
writes to a file an earlier owner may hold: its first write starts a new
file, created exclusively, and a log file is read only up to the frame the
next file starts at (what an earlier owner wrote after a newer one's
recovery lies beyond that point).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from engine.blocking import sync_folder
from engine.durable_log import frames
from engine.durable_log.data_log import LogFenced, PendingWrite, write_one
from engine.errors import DataCorrupted
from engine.naming import log_file_name, parse_log_file_name
from engine.tier1.group_sync import GroupSync

log = logging.getLogger(__name__)

EPOCH_FILE = "EPOCH"
_EPOCH_BYTES = 21  # 20 digits and a newline, written in place



def bump_epoch(folder: Path) -> tuple[int, int]:
    """Raise the log's epoch by one, durably; returns it and the open epoch file to check it on.

    Read and written under an ``flock`` of the file, so two recoveries racing
    each get an epoch of their own.
    """
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / EPOCH_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            text = os.pread(fd, _EPOCH_BYTES, 0).strip()
            epoch = (int(text) if text else 0) + 1
            os.pwrite(fd, f"{epoch:020d}\n".encode(), 0)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except BaseException:
        os.close(fd)
        raise
    sync_folder(folder)
    return epoch, fd


def read_epoch(fd: int) -> int:
    """The epoch the file ``fd`` holds now (one read: its check costs microseconds)."""
    text = os.pread(fd, _EPOCH_BYTES, 0).strip()
    return int(text) if text else 0


class FileDataLog:
    """A folder of append-only log files; blocking, single writer, one write in flight."""

    max_writes_in_flight = 1
    cooperative = False

    def __init__(
        self,
        folder: Path,
        *,
        file_bytes: int,
        max_frame_bytes: int = 1 << 20,
        group: GroupSync | None = None,
        fenced: bool = False,
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
        self._fenced = fenced
        self._epoch = 0
        self._epoch_fd: int | None = None
        self._fenced_by: str | None = None  # set once a newer owner bumped the epoch
        self._new_file = False  # the next write starts a file of its own (a fenced log after recovery)

    def _scan(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        found = []
        for entry in self.folder.iterdir():
            seq = parse_log_file_name(entry.name)
            if seq is not None:
                found.append((seq, entry))
        self._files = sorted(found)

    def recover(self) -> Iterator[frames.Batch]:
        if self._fenced:
            self._epoch, self._epoch_fd = bump_epoch(self.folder)
        self._scan()
        # Files an earlier fenced owner may have written late into (a folder once shared) end
        # where the next one begins; otherwise anything past a file's frames is corruption.
        cut_at_next = self._fenced or (self.folder / EPOCH_FILE).exists()
        expected: int | None = None
        for index, (first_seq, path) in enumerate(self._files):
            newest = index == len(self._files) - 1
            if expected is not None and first_seq != expected:
                raise DataCorrupted(f"{path.name}: starts at frame {first_seq}, expected {expected}")
            data = path.read_bytes()
            end = 0
            expected = first_seq
            ends_at = None if newest or not cut_at_next else self._files[index + 1][0]
            try:
                for batch in frames.iter_batches(data, first_seq):
                    if ends_at is not None and batch.first_frame_seq >= ends_at:
                        break  # an earlier owner's write after a newer owner's recovery
                    end = batch.end
                    expected = batch.first_frame_seq + batch.frame_count
                    yield batch
            except frames.TornTail as torn:
                if ends_at is None or expected != ends_at:  # else cut at the next file, as above
                    end = self._cut_torn(path, data, torn, expected, newest)
            if newest:
                self._size = end
            else:
                self._older_bytes += end if cut_at_next else len(data)
        self._next_seq = expected if expected is not None else 0
        if self._fenced and self._files:
            self._new_file = True
            if self._files[-1][0] == self._next_seq:  # it holds no frame: the new file takes its name
                self._files.pop()[1].unlink()
                sync_folder(self.folder)

    def _cut_torn(self, path: Path, data: bytes, torn: frames.TornTail, expected: int, newest: bool) -> int:
        """Cut a torn write off the end of the newest file; where the file now ends. Else DataCorrupted."""
        if not newest:
            raise DataCorrupted(f"{path.name}: {torn} (not the newest log file)") from None
        if frames.valid_frame_after(data, torn.position, expected, self.max_frame_bytes):
            raise DataCorrupted(f"{path.name}: {torn}, followed by whole writes") from None
        log.warning("%s: cutting off a torn write (%s)", path, torn)
        with open(path, "r+b") as fh:
            fh.truncate(torn.position)
            os.fdatasync(fh.fileno())
        return torn.position

    def _open_current(self, first_seq: int) -> None:
        if not self._files or self._size >= self.file_bytes or self._new_file:
            path = self.folder / log_file_name(first_seq)
            self._close_fd()
            self._fd = self._create(path)
            sync_folder(self.folder)
            self._new_file = False
            if self._files:
                self._older_bytes += self._size
            self._files.append((first_seq, path))
            self._size = 0
        elif self._fd is None:
            self._fd = os.open(self._files[-1][1], os.O_WRONLY)
            os.lseek(self._fd, self._size, os.SEEK_SET)

    def _create(self, path: Path) -> int:
        """A new, empty log file at ``path``.

        A fenced log creates it exclusively: a file already there is a newer
        owner's (then this log is fenced) or an earlier owner's, written after
        this log's recovery and so never read (then it is replaced).
        """
        if not self._fenced:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            self._check_epoch()
            path.unlink()
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def _check_epoch(self) -> None:
        """LogFenced if a newer owner has recovered the log since this one did."""
        if self._epoch_fd is None:
            return
        if self._fenced_by is None:
            found = read_epoch(self._epoch_fd)
            if found != self._epoch:
                self._fenced_by = f"Tier 1 log {self.folder} was recovered by a newer owner (epoch {found})"
        if self._fenced_by is not None:
            raise LogFenced(errno.EPERM, self._fenced_by)

    def begin(self, payload: bytes) -> PendingWrite:
        if self._fenced_by is not None:
            raise LogFenced(errno.EPERM, self._fenced_by)
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
        start = self._size if self._files and self._size < self.file_bytes and not self._new_file else 0
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
        self._check_epoch()  # after the write landed: a newer owner either read it or never will
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
        """Cut a failed write off so the log stays a sequence of whole writes.

        Not once fenced: the newer owner may have read the write, and it cuts
        what it did not read itself.
        """
        if self._fd is None or self._fenced_by is not None:
            return  # it failed before its file was open: nothing was written
        try:
            os.ftruncate(self._fd, start)
            os.lseek(self._fd, start, os.SEEK_SET)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._broken = f"a failed write could not be undone: {exc}"
            log.error("Tier 1 %s: %s", self.folder, self._broken)

    def truncate(self, frame_seq: int) -> int:
        self._check_epoch()  # a newer owner decides what its log still needs
        freed = 0
        while len(self._files) > 1 and self._files[1][0] <= frame_seq:
            _, path = self._files.pop(0)
            freed += path.stat().st_size
            path.unlink()
        if freed:
            sync_folder(self.folder)
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
        if self._epoch_fd is not None:
            os.close(self._epoch_fd)
            self._epoch_fd = None
