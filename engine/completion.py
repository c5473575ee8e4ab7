"""Completion: the one-shot result a caller of the durable log waits on.

A ``concurrent.futures.Future`` allocates a condition, a re-entrant lock and
a waiter list per operation; on the append hot path (and under gevent,
where each is a greenlet-aware object) that cost shows. A completion is one
lock, taken at creation and released when the result is set: exactly one
producer (the processor) and one consumer (the caller). A tail reader's
wake-up (the read index's waiters) is one too, waited on with a timeout.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class Completion(Generic[T]):
    __slots__ = ("_error", "_latch", "_result")

    def __init__(self) -> None:
        self._latch = threading.Lock()
        self._latch.acquire()
        self._result: T | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return not self._latch.locked()

    def set_result(self, result: T) -> None:
        assert self._latch.locked(), "completed twice"
        self._result = result
        self._latch.release()

    def set_exception(self, error: BaseException) -> None:
        assert self._latch.locked(), "completed twice"
        self._error = error
        self._latch.release()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the result (or error) to be set; whether it was."""
        if not self._latch.acquire(True, timeout_s):
            return False
        self._latch.release()
        return True

    def result(self) -> T:
        """Wait for the result; re-raise the error the producer set."""
        self._latch.acquire()
        self._latch.release()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]
