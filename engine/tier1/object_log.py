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
  object took a name the older writer needed first) and is read as empty.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.config import TIER1_WRITES_IN_FLIGHT_MAX
from engine.durable_log import frames
from engine.durable_log.data_log import Fate, LogFenced, PendingWrite, write_one
from engine.errors import DataCorrupted
from engine.naming import (
    epoch_name,
    epoch_prefix,
    parse_epoch_name,
    parse_wal_object_name,
    parse_wal_start_name,
    wal_object_name,
    wal_prefix,
    wal_start_name,
    wal_start_prefix,
)
from engine.tier1.wal_object import HEADER_BYTES, WalObject, Writer, decode_object, encode_object
from engine.tier2.chunk_storage import (
    ChunkExists,
    ChunkHandle,
    ChunkNotFound,
    ChunkStorage,
    ChunkStorageError,
)

log = logging.getLogger(__name__)

# The most writes a writer of the log may have in flight; a fence covers as many names.
REACH = TIER1_WRITES_IN_FLIGHT_MAX
# A writer acknowledges a write only within this long of having seen no newer epoch...
CONFIRM_S = 10.0
# ...and an owner deletes no name its fence covered within this long of the fence.
KEEP_FENCE_S = 120.0
# How often recovery looks at the log again when an old writer moved on meanwhile, and how far
# past the log's end its fence may aim (the distance doubles each time the old writer gets there first).
_RECOVERY_ATTEMPTS = 50
_FENCE_AHEAD_MAX = 1024
# Objects recovery reads at once (a log holds thousands of small objects between checkpoints).
_READERS = 16

@dataclass(slots=True)
class _Entry:
    """A write of the log: number, size, and the frame it starts at (if it holds none: the next write's)."""

    index: int
    first_seq: int
    size: int


