"""What a test starts and does not stop gracefully: a server or a cluster, killed at the end.

A graceful stop takes seconds (a server waits out its clients' idle keep-alive connections, 5 s;
a cluster's nodes hand their containers over) and shows nothing a test checks when the data is
not read again; a test about a graceful stop or a restart stops its server itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol, Self, TypeVar


class Startable(Protocol):
    def start(self) -> Self: ...

    def kill(self) -> None: ...


Started = TypeVar("Started", bound=Startable)


@contextlib.contextmanager
def killed_at_exit(process: Started) -> Iterator[Started]:
    """``process`` (a ``ServerProcess`` or a ``LocalCluster``) started, and killed at the end."""
    try:
        yield process.start()
    finally:
        process.kill()
