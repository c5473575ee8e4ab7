"""In-memory operation log (seed 000 "In-Memory Operation Log").

Committed operations in sequence order, for the storage writer: it reads
what follows the last sequence number it consumed, which also releases the
operations before it.
"""

from __future__ import annotations

import threading
from collections import deque

from engine.operations import Operation


class OperationLog:
    """A FIFO of committed operations with a blocking read for the storage writer."""

    def __init__(self) -> None:
        self._ops: deque[Operation] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False

    def add(self, ops: list[Operation]) -> None:
        with self._cond:
            if self._ops and ops:
                assert ops[0].seq > self._ops[-1].seq, (ops[0].seq, self._ops[-1].seq)
            self._ops.extend(ops)
            self._cond.notify_all()

    def read(self, after_seq: int, max_count: int, timeout_s: float) -> list[Operation]:
        """Operations with seq > ``after_seq`` (those before are released); waits up to ``timeout_s``."""
        with self._cond:
            while self._ops and self._ops[0].seq <= after_seq:
                self._ops.popleft()
            if not self._ops and not self._closed:
                self._cond.wait(timeout_s)
            out = []
            for op in self._ops:
                if len(out) >= max_count:
                    break
                out.append(op)
            return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