class ObjectDataLog:
    """One container's Tier 1 log as objects; blocking, one owner (fenced by epoch)."""

    cooperative = True
    cooperative_write = True

    def __init__(
        self,
        storage: ChunkStorage,
        container_id: int,
        *,
        max_frame_bytes: int = 1 << 20,
        max_writes_in_flight: int = 1,
    ) -> None:
        if not 1 <= max_writes_in_flight <= REACH:
            raise ValueError(f"max_writes_in_flight must lie in [1, {REACH}], not {max_writes_in_flight}")
        self.storage = storage
        self.container_id = container_id
        self.max_frame_bytes = max_frame_bytes
        self.max_writes_in_flight = max_writes_in_flight
        self.epoch = 0
        self.generation = 0
        self._next_index = 0  # number of the next write
        self._next_seq = 0  # first frame sequence number of the next write
        self._completed_below = 0  # every write below this one is in the bucket
        self._landed: dict[int, _Entry] = {}  # writes in the bucket above _completed_below
        self._entries: list[_Entry] = []  # the log from its start up to _completed_below
        self._log_start = 0  # the write the log starts at (its start marker's)
        self._fence_top = -1  # the highest name our fence covered...
        self._fenced_at = 0.0  # ...and when (time.monotonic)
        self._garbage: list[tuple[str, int, float]] = []  # (name, size, not before) below the start
        self._repair_from: int | None = None  # the oldest write that failed, until repaired
        self._confirmed_at = 0.0
        self._lock = threading.Lock()
        self._confirm_lock = threading.Lock()
        self._fenced: str | None = None
        self._broken: str | None = None

    @property
    def writer(self) -> Writer:
        return (self.epoch, self.generation)

    def _name(self, index: int) -> str:
        return wal_object_name(self.container_id, index)

    def _listed(self) -> dict[int, int]:
        """Write number -> size of every WAL object of the container."""
        return {
            index: info.length
            for info in self.storage.list(wal_prefix(self.container_id))
            if (index := parse_wal_object_name(self.container_id, info.name)) is not None
        }

    def _markers(self) -> list[int]:
        """The start markers, oldest first; the newest is where the log starts (0 without one)."""
        return sorted(
            index
            for info in self.storage.list(wal_start_prefix(self.container_id))
            if (index := parse_wal_start_name(self.container_id, info.name)) is not None
        )

    def _start(self) -> int:
        return (self._markers() or [0])[-1]

    def _get(self, index: int, size: int | None = None) -> WalObject | None:
        """Write ``index``; None if there is no such object."""
        name = self._name(index)
        try:
            if size is None:
                size = self.storage.info(name).length
            return decode_object(name, self.storage.read(ChunkHandle(name, read_only=True), 0, size))
        except ChunkNotFound:
            return None

    def _fetch(self, indexes: list[int], sizes: dict[int, int], cache: dict[int, WalObject]) -> None:
        """Read the objects of ``indexes`` missing from ``cache`` into it, several at once."""
        todo = [index for index in indexes if index not in cache]
        pending = iter(todo)
        lock = threading.Lock()
        errors: list[BaseException] = []

        def read() -> None:
            while True:
                with lock:
                    index = None if errors else next(pending, None)
                if index is None:
                    return
                try:
                    got = self._get(index, sizes.get(index))
                except BaseException as exc:  # handed to the caller below
                    with lock:
                        errors.append(exc)
                    return
                if got is not None:
                    with lock:
                        cache[index] = got

        readers = [threading.Thread(target=read, daemon=True) for _ in range(min(_READERS, len(todo)))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        if errors:
            raise errors[0]

    def _batches(self, index: int, body: bytes, first_seq: int | None) -> list[frames.Batch]:
        try:
            return list(frames.iter_batches(body, first_seq))
        except frames.TornTail as torn:
            raise DataCorrupted(f"Tier 1 object {self._name(index)}: {torn}") from None

    def _fence_error(self, newer: Writer) -> LogFenced:
        self._fenced = f"container {self.container_id}: a writer of epoch {newer[0]} owns the Tier 1 log"
        return LogFenced(errno.EPERM, self._fenced)

    def _break(self, why: str) -> OSError:
        self._broken = why
        log.error("container %d: Tier 1 log unusable: %s", self.container_id, why)
        return OSError(errno.EIO, f"Tier 1 log is unusable: {why}")

    # ----------------------------------------------------------------- recovery
    def recover(self) -> Iterator[frames.Batch]:
        """Claim a new epoch, fence every older writer, then give back every write of the log in order.

        The fence reads nothing but the objects above a hole, so it wins
        against an old writer that is still busy; reading follows, once no
        older writer can add to the log.
        """
        self.epoch, self.generation = self._new_epoch(), 0
        cache: dict[int, WalObject] = {}  # objects never change: each is read once
        ahead = REACH + 1
        for _ in range(_RECOVERY_ATTEMPTS):
            covered = self._fence(cache, ahead)
            if covered is None:
                ahead = min(2 * ahead, _FENCE_AHEAD_MAX)
                continue
            self._fence_top, self._fenced_at = covered, time.monotonic()
            batches = self._read_log(cache)
            newer = self._newer_owner(force=True)
            if newer is not None:
                raise self._fence_error(newer)
            log.info("container %d: Tier 1 fenced up to %d, epoch %d", self.container_id, covered, self.epoch)
            yield from batches
            return
        raise DataCorrupted(
            f"container {self.container_id}: could not fence the Tier 1 log in {_RECOVERY_ATTEMPTS} "
            "attempts: another server keeps writing it"
        )

    def _new_epoch(self) -> int:
        """An epoch above every earlier writer's, and ours alone: a put-if-absent claim of its name."""
        prefix = epoch_prefix(self.container_id)
        while True:
            asked = time.monotonic()
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
            self._confirmed_at = asked
            for old in taken:  # the newest claim is all a later writer needs
                self.storage.delete(epoch_name(self.container_id, old))
            return epoch

    def _fence(self, cache: dict[int, WalObject], ahead: int) -> int | None:
        """Take every name an older writer could still create; the highest name covered, or None to retry.

        With ``top`` the highest name listed: claim ``top + ahead`` (at first
        ``REACH + 1``: past anything an old writer with writes in flight
        reaches before one of them completes), fill the names between, and
        the names up to ``REACH`` past the lowest we hold (the writer may have
        moved on while we filled), then the holes below ``top`` once they are
        known to be writes that never landed.
        """
        start = self._start()
        names = {index: size for index, size in self._listed().items() if index >= start}
        if start and start not in names:
            if self._start() != start:
                return None  # truncated meanwhile
            raise DataCorrupted(f"Tier 1 object {self._name(start)}, where the log starts, is missing")
        top = max(names, default=start - 1)
        holes = [index for index in range(start, top) if index not in names]
        base = holes[0] if holes else top + 1
        fence = top + ahead
        if not self._claim(fence, base, cache):
            return None  # the old writer got there first: look again, and aim further
        held = [fence] + [index for index in range(fence - 1, top, -1) if self._claim(index, base, cache)]
        lowest = min(held)
        for index in range(fence + 1, lowest + REACH):
            self._claim(index, base, cache)
        if holes:
            self._check_holes(holes, names, cache)
            for index in reversed(holes):
                self._claim(index, base, cache)
        if self._start() > lowest:
            return None  # a truncation had freed the names we took: they lie below the log's start
        return max(fence, lowest + REACH - 1)

    def _claim(self, index: int, base: int, cache: dict[int, WalObject]) -> bool:
        """Take name ``index`` with an empty object of ours; False if another writer's write has it.

        A newer writer there: LogFenced.
        """
        data = encode_object(self.writer, base, b"")
        while True:
            try:
                self.storage.create(self._name(index), data)
                return True
            except ChunkExists:
                pass
            got = self._get(index)
            if got is None:
                continue
            if got.writer == self.writer:
                return True  # our own earlier claim
            if got.writer > self.writer:
                raise self._fence_error(got.writer)
            cache[index] = got
            return False

    def _check_holes(self, holes: list[int], names: dict[int, int], cache: dict[int, WalObject]) -> None:
        """A hole must be a write that never landed: no later write was begun after it was in the bucket."""
        self._fetch([index for index in names if index > holes[0]], names, cache)
        for hole in holes:
            if any(obj.base > hole for index, obj in cache.items() if index > hole):
                missing = self._name(hole)
                raise DataCorrupted(f"container {self.container_id}: Tier 1 object {missing} is missing")

    def _read_log(self, cache: dict[int, WalObject]) -> list[frames.Batch]:
        """Every write from the log's start up to the end of our fence, in order."""
        while True:
            markers = self._markers()
            start = (markers or [0])[-1]
            listed = self._listed()
            names = sorted(index for index in listed if index >= start)
            self._fetch(names, listed, cache)
            batches: list[frames.Batch] = []
            entries: list[tuple[int, int | None, int]] = []
            expected: int | None = None
            top: Writer = (0, 0)
            for position, index in enumerate(names):
                got = cache.get(index)
                if got is None or index != start + position:
                    if self._start() != start:
                        break  # truncated since the listing: list again
                    missing = start + position
                    raise DataCorrupted(
                        f"container {self.container_id}: Tier 1 object {self._name(missing)} is missing"
                    )
                if got.writer > self.writer:
                    raise self._fence_error(got.writer)
                top = max(top, got.writer)
                found = self._batches(index, got.body, expected) if got.writer == top else []
                entries.append((index, found[0].first_frame_seq if found else None, listed[index]))
                batches += found
                if found:
                    expected = found[-1].first_frame_seq + found[-1].frame_count
            else:
                self._next_seq = expected if expected is not None else 0
                self._entries = self._filled(entries)
                self._next_index = self._completed_below = names[-1] + 1 if names else start
                self._landed = {}
                self._log_start = start
                keep = self._fenced_at + KEEP_FENCE_S
                self._garbage = [(self._name(i), size, keep) for i, size in listed.items() if i < start]
                self._garbage += [(wal_start_name(self.container_id, m), 0, 0.0) for m in markers[:-1]]
                return batches

    def _filled(self, entries: list[tuple[int, int | None, int]]) -> list[_Entry]:
        """Entries with the frame number a write without frames stands at: the next write's."""
        following = self._next_seq
        out: list[_Entry] = []
        for index, first, size in reversed(entries):
            following = first if first is not None else following
            out.append(_Entry(index, following, size))
        return out[::-1]

    # ------------------------------------------------------------------ writes
    def _check_usable(self) -> None:
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
            self._landed[index] = _Entry(index, pending.first_frame_seq, len(pending.data))
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
            raise self._break(f"{name} holds a write of {got.writer}, not of this writer {self.writer}")

    def _newer_owner(self, *, force: bool = False) -> Writer | None:
        """Unless looked for within CONFIRM_S, the writer of a newer epoch claimed in the bucket, or None."""
        if not force and time.monotonic() - self._confirmed_at < CONFIRM_S:
            return None
        with self._confirm_lock:
            if not force and time.monotonic() - self._confirmed_at < CONFIRM_S:
                return None
            asked = time.monotonic()
            try:
                newest = max(
                    (
                        epoch
                        for info in self.storage.list(epoch_prefix(self.container_id))
                        if (epoch := parse_epoch_name(self.container_id, info.name)) is not None
                    ),
                    default=0,
                )
            except ChunkStorageError as exc:
                raise self._break(f"could not look for a newer owner: {exc}") from exc
            if newest > self.epoch:
                return (newest, 0)
            self._confirmed_at = asked
            return None

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
        start, end = self._repair_from, self._next_index
        assert start is not None
        try:
            for index in range(end - 1, start - 1, -1):
                if index not in self._landed and not self._claim(index, start, {}):
                    raise self._break(f"{self._name(index)}: a write taken for failed landed after all")
        except ChunkStorageError as exc:
            raise OSError(errno.EIO, f"Tier 1 repair after a failed write failed: {exc}") from exc
        with self._lock:
            for index in range(start, end):
                landed = self._landed.pop(index, None)
                self._entries.append(_Entry(index, self._next_seq, landed.size if landed else HEADER_BYTES))
            self._completed_below = end
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
            kept_until = self._fenced_at + KEEP_FENCE_S
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
        return None
