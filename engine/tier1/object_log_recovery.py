"""The recovery of an object-store Tier 1 log: claim an epoch, fence older writers, read the log.

``ObjectLogRecovery`` is the base of ``ObjectDataLog`` (``object_log.py``,
where the layout and the invariants are written up): the log's state, the
reading of its objects (several at once), and ``recover``, which claims a
new epoch, takes every name an older writer could still create and then
reads every write from the log's start. Whether a newer owner claimed the
log since (``_newer_owner``) is asked here too: by recovery, and by a
writer before it acknowledges.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from engine.config import TIER1_WRITES_IN_FLIGHT_MAX
from engine.durable_log import frames
from engine.durable_log.data_log import LogFenced
from engine.errors import DataCorrupted
from engine.naming import (
    epoch_name,
    epoch_prefix,
    parse_epoch_name,
    parse_wal_closed_name,
    parse_wal_object_name,
    parse_wal_start_name,
    wal_closed_prefix,
    wal_object_name,
    wal_prefix,
    wal_start_name,
    wal_start_prefix,
)
from engine.tier1.at_once import at_once
from engine.tier1.wal_object import WalObject, Writer, decode_object, encode_object
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
@dataclass(slots=True)
class LogEntry:
    """A write of the log: number, size, and the frame it starts at (if it holds none: the next write's)."""

    index: int
    first_seq: int
    size: int


class ObjectLogRecovery:
    """One container's Tier 1 log as objects: its state, its objects, and its recovery."""

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
        self._landed: dict[int, LogEntry] = {}  # writes in the bucket above _completed_below
        self._entries: list[LogEntry] = []  # the log from its start up to _completed_below
        self._log_start = 0  # the write the log starts at (its start marker's)
        self._fence_top = -1  # the highest name our fence covered...
        self._fenced_at = 0.0  # ...and when (time.monotonic)
        self._garbage: list[tuple[str, int, float]] = []  # (name, size, not before) below the start
        self._repair_from: int | None = None  # the oldest write that failed, until repaired
        self._skip_to = 0  # a repair fills the names up to here (past a lost recovery's claims)
        self._older_claims: list[str] = []  # the epochs claimed before ours, deleted once recovered
        self._recovered = False  # recover() ended: the log is ours to write
        self._closed = False  # close() began: no write begins any more
        self._confirmed_at = 0.0
        self._lock = threading.Lock()
        self._confirm_lock = threading.Lock()
        self._fenced: str | None = None
        self._broken: str | None = None
        self._prefetch: Future[None] | None = None  # recovery's early read of the log's objects...
        self._ahead: dict[int, WalObject] = {}  # ...and what it read
        self._newer_check: Future[Writer | None] | None = None  # recovery's look for a newer epoch

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
        """Read the objects of ``indexes`` missing from ``cache`` into it, several at once.

        Once recovery's early read (``_read_ahead``) has ended: what it read is not read twice.
        """
        if self._prefetch is not None:
            self._prefetch.result()
            self._prefetch = None
        for index in indexes:
            if index not in cache and index in self._ahead:
                cache[index] = self._ahead[index]
        self._fetch_now(indexes, sizes, cache)

    def _fetch_now(self, indexes: list[int], sizes: dict[int, int], cache: dict[int, WalObject]) -> None:
        todo = [index for index in indexes if index not in cache]
        for index, got in at_once(lambda index: self._get(index, sizes.get(index)), todo).items():
            if got is not None:
                cache[index] = got

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

    def _kept_until(self) -> float:
        """Until when the names our fence covered must stay (KEEP_FENCE_S after the fence)."""
        return self._fenced_at + KEEP_FENCE_S

    # ----------------------------------------------------------------- recovery
    def recover(self) -> Iterator[frames.Batch]:
        """Claim a new epoch, fence every older writer, then give back every write of the log in order.

        The fence reads nothing but the objects above a hole, so it wins
        against an old writer that is still busy; reading follows, once no
        older writer can add to the log. When the writer of the epoch just
        before ours closed the log cleanly, there is nothing to fence
        (``_after_clean_close``).
        """
        cache: dict[int, WalObject] = {}  # objects never change: each is read once
        self._newer_check = None
        with ThreadPoolExecutor(2) as aside:
            # While the epoch is claimed (and the log fenced): the clean-close records, and the log's objects.
            closes = aside.submit(self._close_records)
            self._prefetch = aside.submit(self._read_ahead, self._ahead)
            try:
                self.epoch, self.generation = self._new_epoch(), 0
                obsolete = self._older_claims + closes.result()
                batches = self._after_clean_close(obsolete, cache)
                if batches is None:
                    batches = self._fenced_log(cache)
            finally:
                self._prefetch = None
        self._ahead = {}
        check, self._newer_check = self._newer_check, None
        newer = check.result() if check is not None else self._newer_owner(force=True)
        if newer is not None:
            raise self._fence_error(newer)
        self._garbage += [(name, 0, 0.0) for name in obsolete]
        self._recovered = True
        yield from batches

    def _read_ahead(self, ahead: dict[int, WalObject]) -> None:
        """Read the objects the log holds now into ``ahead``, before recovery knows it needs them.

        Safe at any moment: an object never changes once written, and
        recovery takes from ``ahead`` only those its own reads ask for (its
        listings after its epoch and fence), so it judges exactly the objects
        it would have read itself. What fails here is left for recovery to read.
        """
        try:
            with ThreadPoolExecutor(1) as lister:
                listing = lister.submit(self._listed)
                start = self._start()
                listed = listing.result()
            self._fetch_now(sorted(index for index in listed if index >= start), listed, ahead)
        except (ChunkStorageError, DataCorrupted) as exc:
            log.debug("container %d: early read of the Tier 1 log failed: %s", self.container_id, exc)

    def _fenced_log(self, cache: dict[int, WalObject]) -> list[frames.Batch]:
        """Fence every older writer, then read the log."""
        ahead = REACH + 1
        for _ in range(_RECOVERY_ATTEMPTS):
            covered = self._fence(cache, ahead)
            if covered is None:
                ahead = min(2 * ahead, _FENCE_AHEAD_MAX)
                continue
            self._fence_top, self._fenced_at = covered, time.monotonic()
            batches = self._read_log(cache)
            log.info("container %d: Tier 1 fenced up to %d, epoch %d", self.container_id, covered, self.epoch)
            return batches
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
            self._older_claims = [epoch_name(self.container_id, old) for old in taken]
            return epoch

    def _close_records(self) -> list[str]:
        """Every clean-close record (``ObjectDataLog.close``).

        Only the one of the epoch right before ours counts, and a recovery
        needs none of them once it holds its epoch: they are deleted with the
        log's garbage, and so are the older epochs' claims (the newest claim
        is all that tells later writers where epochs stand).
        """
        return [info.name for info in self.storage.list(wal_closed_prefix(self.container_id))]

    def _after_clean_close(
        self, records: list[str], cache: dict[int, WalObject]
    ) -> list[frames.Batch] | None:
        """The log, read without a fence if the writer of the epoch before ours closed it cleanly; else None.

        That writer recorded (``ObjectDataLog.close``) that it will never
        write again and that every write it began, all below ``end``, is in
        the bucket. Our epoch is the next one, so no writer began between;
        every older writer was fenced by a recovery before that writer's
        (it could only write after one), so none can create a name past the
        names the log held then, all taken since. So no writer but us can add
        to the log: only recoveries that lost to ours, whose empty claims
        past ``end`` read as nothing (``_read_log``). A writer paused after
        its stop and before its record is written is no matter: the record
        comes late or never, and a later recovery looks only for the record
        of the epoch just before its own.
        """
        closes = [parse_wal_closed_name(self.container_id, name) for name in records]
        ends = [close[1] for close in closes if close is not None and close[0] == self.epoch - 1]
        if not ends:
            return None
        end = ends[0]
        self._fence_top, self._fenced_at = end - 1, time.monotonic()
        batches = self._read_log(cache)
        if self._next_index < end:
            raise DataCorrupted(
                f"container {self.container_id}: the Tier 1 log ends before write {end}, "
                f"which its writer of epoch {self.epoch - 1} closed it at"
            )
        log.info("container %d: Tier 1 closed cleanly at %d, epoch %d", self.container_id, end, self.epoch)
        return batches

    def _fence(self, cache: dict[int, WalObject], ahead: int) -> int | None:
        """Take every name an older writer could still create; the highest name covered, or None to retry.

        With ``top`` the highest name listed: claim ``top + ahead`` (at first
        ``REACH + 1``: past anything an old writer with writes in flight
        reaches before one of them completes), fill the names between, and
        the names up to ``REACH`` past the lowest we hold (the writer may have
        moved on while we filled), then the holes below ``top`` once they are
        known to be writes that never landed.
        """
        # The start first, then the listing, not both at once: a listing older than the start it is
        # judged against may lack the start's object (truncated between), which reads as corruption.
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
        claimed = self._claim_all(range(top + 1, fence), base, cache)
        lowest = min([fence] + [index for index, ours in claimed.items() if ours])
        self._claim_all(range(fence + 1, lowest + REACH), base, cache)
        if holes:
            if not self._check_holes(holes, names, cache):
                return None  # a hole was filled since the listing (a racing recovery's claim): look again
            self._claim_all(holes, base, cache)
        if self._start() > lowest:
            return None  # a truncation had freed the names we took: they lie below the log's start
        return max(fence, lowest + REACH - 1)

    def _claim_all(self, indexes: Iterable[int], base: int, cache: dict[int, WalObject]) -> dict[int, bool]:
        """``_claim`` of every name of ``indexes`` at once: which of them we hold."""
        return at_once(lambda index: self._claim(index, base, cache), list(indexes))

    def _claim(self, index: int, base: int, cache: dict[int, WalObject]) -> bool:
        """Take name ``index`` with an empty object of ours; False if another writer's write has it.

        A newer writer there: LogFenced. The object found or made goes into
        ``cache`` (reading the log then need not read our own claims back).
        """
        data = encode_object(self.writer, base, b"")
        while True:
            try:
                self.storage.create(self._name(index), data)
                cache[index] = WalObject(self.writer, base, b"")
                return True
            except ChunkExists:
                pass
            got = self._get(index)
            if got is None:
                continue
            if got.writer > self.writer:
                raise self._fence_error(got.writer)
            cache[index] = got
            return got.writer == self.writer  # our own earlier claim, or another writer's write

    def _check_holes(self, holes: list[int], names: dict[int, int], cache: dict[int, WalObject]) -> bool:
        """A hole must be a write that never landed: no later write was begun after it was in the bucket.

        False if a hole that looked like a lost write is in the bucket now:
        filled since the listing (a racing recovery claims names above its
        own listing, with a base past holes it did not see), so not missing.
        """
        self._fetch([index for index in names if index > holes[0]], names, cache)
        for hole in holes:
            if any(obj.base > hole for index, obj in cache.items() if index > hole):
                if self._get(hole) is not None:
                    return False
                missing = self._name(hole)
                raise DataCorrupted(f"container {self.container_id}: Tier 1 object {missing} is missing")
        return True

    def _read_log(self, cache: dict[int, WalObject]) -> list[frames.Batch]:
        """Every write from the log's start up to the end of our fence, in order.

        Past our fence only recoveries that lost to ours (fenced by our newer
        epoch) may have claimed names, with empty objects, not necessarily one
        after another: the log ends at the first gap past the fence (a write
        meeting such a claim later goes past it: ``_passed_claims``).
        """
        while True:
            with ThreadPoolExecutor(2) as lister:  # both at once: every name up to our fence's end exists
                listing = lister.submit(self._listed)
                if self._newer_check is None:
                    # Recovery's last step, whether an epoch newer than ours was claimed meanwhile, is
                    # asked now too: a listing of the epochs, which nothing read here changes.
                    self._newer_check = lister.submit(self._newer_owner, force=True)
                markers = self._markers()
                listed = listing.result()
            start = (markers or [0])[-1]
            names = sorted(index for index in listed if index >= start)
            past = range(max(start, self._fence_top + 1), names[-1] + 1 if names else 0)
            gaps = [index for index in past if index not in listed]
            if gaps:
                self._skip_to = names[-1] + 1
                names = [index for index in names if index < gaps[0]]
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
                keep = self._kept_until()
                self._garbage = [(self._name(i), size, keep) for i, size in listed.items() if i < start]
                self._garbage += [(wal_start_name(self.container_id, m), 0, 0.0) for m in markers[:-1]]
                return batches

    def _filled(self, entries: list[tuple[int, int | None, int]]) -> list[LogEntry]:
        """Entries with the frame number a write without frames stands at: the next write's."""
        following = self._next_seq
        out: list[LogEntry] = []
        for index, first, size in reversed(entries):
            following = first if first is not None else following
            out.append(LogEntry(index, following, size))
        return out[::-1]

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
