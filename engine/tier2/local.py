"""LocalChunkStorage: Tier 2 in a local folder, one file per chunk.

A chunk name is a relative path below the root (``c0/seg.3/e...-o...-1a2b``);
missing folders are created, each made durable in its parent, and folders a
delete leaves empty are removed again (one lock keeps a delete from removing
a folder a create is about to use). Every method does its disk work in one
``run_blocking`` call, so under gevent it runs on a real OS thread.

- create: the bytes go to a temporary file in the chunk's folder, are
  fsynced, then ``os.link`` gives the file its name. ``link`` fails if the
  name exists, so create is exclusive, and a crash leaves either the whole
  chunk or none (plus, at worst, a temporary file ``list`` never shows).
- write: under an exclusive ``flock``, the offset must be the file's size
  (BadChunkOffset otherwise), then ``pwrite`` and ``fdatasync``.
- concat: the sources are opened first (all exist or nothing changes), then
  appended in place with ``copy_file_range`` (plain reads and writes where
  the kernel cannot), then ``fdatasync``; a failure cuts the target back.
- Errors: a missing chunk is ChunkNotFound, any other OSError a
  ChunkStorageError. A name with ``..``, empty or ``.`` parts, or an absolute
  name is a ValueError, as is writing through a read-only handle.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.blocking import os_thread_lock, run_blocking, sync_folder
from engine.tier2.chunk_storage import (
    BadChunkOffset,
    ChunkExists,
    ChunkHandle,
    ChunkInfo,
    ChunkNotFound,
    ChunkStorageError,
    ChunkStorageFull,
    ChunkStorageUnusable,
    Pieces,
    pieces_of,
)

# Temporary files of ``create`` start with this; no chunk's file name may.
TEMP_PREFIX = ".segstore-tmp-"
COPY_BLOCK_BYTES = 1024 * 1024
# copy_file_range cannot do it (other file system, old kernel): copy by hand.
_NO_COPY_RANGE = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}
# Held by a create from making its chunk's folder until its temporary file is
# in it, and by a delete while it removes the folders it emptied: otherwise a
# delete could remove a folder between a create's mkdir and its open. One per
# process, as no other process writes the data folder (it is locked).
_FOLDERS = os_thread_lock()


class LocalChunkStorage:
    """Chunks as files under ``root``; appends, concatenates and truncates natively."""

    supports_append = True
    supports_concat = True
    supports_truncation = True

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        parts = name.split("/")
        if (
            not name
            or name.startswith("/")
            or "\x00" in name
            or any(p in ("", ".", "..") for p in parts)
            or parts[-1].startswith(TEMP_PREFIX)
        ):
            raise ValueError(f"bad chunk name {name!r}")
        return self.root.joinpath(*parts)

    # ------------------------------------------------------------ create
    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        """Write ``data`` to a new file atomically; ChunkExists if the name is taken."""
        path = self._path(name)
        with _translated(name):
            run_blocking(self._create, path, name, data)
        return ChunkHandle(name, read_only=False)

    def _create(self, path: Path, name: str, data: bytes) -> None:
        temp = path.with_name(f"{TEMP_PREFIX}{secrets.token_hex(8)}")
        with _FOLDERS:  # once the temporary file is in it, no delete removes the folder
            self._make_folders(path.parent)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                _write_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, path)
            except FileExistsError:
                raise ChunkExists(f"chunk {name!r} exists") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        sync_folder(path.parent)

    def _make_folders(self, folder: Path) -> None:
        """Create ``folder`` and any missing parents, each made durable in its parent."""
        missing = []
        while not folder.is_dir():
            missing.append(folder)
            folder = folder.parent
        for made in reversed(missing):
            try:
                os.mkdir(made)
            except FileExistsError:
                continue
            sync_folder(made.parent)

    # ------------------------------------------------------------ lookups
    def exists(self, name: str) -> bool:
        path = self._path(name)
        with _translated(name):
            return run_blocking(_regular_size, path) is not None

    def open_read(self, name: str) -> ChunkHandle:
        self.info(name)
        return ChunkHandle(name, read_only=True)

    def open_write(self, name: str) -> ChunkHandle:
        self.info(name)
        return ChunkHandle(name, read_only=False)

    def info(self, name: str) -> ChunkInfo:
        path = self._path(name)
        with _translated(name):
            size = run_blocking(_regular_size, path)
        if size is None:
            raise ChunkNotFound(f"no chunk {name!r}")
        return ChunkInfo(name, size)

    # ------------------------------------------------------------- data
    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; b"" past the end or for length 0."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad read range: offset {offset}, length {length}")
        path = self._path(handle.name)
        if length == 0:
            return b""
        with _translated(handle.name):
            return run_blocking(_read, path, offset, length)

    def read_stream(self, handle: ChunkHandle, offset: int, length: int, piece_bytes: int) -> Pieces:
        return pieces_of(self.read, handle, offset, length, piece_bytes)

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """Append ``data`` at ``offset`` (the file's size) and fdatasync; returns the new size."""
        path = self._writable(handle)
        with _translated(handle.name):
            return run_blocking(_write, path, handle.name, offset, data)

    def concat(self, target: ChunkHandle, sources: Sequence[str]) -> int:
        """Append the sources' bytes to ``target`` in place; returns its new size."""
        path = self._writable(target)
        named = [(source, self._path(source)) for source in sources]
        with _translated(target.name):
            return run_blocking(_concat, path, named)

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        """Cut the file to ``length``; BadChunkOffset if it is shorter than that."""
        path = self._writable(handle)
        with _translated(handle.name):
            run_blocking(_truncate, path, handle.name, length)

    def _writable(self, handle: ChunkHandle) -> Path:
        if handle.read_only:
            raise ValueError(f"chunk handle {handle.name!r} is read-only")
        return self._path(handle.name)

    # ---------------------------------------------------------- clean-up
    def delete(self, name: str) -> None:
        """Remove the file and the folders that leaves empty; no error if it is gone."""
        path = self._path(name)
        with _translated(name):
            run_blocking(self._delete, path)

    def _delete(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        folder = path.parent
        with _FOLDERS:
            while folder != self.root and self.root in folder.parents:
                try:
                    os.rmdir(folder)
                except OSError:  # not empty (or already gone): the walk up ends here
                    break
                folder = folder.parent
        with contextlib.suppress(FileNotFoundError):
            sync_folder(folder)

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        """The chunks whose names start with ``prefix``, in name order (temporary files skipped)."""
        folder = prefix.rpartition("/")[0]
        start = self._path(folder) if folder else self.root
        with _translated(prefix):
            found = run_blocking(self._walk, start, prefix)
        return iter(found)

    def _walk(self, start: Path, prefix: str) -> builtins.list[ChunkInfo]:
        found: list[ChunkInfo] = []
        folders = [start]
        while folders:
            try:
                entries = list(os.scandir(folders.pop()))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                    continue
                if entry.name.startswith(TEMP_PREFIX) or not entry.is_file(follow_symlinks=False):
                    continue
                name = Path(entry.path).relative_to(self.root).as_posix()
                if not name.startswith(prefix):
                    continue
                try:
                    found.append(ChunkInfo(name, entry.stat(follow_symlinks=False).st_size))
                except FileNotFoundError:
                    continue  # deleted while we walked
        found.sort(key=lambda info: info.name)
        return found


@contextlib.contextmanager
def _translated(name: str) -> Iterator[None]:
    """OSErrors as chunk errors: missing files are ChunkNotFound, a full disk ChunkStorageFull,
    a folder we may not write ChunkStorageUnusable, the rest ChunkStorageError."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        raise ChunkNotFound(f"no chunk {name!r}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ChunkStorageFull(f"chunk {name!r}: {exc}") from exc
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ChunkStorageUnusable(f"chunk {name!r}: {exc}") from exc
        raise ChunkStorageError(f"chunk {name!r}: {exc}") from exc


def _open(path: Path, flags: int) -> int:
    """Open a chunk's file; FileNotFoundError unless it is a regular file."""
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "not a chunk file", str(path))
    return fd


def _regular_size(path: Path) -> int | None:
    """The file's size, or None if there is no regular file at ``path``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _read(path: Path, offset: int, length: int) -> bytes:
    fd = _open(path, os.O_RDONLY)
    try:
        parts = []
        while length > 0:
            piece = os.pread(fd, length, offset)
            if not piece:
                break
            parts.append(piece)
            offset += len(piece)
            length -= len(piece)
        return b"".join(parts)
    finally:
        os.close(fd)


def _write(path: Path, name: str, offset: int, data: bytes) -> int:
    fd = _open(path, os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if offset != size:
            raise BadChunkOffset(f"chunk {name!r} has {size} bytes, a write expected {offset}")
        if data:
            _write_all(fd, data, offset)
            os.fdatasync(fd)
        return offset + len(data)
    finally:
        os.close(fd)


def _concat(path: Path, sources: Sequence[tuple[str, Path]]) -> int:
    fd = _open(path, os.O_WRONLY)
    opened: list[int] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for name, source in sources:
            try:
                opened.append(_open(source, os.O_RDONLY))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise ChunkNotFound(f"no chunk {name!r} to concatenate") from None
        lengths = [os.fstat(src).st_size for src in opened]
        start = os.fstat(fd).st_size
        end = start
        try:
            for src, length in zip(opened, lengths, strict=True):
                _copy(src, fd, length, end)
                end += length
            if end != start:
                os.fdatasync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        return end
    finally:
        for src in opened:
            os.close(src)
        os.close(fd)


def _truncate(path: Path, name: str, length: int) -> None:
    fd = _open(path, os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if not 0 <= length <= size:
            raise BadChunkOffset(f"chunk {name!r} has {size} bytes, cannot cut to {length}")
        if length != size:
            os.ftruncate(fd, length)
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _copy(src: int, dst: int, count: int, dst_offset: int) -> None:
    """Copy ``count`` bytes from the start of ``src`` to ``dst`` at ``dst_offset``."""
    src_offset = 0
    while src_offset < count:
        try:
            copied = os.copy_file_range(src, dst, count - src_offset, src_offset, dst_offset + src_offset)
        except OSError as exc:
            if exc.errno not in _NO_COPY_RANGE:
                raise
            break
        if copied == 0:
            raise ChunkStorageError(f"a concat source shrank while it was copied ({src_offset} of {count})")
        src_offset += copied
    while src_offset < count:
        block = os.pread(src, min(COPY_BLOCK_BYTES, count - src_offset), src_offset)
        if not block:
            raise ChunkStorageError(f"a concat source shrank while it was copied ({src_offset} of {count})")
        _write_all(dst, block, dst_offset + src_offset)
        src_offset += len(block)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
