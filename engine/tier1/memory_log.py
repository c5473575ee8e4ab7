"""MemoryDataLog: Tier 1 in memory, for tests, with fault injection.

Like TigerBeetle's testing storage, it is the real log's twin: the same
frames, plus knobs to fail or stall writes, to lose data not yet "synced",
and to reopen the same bytes as a restarted process would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from engine.durable_log import frames
from engine.durable_log.data_log import PendingWrite, write_one


class MemoryDataLog:
    """Frames kept in a list of writes; ``reopen`` shares them with a new instance. One write in flight."""

    max_writes_in_flight = 1
    cooperative = False
    cooperative_write = False

    def __init__(self, *, max_frame_bytes: int = 1 << 20, _writes: list[bytes] | None = None):
        self.max_frame_bytes = max_frame_bytes
        self.writes: list[bytes] = [] if _writes is None else _writes
        self._next_seq = 0
        self.fail_writes = 0  # the next N writes raise OSError
        self.fail_error: OSError = OSError(5, "injected Tier 1 write failure")
        self.gate = threading.Event()  # cleared: writes block until it is set
        self.gate.set()
        self.appended = threading.Event()  # set after every successful write

    def reopen(self) -> MemoryDataLog:
        """The same log as a new process would find it."""
        return MemoryDataLog(max_frame_bytes=self.max_frame_bytes, _writes=self.writes)

    def recover(self) -> Iterator[frames.Batch]:
        expected = None
        for i, buf in enumerate(self.writes):
            try:
                for batch in frames.iter_batches(buf, expected):
                    expected = batch.first_frame_seq + batch.frame_count
                    yield batch
            except frames.TornTail:
                assert i == len(self.writes) - 1, "a torn write must be the last one"
                del self.writes[i:]
                break
        self._next_seq = expected or 0

    def begin(self, payload: bytes) -> PendingWrite:
        first = self._next_seq
        buf, count = frames.encode_batch(payload, first, self.max_frame_bytes)
        self._next_seq += count
        return PendingWrite(first, count, buf)

    def write(self, pending: PendingWrite) -> None:
        self.gate.wait()
        if self.fail_writes:
            self.fail_writes -= 1
            raise self.fail_error
        self.writes.append(pending.data)
        self.appended.set()

    def abandon(self, pending: PendingWrite) -> None:
        self._next_seq = pending.first_frame_seq

    def append(self, payload: bytes) -> tuple[int, int]:
        return write_one(self, payload)

    def truncate(self, frame_seq: int) -> int:
        freed = 0
        while len(self.writes) > 1:
            header = frames.HEADER.unpack_from(self.writes[1], 0)
            if header[2] > frame_seq:
                break
            freed += len(self.writes.pop(0))
        return freed

    def close(self) -> None:
        self.gate.set()
