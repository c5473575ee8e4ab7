"""Who may open a store, and with what: the data folder's lock and the store record.

With Tier 1 on local files the data folder holds both: an exclusive
``flock`` on ``LOCK`` (one server process per folder; ``StoreLocked``
otherwise) and ``store.json``; with ``processes`` > 1 each process holds
a slot instead, and they share the lock (``engine/cluster/processes.py``).
With Tier 1 on S3 there is no lock (each
container log's fence takes its place) and the record lives in the bucket.
The record is checked when the store opens (``Misconfigured`` on a
difference) but written only once every container has recovered, so that a
start that failed binds the store to nothing (``engine/store/record.py``).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

from engine.blocking import run_blocking
from engine.cluster.processes import ProcessSlot
from engine.config import Settings
from engine.errors import StoreLocked
from engine.naming import FOLDER_LOCK_NAME
from engine.store import record as store_record
from engine.tier2.chunk_storage import ChunkStorage, ChunkStorageError

log = logging.getLogger(__name__)



def locked(data: Path, holder: str) -> StoreLocked:
    """The refusal of a start on a folder another server holds (``holder``: its pid, as it wrote it)."""
    return StoreLocked(
        f"another process (pid {holder}) owns the data directory {data}: stop it, "
        "or set SEGSTORE_DATA_DIR to another folder"
    )


def _holder(fd: int) -> str:
    return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"


def check_unlocked(data: Path) -> None:
    """``StoreLocked`` if a server holds ``data`` now (one process or several); nothing is taken.

    Blocking disk I/O. A start's early check only: the lock is taken when the store opens.
    """
    try:
        fd = os.open(data / FOLDER_LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise locked(data, _holder(fd)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class DataFolder:
    """The lock and the record of one store; ``tier1_objects`` gives an S3 Tier 1's bucket."""

    def __init__(self, settings: Settings, tier1_objects: Callable[[], ChunkStorage]) -> None:
        self.settings = settings
        self._tier1_objects = tier1_objects
        self._lock_fd: int | None = None
        self._record_to_write: store_record.StoreRecord | None = None
        self.slot: ProcessSlot | None = None  # this process's, one of several over the folder

    def open(self) -> None:
        """Take the lock (or a process slot) and check the record (StoreLocked, Misconfigured)."""
        s = self.settings
        if s.local_members:
            self.slot = ProcessSlot(s.data_path.resolve(), s.processes, s.node_id)
            self.slot.take()
            try:
                if s.tier1_s3 is None:
                    data = s.data_path.resolve()
                    self._record_to_write = run_blocking(store_record.check_in_folder, data, s)
                    run_blocking(store_record.sweep_temporaries, data)
                else:
                    self._record_to_write = store_record.check_in_bucket(self._tier1_objects(), s)
            except BaseException:
                self.slot.close()
                raise
        elif self.settings.tier1_s3 is None:
            run_blocking(self._lock_and_check)
        else:
            self._record_to_write = store_record.check_in_bucket(self._tier1_objects(), self.settings)

    def _lock_and_check(self) -> None:
        data = self.settings.data_path.resolve()
        data.mkdir(parents=True, exist_ok=True)
        fd = os.open(data / FOLDER_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise locked(data, holder) from None
        # The holder's pid, for the message above (the lock itself is the flock, dropped on exit).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            self._record_to_write = store_record.check_in_folder(data, self.settings)
            store_record.sweep_temporaries(data)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def write_record(self) -> None:
        """Write the record if it is missing or partial (once every container reached Tier 2)."""
        record, self._record_to_write = self._record_to_write, None
        if record is None:
            return
        try:
            if self.settings.tier1_s3 is None:
                run_blocking(store_record.write_in_folder, self.settings.data_path, record)
            else:
                store_record.write_in_bucket(self._tier1_objects(), record)
        except (OSError, ChunkStorageError) as exc:
            log.warning("the store record is not written (%s); the next start writes it", exc)

    def close(self) -> None:
        """Release the lock."""
        if self.slot is not None:
            self.slot.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
