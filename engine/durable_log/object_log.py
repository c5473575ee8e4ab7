"""ObjectDataLog: Tier 1 on an object store, one object per write (docs/tier1-on-s3.md).

Seed 000 ("Storage Abstractions") calls a log on one node's disk
semi-durable; this binding puts the write-ahead log in object storage, as
object-store logs do (SlateDB, S2, WarpStream), through the ``ChunkStorage``
seam (S3, memory, local folder, and the fault-injecting wrapper alike).

Layout: a write is the object ``c{container}/wal/{first frame seq:020d}``
(``engine.naming``), created put-if-absent (S3: ``If-None-Match: *``), and a
write is durable (and answered) once the create returned. Its bytes are

    magic "SGW1" | writer epoch u64 | CRC32C u32 of both | frames (``frames.py``)

Fencing (SlateDB's way): a log has one writer. ``recover`` reads every
object, picks an epoch above every epoch it saw, and claims the next
sequence number with a fence object (one empty frame). An older writer's
next create then finds that name taken by a newer epoch: it raises
``LogFenced`` and never acknowledges again. Invariants:

- the objects of the log, in sequence order, are contiguous and their epochs
  never decrease; an object of an older epoch past a newer one is a *ghost*
  (a pipelined or retried write of a fenced writer, never acknowledged, since
  the slot before it belongs to the newer writer) and is deleted when met;
- a name taken by our own bytes is our own earlier attempt: success;
- a name taken by an epoch at or above ours: we are fenced (never retried);
- a missing object followed by objects of a newer writer is corruption.
"""

from __future__ import annotations

import errno
import logging
import struct
import threading
from collections.abc import Iterator

import crc32c

from engine.durable_log import frames
from engine.durable_log.data_log import LogFenced
from engine.errors import DataCorrupted
from engine.naming import parse_wal_object_name, wal_object_name, wal_prefix
from engine.tier2.chunk_storage import ChunkExists, ChunkNotFound, ChunkStorage, ChunkStorageError

log = logging.getLogger(__name__)

MAGIC = b"SGW1"
_HEADER = struct.Struct(">4sQI")


def encode_object(epoch: int, body: bytes) -> bytes:
    head = MAGIC + epoch.to_bytes(8, "big")
    return head + crc32c.crc32c(head).to_bytes(4, "big") + body


def decode_object(name: str, data: bytes) -> tuple[int, bytes]:
    """(writer epoch, frames) of a WAL object; DataCorrupted if its header is not whole."""
    if len(data) < _HEADER.size:
        raise DataCorrupted(f"Tier 1 object {name}: {len(data)} bytes, shorter than its header")
    magic, epoch, crc = _HEADER.unpack_from(data)
    if magic != MAGIC or crc32c.crc32c(data[:12]) != crc:
        raise DataCorrupted(f"Tier 1 object {name}: bad header")
    return epoch, data[_HEADER.size :]


def fence_frame(seq: int) -> bytes:
    """One empty frame with the LAST flag: a write that holds no operation."""
    head = frames.HEADER.pack(0, 0, seq, frames.LAST)
    crc = crc32c.crc32c(b"", crc32c.crc32c(head[8:]))
    return frames.HEADER.pack(0, crc, seq, frames.LAST)


