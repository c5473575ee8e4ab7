"""The one helper for blocking disk I/O.

gevent makes sockets cooperative but not ``os.write``/``os.fsync``: under a
patched process such a call would stall every greenlet. ``run_blocking`` runs
it on gevent's pool of real OS threads instead. Unpatched (tests, the CLI,
benchmarks) the engine's callers already are OS threads, so the call runs in
place: a thread hop would only add latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import gevent
import gevent.monkey

T = TypeVar("T")


def _patched() -> bool:
    return gevent.monkey.is_module_patched("threading")


def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` where blocking it cannot stall other requests."""
    if _patched():
        return gevent.get_hub().threadpool.apply(fn, args, kwargs)
    return fn(*args, **kwargs)
