"""ObjectDataLog: Tier 1 on an object store, one object per write (docs/tier1-on-s3.md).

Seed 000 ("Storage Abstractions") calls a log on one node's disk
semi-durable; this binding puts the write-ahead log in object storage, as
object-store logs do (SlateDB, S2, WarpStream), through the ``ChunkStorage``
seam (S3, memory, local folder, and the fault-injecting wrapper alike).

Layout: the n-th write of a container's log is the object
``c{container}/wal/{n:020d}`` (``engine.naming``), created put-if-absent
(S3: ``If-None-Match: *``); a write is durable, and answered, once the create
returned. Write numbers are dense; frame sequence numbers (the log's
addresses) run on inside the objects. An object's bytes are

    magic "SGW1" | writer epoch u64 | CRC32C u32 of both | frames (``frames.py``, maybe none)

Fencing: a log has one writer. ``recover`` picks an epoch above every epoch
in the log and claims a write number past the log's end with an empty
object, then every number before it (SlateDB claims the next manifest id;
claiming further ahead wins against an old writer that is busy writing, and
the distance doubles each time the old writer gets there first). An older
writer's create then finds a name taken by a newer epoch: it raises
``LogFenced`` and never acknowledges again. Invariants:

- write numbers are dense and epochs never decrease along the log; an object
  of an older epoch after a newer one is a *ghost* (a fenced writer's write
  that was never acknowledged) and is deleted where it is met;
- a name taken by our own bytes is our own earlier attempt: success;
- a name taken by an epoch at or above ours: we are fenced (never retried);
- a missing object in the middle of the log is corruption, never skipped.
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
from engine.naming import (
    epoch_name,
    epoch_prefix,
    parse_epoch_name,
    parse_wal_object_name,
    wal_object_name,
    wal_prefix,
)
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


# How often recovery looks at the log again when its old writer moved on meanwhile, and how far
# past the log's end its fence may go (the distance doubles each time the old writer wins).
_RECOVERY_ATTEMPTS = 50
_FENCE_AHEAD_MAX = 1024


class ObjectDataLog:
    """One container's Tier 1 log as objects; blocking, one writer (fenced by epoch)."""

    def __init__(self, storage: ChunkStorage, container_id: int, *, max_frame_bytes: int = 1 << 20) -> None:
        self.storage = storage
        self.container_id = container_id
        self.max_frame_bytes = max_frame_bytes
        self.epoch = 0
        self._next_index = 0  # number of the next write
        self._next_seq = 0  # first frame sequence number of the next write
        self._objects: list[tuple[int, int]] = []  # (write number, first frame seq), oldest first
        self._lock = threading.Lock()
        self._fenced: str | None = None
        self._broken: str | None = None

    def _name(self, index: int) -> str:
        return wal_object_name(self.container_id, index)

    def _listed(self) -> list[int]:
        return sorted(
            index
            for info in self.storage.list(wal_prefix(self.container_id))
            if (index := parse_wal_object_name(self.container_id, info.name)) is not None
        )

    def _get(self, index: int) -> tuple[int, bytes] | None:
        """(epoch, frames) of write ``index``; None if there is no such object."""
        name = self._name(index)
        try:
            handle = self.storage.open_read(name)
            length = self.storage.info(name).length
            return decode_object(name, self.storage.read(handle, 0, length))
        except ChunkNotFound:
            return None

    def _batches(self, index: int, body: bytes, first_seq: int | None) -> list[frames.Batch]:
        try:
            return list(frames.iter_batches(body, first_seq))
        except frames.TornTail as torn:
            raise DataCorrupted(f"Tier 1 object {self._name(index)}: {torn}") from None

    # ----------------------------------------------------------------- recovery
    def recover(self) -> Iterator[frames.Batch]:
        """Take a new epoch, fence every older writer, then give back every write of the log in order.

        The fence needs a listing and two creates, never a read of the log, so
        it wins against an old writer that is still busy; reading follows,
        once no older writer can add to the log.
        """
        self.epoch = self._new_epoch()
        cache: dict[int, tuple[int, bytes]] = {}  # objects never change: each is read once
        ahead = 1
        for _ in range(_RECOVERY_ATTEMPTS):
            listed = self._listed()
            end = listed[-1] + 1 if listed else 0
            fence = end + ahead
            if not self._claim(fence, cache):
                ahead = min(2 * ahead, _FENCE_AHEAD_MAX)  # the old writer got there first: aim further
                continue
            made = [fence]
            made += [index for index in range(end, fence) if self._claim(index, cache)]
            if any(index > fence for index in self._listed()):
                for index in made:  # our fence fell into a hole the log had already moved past
                    self.storage.delete(self._name(index))
                continue
            log.info("container %d: Tier 1 fenced at %d, epoch %d", self.container_id, fence, self.epoch)
            yield from self._read_log(fence, cache)
            return
        raise DataCorrupted(
            f"container {self.container_id}: could not fence the Tier 1 log in {_RECOVERY_ATTEMPTS} "
            "attempts: another server keeps writing it"
        )

    def _new_epoch(self) -> int:
        """An epoch above every earlier writer's, and ours alone: a put-if-absent claim of its name."""
        prefix = epoch_prefix(self.container_id)
        while True:
            taken = [
                epoch
                for info in self.storage.list(prefix)
                if (epoch := parse_epoch_name(self.container_id, info.name)) is not None
            ]
            epoch = max(taken, default=0) + 1
            try:
                self.storage.create(epoch_name(self.container_id, epoch), b"")
            except ChunkExists:
                continue
            for old in taken:  # the newest claim is all a later writer needs
                self.storage.delete(epoch_name(self.container_id, old))
            return epoch

    def _claim(self, index: int, cache: dict[int, tuple[int, bytes]]) -> bool:
        """Take write ``index`` with an empty object of our epoch; False if a write of the log has it.

        An epoch above ours there is a newer owner: LogFenced.
        """
        while True:
            try:
                self.storage.create(self._name(index), encode_object(self.epoch, b""))
                return True
            except ChunkExists:
                pass
            got = self._get(index)
            if got is None:
                continue
            if got[0] >= self.epoch:
                owner = f"a writer of epoch {got[0]} owns the Tier 1 log"
                raise LogFenced(f"container {self.container_id}: {owner}")
            cache[index] = got
            return False

    def _read_log(self, fence: int, cache: dict[int, tuple[int, bytes]]) -> list[frames.Batch]:
        """Every write up to our fence, in order; the objects' frame numbers for truncation."""
        while True:
            indexes = [i for i in self._listed() if i <= fence]
            batches: list[frames.Batch] = []
            objects: list[tuple[int, int | None]] = []
            expected: int | None = None
            top = 0
            for position, index in enumerate(indexes):
                got = cache.get(index) or self._get(index)
                if got is None:
                    break  # truncated since the listing: list again
                if position and index != indexes[position - 1] + 1:
                    raise DataCorrupted(
                        f"container {self.container_id}: Tier 1 object {self._name(index - 1)} is missing"
                    )
                top = max(top, got[0])
                # A write of an older epoch than one before it is a ghost: never acknowledged.
                found = self._batches(index, got[1], expected) if got[0] == top else []
                objects.append((index, found[0].first_frame_seq if found else None))
                batches += found
                if found:
                    expected = found[-1].first_frame_seq + found[-1].frame_count
            else:
                self._next_seq = expected if expected is not None else 0
                following = self._next_seq
                filled: list[tuple[int, int]] = []
                for index, first in reversed(objects):  # an empty write starts where the next one does
                    following = first if first is not None else following
                    filled.append((index, following))
                with self._lock:
                    self._objects = filled[::-1]
                self._next_index = fence + 1
                return batches

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
        first, index = self._next_seq, self._next_index
        body, count = frames.encode_batch(payload, first, self.max_frame_bytes)
        data = encode_object(self.epoch, body)
        try:
            self._create(index, data)
        except ChunkStorageError as exc:
            try:
                landed = self._get(index)
            except (ChunkStorageError, DataCorrupted) as again:
                self._broken = f"the outcome of writing {self._name(index)} is unknown: {again}"
                raise OSError(errno.EIO, self._broken) from exc
            if landed is None:
                raise OSError(errno.EIO, f"Tier 1 write of {self._name(index)} failed: {exc}") from exc
            if encode_object(*landed) != data:
                self._broken = f"{self._name(index)} holds other bytes after a failed write"
                raise OSError(errno.EIO, self._broken) from exc
        with self._lock:
            self._objects.append((index, first))
        self._next_index = index + 1
        self._next_seq = first + count
        return first, count

    def _create(self, index: int, data: bytes) -> None:
        """Create write ``index``, settling a taken name: own bytes, a ghost, or a newer owner."""
        name = self._name(index)
        while True:
            try:
                self.storage.create(name, data)
                return
            except ChunkExists:
                pass
            got = self._get(index)
            if got is None:
                continue
            if encode_object(*got) == data:
                return  # our own earlier attempt landed
            epoch = got[0]
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
                if len(self._objects) < 2 or self._objects[1][1] > frame_seq:
                    return freed
                index = self._objects[0][0]
            name = self._name(index)
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
                assert self._objects[0][0] == index, (self._objects[:2], index)
                self._objects.pop(0)

    def close(self) -> None:
        return None
