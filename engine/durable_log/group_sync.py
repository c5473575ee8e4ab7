"""GroupSync: one sync round makes the Tier 1 files of every container on a node durable together.

Each container's ``FileDataLog`` writes its frames to its own file and then
waits for a round of its node's ``GroupSync`` (seed 000 "Durable Data Log":
group commit, here across containers and not only within one). One OS
thread runs the rounds: a round covers every write that finished before it
began, and is one ``syncfs`` of the file system that holds them (Linux 5.8
and later, where ``syncfs`` reports write-back errors), else one
``fdatasync`` per file in the round. So operations per sync grow with the
number of containers writing at once, instead of each container paying its
own sync.

The waiting is done with the interpreter's own locks, never gevent's: the
callers are real OS threads (the store's blocking-I/O helper runs file writes
on gevent's thread pool), and so is the round thread.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gevent.monkey

log = logging.getLogger(__name__)

_allocate_lock: Callable[[], Any] = gevent.monkey.get_original("_thread", "allocate_lock")
_start_new_thread: Callable[..., int] = gevent.monkey.get_original("_thread", "start_new_thread")


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
    """Make what was written to every file of ``fds`` (one file system) durable; returns syncs made."""
    if _SYNCFS is not None:
        if _SYNCFS(fds[0]) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}")
        return 1
    for fd in fds:
        os.fdatasync(fd)
    return len(fds)


class _Round:
    """The files one sync covers; ``done`` is released once it ended, with ``error`` if it failed."""

    __slots__ = ("done", "error", "fds")

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.error: OSError | None = None
        self.done = _allocate_lock()
        self.done.acquire()


class GroupSync:
    """Sync rounds shared by every Tier 1 file of a node; ``sync(fd)`` waits for the next one."""

    def __init__(self, sync: Callable[[Sequence[int]], int] = sync_files) -> None:
        self._sync = sync
        self._lock = _allocate_lock()
        self._round: _Round | None = None  # the round writes join now; the thread has not taken it
        self._wake = _allocate_lock()  # released once per round created, taken by the thread
        self._wake.acquire()
        self._started = False
        self._closed = False
        self.rounds = 0  # rounds run
        self.syncs = 0  # syncfs or fdatasync calls made
        self.writes = 0  # writes covered

    def sync(self, fd: int) -> None:
        """Return once a sync that began after this call ended: what ``fd`` holds is durable.

        OSError when that sync failed: every write it covered is then in doubt.
        """
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
            if fd not in current.fds:
                current.fds.append(fd)
            self.writes += 1
        current.done.acquire()
        current.done.release()
        if current.error is not None:
            raise current.error

    def _run(self) -> None:
        while True:
            self._wake.acquire()
            with self._lock:
                current, self._round = self._round, None
            if current is None:
                return  # closed
            try:
                self.syncs += self._sync(current.fds)
            except OSError as exc:
                current.error = exc
            except Exception as exc:  # a bug: the writes fail rather than be acknowledged unsynced
                log.exception("Tier 1 sync round failed")
                current.error = OSError(errno.EIO, f"Tier 1 sync failed: {exc}")
            self.rounds += 1
            current.done.release()
            with self._lock:
                if self._closed and self._round is None:
                    return

    def close(self) -> None:
        """Stop the round thread once the rounds already joined have run."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._round is None and self._started:
                self._wake.release()
