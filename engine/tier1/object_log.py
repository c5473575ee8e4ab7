"""ObjectDataLog: Tier 1 on an object store, one object per write (docs/tier1-on-s3.md).

Seed 000 ("Storage Abstractions") calls a log on one node's disk
semi-durable; this binding puts the write-ahead log in object storage, as
object-store logs do (SlateDB, S2, WarpStream), through the ``ChunkStorage``
seam (S3, memory, local folder, and the fault-injecting wrapper alike).

Layout (``engine.naming``): write number ``n`` of container ``c`` is the
object ``c{c}/wal/{n:020d}``, created put-if-absent (S3: ``If-None-Match:
*``); it is durable once the create returned. ``c{c}/epochs/`` holds the
newest epoch claimed, ``c{c}/start/`` the write the log starts at after a
truncation. An object's bytes are in ``engine.tier1.wal_object``:
``(epoch, generation)`` names its writer: a new owner claims a new epoch, a
writer that repairs its log after a failed write takes a new generation.
``base``: every write below it was in the bucket when this one was begun. A
write without frames is a fence or a filled hole. Frame sequence numbers
(the log's addresses) run on across objects.

Recovery, and the limits named below, are in ``object_log_recovery.py``.
Several writes may be in flight (at most ``REACH``); they complete in any
order and the caller acknowledges them in order. Invariants:

- one writer: a new owner takes every name an older writer could still
  create (``REACH`` names past the lowest name it holds), so each of its
  creates answers "taken" (412) and it stops for good (``LogFenced``);
- a truncation records the log's new start before it deletes anything, and
  no name a fence covered is deleted within ``KEEP_FENCE_S`` of that fence; a
  writer that has not seen, within ``CONFIRM_S``, that no newer epoch exists
  looks before it acknowledges, and once there is one it acknowledges only
  writes at or above the start. So even a writer paused for minutes never
  acknowledges a create that landed in a name a truncation freed;
- write numbers are dense from the start; a hole is a write that never
  landed, which only a writer that stopped with writes in flight leaves, and
  then no later write has a base above it; the next owner fills it. Any other
  missing object, or one failing its CRC, is corruption, never skipped;
- along the log writers never get older, except for ghosts: a write of an
  older writer after a newer one's object was never acknowledged (the newer
  object took a name the older writer needed first) and is read as empty;
- a writer that closes with every write it began in the bucket records a
  clean close; the recovery of the next epoch then has nobody to fence
  (``_after_clean_close``).
"""

from __future__ import annotations

import errno
import logging
import time

from engine.durable_log import frames
from engine.durable_log.data_log import Fate, LogFenced, PendingWrite, write_one
from engine.errors import DataCorrupted
from engine.naming import wal_closed_name, wal_start_name
from engine.tier1.object_log_recovery import LogEntry, ObjectLogRecovery
from engine.tier1.wal_object import HEADER_BYTES, WalObject, encode_object
from engine.tier2.chunk_storage import ChunkExists, ChunkStorageError

log = logging.getLogger(__name__)

