"""What the real-server stream tests share: keyed writers that number their events, and the check
that reads every segment back in successor order."""

from __future__ import annotations

import threading
from collections import defaultdict

from client.events import EventReader
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from client.stream_writer import StreamWriter

PACE_S = 0.005


class KeyedWriters:
    """Threads writing ``key:n`` events (n = 1, 2, ... per key) through one StreamWriter each, one
    event of each of their keys every ``PACE_S`` (enough to keep every segment busy, few enough to
    read back quickly).

    ``written`` is how many events of each key were handed to a writer; all
    of them must end up stored once a writer is flushed.
    """

    def __init__(
        self, client: SegmentClient, scope: str, stream: str, keys: list[str], threads: int, **options: float
    ) -> None:
        self.keys = keys
        self.written: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self.writers = [
            StreamWriter(client, scope, stream, linger_s=0.002, **options) for _ in range(threads)
        ]
        share = [keys[i::threads] for i in range(threads)]
        self._threads = [
            threading.Thread(target=self._run, args=(w, mine), daemon=True)
            for w, mine in zip(self.writers, share, strict=True)
        ]

    def start(self) -> KeyedWriters:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, writer: StreamWriter, keys: list[str]) -> None:
        try:
            while not self._stop.wait(PACE_S):
                for key in keys:
                    with self._lock:
                        self.written[key] += 1
                        number = self.written[key]
                    writer.write(f"{key}:{number}".encode(), key)
        except BaseException as err:
            self.errors.append(err)

    def stop(self) -> None:
        """Stop writing, flush and close every writer (raises the first error)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        for writer in self.writers:
            writer.close()
        assert not self.errors, self.errors


def read_in_successor_order(client: SegmentClient, scope: str, stream: str) -> dict[str, list[int]]:
    """Every key's event numbers, reading each segment whole, predecessors before successors.

    Segment ids grow along every successor chain, so ascending ids are an
    order in which every segment comes after all its predecessors; the
    newest ids are the current segments'.
    """
    _, current = StreamClient(client).segments(scope, stream)
    found: dict[str, list[int]] = defaultdict(list)
    for segment_id in range(max(s.id for s in current) + 1):
        for event in EventReader(client, f"{scope}/{stream}/{segment_id}"):
            key, _, number = event.payload.decode().rpartition(":")
            found[key].append(int(number))
    return found


def assert_exactly_once_in_order(found: dict[str, list[int]], written: dict[str, int]) -> None:
    """Each key's events 1..written[key], each once, in order."""
    for key, count in written.items():
        assert found.get(key, []) == list(range(1, count + 1)), (key, count, found.get(key, [])[:20])
    assert set(found) <= set(written)
