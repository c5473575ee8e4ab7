"""Creating a stream: a new one, an idempotent confirmation, or a fork.

A fork's data segment is an engine fork of its source's (``SegmentStore.fork``):
it names the source's Tier 2 chunks up to the fork offset, so no flushed
byte is copied (the unflushed rest is, through Tier 1), and reads never go
back to the source. Chunks are shared within one container, so a fork's data
segment takes an incarnation that hashes to its source's container.

In a cluster a stream's data stays beside its own meta segment, so that one
node serves all of it: a fork's data segment is a copy of the source's bytes
below the fork offset (``SegmentStore.copy``: offsets kept, chunks shared
only when both land in one container), its source read through the node
serving it if need be; the fork registers with its source (``fork_refs``)
before its own meta record makes it exist.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING

from app.streams import fork_refs
from app.streams.errors import StreamConflict, StreamNotFound
from app.streams.format import (
    DEFAULT_CONTENT_TYPE,
    frame,
    is_json,
    json_join,
    json_payload,
    json_values,
    normalize_content_type,
    parse_offset,
    validate_expires_at,
)
from app.streams.names import stream_data_segment, stream_meta_segment
from app.streams.records import Stream, StreamConfig, StreamInfo, encode_record
from engine import (
    InvalidArgument,
    SegmentExists,
    SegstoreError,
)

if TYPE_CHECKING:
    from app.streams.store import StreamStore


def create(
    streams: StreamStore,
    name: str,
    *,
    content_type: str | None,
    ttl_s: int | None,
    expires_at: str | None,
    closed: bool,
    body: bytes,
    forked_from: str | None,
    fork_offset: str | None,
    fork_sub_offset: int,
) -> tuple[StreamInfo, bool]:
    """``StreamStore.create`` (see there)."""
    if ttl_s is not None and expires_at is not None:
        raise InvalidArgument("Stream-TTL and Stream-Expires-At exclude each other")
    if expires_at is not None:
        validate_expires_at(expires_at)
    if fork_sub_offset and not forked_from:
        raise InvalidArgument("Stream-Fork-Sub-Offset needs Stream-Forked-From")
    with streams.lock:
        existing = streams.find(name)
        if existing is not None:
            return _confirm(
                streams,
                existing,
                content_type,
                ttl_s,
                expires_at,
                closed,
                forked_from,
                fork_offset,
                fork_sub_offset,
            ), False
        prefix = b""
        position = 0
        source = None
        data_segment = beside(streams, name, stream_meta_segment(name))
        if forked_from is not None:
            source = streams.fork_source(forked_from)
            if source is None:
                raise StreamNotFound(f"fork source {forked_from!r} does not exist")
            if source.soft_deleted:
                raise StreamConflict(f"fork source {forked_from!r} was deleted; it only serves its forks")
            source_type = source.config.content_type
            if content_type and normalize_content_type(content_type) != normalize_content_type(source_type):
                raise StreamConflict(
                    f"content type {content_type!r} differs from the source's {source_type!r}"
                )
            content_type = source_type
            source_tail, _ = streams.tail(source, anywhere=True)
            position = source_tail if fork_offset is None else parse_offset(fork_offset)
            if position > source_tail:
                raise InvalidArgument(f"fork offset {fork_offset} is past the source's tail")
            if fork_sub_offset:
                prefix = _sub_offset_prefix(streams, source, position, fork_sub_offset)
            if streams.store.node is None:
                data_segment = beside(streams, name, source.config.data_segment)
            if ttl_s is None and expires_at is None:
                ttl_s, expires_at = source.config.ttl_s, source.config.expires_at
        content_type = content_type or DEFAULT_CONTENT_TYPE
        payload: bytes | None = body or None
        if body and is_json(content_type):
            payload = json_payload(body, allow_empty=True)
        config = StreamConfig(
            content_type=content_type,
            data_segment=data_segment,
            ttl_s=ttl_s,
            expires_at=expires_at,
            forked_from=forked_from,
            fork_offset=fork_offset,
            fork_sub_offset=fork_sub_offset,
            fork_position=position,
        )
        _create_segments(streams, name, config, [p for p in (prefix, payload) if p], closed, source)
        streams.streams[name] = Stream(name, config)
        if forked_from is not None and forked_from in streams.streams:
            streams.streams[forked_from].forks += 1
        return streams.info(name), True


def beside(streams: StreamStore, name: str, neighbour: str) -> str:
    """A new data segment for ``name`` in the container of ``neighbour``.

    A stream's data goes beside its meta segment, so one request touches one
    container; a fork's beside its source's data, whose chunks it shares.
    """
    container = streams.store.container_of(neighbour)
    while True:
        segment = stream_data_segment(name, uuid.uuid4().hex[:16])
        if streams.store.container_of(segment) == container:
            return segment


def _create_segments(
    streams: StreamStore,
    name: str,
    config: StreamConfig,
    messages: list[bytes],
    closed: bool,
    source: Stream | None,
) -> None:
    """Data segment first, meta segment last: the meta record is what makes the stream exist.

    A fork's data segment starts as the engine's fork of its source's, up to the fork offset.
    """
    store = streams.store
    meta = stream_meta_segment(name)
    if source is None:
        store.create(config.data_segment)
    elif store.node is None:
        store.fork(source.config.data_segment, config.data_segment, config.fork_position)
    else:
        store.copy(source.config.data_segment, config.data_segment, config.fork_position)
    registered = False
    try:
        if source is not None and store.node is not None:
            fork_refs.register(streams, source.name, name, config.data_segment)
            registered = True
        if messages:
            store.append(config.data_segment, b"".join(frame(m) for m in messages))
        if closed:
            store.seal(config.data_segment)
        with contextlib.suppress(SegmentExists):  # left by a create that crashed before its record
            store.create(meta)
        store.append(meta, encode_record(config.to_json()), expected_offset=0)
    except BaseException:
        with contextlib.suppress(SegstoreError):
            store.delete(config.data_segment)
        if registered:
            assert source is not None
            with contextlib.suppress(SegstoreError):
                fork_refs.release(streams, source.name, name, config.data_segment)
        raise


def _confirm(
    streams: StreamStore,
    stream: Stream,
    content_type: str | None,
    ttl_s: int | None,
    expires_at: str | None,
    closed: bool,
    forked_from: str | None,
    fork_offset: str | None,
    fork_sub_offset: int,
) -> StreamInfo:
    """An idempotent create: the same configuration answers the stream, another one conflicts."""
    if stream.soft_deleted:
        raise StreamConflict(f"stream {stream.name!r} was deleted but forks still use it; the name is taken")
    c = stream.config
    _, is_closed = streams.tail(stream)
    wanted_type = normalize_content_type(content_type or (c.content_type if forked_from else ""))
    same = (
        (wanted_type or DEFAULT_CONTENT_TYPE) == normalize_content_type(c.content_type)
        and (ttl_s == c.ttl_s or (forked_from is not None and ttl_s is None and expires_at is None))
        and (expires_at == c.expires_at or (forked_from is not None and ttl_s is None and expires_at is None))
        and closed == is_closed
        and forked_from == c.forked_from
        and (
            fork_offset is None
            or fork_offset == c.fork_offset
            or parse_offset(fork_offset) == c.fork_position
        )
        and fork_sub_offset == c.fork_sub_offset
    )
    if not same:
        raise StreamConflict(f"stream {stream.name!r} exists with another configuration")
    return streams.info(stream.name)


def _sub_offset_prefix(streams: StreamStore, source: Stream, position: int, sub_offset: int) -> bytes:
    """The first ``sub_offset`` bytes (or JSON values) of the source's message at ``position``."""
    c = source.config
    frames, _, _ = streams.read_frames(c.data_segment, position, None, anywhere=True)
    if not frames:
        raise InvalidArgument("Invalid fork sub-offset: the source has no message at the fork offset")
    first = frames[0]
    if is_json(c.content_type):
        values = json_values(first)
        if sub_offset > len(values):
            raise InvalidArgument(f"Invalid fork sub-offset: the message has {len(values)} values")
        return json_join(values[:sub_offset])
    if sub_offset > len(first):
        raise InvalidArgument(f"Invalid fork sub-offset: the message has {len(first)} bytes")
    return first[:sub_offset]
