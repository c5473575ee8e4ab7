"""Fork references in a cluster: a source counts its forks in its own meta segment.

On a cluster node (processes of one node included) a fork and its source
may be served by different members, and containers move, so a count kept in
one member's memory would miss forks. There a fork is counted by records in
its source's meta segment, appended through the member serving the source:
``{"t": "fork_ref", "fork", "data"}`` when the fork is created (after its
data segment, before its own meta record) and ``{"t": "fork_unref", ...}``
when it is deleted. A reference is the fork's name and data segment, so a
retried record changes nothing and a recreated fork is another reference.

Races are closed by conditional appends on the source's meta segment: a
fork registers at the length where it read the source not soft-deleted, and
a delete writes ``soft_deleted`` at the length where it read no references
(then removes the stream if none). So no fork is registered with a source
that is deleted or being deleted. The member that deletes a source's last
fork finishes a soft-deleted source itself, through the member serving it
(and so on up a chain); that member, next time it touches its soft-deleted
stream, finds the meta segment gone and forgets it.

A single node keeps counting in memory (``StreamStore.remove``).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from app.streams.errors import StreamConflict, StreamNotFound
from app.streams.names import stream_meta_segment
from app.streams.records import Stream, encode_record, replay
from engine import AppendStep, ConditionalCheckFailed, DeleteStep, SegmentNotFound

if TYPE_CHECKING:
    from app.streams.store import StreamStore


def read_meta(streams: StreamStore, name: str, *, anywhere: bool = False) -> tuple[Stream | None, int]:
    """The stream ``name``'s meta segment describes (None: none) and the segment's length."""
    meta = stream_meta_segment(name)
    records: list[dict[str, Any]] = []
    offset = 0
    try:
        while True:
            got, offset, _ = streams.read_frames(meta, offset, None, anywhere=anywhere)
            if not got:
                break
            records.extend(json.loads(p) for p in got)
    except SegmentNotFound:
        return None, 0
    replayed = replay(name, records)
    return (None if replayed is None else replayed[0]), offset


def _append(streams: StreamStore, name: str, record: dict[str, str], expected: int | None) -> None:
    step = AppendStep(stream_meta_segment(name), encode_record(record), expected_offset=expected)
    streams.store.composite([step], anywhere=True)


def register(streams: StreamStore, source: str, fork: str, data: str) -> None:
    """Count fork ``fork`` (data segment ``data``) in ``source``'s meta segment.

    StreamNotFound / StreamConflict when the source is gone or soft-deleted by then.
    """
    while True:
        current, length = read_meta(streams, source, anywhere=True)
        if current is None:
            raise StreamNotFound(f"fork source {source!r} does not exist")
        if current.soft_deleted:
            raise StreamConflict(f"fork source {source!r} was deleted; it only serves its forks")
        try:
            _append(streams, source, {"t": "fork_ref", "fork": fork, "data": data}, length)
            return
        except ConditionalCheckFailed:
            continue  # another record came first: judge the source again
        except SegmentNotFound:
            raise StreamNotFound(f"fork source {source!r} does not exist") from None


def release(streams: StreamStore, source: str, fork: str, data: str) -> None:
    """Uncount fork ``fork`` in ``source``; a soft-deleted source left without forks goes too."""
    try:
        _append(streams, source, {"t": "fork_unref", "fork": fork, "data": data}, None)
    except SegmentNotFound:
        return
    with streams.lock:
        here = streams.streams.get(source)
        if here is not None:
            if here.soft_deleted:
                remove(streams, here)
            return
    current, _ = read_meta(streams, source, anywhere=True)
    if current is None or not current.soft_deleted or current.fork_refs:
        return
    with contextlib.suppress(SegmentNotFound):  # no record comes after soft_deleted but references' ends
        streams.store.composite([DeleteStep(stream_meta_segment(source))], anywhere=True)
    if current.config.forked_from is not None:
        release(streams, current.config.forked_from, source, current.config.data_segment)


def remove(streams: StreamStore, stream: Stream) -> None:
    """``StreamStore.remove`` on a cluster node: soft-delete while referenced, else delete.

    Caller holds ``streams.lock``.
    """
    while True:
        current, length = read_meta(streams, stream.name)
        if current is None:  # a releasing member finished it
            _forget(streams, stream)
            return
        if not current.soft_deleted:
            try:
                _append(streams, stream.name, {"t": "soft_deleted"}, length)
            except ConditionalCheckFailed:
                continue  # a fork registered meanwhile: count again
            stream.soft_deleted = True
            with contextlib.suppress(SegmentNotFound):
                streams.store.delete(stream.config.data_segment)
        if current.fork_refs:
            return
        with contextlib.suppress(SegmentNotFound):
            streams.store.delete(stream_meta_segment(stream.name))
        _forget(streams, stream)
        if stream.config.forked_from is not None:
            release(streams, stream.config.forked_from, stream.name, stream.config.data_segment)
        return


def _forget(streams: StreamStore, stream: Stream) -> None:
    if streams.streams.get(stream.name) is stream:
        del streams.streams[stream.name]
