"""Stream expiry in the background: a thread that reaps expired streams every interval.

``Stream-TTL`` is a sliding window from the last read or append,
``Stream-Expires-At`` an instant. Expired streams are deleted (or
soft-deleted while forks need them) when next touched and by this reaper.
The last access time lives in memory: after a restart, the window starts
again from the restart.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from engine import SegstoreError

if TYPE_CHECKING:
    from app.streams.store import StreamStore

log = logging.getLogger(__name__)


class Reaper:
    """Calls ``streams.reap()`` every ``interval_s`` once the store is ready, until stopped."""

    def __init__(self, streams: StreamStore, interval_s: float) -> None:
        self.streams = streams
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="stream-reaper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            if not self.streams.store.ready:
                continue
            try:
                self.streams.reap()
            except SegstoreError as exc:
                log.info("stream reaper: %s %s", exc.code, exc.detail)
            except Exception:  # the reaper must outlive a bad record; the next round tries again
                log.exception("stream reaper failed")
