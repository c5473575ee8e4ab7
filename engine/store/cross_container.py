"""Merges and forks whose two segments live in different containers: the bytes are copied.

Within one container a merge is one log operation and a fork shares Tier 2
chunks. Across containers neither can be: the source's bytes are read (from
a container of this node, or through the node serving it, ``PeerSegments``)
and appended beside the target, then the result is made whole at once. The
reading side needs only ``info``, ``read`` and ``delete`` (``Source``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TYPE_CHECKING, Protocol

from engine.container.composite import Step, StepResult
from engine.errors import (
    InvalidArgument,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegstoreError,
    Throttled,
)
from engine.naming import staging_name
from engine.types import MergeResult, ReadResult, SegmentInfo

if TYPE_CHECKING:
    from engine.config import Settings
    from engine.container.segment_container import SegmentContainer


class Source(Protocol):
    """Segments another call reaches wherever they live: a container of this node or of another one."""

    def info(self, name: str) -> SegmentInfo: ...

    def read(self, name: str, offset: int | None, max_length: int | None, *, wait_s: float) -> ReadResult: ...

    def delete(self, name: str) -> None: ...

    def composite(self, steps: list[Step]) -> list[StepResult]: ...

    def writer_event_number(self, name: str, writer_id: uuid.UUID) -> int | None: ...


def merge(
    into: SegmentContainer, origin: Source, target: str, source: str, settings: Settings
) -> MergeResult:
    """``SegmentStore.merge`` across containers: copy into a staging segment beside the target, merge that.

    The target remembers the merge under the source's name and creation
    time, so a retry after a crash or a lost answer finds it and only the
    source's delete is left to do.
    """
    try:
        info = origin.info(source)
    except SegmentNotFound:
        recorded = into.merge_record(target, source)
        if recorded is None:
            raise
        return recorded
    if not info.sealed:
        raise SegmentNotSealed(f"segment {source!r} must be sealed before it is merged", segment=info)
    if info.start_offset > 0:
        raise InvalidArgument(f"segment {source!r} is truncated; only a whole segment can be merged")
    recorded = into.merge_record(target, source, created=info.created)
    if recorded is None and into.info(target).sealed:
        raise SegmentSealed(f"segment {target!r} is sealed", segment=into.info(target))
    if recorded is None:  # else merged before a crash or a lost answer; only the delete is left
        staging = staging_name(target, uuid.uuid4())
        into.create(staging, rollover_bytes=None)
        try:
            copy_bytes(origin, source, into, staging, info.length, settings)
            into.seal(staging)
            recorded = into.merge(target, staging, record_as=source, record_created=info.created)
        except BaseException:
            with contextlib.suppress(SegstoreError):
                into.delete(staging)
            raise
    with contextlib.suppress(SegmentNotFound):
        origin.delete(source)
    return recorded


def fork(
    into: SegmentContainer, origin: Source, source: str, name: str, offset: int | None, settings: Settings
) -> SegmentInfo:
    """``SegmentStore.fork`` across containers: ``name`` gets a copy of ``source``'s bytes below ``offset``.

    Offsets stay those of the source, so the source must not be truncated.
    Nothing is shared: the copy costs its bytes once, and the two segments
    never depend on each other after.
    """
    info = origin.info(source)
    end = info.length if offset is None else offset
    if not 0 <= end <= info.length:
        raise InvalidArgument(f"fork offset {end} is outside segment {source!r} (length {info.length})")
    if info.start_offset > 0:
        raise InvalidArgument(f"segment {source!r} is truncated; a fork in another container copies it whole")
    into.create(name, rollover_bytes=None)
    try:
        copy_bytes(origin, source, into, name, end, settings)
    except BaseException:
        with contextlib.suppress(SegstoreError):
            into.delete(name)
        raise
    return into.info(name)


def copy_bytes(
    origin: Source, source: str, into: SegmentContainer, name: str, length: int, settings: Settings
) -> None:
    """Copy ``source``'s first ``length`` bytes to the empty ``name``, an append at a time.

    Back-pressure is waited out.
    """
    step = min(settings.max_append_bytes, settings.max_read_bytes)
    offset = 0
    while offset < length:
        data = origin.read(source, offset, min(step, length - offset), wait_s=0).data
        if not data:
            raise SegmentNotFound(f"segment {source!r} ended at {offset} while {length} bytes were copied")
        while True:
            try:
                into.append(
                    name, data, expected_offset=offset, writer_id=None, event_number=None, event_count=1
                )
                break
            except Throttled as exc:
                time.sleep(exc.retry_after_s)
        offset += len(data)
