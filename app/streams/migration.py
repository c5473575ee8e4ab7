"""Durable Streams' state moves out of ordinary names into reserved ones.

``streams/meta/...`` and ``streams/data/...`` become ``#stream/meta/...``
and ``#stream/data/...``, names of the same length.

Data folders written before the surface had reserved names keep each
stream's meta and data segments where the native API could reach them.
Once per data folder, before the streams are loaded, each stream moves:

1. its data segment is forked (``SegmentStore.fork``: no flushed byte is
   copied) into a reserved name in the same container, with every
   attribute (producers' epochs and sequence numbers, the ``Stream-Seq``
   generation) and sealed if it was (closed); a soft-deleted stream has no
   data segment left;
2. its meta segment's records are written, in one append, into the new meta
   segment, the configuration naming the new data segment;
3. the old meta segment goes (from here the stream is the new one), then
   the old data segment.

A crash before 3 leaves the old meta segment, and the next start moves the
stream again (what the crashed try wrote is replaced); after it, the old
data segment is dropped with the other leftovers under ``streams/data/``.
The marker ``#stream/migrated`` is written last: from then on those are
ordinary names a user may take, never looked at again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging

from app.streams.format import unframe
from app.streams.names import (
    LEGACY_STREAM_DATA_PREFIX,
    LEGACY_STREAM_META_PREFIX,
    STREAM_DATA_PREFIX,
    STREAMS,
    stream_meta_segment,
    stream_of_meta_segment,
)
from app.streams.records import encode_record
from engine import (
    ATTRIBUTES_PER_REQUEST_MAX,
    AttributeUpdate,
    AttributeUpdateType,
    SegmentExists,
    SegmentNotFound,
    SegmentStore,
)

log = logging.getLogger(__name__)


def migrate(store: SegmentStore) -> int:
    """Move every stream of the old layout (unless the marker says it is done); returns how many.

    A cluster node moves nothing: a cluster's state was written with
    reserved names (a data folder from before them runs once as a single
    node first), and the marker lives in one container of one node.
    """
    if store.node is not None:
        return 0
    marker = STREAMS.migrated
    with contextlib.suppress(SegmentNotFound):
        store.info(marker)
        return 0
    moved = 0
    for info in store.scan(LEGACY_STREAM_META_PREFIX):
        _move(store, info.name)
        moved += 1
    for info in store.scan(LEGACY_STREAM_DATA_PREFIX):
        _drop(store, info.name)  # no meta segment names it any more
    with contextlib.suppress(SegmentExists):
        store.create(marker)
    if moved:
        log.info("streams: %d moved from %s to reserved names", moved, LEGACY_STREAM_META_PREFIX)
    return moved


def _move(store: SegmentStore, old_meta: str) -> None:
    name = stream_of_meta_segment(old_meta, LEGACY_STREAM_META_PREFIX)
    records = [json.loads(frame) for frame in unframe(_read_all(store, old_meta))[0]]
    new_meta = stream_meta_segment(name)
    _drop(store, new_meta)  # half-written by a migration that crashed
    if not records or records[0].get("t") != "config":
        _drop(store, old_meta)  # a create that crashed before its record: the loader would drop it
        return
    old_data = records[0]["data_segment"]
    new_data = data_segment_beside(store, old_data)
    _drop(store, new_data)
    with contextlib.suppress(SegmentNotFound):  # else soft-deleted, or half-deleted: the loader judges
        _fork(store, old_data, new_data)
    records[0] = {**records[0], "data_segment": new_data}
    store.create(new_meta)
    store.append(new_meta, b"".join(encode_record(record) for record in records))
    _drop(store, old_meta)
    _drop(store, old_data)


def data_segment_beside(store: SegmentStore, old_data: str) -> str:
    """The reserved name of an old data segment, in the same container (a fork shares chunks there only).

    The same incarnation if that name hashes to the old one's container,
    else the first of a fixed series of others of the same length that
    does: the same old name always gives the same new one, and it is no
    longer than the old one.
    """
    escaped, _, incarnation = old_data.removeprefix(LEGACY_STREAM_DATA_PREFIX).rpartition("/")
    home = store.container_of(old_data)
    n = 0
    while True:  # ends: about one name in container_count fits
        if n:
            seed = f"{incarnation}/{n}".encode()
            incarnation_n = hashlib.blake2b(seed, digest_size=len(incarnation) // 2 or 1).hexdigest()
        else:
            incarnation_n = incarnation
        candidate = f"{STREAM_DATA_PREFIX}{escaped}/{incarnation_n}"
        if store.container_of(candidate) == home:
            return candidate
        n += 1


def _fork(store: SegmentStore, old: str, new: str) -> None:
    """``new`` as a copy of ``old``: its bytes (shared chunks), attributes and seal."""
    info = store.info(old)
    store.fork(old, new)
    updates = [
        AttributeUpdate(key, AttributeUpdateType.REPLACE, value)
        for key, value in store.attribute_items(old).items()
    ]
    for i in range(0, len(updates), ATTRIBUTES_PER_REQUEST_MAX):
        store.update_attributes(new, updates[i : i + ATTRIBUTES_PER_REQUEST_MAX])
    if info.sealed:
        store.seal(new)


def _read_all(store: SegmentStore, segment: str) -> bytes:
    info = store.info(segment)
    data = bytearray()
    offset = info.start_offset
    while offset < info.length:
        result = store.read(segment, offset)
        data += result.data
        offset = result.next_offset
    return bytes(data)


def _drop(store: SegmentStore, name: str) -> None:
    with contextlib.suppress(SegmentNotFound):
        store.delete(name)
