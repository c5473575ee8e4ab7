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


def _captured(fn: Callable[..., T], args: Any, kwargs: Any) -> tuple[bool, Any]:
    """(True, result) or (False, the exception): gevent's pool prints what a task raises."""
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:  # handed to the caller, which re-raises it
        return False, exc


def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` where blocking it cannot stall other requests.

    An exception reaches the caller as if the call had run in place (and is
    not printed by gevent's thread pool as an unhandled error).
    """
    if _patched():
        ok, outcome = gevent.get_hub().threadpool.apply(_captured, (fn, args, kwargs))
        if not ok:
            raise outcome
        return outcome
    return fn(*args, **kwargs)
