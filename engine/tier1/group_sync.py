"""GroupSync: one sync round makes the Tier 1 files of every container on a node durable together.

Each container's ``FileDataLog`` hands its next write to its node's
``GroupSync`` (seed 000 "Durable Data Log": group commit, here across
containers and not only within one). One OS thread runs the rounds: it
writes what every container handed over since the last round, each to its
own file, then makes them durable at once with one ``syncfs`` of the file
system that holds them (Linux 5.8 and later, where ``syncfs`` reports
write-back errors), else one ``fdatasync`` per file; a round of one file
uses that file's ``fdatasync``, which is cheaper. So operations per sync
grow with the number of containers writing at once, instead of each
container paying its own sync.

Callers wait on a ``Signal`` (engine/blocking.py): a round wakes the gevent
hub once, not once per container through the thread pool, and the disk
calls all stay on the round thread.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence

import gevent.monkey

from engine.blocking import Signal, os_thread_lock

log = logging.getLogger(__name__)

_start_new_thread: Callable[..., int] = gevent.monkey.get_original("_thread", "start_new_thread")
_monotonic: Callable[[], float] = time.monotonic
# The longest a round waits for the previous round's writers to hand over their next writes.
MAX_LINGER_S = 0.002


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


def _syncfs_call() -> Callable[[int], int] | None:
    """libc's ``syncfs``, where it also reports write-back errors (Linux >= 5.8), else None."""
    if not sys.platform.startswith("linux") or not _kernel_at_least(5, 8):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs  # releases the GIL while it runs
    except (OSError, AttributeError):
        return None


_SYNCFS = _syncfs_call()


def sync_files(fds: Sequence[int]) -> int:
    """Make what was written to every file of ``fds`` (one file system) durable; returns syncs made.

    One file: its ``fdatasync``, which costs less than a ``syncfs`` (measured on
    ext4: 0.30 against 0.47-0.72 ms); several: one ``syncfs`` where it reports
    errors, else one ``fdatasync`` each.
    """
    if _SYNCFS is not None and len(fds) > 1:
        if _SYNCFS(fds[0]) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}")
        return 1
    for fd in fds:
        os.fdatasync(fd)
    return len(fds)


class _Job:
    """A container's write in a round: ``write`` stores it (returns the fd to sync), ``undo`` cuts it off."""

    __slots__ = ("error", "undo", "write", "writer")

    def __init__(self, write: Callable[[], int], undo: Callable[[], None], writer: int) -> None:
        self.write = write
        self.undo = undo
        self.writer = writer
        self.error: OSError | None = None


class _Round:
    """The writes one sync covers; ``done`` is set once they are durable or failed."""

    __slots__ = ("done", "jobs")

    def __init__(self) -> None:
        self.jobs: list[_Job] = []
        self.done = Signal()


class GroupSync:
    """Sync rounds shared by every Tier 1 file of a node, run by one OS thread.

    ``write(store, undo)`` hands a container's write to the next round and
    waits (cooperatively under gevent) until it is durable. A round runs the
    writes it collected, then one sync for all of them; a write that failed,
    or every write of a round whose sync failed, is cut off by its ``undo``
    on the same thread, and its caller gets the OSError.

    A round begins once every steady writer (one that wrote in two of the
    last three rounds) has handed over its next write, or after a linger of
    ``MAX_LINGER_S``: writers woken together by one round come back
    together, so the next round covers them all instead of the first one
    alone. A lone writer never lingers; a writer seen once (a container's
    occasional bookkeeping) is not waited for; one that stopped costs at
    most two lingers.
    """

    def __init__(self, sync: Callable[[Sequence[int]], int] = sync_files) -> None:
        self._sync = sync
        self._lock = os_thread_lock()
        self._round: _Round | None = None  # the round writes join now; the thread has not taken it
        self._wake = os_thread_lock()  # released once per round created, taken by the thread
        self._wake.acquire()
        self._joined = os_thread_lock()  # released when a write joins while the thread gathers
        self._joined.acquire()
        self._gathering = False
        self._recent: deque[set[int]] = deque(maxlen=3)  # the writers of the last rounds
        self._expected: set[int] = set()  # those of them a round waits for
        self._started = False
        self._closed = False
        self.rounds = 0  # rounds run
        self.syncs = 0  # syncfs or fdatasync calls made
        self.writes = 0  # writes covered

    def write(self, store: Callable[[], int], undo: Callable[[], None], writer: object = None) -> None:
        """Run ``store`` and then a sync on the round thread; return once durable, else OSError.

        ``store`` writes and returns the file descriptor written to; the sync
        that covers it begins after it returned. ``writer`` (a container's
        log) tells the rounds who writes again soon.
        """
        job = _Job(store, undo, id(writer))
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "the Tier 1 sync rounds have stopped")
            if not self._started:
                _start_new_thread(self._run, ())
                self._started = True
            current = self._round
            if current is None:
                current = self._round = _Round()
                self._wake.release()
            current.jobs.append(job)
            if self._gathering and self._joined.locked():
                self._joined.release()
        current.done.wait()
        if job.error is not None:
            raise job.error

    def _run(self) -> None:
        while True:
            self._wake.acquire()
            self._gather()
            with self._lock:
                current, self._round = self._round, None
            if current is None:
                return  # closed
            self._recent.append({job.writer for job in current.jobs})
            self._expected = {w for w in set().union(*self._recent) if sum(w in r for r in self._recent) >= 2}
            self._run_round(current.jobs)
            current.done.set()
            with self._lock:
                if self._closed and self._round is None:
                    return

    def _gather(self) -> None:
        """Wait until the previous round's writers all joined the next round, or the linger ends."""
        deadline = _monotonic() + MAX_LINGER_S
        while True:
            with self._lock:
                current = self._round
                joined = {job.writer for job in current.jobs} if current is not None else set()
                remaining = deadline - _monotonic()
                if current is None or self._closed or self._expected <= joined or remaining <= 0:
                    self._gathering = False
                    return
                self._gathering = True
            self._joined.acquire(True, remaining)  # held again after: the next join releases it

    def _run_round(self, jobs: list[_Job]) -> None:
        fds: list[int] = []
        for job in jobs:
            try:
                fd = job.write()
            except Exception as exc:
                job.error = _as_os_error(exc)
            else:
                if fd not in fds:
                    fds.append(fd)
        if fds:
            try:
                self.syncs += self._sync(fds)
            except Exception as exc:
                error = _as_os_error(exc)
                for job in jobs:
                    job.error = job.error or error
        for job in jobs:
            if job.error is not None:
                try:
                    job.undo()
                except Exception:
                    log.exception("Tier 1: a failed write could not be cut off")
        self.rounds += 1
        self.writes += len(jobs)

    def close(self) -> None:
        """Stop the round thread once the rounds already joined have run."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._round is None and self._started:
                self._wake.release()


def _as_os_error(exc: Exception) -> OSError:
    """An OSError as it is; anything else is a bug, and the write fails rather than be acknowledged."""
    if isinstance(exc, OSError):
        return exc
    log.exception("Tier 1 sync round failed", exc_info=exc)
    return OSError(errno.EIO, f"Tier 1 write failed: {exc}")
