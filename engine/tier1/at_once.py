"""Calls of many WAL names at once: recovery reads, and claims, a log's names 16 at a time.

A log holds thousands of small objects between checkpoints; one S3 request
after another would make a recovery's time grow with them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

# Objects recovery reads (or names it claims) at once.
READERS = 16

T = TypeVar("T")


def at_once(call: Callable[[int], T], items: list[int]) -> dict[int, T]:
    """``call`` of every item on up to ``READERS`` threads; the first error is raised, the rest not begun."""
    results: dict[int, T] = {}
    pending = iter(items)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                item = None if errors else next(pending, None)
            if item is None:
                return
            try:
                result = call(item)
            except BaseException as exc:  # handed to the caller below
                with lock:
                    errors.append(exc)
                return
            with lock:
                results[item] = result

    if len(items) <= 1:
        return {item: call(item) for item in items}
    workers = [threading.Thread(target=work, daemon=True) for _ in range(min(READERS, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results
