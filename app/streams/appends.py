"""Appends to a stream: plain, with ``Stream-Seq``, by an idempotent producer, and closing.

A plain append (no producer, no ``Stream-Seq``, no close) is one engine
append of one frame, without a lock: it is the hot path. A producer's
append takes no lock either: its conditions on the producer's attributes
catch a concurrent change, and the decision is taken again. ``Stream-Seq``
and closing hold the stream's lock.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING

from app.streams.errors import StreamClosed, StreamConflict
from app.streams.format import format_offset, frame, is_json, json_payload, normalize_content_type
from app.streams.producers import (
    SEQ_GENERATION_KEY,
    AppendOutcome,
    Producer,
    producer_keys,
    producer_verdict,
)
from app.streams.records import Stream
from engine import AppendResult, AttributeUpdate, AttributeUpdateType, ConditionalCheckFailed, SegmentSealed

if TYPE_CHECKING:
    from app.streams.store import StreamStore


def append(
    streams: StreamStore,
    stream: Stream,
    body: bytes,
    content_type: str | None,
    seq: str | None,
    producer: Producer | None,
    close: bool,
) -> AppendOutcome:
    """``StreamStore.append`` once the stream is found (see there)."""
    config = stream.config
    wanted = normalize_content_type(content_type)
    if body and content_type is not None and wanted != normalize_content_type(config.content_type):
        raise StreamConflict(
            f"content type {content_type!r} differs from the stream's {config.content_type!r}"
        )
    payload = body
    if body and is_json(config.content_type):
        payload = json_payload(body, allow_empty=False) or b""
    if seq is None and not close:
        if producer is None:
            return _plain(streams, stream, payload)
        while True:  # no lock: the append's conditions catch a concurrent change of the state
            with contextlib.suppress(ConditionalCheckFailed):
                return _checked(streams, stream, payload, None, producer, False)
    with stream.lock:
        while True:
            with contextlib.suppress(ConditionalCheckFailed):
                return _checked(streams, stream, payload, seq, producer, close)


def _closed(streams: StreamStore, stream: Stream) -> StreamClosed:
    tail, _ = streams.tail(stream)
    return StreamClosed(f"stream {stream.name!r} is closed", format_offset(tail))


def _plain(streams: StreamStore, stream: Stream, payload: bytes) -> AppendOutcome:
    framed = frame(payload)
    try:
        result = streams.store.append(stream.config.data_segment, framed)
    except SegmentSealed:
        raise _closed(streams, stream) from None
    return AppendOutcome("appended", format_offset(_end_of(result, len(framed))), False)


def _checked(
    streams: StreamStore,
    stream: Stream,
    payload: bytes,
    seq: str | None,
    producer: Producer | None,
    close: bool,
) -> AppendOutcome:
    """One try of a conditional append; ConditionalCheckFailed when a producer's state moved meanwhile.

    ``Stream-Seq`` and closing need the stream's lock held.
    """
    store = streams.store
    segment = stream.config.data_segment
    tail, closed = streams.tail(stream)
    if closed and not payload and producer is None:
        return AppendOutcome("appended", format_offset(tail), True)  # closing is idempotent
    if closed:
        if producer is not None and stream.closed_by == (producer.producer_id, producer.epoch, producer.seq):
            return AppendOutcome("duplicate", format_offset(tail), True, last_seq=producer.seq)
        raise _closed(streams, stream)
    updates: list[AttributeUpdate] = []
    if producer is not None:
        keys = producer_keys(producer.producer_id)
        state = store.get_attributes(segment, list(keys))
        last = (state[keys[0]], state[keys[1]])
        verdict = producer_verdict(last, producer)
        if verdict is not None:
            return replace(verdict, next_offset=format_offset(tail))
        updates = [
            AttributeUpdate(key, AttributeUpdateType.REPLACE_IF_EQUALS, value, expected=old)
            for key, value, old in zip(keys, (producer.epoch, producer.seq), last, strict=True)
        ]
    if seq is not None and payload:
        if stream.last_seq is not None and seq <= stream.last_seq:
            raise StreamConflict(f"Stream-Seq {seq!r} is not above the last one, {stream.last_seq!r}")
        # The record first, then the append that makes it count (its generation), atomically.
        generation = stream.seq_generation + 1
        streams.record(stream, {"t": "seq", "seq": seq, "generation": generation})
        updates.append(
            AttributeUpdate(
                SEQ_GENERATION_KEY,
                AttributeUpdateType.REPLACE_IF_EQUALS,
                generation,
                expected=stream.seq_generation or None,
            )
        )
    try:
        if payload:
            framed = frame(payload)
            result = store.append(segment, framed, attributes=updates)
            tail = _end_of(result, len(framed))
        elif updates:
            store.update_attributes(segment, updates)
    except SegmentSealed:
        raise _closed(streams, stream) from None
    if seq is not None and payload:
        stream.last_seq, stream.seq_generation = seq, stream.seq_generation + 1
    if close:
        if producer is not None:
            closer = {"producer": producer.producer_id, "epoch": producer.epoch, "seq": producer.seq}
            streams.record(stream, {"t": "closed_by", **closer})
            stream.closed_by = (producer.producer_id, producer.epoch, producer.seq)
        store.seal(segment)
    return AppendOutcome("appended", format_offset(tail), close)


def _end_of(result: AppendResult, length: int) -> int:
    """Where the appended message ends: its own next offset, not the tail (other appends may follow it)."""
    return result.info.length if result.offset is None else result.offset + length
