"""The one helper for blocking disk I/O.

gevent makes sockets cooperative but not ``os.write``/``os.fsync``: under a
patched process such a call would stall every greenlet. ``run_blocking`` runs
it on gevent's pool of real OS threads instead. Unpatched (tests, the CLI,
benchmarks) the engine's callers already are OS threads, so the call runs in
place: a thread hop would only add latency.

A component that runs its own OS thread for disk I/O (the Tier 1 sync
rounds) hands results back with a ``Signal``: set by that thread, waited on
cooperatively by greenlets and plainly by OS threads, with one wake-up of a
hub per signal however many greenlets wait.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import gevent
import gevent.event
import gevent.monkey
from gevent._hub_local import get_hub_if_exists

T = TypeVar("T")


def sync_folder(folder: Path) -> None:
    """Make the folder's entries (a new name, a removed one) durable; blocking, for ``run_blocking``."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _patched() -> bool:
    return gevent.monkey.is_module_patched("threading")


def _captured(fn: Callable[..., T], args: Any, kwargs: Any) -> tuple[bool, Any]:
    """(True, result) or (False, the exception): gevent's pool prints what a task raises."""
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:  # handed to the caller, which re-raises it
        return False, exc


def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` where blocking it cannot stall other requests.

    An exception reaches the caller as if the call had run in place (and is
    not printed by gevent's thread pool as an unhandled error).
    """
    if _patched():
        ok, outcome = gevent.get_hub().threadpool.apply(_captured, (fn, args, kwargs))
        if not ok:
            raise outcome
        return outcome
    return fn(*args, **kwargs)


# A lock for OS threads (the thread pool, the sync thread): never gevent's, even in a patched process.
os_thread_lock: Callable[[], Any] = gevent.monkey.get_original("_thread", "allocate_lock")


class Signal:
    """A one-shot event any OS thread may set; greenlets wait without blocking their hub."""

    __slots__ = ("_events", "_latch", "_lock")

    def __init__(self) -> None:
        self._lock = os_thread_lock()
        self._latch = os_thread_lock()
        self._latch.acquire()
        self._events: list[tuple[Any, gevent.event.Event]] = []  # (hub, its event) per waiting hub

    def is_set(self) -> bool:
        return not self._latch.locked()

    def set(self) -> None:
        """Wake every waiter: threads at once, each waiting hub by one callback."""
        with self._lock:
            self._latch.release()
            events, self._events = self._events, []
        for hub, event in events:
            hub.loop.run_callback_threadsafe(event.set)

    def wait(self) -> None:
        hub = get_hub_if_exists()
        if hub is None or not _patched():
            self._latch.acquire()  # an OS thread (or an unpatched process): block it
            self._latch.release()
            return
        with self._lock:
            if not self._latch.locked():
                return
            event = next((e for h, e in self._events if h is hub), None)
            if event is None:
                event = gevent.event.Event()
                self._events.append((hub, event))
        event.wait()
