"""FaultyChunkStorage: any ChunkStorage with injected faults and latency, for tests.

In the way of TigerBeetle's testing storage, the real binding (or its
in-memory twin) is wrapped rather than copied. Per operation name (the
protocol's method names: ``"create"``, ``"write"``, ``"list"``, ...) it can:

- ``fail(op, n)``: the next ``n`` calls raise InjectedFault and never reach
  the inner storage;
- ``fail_after_landing(op, n)``: the next ``n`` calls reach the inner storage,
  which does the work, and then raise InjectedFault, as when a request
  succeeds but its answer is lost;
- ``delay(op, s)``: every call first sleeps ``s`` seconds;
- ``hold(op)`` / ``release(op)``: the next call waits until ``release``,
  however long the test takes to bring about what must happen meanwhile;
- ``outage(*ops)`` / ``end_outage()``: while on, every call of those
  operations (of all when none is named) raises InjectedFault;
  ``outage(*ops, full=True)`` raises InjectedFull instead, a
  ChunkStorageFull, as a full disk would.

``calls`` counts every call per operation, faulted or not. Faults are
consumed in call order under one lock: deterministic, and safe to share
between threads.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from engine.tier2.chunk_storage import (
    ChunkHandle,
    ChunkInfo,
    ChunkStorage,
    ChunkStorageError,
    ChunkStorageFull,
    Pieces,
)

T = TypeVar("T")

OPERATIONS = frozenset(
    {
        "create",
        "exists",
        "open_read",
        "open_write",
        "info",
        "read",
        "write",
        "concat",
        "truncate",
        "delete",
        "list",
    }
)


class InjectedFault(ChunkStorageError):
    """A failure FaultyChunkStorage raised on purpose."""


class InjectedFull(InjectedFault, ChunkStorageFull):
    """An injected want of space (ENOSPC)."""


class FaultyChunkStorage:
    """Wraps ``inner`` (same protocol, same capabilities) and injects faults per operation."""

    def __init__(self, inner: ChunkStorage) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self._fail_before: Counter[str] = Counter()
        self._fail_after: Counter[str] = Counter()
        self._delay_s: dict[str, float] = {}
        self._holds: dict[str, threading.Event] = {}  # set by release
        self._hold_next: set[str] = set()  # the operations whose next call waits on its hold
        self._outage: frozenset[str] = frozenset()
        self._outage_error: type[InjectedFault] = InjectedFault
        self._lock = threading.Lock()

    @property
    def supports_append(self) -> bool:
        return self.inner.supports_append

    @property
    def supports_concat(self) -> bool:
        return self.inner.supports_concat

    @property
    def supports_truncation(self) -> bool:
        return self.inner.supports_truncation

    # --------------------------------------------------------- injecting
    def fail(self, operation: str, count: int = 1) -> None:
        """The next ``count`` calls of ``operation`` raise before they reach the inner storage."""
        with self._lock:
            self._fail_before[_checked(operation)] += count

    def fail_after_landing(self, operation: str, count: int = 1) -> None:
        """The next ``count`` calls of ``operation`` take effect, then raise."""
        with self._lock:
            self._fail_after[_checked(operation)] += count

    def delay(self, operation: str, seconds: float) -> None:
        """Every call of ``operation`` sleeps ``seconds`` first (0 ends it)."""
        with self._lock:
            self._delay_s[_checked(operation)] = seconds

    def hold(self, operation: str) -> None:
        """The next call of ``operation`` waits until ``release``; the calls after it do not."""
        with self._lock:
            self._holds[_checked(operation)] = threading.Event()
            self._hold_next.add(operation)

    def release(self, operation: str) -> None:
        """The call held by ``hold`` goes on (at once when it has not come yet)."""
        with self._lock:
            self._hold_next.discard(_checked(operation))
            self._holds.pop(operation, threading.Event()).set()

    def outage(self, *operations: str, full: bool = False) -> None:
        """Every call of ``operations`` (of all, if none is named) raises until ``end_outage``.

        ``full``: they raise InjectedFull (no space left) rather than InjectedFault.
        """
        with self._lock:
            self._outage = frozenset(_checked(op) for op in operations) or OPERATIONS
            self._outage_error = InjectedFull if full else InjectedFault

    def end_outage(self) -> None:
        with self._lock:
            self._outage = frozenset()

    def clear(self) -> None:
        """Remove every fault and delay (the call counts stay)."""
        with self._lock:
            self._fail_before.clear()
            self._fail_after.clear()
            self._delay_s.clear()
            self._outage = frozenset()
            waiting = list(self._holds.values())
            self._holds.clear()
            self._hold_next.clear()
        for event in waiting:
            event.set()

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        with self._lock:
            self.calls[operation] += 1
            down = operation in self._outage
            before = not down and self._fail_before[operation] > 0
            if before:
                self._fail_before[operation] -= 1
            after = not (down or before) and self._fail_after[operation] > 0
            if after:
                self._fail_after[operation] -= 1
            delay_s = self._delay_s.get(operation, 0.0)
            outage_error = self._outage_error
            held = self._holds[operation] if operation in self._hold_next else None
            self._hold_next.discard(operation)
        if held is not None:
            held.wait()
        if delay_s:
            time.sleep(delay_s)
        if down:
            raise outage_error(f"injected Tier 2 outage: {operation} failed")
        if before:
            raise InjectedFault(f"injected failure: {operation} failed")
        result = fn()
        if after:
            raise InjectedFault(f"injected failure: {operation} took effect, then failed")
        return result

    # ----------------------------------------------------------- protocol
    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        return self._call("create", lambda: self.inner.create(name, data))

    def exists(self, name: str) -> bool:
        return self._call("exists", lambda: self.inner.exists(name))

    def open_read(self, name: str) -> ChunkHandle:
        return self._call("open_read", lambda: self.inner.open_read(name))

    def open_write(self, name: str) -> ChunkHandle:
        return self._call("open_write", lambda: self.inner.open_write(name))

    def info(self, name: str) -> ChunkInfo:
        return self._call("info", lambda: self.inner.info(name))

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        return self._call("read", lambda: self.inner.read(handle, offset, length))

    def read_stream(self, handle: ChunkHandle, offset: int, length: int, piece_bytes: int) -> Pieces:
        """Faults of ``read`` apply when the stream is opened."""
        return self._call("read", lambda: self.inner.read_stream(handle, offset, length, piece_bytes))

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        return self._call("write", lambda: self.inner.write(handle, offset, data))

    def concat(self, target: ChunkHandle, sources: Sequence[str]) -> int:
        return self._call("concat", lambda: self.inner.concat(target, sources))

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        self._call("truncate", lambda: self.inner.truncate(handle, length))

    def delete(self, name: str) -> None:
        self._call("delete", lambda: self.inner.delete(name))

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        """The inner listing, read in full within the call (so a fault covers all of it)."""
        return iter(self._call("list", lambda: list(self.inner.list(prefix))))


def _checked(operation: str) -> str:
    if operation not in OPERATIONS:
        raise ValueError(f"no chunk storage operation {operation!r}")
    return operation
