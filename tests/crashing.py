"""A crash at every step of a procedure over a store, and a restart after each (migrations use it).

``crash_everywhere`` runs the procedure on a fresh data folder once per
step: the first time it fails before the first change, then after one
change, after two..., each time closing the store as a crash would leave it
(every acknowledged change durable, nothing after), reopening it and running
the procedure again to its end, until a run meets no crash.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine import SegmentStore, Settings

# The SegmentStore calls that change something.
CHANGES = (
    "create", "append", "seal", "truncate", "delete", "fork", "update_attributes", "merge", "composite",
)


class Crash(Exception):
    """The process died here."""


@contextmanager
def crash_after(store: SegmentStore, changes: int) -> Iterator[None]:
    """Let ``changes`` changes of ``store`` through; every later one raises Crash."""
    left = [changes]

    def crashing(real: Callable[..., Any]) -> Callable[..., Any]:
        def change(*args: Any, **kwargs: Any) -> Any:
            if left[0] == 0:
                raise Crash(f"crash before {real.__name__}{args!r}")
            left[0] -= 1
            return real(*args, **kwargs)

        return change

    for name in CHANGES:
        setattr(store, name, crashing(getattr(store, name)))
    try:
        yield
    finally:
        for name in CHANGES:
            delattr(store, name)


def open_store(settings: Settings) -> SegmentStore:
    store = SegmentStore(settings)
    store.start(wait=True)
    return store


def crash_everywhere(
    tmp_path: Path,
    settings_for: Callable[[Path], Settings],
    build: Callable[[SegmentStore], None],
    procedure: Callable[[SegmentStore], object],
    check: Callable[[SegmentStore], None],
    restarted: Callable[[SegmentStore, bool], None] | None = None,
) -> int:
    """Crash ``procedure`` at each step of it in turn (see the module); returns how many steps it has.

    ``restarted(store, completed)`` looks at the reopened store before the
    procedure runs again (``completed``: the run it follows met no crash).
    """
    for steps in itertools.count():  # ends: the procedure has finitely many steps
        settings = settings_for(tmp_path / f"crash-after-{steps}")
        store = open_store(settings)
        try:
            build(store)
        finally:
            store.close()
        store = open_store(settings)
        crashed = False
        try:
            with crash_after(store, steps):
                procedure(store)
        except Crash:
            crashed = True
        finally:
            store.close()
        store = open_store(settings)
        try:
            if restarted is not None:
                restarted(store, not crashed)
            procedure(store)
            check(store)
        finally:
            store.close()
        if not crashed:
            return steps
