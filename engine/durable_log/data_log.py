"""DurableDataLog: the Tier 1 seam (seed 000 "Durable Data Log").

A Tier 1 log stores whole writes of framed operations and gives them back in
order on recovery. Addresses are frame sequence numbers. Implementations:
``FileDataLog`` (local files, the default), ``ObjectDataLog`` (an object
store such as S3, fenced by epoch) and ``MemoryDataLog`` (tests, with fault
injection). Both are blocking; callers go through ``run_blocking``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from engine.durable_log.frames import Batch


class LogFenced(OSError):
    """A newer writer owns the log: this one must stop and never acknowledge again (never retried)."""


class DurableDataLog(Protocol):
    """Append-only, durable, truncatable log of writes."""

    def recover(self) -> Iterator[Batch]:
        """Yield every whole write still in the log, oldest first; cut off a torn tail."""
        ...

    def append(self, payload: bytes) -> tuple[int, int]:
        """Durably write ``payload`` as one write; returns (first frame seq, frame count).

        Raises OSError when the write failed; the log is then as it was before.
        Raises LogFenced (an OSError) once a newer writer owns the log.
        """
        ...

    def truncate(self, frame_seq: int) -> int:
        """Drop storage holding only frames below ``frame_seq``; returns bytes freed."""
        ...

    def close(self) -> None: ...
