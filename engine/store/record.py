"""The store record: what a data folder was created with, so that it is never opened otherwise.

One small JSON object, ``store.json``: the container count (another would
re-route every name), where Tier 1 is and where Tier 2 is (the metadata in
Tier 1 names chunks in that Tier 2 only: opened against another, reads of
flushed bytes would fail and new chunks would land beside strangers). It
lives in the data folder, or with Tier 1 on S3 beside the log in the bucket,
where every node of the store reads the same one.

A store without a record (new, or created before records existed) gets one
once every container has recovered and reached Tier 2, so that a start that
fails (a misspelt bucket) binds the folder to nothing; a record from before
Tier 1 and Tier 2 were kept in it gets them added. Anything else that
differs from the settings refuses the start with ``Misconfigured``, naming
both values. The S3 endpoint is not recorded: the same bucket may be reached
under another address.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.config import Settings, tier1_location, tier2_location
from engine.errors import ContainerNotReady, DataCorrupted, Misconfigured
from engine.naming import STORE_RECORD_NAME
from engine.tier2.chunk_storage import (
    ChunkExists,
    ChunkNotFound,
    ChunkStorage,
    ChunkStorageError,
    ChunkStorageUnusable,
)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class StoreRecord:
    """What a store was created with; ``None``: not recorded yet (an older record)."""

    container_count: int
    tier1: str | None = None
    tier2: str | None = None

    @classmethod
    def for_settings(cls, settings: Settings) -> StoreRecord:
        return cls(settings.container_count, tier1_location(settings), tier2_location(settings))

    @classmethod
    def parse(cls, raw: bytes, where: str) -> StoreRecord:
        try:
            fields = json.loads(raw)
            return cls(int(fields["container_count"]), fields.get("tier1"), fields.get("tier2"))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataCorrupted(f"{where} is not a store record: {exc}") from None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @property
    def complete(self) -> bool:
        return self.tier1 is not None and self.tier2 is not None

    def refusal(self, wanted: StoreRecord, where: str) -> str | None:
        """Why a store created as ``self`` must not open with ``wanted``, or None."""
        if self.container_count != wanted.container_count:
            return (
                f"{where} was created with container_count={self.container_count}; "
                f"it cannot be opened with {wanted.container_count}"
            )
        for tier, had, now in (("Tier 1", self.tier1, wanted.tier1), ("Tier 2", self.tier2, wanted.tier2)):
            if had is not None and had != now:
                return (
                    f"{where} was created with {tier} at {had}, but the settings put {tier} at {now}: "
                    f"its data would not be found there. Start it with its own {tier} "
                    "(or give the other one a data folder of its own)"
                )
        return None

    def completed(self, wanted: StoreRecord) -> StoreRecord:
        """This record with what it does not hold yet taken from ``wanted``."""
        return StoreRecord(self.container_count, self.tier1 or wanted.tier1, self.tier2 or wanted.tier2)


def shown(location: str, settings: Settings) -> str:
    """A recorded location with the data folder's path in it, for a log line."""
    return location.replace("<data folder>", str(settings.data_path.absolute()), 1)


def check_in_folder(data: Path, settings: Settings) -> StoreRecord | None:
    """Compare the data folder's record with the settings; the record still to write, or None.

    Raises ``Misconfigured`` on a difference. Blocking disk I/O (callers go
    through ``run_blocking``).
    """
    path = data / STORE_RECORD_NAME
    wanted = StoreRecord.for_settings(settings)
    try:
        found = StoreRecord.parse(path.read_bytes(), str(path))
    except FileNotFoundError:
        return wanted
    refusal = found.refusal(wanted, f"data folder {data}")
    if refusal is not None:
        raise Misconfigured(refusal)
    return None if found.complete else found.completed(wanted)


def write_in_folder(data: Path, record: StoreRecord) -> None:
    """Write the record (atomically, durably). A full disk leaves it to the next start.

    The processes of a node may write it at once: each through a file of its own.
    """
    path = data / STORE_RECORD_NAME
    temp = path.with_name(f"{path.stem}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "wb") as fh:
            fh.write(record.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        with contextlib.suppress(OSError):
            temp.unlink()
        log.warning("data folder %s: the store record is not written (%s); the next start writes it",
                    data, exc)


# A temporary record file older than this is a crashed write's (a write takes milliseconds).
_STALE_TEMPORARY_S = 60.0


def sweep_temporaries(data: Path) -> None:
    """Remove the temporary files of record writes a crash cut short (``write_in_folder``).

    Blocking disk I/O. Another process of the node may be writing one now: only old ones go.
    """
    path = data / STORE_RECORD_NAME
    for temp in data.glob(f"{path.stem}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - temp.stat().st_mtime > _STALE_TEMPORARY_S:
                temp.unlink()
                log.info("data folder %s: %s removed (a record write a crash cut short)", data, temp.name)


def check_in_bucket(storage: ChunkStorage, settings: Settings) -> StoreRecord | None:
    """The same with Tier 1 on S3, where the record is an object beside the log."""
    where = f"Tier 1 {settings.tier1}"
    wanted = StoreRecord.for_settings(settings)
    try:
        found = _read_from_bucket(storage, where)
    except ChunkStorageUnusable as exc:
        raise Misconfigured.unusable(where, exc) from None
    except ChunkStorageError as exc:  # not waited for here: the server's start would time out
        raise ContainerNotReady(f"{where} does not answer: {exc}") from None
    if found is None:
        return wanted
    refusal = found.refusal(wanted, where)
    if refusal is not None:
        raise Misconfigured(refusal)
    return None if found.complete else found.completed(wanted)


def write_in_bucket(storage: ChunkStorage, record: StoreRecord) -> None:
    """Create the record object; an incomplete one is replaced (every node writes the same record)."""
    try:
        storage.create(STORE_RECORD_NAME, record.to_json())
        return
    except ChunkExists:
        pass
    found = _read_from_bucket(storage, STORE_RECORD_NAME)
    if found is not None and not found.complete:
        storage.delete(STORE_RECORD_NAME)
        with contextlib.suppress(ChunkExists):  # another node wrote it meanwhile
            storage.create(STORE_RECORD_NAME, found.completed(record).to_json())


def _read_from_bucket(storage: ChunkStorage, where: str) -> StoreRecord | None:
    try:
        handle = storage.open_read(STORE_RECORD_NAME)
        raw = storage.read(handle, 0, 1 << 16)
    except ChunkNotFound:
        return None
    return StoreRecord.parse(raw, f"{where}: {STORE_RECORD_NAME}")