class ObjectDataLog:
    """One container's Tier 1 log as objects; blocking, one writer (fenced by epoch)."""

    def __init__(self, storage: ChunkStorage, container_id: int, *, max_frame_bytes: int = 1 << 20) -> None:
        self.storage = storage
        self.container_id = container_id
        self.max_frame_bytes = max_frame_bytes
        self.epoch = 0
        self._next_seq = 0
        self._objects: list[int] = []  # first frame seq of every object of the log, oldest first
        self._lock = threading.Lock()
        self._fenced: str | None = None
        self._broken: str | None = None

    def _name(self, seq: int) -> str:
        return wal_object_name(self.container_id, seq)

    def _read(self, seq: int) -> tuple[int, bytes] | None:
        name = self._name(seq)
        try:
            handle = self.storage.open_read(name)
            length = self.storage.info(name).length
            return decode_object(name, self.storage.read(handle, 0, length))
        except ChunkNotFound:
            return None

    @staticmethod
    def _batches(name: str, body: bytes, first_seq: int) -> list[frames.Batch]:
        try:
            batches = list(frames.iter_batches(body, first_seq))
        except frames.TornTail as torn:
            raise DataCorrupted(f"Tier 1 object {name}: {torn}") from None
        if not batches:
            raise DataCorrupted(f"Tier 1 object {name} holds no write")
        return batches

    # ----------------------------------------------------------------- recovery
    def recover(self) -> Iterator[frames.Batch]:
        """Every write of the log in order, then fence older writers by claiming the next slot."""
        listed = sorted(
            seq
            for info in self.storage.list(wal_prefix(self.container_id))
            if (seq := parse_wal_object_name(self.container_id, info.name)) is not None
        )
        batches: list[frames.Batch] = []
        objects: list[int] = []
        expected: int | None = None
        top_epoch = 0  # the newest epoch of the contiguous log
        seen_epoch = 0
        leftovers: dict[int, int] = {}
        for seq in listed:
            read = self._read(seq)
            if read is None:
                continue  # deleted by a truncation meanwhile
            epoch, body = read
            seen_epoch = max(seen_epoch, epoch)
            if leftovers or (expected is not None and seq != expected) or epoch < top_epoch:
                leftovers[seq] = epoch
                continue
            found = self._batches(self._name(seq), body, seq)
            batches += found
            objects.append(seq)
            expected = found[-1].first_frame_seq + found[-1].frame_count
            top_epoch = epoch
        newer = {seq: epoch for seq, epoch in leftovers.items() if epoch > top_epoch}
        if newer:
            raise DataCorrupted(
                f"container {self.container_id}: Tier 1 object {self._name(expected or 0)} is missing, "
                f"and writes of a newer writer follow it (at {sorted(newer)[:3]})"
            )
        self.epoch = seen_epoch + 1
        self._next_seq = expected if expected is not None else 0
        batches += self._fence(objects, top_epoch)
        with self._lock:
            self._objects = objects
        yield from batches

    def _fence(self, objects: list[int], top_epoch: int) -> list[frames.Batch]:
        """Claim the next slot with an empty write of our epoch; returns writes that landed meanwhile.

        A write of the last writer (or a later one of an older epoch than ours)
        may land after our listing: it may have been acknowledged, so it is
        read and the fence moves past it. A ghost (older than the log's newest
        epoch) is deleted. An epoch at or above ours means a newer owner.
        """
        late: list[frames.Batch] = []
        while True:
            seq = self._next_seq
            try:
                self.storage.create(self._name(seq), encode_object(self.epoch, fence_frame(seq)))
                objects.append(seq)
                self._next_seq = seq + 1
                log.info("container %d: Tier 1 fenced at %d, epoch %d", self.container_id, seq, self.epoch)
                return late
            except ChunkExists:
                pass
            read = self._read(seq)
            if read is None:
                continue
            epoch, body = read
            if epoch >= self.epoch:
                owner = f"a writer of epoch {epoch} owns the Tier 1 log"
                raise LogFenced(f"container {self.container_id}: {owner}")
            if epoch < top_epoch:
                self.storage.delete(self._name(seq))
                continue
            found = self._batches(self._name(seq), body, seq)
            late += found
            objects.append(seq)
            top_epoch = epoch
            self._next_seq = found[-1].first_frame_seq + found[-1].frame_count

    # ------------------------------------------------------------------ writes
    def append(self, payload: bytes) -> tuple[int, int]:
        """One object holding ``payload``'s frames; durable on return. LogFenced once fenced.

        A create whose outcome is unknown (an error after the request left) is
        settled by reading the name back: our bytes there are a success, no
        object is a clean failure; anything else breaks the log, as the
        rolled-back operations might still be in it (a restart recovers).
        """
        if self._fenced:
            raise LogFenced(self._fenced)
        if self._broken:
            raise OSError(errno.EIO, f"Tier 1 log is unusable: {self._broken}")
        first = self._next_seq
        body, count = frames.encode_batch(payload, first, self.max_frame_bytes)
        data = encode_object(self.epoch, body)
        try:
            self._create(first, data)
        except ChunkStorageError as exc:
            try:
                landed = self._read(first)
            except (ChunkStorageError, DataCorrupted) as again:
                self._broken = f"the outcome of writing {self._name(first)} is unknown: {again}"
                raise OSError(errno.EIO, self._broken) from exc
            if landed is None:
                raise OSError(errno.EIO, f"Tier 1 write of {self._name(first)} failed: {exc}") from exc
            if encode_object(*landed) != data:
                self._broken = f"{self._name(first)} holds other bytes after a failed write"
                raise OSError(errno.EIO, self._broken) from exc
        with self._lock:
            self._objects.append(first)
        self._next_seq = first + count
        return first, count

    def _create(self, seq: int, data: bytes) -> None:
        """Create the object of ``seq``, settling a taken name: own bytes, a ghost, or a newer owner."""
        name = self._name(seq)
        while True:
            try:
                self.storage.create(name, data)
                return
            except ChunkExists:
                pass
            read = self._read(seq)
            if read is None:
                continue
            if encode_object(*read) == data:
                return  # our own earlier attempt landed
            epoch = read[0]
            if epoch < self.epoch:
                self.storage.delete(name)  # a ghost of a fenced writer: never acknowledged
                continue
            self._fenced = f"container {self.container_id}: fenced by a writer of epoch {epoch}"
            raise LogFenced(self._fenced)

    def truncate(self, frame_seq: int) -> int:
        """Delete the objects holding only frames below ``frame_seq``; returns bytes freed."""
        freed = 0
        while True:
            with self._lock:
                if len(self._objects) < 2 or self._objects[1] > frame_seq:
                    return freed
                seq = self._objects[0]
            name = self._name(seq)
            try:  # oldest first, stopping at a failure: the log never gets a hole
                size = self.storage.info(name).length
                self.storage.delete(name)
                freed += size
            except ChunkNotFound:
                pass
            except ChunkStorageError as exc:
                log.warning("container %d: Tier 1 object %s not deleted: %s", self.container_id, name, exc)
                return freed
            with self._lock:
                assert self._objects[0] == seq, (self._objects[:2], seq)
                self._objects.pop(0)

    def close(self) -> None:
        return None
