"""Values the engine hands to its callers (immutable snapshots)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment's state at one moment. Offsets in bytes, times in Unix seconds."""

    name: str
    segment_id: int
    length: int
    start_offset: int
    storage_length: int
    sealed: bool
    event_count: int
    created: float
    last_modified: float


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Outcome of an append.

    ``offset`` is where the bytes start (None for a duplicate), ``info`` the
    segment's state once the Tier 1 write that carried the append was applied
    (so its length may count appends committed in the same write after it). ``duplicate`` is True when the
    writer's event number was not greater than the stored one; then nothing
    was appended and ``event_number`` is the stored one.
    """

    offset: int | None
    duplicate: bool
    event_number: int | None
    info: SegmentInfo


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Bytes read from ``offset``, in pieces; ``next_offset`` = offset + their length.

    The pieces are cache blocks where a read covers them whole, so a large
    read is sent without joining (copying) them; ``data`` joins them. No bytes
    when a tail read timed out, or at the end of a sealed segment
    (``info.sealed`` and ``next_offset == info.length``).
    """

    pieces: tuple[bytes, ...]
    offset: int
    next_offset: int
    info: SegmentInfo

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)


@dataclass(frozen=True, slots=True)
class MergeResult:
    """Where a merge (or a transaction's commit) put the source's bytes in the target.

    ``offset`` is where they start, ``length`` how many; ``info`` the target's
    state after the merge (at the first try, for an answer to a retry).
    """

    offset: int
    length: int
    info: SegmentInfo
