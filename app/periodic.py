"""A surface's housekeeping in the background: a thread that does its work every interval.

The work starts once the store is ready and runs until stopped; an engine
error (a container moving, a listing refused) is logged and the next round
tries again, so is any other failure (the task must outlive a bad record).
The Durable Streams reaper and the stream layer's keeper are such tasks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from engine import SegmentStore, SegstoreError

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``work()`` every ``interval_s`` once ``store`` is ready, in a thread named ``name``."""

    def __init__(self, name: str, interval_s: float, store: SegmentStore, work: Callable[[], object]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.store = store
        self.work = work
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            if not self.store.ready:
                continue
            try:
                self.work()
            except SegstoreError as exc:
                log.info("%s: %s %s", self.name, exc.code, exc.detail)
            except Exception:
                log.exception("%s failed", self.name)