class ObjectDataLog(ObjectLogRecovery):
    """One container's Tier 1 log as objects; blocking, one owner (fenced by epoch)."""

    cooperative = True
    cooperative_write = True

    # ------------------------------------------------------------------ writes
    def _check_usable(self) -> None:
        if self._closed:
            raise OSError(errno.ESHUTDOWN, f"container {self.container_id}: the Tier 1 log is closed")
        if self._fenced:
            raise LogFenced(errno.EPERM, self._fenced)
        if self._broken:
            raise OSError(errno.EIO, f"Tier 1 log is unusable: {self._broken}")

    def begin(self, payload: bytes) -> PendingWrite:
        """Number the next write; after a failed one, first repair the log (which may fail: OSError)."""
        self._check_usable()
        if self._repair_from is not None:
            self._repair()
        with self._lock:
            self._check_usable()  # close() may have begun meanwhile: a clean close has no write after it
            index, base = self._next_index, self._completed_below
            self._next_index += 1
        first = self._next_seq
        body, count = frames.encode_batch(payload, first, self.max_frame_bytes)
        self._next_seq = first + count
        return PendingWrite(first, count, encode_object(self.writer, base, body), index)

    def write(self, pending: PendingWrite) -> None:
        """Create the write's object; durable (and confirmed ours) on return.

        A create whose outcome is unknown (an error after the request left) is
        settled by reading the name back: our bytes there are a success, no
        object is a failure; anything else breaks the log, as the
        operations failed to their callers might be in it (a restart recovers).
        A write that meets a newer writer's object in its name is ``BARRED``:
        the newer writer reads neither it nor, as ghosts, the writes begun after it.
        """
        try:
            self._check_usable()
        except OSError:
            pending.fate = Fate.NOT_SENT
            raise
        index = pending.index
        try:
            self._create(index, pending.data)
        except LogFenced:  # a newer writer's write holds the name
            pending.fate = Fate.BARRED
            raise
        except ChunkStorageError as exc:
            try:
                landed = self._get(index)
            except (ChunkStorageError, DataCorrupted) as again:
                raise self._break(f"the outcome of writing {self._name(index)} is unknown: {again}") from exc
            if landed is None:
                raise OSError(errno.EIO, f"Tier 1 write of {self._name(index)} failed: {exc}") from exc
            if encode_object(landed.writer, landed.base, landed.body) != pending.data:
                if landed.writer > self.writer:
                    pending.fate = Fate.BARRED
                    raise self._fence_error(landed.writer) from exc
                raise self._break(f"{self._name(index)} holds other bytes after a failed write") from exc
        with self._lock:
            self._landed[index] = LogEntry(index, pending.first_frame_seq, len(pending.data))
            while self._completed_below in self._landed:
                self._entries.append(self._landed.pop(self._completed_below))
                self._completed_below += 1
        self._confirm(index)

    def _create(self, index: int, data: bytes) -> None:
        """Create write ``index``, settling a taken name: our own earlier attempt, or a newer owner."""
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
            if encode_object(got.writer, got.base, got.body) == data:
                return  # our own earlier attempt landed
            if got.writer > self.writer:
                raise self._fence_error(got.writer)
            if got.writer[0] < self.epoch and not got.body:
                raise self._passed_claims(index, got.writer[0])
            raise self._break(f"{name} holds a write of {got.writer}, not of this writer {self.writer}")

    def _passed_claims(self, index: int, epoch: int) -> OSError:
        """Write ``index`` met an empty object of an older epoch: the write fails, the repair goes past.

        Only a recovery that lost to ours leaves such objects past the end of
        the log we recovered: one that listed the log after our fence, or
        aimed further, claims names there and is fenced afterwards (our epoch
        is newer). They hold no write and read as nothing after our objects;
        the repair fills the free names up to the highest one listed now, so
        the next write goes past every such claim made so far.
        """
        try:
            highest = max(self._listed(), default=index)
        except ChunkStorageError:
            highest = index
        with self._lock:
            self._skip_to = max(self._skip_to, highest + 1)
        return OSError(errno.EIO, f"{self._name(index)} holds an empty claim of a recovery of epoch {epoch}, "
                       f"fenced by this writer's {self.epoch}: writing past it")

    def _confirm(self, index: int) -> None:
        """Before write ``index`` is acknowledged: if a newer owner claimed the log, stop writing.

        The write itself stands if it lies at or above the log's start: the
        new owner's fence takes every name this writer could still create, so
        what landed there is in the log it reads. Below the start it landed in
        a name a truncation freed, which nobody reads: LogFenced.
        """
        newer = self._newer_owner()
        if newer is None:
            return
        fenced = self._fence_error(newer)
        try:
            start = self._start()
        except ChunkStorageError as exc:
            raise self._break(f"could not read the log's start: {exc}") from exc
        if index < start:
            raise fenced

    def abandon(self, pending: PendingWrite) -> None:
        """Forget ``pending`` and the writes begun after it, and repair the log at once.

        The repair takes the names they left free, so a create whose error
        hid that it landed (or lands late) is found now, before its callers
        are answered. If it fails (OSError), the next ``begin`` repairs first.
        """
        with self._lock:
            if self._repair_from is None:
                self.generation += 1
                self._repair_from = pending.index
            self._repair_from = min(self._repair_from, pending.index)
        self._next_seq = pending.first_frame_seq
        self._check_usable()
        self._repair()

    def _repair(self) -> None:
        """Take, as a new generation, every name the failed writes left free.

        The writes that landed after the oldest failed one then read as
        ghosts (they were never acknowledged); the log goes on after the
        highest name used, frames numbered from the oldest failed write's.
        """
        start, end = self._repair_from, max(self._next_index, self._skip_to)
        assert start is not None
        found: dict[int, WalObject] = {}
        try:
            for index in range(end - 1, start - 1, -1):
                if index in self._landed or self._claim(index, start, found):
                    continue
                if found[index].writer[0] >= self.epoch or found[index].body:
                    raise self._break(f"{self._name(index)}: a write taken for failed landed after all")
        except ChunkStorageError as exc:
            raise OSError(errno.EIO, f"Tier 1 repair after a failed write failed: {exc}") from exc
        with self._lock:
            for index in range(start, end):
                landed = self._landed.pop(index, None)
                self._entries.append(LogEntry(index, self._next_seq, landed.size if landed else HEADER_BYTES))
            self._completed_below = self._next_index = end
            self._repair_from = None

    def append(self, payload: bytes) -> tuple[int, int]:
        return write_one(self, payload)

    # -------------------------------------------------------------- truncation
    def truncate(self, frame_seq: int) -> int:
        """Start the log at the write holding ``frame_seq``; returns bytes freed by deleting those before.

        The new start is recorded first, so a reader never takes an object
        below it for part of the log; names our fence covered stay until
        KEEP_FENCE_S after it.
        """
        with self._lock:
            keep = 0
            while keep + 1 < len(self._entries) and self._entries[keep + 1].first_seq <= frame_seq:
                keep += 1
            gone = self._entries[:keep]
            start = self._entries[keep].index if keep else 0
        if gone:
            try:
                self.storage.create(wal_start_name(self.container_id, start), b"")
            except ChunkExists:
                pass
            except ChunkStorageError as exc:
                log.warning("container %d: Tier 1 start %d not recorded: %s", self.container_id, start, exc)
                return self._collect()
            with self._lock:
                assert self._entries[:keep] == gone, (gone, self._entries[:keep])
                del self._entries[:keep]
            kept_until = self._kept_until()
            self._garbage += [
                (self._name(e.index), e.size, kept_until if e.index <= self._fence_top else 0.0) for e in gone
            ]
            if self._log_start:
                self._garbage.append((wal_start_name(self.container_id, self._log_start), 0, 0.0))
            self._log_start = start
        return self._collect()

    def _collect(self) -> int:
        """Delete the names below the start that may go now; returns bytes freed."""
        now = time.monotonic()
        freed = 0
        left = []
        for name, size, not_before in self._garbage:
            if now < not_before:
                left.append((name, size, not_before))
                continue
            try:
                self.storage.delete(name)
                freed += size
            except ChunkStorageError as exc:
                log.warning("container %d: Tier 1 object %s not deleted: %s", self.container_id, name, exc)
                left.append((name, size, not_before))
        self._garbage = left
        return freed

    def close(self) -> None:
        """No write begins from now on; if every write begun is in the bucket, record a clean close.

        The record (``c{n}/closed/<epoch>/<next write>``) lets the next owner
        skip the fence (``_after_clean_close``): this writer has nothing in
        flight and will never write again, so there is nobody to fence. A log
        fenced, broken, waiting for a repair or with a write still out is not
        clean: the next owner fences as after a crash.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            end = self._next_index
            settled = self._repair_from is None and not self._landed and self._completed_below == end
            clean = self._recovered and self._fenced is None and self._broken is None and settled
        if not clean:
            return
        try:
            self.storage.create(wal_closed_name(self.container_id, self.epoch, end), b"")
        except (ChunkExists, ChunkStorageError) as exc:
            log.warning("container %d: Tier 1 clean close not recorded: %s", self.container_id, exc)
