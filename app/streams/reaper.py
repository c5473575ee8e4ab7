"""Stream expiry in the background: a thread that reaps expired streams every interval.

``Stream-TTL`` is a sliding window from the last read or append,
``Stream-Expires-At`` an instant. Expired streams are deleted (or
soft-deleted while forks need them) when next touched and by this reaper.
The last access time lives in memory: after a restart, the window starts
again from the restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.periodic import Periodic

if TYPE_CHECKING:
    from app.streams.store import StreamStore


class Reaper(Periodic):
    """Calls ``streams.reap()`` every ``interval_s`` once the store is ready, until stopped."""

    def __init__(self, streams: StreamStore, interval_s: float) -> None:
        super().__init__("stream-reaper", interval_s, streams.store, streams.reap)
