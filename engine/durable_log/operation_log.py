"""In-memory operation log (seed 000 "In-Memory Operation Log").

Committed operations in sequence order, for the storage writer: it reads
what follows the last sequence number it consumed, which also releases the
operations before it.

A commit of plain appends does not wake a waiting reader until they add up
to ``wake_bytes``: the writer flushes by size or age, and checks the age on
its own polls, so waking it for every small append only cost CPU (a tenth
of the server's at a steady 1,000 appends/s). Anything else (a seal, a
truncate, a delete, a merge...) wakes it at once.
"""

from __future__ import annotations

import threading
from collections import deque

from engine.metadata.operations import Append, Operation


class OperationLog:
    """A FIFO of committed operations with a blocking read for the storage writer."""

    def __init__(self, wake_bytes: int = 0) -> None:
        assert wake_bytes >= 0
        self._ops: deque[Operation] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._wake_bytes = wake_bytes
        self._unread_bytes = 0  # of the plain appends added since the reader last read

    def add(self, ops: list[Operation]) -> None:
        with self._cond:
            if self._ops and ops:
                assert ops[0].seq > self._ops[-1].seq, (ops[0].seq, self._ops[-1].seq)
            self._ops.extend(ops)
            wake = False
            for op in ops:
                if type(op) is Append:
                    self._unread_bytes += op.length
                else:
                    wake = True
            if wake or self._unread_bytes >= self._wake_bytes:
                self._cond.notify_all()

    def read(self, after_seq: int, max_count: int, timeout_s: float) -> list[Operation]:
        """Operations with seq > ``after_seq`` (those before are released); waits up to ``timeout_s``."""
        with self._cond:
            while self._ops and self._ops[0].seq <= after_seq:
                self._ops.popleft()
            if not self._ops and not self._closed:
                self._cond.wait(timeout_s)
            self._unread_bytes = 0
            out: list[Operation] = []
            for op in self._ops:
                if len(out) >= max_count:
                    break
                out.append(op)
            return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
