"""DurableDataLog: the Tier 1 seam (seed 000 "Durable Data Log").

A Tier 1 log stores whole writes of framed operations and gives them back in
order on recovery. Addresses are frame sequence numbers. Implementations:
``FileDataLog`` (local files, the default), ``ObjectDataLog`` (an object
store such as S3, fenced by epoch) and ``MemoryDataLog`` (tests, with fault
injection).

A write is begun, then written: ``begin`` numbers its frames (so the address
is known before any I/O) and ``write`` makes it durable. A log may allow
several writes in flight (``max_writes_in_flight``): they are begun in order,
written at once, and the caller acknowledges them in begin order, each only
once every earlier one is durable. After a failed write the caller waits
until none is running and calls ``abandon``: that write and every one begun
after it are forgotten, and the next write begins where the failed one did.
``append`` is the one-at-a-time shorthand (recovery's checkpoint, tests).

Calls are blocking. A ``cooperative`` log does only socket I/O (which gevent
makes cooperative) and is called in place; the others go through
``run_blocking``, except ``write`` where ``cooperative_write`` says it only
waits while another thread does its I/O (the local files' sync rounds).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from engine.blocking import run_blocking
from engine.durable_log.frames import Batch

T = TypeVar("T")


class LogFenced(OSError):
    """A newer writer owns the log: this one must stop and never acknowledge again (never retried).

    Writes in flight then have a ``fate``: one the newer writer may read was
    perhaps applied, so its caller must not be told to resend it blindly.
    """


class Fate(enum.Enum):
    """What a fenced writer knows of one of its writes: whether the newer writer may read it."""

    UNKNOWN = "unknown"  # it may be in the log the newer writer reads (it landed, or it may have)
    NOT_SENT = "not sent"  # never sent: not in the log
    BARRED = "barred"  # the newer writer holds its place: neither it nor any write begun after it is read


@dataclass(slots=True)
class PendingWrite:
    """A begun write: its frames are numbered, its bytes encoded, nothing is stored yet."""

    first_frame_seq: int
    frame_count: int
    data: bytes = field(repr=False)
    index: int = 0  # the log's own number for the write (an object log's write number)
    fate: Fate = Fate.UNKNOWN  # set by a log that was fenced meanwhile (LogFenced)


class DurableDataLog(Protocol):
    """Append-only, durable, truncatable log of writes."""

    @property
    def max_writes_in_flight(self) -> int: ...

    @property
    def cooperative(self) -> bool: ...

    @property
    def cooperative_write(self) -> bool: ...

    def recover(self) -> Iterator[Batch]:
        """Yield every whole write still in the log, oldest first; cut off a torn tail."""
        ...

    def begin(self, payload: bytes) -> PendingWrite:
        """Number the frames of the next write of ``payload``; nothing is written yet.

        Raises OSError when the log cannot take writes (it then stays as it was).
        """
        ...

    def write(self, pending: PendingWrite) -> None:
        """Make a begun write durable.

        Raises OSError when it failed (then ``abandon`` it), LogFenced (an
        OSError) once a newer writer owns the log.
        """
        ...

    def abandon(self, pending: PendingWrite) -> None:
        """Forget ``pending`` and every write begun after it; none of them is running.

        On return none of them is, or will ever be, in the log. Raises OSError
        when that could not be made sure: any of them may still be read back.
        """
        ...

    def append(self, payload: bytes) -> tuple[int, int]:
        """Begin and write ``payload`` (abandoned if the write fails); returns (first frame seq, count)."""
        ...

    def truncate(self, frame_seq: int) -> int:
        """Drop storage holding only frames below ``frame_seq``; returns bytes freed."""
        ...

    def close(self) -> None: ...


def write_one(log: DurableDataLog, payload: bytes) -> tuple[int, int]:
    """``append`` of every binding: begin, write, and abandon the write if it failed."""
    pending = log.begin(payload)
    try:
        log.write(pending)
    except LogFenced:
        raise
    except OSError:
        log.abandon(pending)
        raise
    return pending.first_frame_seq, pending.frame_count


def log_call(log: DurableDataLog, fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn`` of the Tier 1 log in place when its I/O is cooperative, else through run_blocking."""
    return fn(*args) if log.cooperative else run_blocking(fn, *args)
