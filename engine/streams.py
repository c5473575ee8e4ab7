"""Durable Streams over segments: the stream layer behind ``/v1/stream/{name}``.

A stream is two segments, used only through ``SegmentStore``'s public methods:

- its **data segment** ``streams/data/<escaped name>/<incarnation>`` holds the
  messages, each framed as a 4-byte big-endian length then the payload, so
  message boundaries survive in the segment (JSON mode and fork sub-offsets
  need them). A stream offset is ``<16 digits>_<16 digits>``: zero, then the
  message's byte position in the stream; it is sortable as a string and maps
  to a byte offset of the data segment;
- its **meta segment** ``streams/meta/<escaped name>`` is a log of framed
  JSON records: the configuration first (content type, TTL or expiry time,
  fork source and offset, data segment), then state changes (``Stream-Seq``,
  the producer tuple that closed the stream, soft deletion). The last record
  of a kind wins. The stream exists while its meta segment has a
  configuration record.

Neither name carries ``#``: the engine aborts idle ``#`` segments as stale
transactions. The incarnation makes a stream recreated after a delete a new
segment, so nothing of the old one can show through.

Closing is sealing the data segment. An idempotent producer's state is two
attributes of the data segment (seed 001), keyed by UUIDv5s of the producer
id: its epoch and its last sequence number. The state is read, the decision
taken (duplicate, gap, stale epoch), and the append carries
``replace_if_equals`` updates of both, so data and state change atomically;
a lost race fails the condition and the decision is taken again.

A fork's data segment is an engine fork of its source's (``SegmentStore.fork``):
it names the source's Tier 2 chunks up to the fork offset, so no flushed
byte is copied (the unflushed rest is, through Tier 1), and reads never go
back to the source. Chunks are shared within one container, so a fork's data
segment takes an incarnation that hashes to its source's container. Deleting a
source with forks soft-deletes it, as the protocol wants: it answers 410 and
keeps its name taken until its last fork goes. Its data segment goes at once
(the forks hold the chunks they share; the rest is freed), only its meta
segment stays.

Expiry: ``Stream-TTL`` is a sliding window from the last read or append,
``Stream-Expires-At`` an instant. Expired streams are deleted (or
soft-deleted while forks need them) when next touched and by a reaper thread
every ``stream_reap_interval_s``. The last access time lives in memory: after
a restart, the window starts again from the restart.

``Stream-Seq``: the meta segment gets a record ``(seq, generation n)``
first; the append then moves the data segment's generation attribute from
n-1 to n atomically with its bytes. At load, the seq of the attribute's
generation is the last one, so a record whose append never happened does
not count.

Weak spot, named: the in-memory state is loaded from every meta segment at
the first request (a cost that grows with the number of streams).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from engine.attributes import AttributeUpdate, AttributeUpdateType
from engine.errors import (
    ConditionalCheckFailed,
    InvalidArgument,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegstoreError,
)
from engine.naming import (
    STREAM_DATA_PREFIX,
    STREAM_META_PREFIX,
    stream_data_segment,
    stream_meta_segment,
    stream_of_meta_segment,
)
from engine.store import SegmentStore
from engine.types import AppendResult

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">I")
_OFFSET = re.compile(r"^(\d+)_(\d+)$")
_PRODUCER_NAMESPACE = uuid.UUID("6f1d8a52-3b0e-4f7c-9a51-0d6c2b7e4a10")
# The data segment's count of appends that carried a Stream-Seq.
SEQ_GENERATION_KEY = uuid.uuid5(_PRODUCER_NAMESPACE, "stream-seq-generation")
# Producer epochs and sequence numbers are JavaScript's safe integers, as the protocol's clients send.
MAX_PRODUCER_SEQ = MAX_PRODUCER_EPOCH = 2**53 - 1
DEFAULT_CONTENT_TYPE = "application/octet-stream"
JSON_TYPE = "application/json"


# ------------------------------------------------------------------- errors
class StreamNotFound(SegmentNotFound):
    """No such stream (or it expired); its code stays ``SegmentNotFound`` (API.md "Errors")."""


class StreamGone(SegstoreError):
    """The stream was deleted or expired, but forks still read its bytes (410)."""

    code = "StreamGone"


class StreamConflict(SegstoreError):
    """The request contradicts the stream: other configuration, content type, ``Stream-Seq`` (409)."""

    code = "StreamConflict"


class StreamClosed(SegstoreError):
    """An append to a closed stream (409 with ``Stream-Closed``); ``next_offset`` is its tail."""

    code = "StreamClosed"

    def __init__(self, detail: str, next_offset: str) -> None:
        super().__init__(detail)
        self.next_offset = next_offset


# ------------------------------------------------------------------ offsets
def format_offset(position: int) -> str:
    """The opaque offset of a byte position: sortable, fixed width."""
    return f"{0:016d}_{position:016d}"


ZERO_OFFSET = format_offset(0)


def parse_offset(text: str) -> int:
    """The byte position an offset names; InvalidArgument for anything but ``digits_digits``."""
    match = _OFFSET.match(text)
    if match is None:
        raise InvalidArgument(f"offset {text!r} is not of the form <digits>_<digits>")
    return int(match.group(2))


def normalize_content_type(content_type: str | None) -> str:
    """The media type alone, lower case (``text/plain; charset=utf-8`` -> ``text/plain``)."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str | None) -> bool:
    return normalize_content_type(content_type) == JSON_TYPE


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload)) + payload


def _unframe(data: bytes) -> tuple[list[bytes], int]:
    """The whole frames at the start of ``data`` and how many bytes they take."""
    frames: list[bytes] = []
    i = 0
    while i + _FRAME.size <= len(data):
        (size,) = _FRAME.unpack_from(data, i)
        end = i + _FRAME.size + size
        if end > len(data):
            break
        frames.append(bytes(data[i + _FRAME.size : end]))
        i = end
    return frames, i


# ---------------------------------------------------------------- JSON mode
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")  # it would be written back as Infinity
    return value


def json_payload(body: bytes, *, allow_empty: bool) -> bytes | None:
    """One JSON append as stored: its values (an array's elements, or the value) joined by commas.

    None for an empty array at create (``allow_empty``); InvalidArgument for
    invalid JSON or an empty array on append.
    """
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
        values = value if isinstance(value, list) else [value]
        if not values:
            if allow_empty:
                return None
            raise InvalidArgument("Empty arrays are not allowed in an append")
        return ",".join(json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in values).encode()
    except (UnicodeDecodeError, ValueError):
        raise InvalidArgument("Invalid JSON: the body is not a JSON document") from None
    except RecursionError:
        raise InvalidArgument("Invalid JSON: the body is nested too deeply") from None


def json_values(payload: bytes) -> list[Any]:
    return json.loads(b"[" + payload + b"]")


# ------------------------------------------------------------------- values
@dataclass(frozen=True, slots=True)
class StreamConfig:
    """What a stream was created with (the meta segment's first record)."""

    content_type: str
    data_segment: str
    ttl_s: int | None = None
    expires_at: str | None = None
    forked_from: str | None = None
    fork_offset: str | None = None  # as the client gave it (None: defaulted to the source's tail)
    fork_sub_offset: int = 0
    fork_position: int = 0  # where the fork begins in its source (the offset, resolved)

    def to_json(self) -> dict[str, Any]:
        return {"t": "config", **{k: getattr(self, k) for k in self.__slots__}}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> StreamConfig:
        return cls(**{k: record[k] for k in cls.__slots__ if k in record})


@dataclass(slots=True)
class _Stream:
    """A stream's live state in memory (rebuilt from its meta segment at load)."""

    name: str
    config: StreamConfig
    last_seq: str | None = None
    seq_generation: int = 0  # how many appends carried a Stream-Seq (an attribute of the data segment)
    closed_by: tuple[str, int, int] | None = None
    soft_deleted: bool = False
    forks: int = 0
    last_access: float = field(default_factory=time.monotonic)
    # Looked up at each call: gevent patches ``threading`` after this module is imported
    # (gunicorn's config imports the engine), and an unpatched lock would block the worker.
    lock: threading.Lock = field(default_factory=lambda: threading.Lock())

    @property
    def expires_unix(self) -> float | None:
        return _parse_instant(self.config.expires_at) if self.config.expires_at else None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream's state for HEAD and create answers."""

    name: str
    content_type: str
    next_offset: str
    closed: bool
    ttl_s: int | None
    expires_at: str | None


@dataclass(frozen=True, slots=True)
class StreamRead:
    """Messages from ``offset`` on; ``next_offset`` is where to read next.

    ``up_to_date`` when ``next_offset`` is the tail; ``closed`` when the
    stream is closed and ``next_offset`` is its tail; ``timed_out`` when a
    tail wait ended with nothing.
    """

    messages: tuple[bytes, ...]
    next_offset: str
    up_to_date: bool
    closed: bool
    timed_out: bool
    content_type: str


@dataclass(frozen=True, slots=True)
class Producer:
    """An idempotent producer's headers."""

    producer_id: str
    epoch: int
    seq: int


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What an append (or a close) did.

    ``status``: ``appended``, ``duplicate``, ``stale_epoch``,
    ``invalid_epoch_seq`` or ``sequence_gap``. ``last_seq`` answers a
    duplicate, ``current_epoch`` a stale epoch, ``expected_seq`` a gap.
    """

    status: str
    next_offset: str
    closed: bool
    last_seq: int | None = None
    current_epoch: int | None = None
    expected_seq: int | None = None


def _parse_instant(text: str) -> float:
    """Unix seconds of an ISO 8601 instant (``Z`` or an offset); a naive one is UTC."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(f"Stream-Expires-At {text!r} is not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.now().astimezone().tzinfo).astimezone()
    return moment.timestamp()


def validate_expires_at(text: str) -> None:
    """InvalidArgument unless ``text`` is an ISO 8601 instant."""
    _parse_instant(text)


# -------------------------------------------------------------------- store
class StreamStore:
    """Every Durable Stream of one ``SegmentStore``. Thread-safe (and gevent-cooperative)."""

    def __init__(self, store: SegmentStore, *, reap_interval_s: float = 1.0) -> None:
        self.store = store
        self.reap_interval_s = reap_interval_s
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.RLock()
        self._loaded = False
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the expiry reaper (it loads the streams once the store is ready)."""
        self._reaper = threading.Thread(target=self._reap_loop, name="stream-reaper", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        self._stopping.set()

    def _reap_loop(self) -> None:
        while not self._stopping.wait(self.reap_interval_s):
            if not self.store.ready:
                continue
            try:
                self.reap()
            except SegstoreError as exc:
                log.info("stream reaper: %s %s", exc.code, exc.detail)
            except Exception:  # the reaper must outlive a bad record; the next round tries again
                log.exception("stream reaper failed")

    def reap(self) -> list[str]:
        """Delete (or soft-delete) every expired stream now; returns their names."""
        self._ensure_loaded()
        with self._lock:
            expired = [s for s in self._streams.values() if not s.soft_deleted and self._expired(s)]
        for stream in expired:
            with self._lock:
                if self._streams.get(stream.name) is stream and not stream.soft_deleted:
                    self._remove(stream)
        return [s.name for s in expired]

    def _ensure_loaded(self) -> None:
        """Read every meta segment once; drop half-created or half-deleted leftovers."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            streams: dict[str, _Stream] = {}
            for segment in self._list(STREAM_META_PREFIX):
                name = stream_of_meta_segment(segment)
                stream = self._load(name, segment)
                if stream is None:
                    with contextlib.suppress(SegmentNotFound):
                        self.store.delete(segment)
                else:
                    streams[name] = stream
            for stream in streams.values():
                source = streams.get(stream.config.forked_from or "")
                if source is not None:
                    source.forks += 1
            live = {s.config.data_segment for s in streams.values() if not s.soft_deleted}
            for segment in self._list(STREAM_DATA_PREFIX):
                if segment not in live:
                    with contextlib.suppress(SegmentNotFound):
                        self.store.delete(segment)
            self._streams = streams
            self._loaded = True
            log.info("streams: %d loaded", len(streams))

    def _list(self, prefix: str) -> Iterator[str]:
        after = None
        while True:
            page, after = self.store.list(prefix, after=after, limit=1000)
            yield from (info.name for info in page)
            if after is None:
                return

    def _load(self, name: str, segment: str) -> _Stream | None:
        records = [json.loads(p) for p in self._read_all(segment)]
        if not records or records[0].get("t") != "config":
            return None
        stream = _Stream(name, StreamConfig.from_json(records[0]))
        seqs: dict[int, str] = {}
        for record in records[1:]:
            kind = record["t"]
            if kind == "seq":
                seqs[record["generation"]] = record["seq"]  # a later try of a generation wins
            elif kind == "closed_by":
                stream.closed_by = (record["producer"], record["epoch"], record["seq"])
            elif kind == "soft_deleted":
                stream.soft_deleted = True
        if stream.soft_deleted:  # its data segment is gone, or goes with the leftovers at load
            return stream
        try:
            info = self.store.info(stream.config.data_segment)
        except SegmentNotFound:
            return None
        if stream.closed_by is not None and not info.sealed:
            self.store.seal(stream.config.data_segment)  # the crash came between record and seal
        # A seq record whose append never happened has a generation past the attribute's.
        stream.seq_generation = (
            self.store.get_attributes(info.name, [SEQ_GENERATION_KEY])[SEQ_GENERATION_KEY] or 0
        )
        stream.last_seq = seqs.get(stream.seq_generation)
        return stream

    def _read_all(self, segment: str) -> list[bytes]:
        frames: list[bytes] = []
        offset = 0
        while True:
            got, offset, _ = self._read_frames(segment, offset, None)
            if not got:
                return frames
            frames.extend(got)

    # -------------------------------------------------------------- helpers
    def _expired(self, stream: _Stream) -> bool:
        expires = stream.expires_unix
        if expires is not None and time.time() >= expires:
            return True
        ttl = stream.config.ttl_s
        return ttl is not None and time.monotonic() >= stream.last_access + ttl

    def _find(self, name: str) -> _Stream | None:
        """The stream (soft-deleted ones too), expiring it first if its time is up."""
        self._ensure_loaded()
        stream = self._streams.get(name)  # no lock: a create or delete in flight does not hold up others
        if stream is None or stream.soft_deleted or not self._expired(stream):
            return stream
        with self._lock:
            if self._streams.get(name) is stream and not stream.soft_deleted:
                self._remove(stream)
            return self._streams.get(name)

    def _live(self, name: str) -> _Stream:
        """The stream, or StreamNotFound (404) / StreamGone (410)."""
        stream = self._find(name)
        if stream is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        if stream.soft_deleted:
            raise StreamGone(f"stream {name!r} was deleted; its forks still read it")
        return stream

    def _record(self, stream: _Stream, record: dict[str, Any]) -> None:
        self.store.append(stream_meta_segment(stream.name), _frame(json.dumps(record).encode()))

    def _tail(self, stream: _Stream) -> tuple[int, bool]:
        """(tail position, closed) of the stream."""
        info = self.store.info(stream.config.data_segment)
        return info.length, info.sealed

    def _remove(self, stream: _Stream) -> None:
        """Delete the stream (soft-delete while forks need it); a last fork takes its soft-deleted source.

        Caller holds ``self._lock``.
        """
        if stream.forks > 0:
            self._record(stream, {"t": "soft_deleted"})
            stream.soft_deleted = True
            with contextlib.suppress(SegmentNotFound):
                self.store.delete(stream.config.data_segment)
            return
        # The meta segment goes first: without it the stream is gone, and a
        # crash before the data segment's delete leaves only what load collects.
        with contextlib.suppress(SegmentNotFound):
            self.store.delete(stream_meta_segment(stream.name))
        if not stream.soft_deleted:
            with contextlib.suppress(SegmentNotFound):
                self.store.delete(stream.config.data_segment)
        del self._streams[stream.name]
        source = self._streams.get(stream.config.forked_from or "")
        if source is not None:
            source.forks -= 1
            if source.forks == 0 and source.soft_deleted:
                self._remove(source)

    # ------------------------------------------------------------ reading
    def _read_frames(self, segment: str, offset: int, limit: int | None, wait_s: float = 0.0):
        """Whole frames of ``segment`` from ``offset`` (at most about ``limit`` bytes).

        Returns (payloads, next offset, read result). A frame larger than one
        read is assembled from several.
        """
        result = self.store.read(segment, offset, limit, wait_s=wait_s)
        data = result.data
        frames, used = _unframe(data)
        if not frames and len(data) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(data, 0)
            whole = bytearray(data)
            while len(whole) < _FRAME.size + size:
                more = self.store.read(segment, offset + len(whole), _FRAME.size + size - len(whole)).data
                if not more:
                    break
                whole += more
            frames, used = _unframe(bytes(whole))
        return frames, offset + used, result

    def read(self, name: str, offset: str | None, *, wait_s: float = 0.0) -> StreamRead:
        """Messages from ``offset`` (None: the start; ``"now"``: the tail).

        At the tail of an open stream it waits up to ``wait_s`` for an append
        or the close.
        """
        stream = self._live(name)
        stream.last_access = time.monotonic()
        config = stream.config
        tail, closed = self._tail(stream)
        position = tail if offset == "now" else (0 if offset is None else parse_offset(offset))
        position = min(position, tail)
        timed_out = False
        try:
            wait = 0 if position < tail or closed else wait_s
            frames, position, result = self._read_frames(config.data_segment, position, None, wait)
            if wait:
                closed = result.info.sealed
                tail = result.info.length
                timed_out = not frames and not closed
        except SegmentNotFound:
            raise StreamNotFound(f"stream {name!r} was deleted") from None
        if self._streams.get(name) is not stream:
            raise StreamNotFound(f"stream {name!r} expired or was deleted")
        stream.last_access = time.monotonic()
        at_tail = position >= tail
        return StreamRead(
            tuple(frames),
            format_offset(position),
            at_tail,
            closed and at_tail,
            timed_out,
            config.content_type,
        )

    def info(self, name: str) -> StreamInfo:
        """The stream's state (does not count as an access for TTL)."""
        stream = self._live(name)
        tail, closed = self._tail(stream)
        c = stream.config
        return StreamInfo(name, c.content_type, format_offset(tail), closed, c.ttl_s, c.expires_at)

    def touch(self, name: str) -> None:
        """Count an access (for the TTL window) without reading."""
        self._live(name).last_access = time.monotonic()

    # ------------------------------------------------------------- create
    def create(
        self,
        name: str,
        *,
        content_type: str | None,
        ttl_s: int | None = None,
        expires_at: str | None = None,
        closed: bool = False,
        body: bytes = b"",
        forked_from: str | None = None,
        fork_offset: str | None = None,
        fork_sub_offset: int = 0,
    ) -> tuple[StreamInfo, bool]:
        """Create the stream, or confirm an identical one. Returns (info, created).

        StreamConflict for another configuration (or a soft-deleted name),
        StreamNotFound for a missing fork source, InvalidArgument for a fork
        offset past the source's tail or a sub-offset past its message.
        """
        if ttl_s is not None and expires_at is not None:
            raise InvalidArgument("Stream-TTL and Stream-Expires-At exclude each other")
        if expires_at is not None:
            validate_expires_at(expires_at)
        if fork_sub_offset and not forked_from:
            raise InvalidArgument("Stream-Fork-Sub-Offset needs Stream-Forked-From")
        with self._lock:
            existing = self._find(name)
            if existing is not None:
                return self._confirm(
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
            data_segment = stream_data_segment(name, uuid.uuid4().hex[:16])
            if forked_from is not None:
                source = self._find(forked_from)
                if source is None:
                    raise StreamNotFound(f"fork source {forked_from!r} does not exist")
                if source.soft_deleted:
                    raise StreamConflict(f"fork source {forked_from!r} was deleted; it only serves its forks")
                source_type = source.config.content_type
                if content_type and normalize_content_type(content_type) != normalize_content_type(
                    source_type
                ):
                    raise StreamConflict(
                        f"content type {content_type!r} differs from the source's {source_type!r}"
                    )
                content_type = source_type
                source_tail, _ = self._tail(source)
                position = source_tail if fork_offset is None else parse_offset(fork_offset)
                if position > source_tail:
                    raise InvalidArgument(f"fork offset {fork_offset} is past the source's tail")
                if fork_sub_offset:
                    prefix = self._sub_offset_prefix(source, position, fork_sub_offset)
                data_segment = self._beside(name, source.config.data_segment)
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
            self._create_segments(name, config, [p for p in (prefix, payload) if p], closed, source)
            stream = _Stream(name, config)
            self._streams[name] = stream
            if forked_from is not None:
                self._streams[forked_from].forks += 1
            return self.info(name), True

    def _beside(self, name: str, source_segment: str) -> str:
        """A new data segment for ``name`` in the container of ``source_segment`` (forks share chunks)."""
        container = self.store.container_of(source_segment)
        while True:
            segment = stream_data_segment(name, uuid.uuid4().hex[:16])
            if self.store.container_of(segment) == container:
                return segment

    def _create_segments(
        self,
        name: str,
        config: StreamConfig,
        messages: list[bytes],
        closed: bool,
        source: _Stream | None,
    ) -> None:
        """Data segment first, meta segment last: the meta record is what makes the stream exist.

        A fork's data segment starts as the engine's fork of its source's, up to the fork offset.
        """
        meta = stream_meta_segment(name)
        if source is None:
            self.store.create(config.data_segment)
        else:
            self.store.fork(source.config.data_segment, config.data_segment, config.fork_position)
        try:
            if messages:
                self.store.append(config.data_segment, b"".join(_frame(m) for m in messages))
            if closed:
                self.store.seal(config.data_segment)
            with contextlib.suppress(SegmentExists):  # left by a create that crashed before its record
                self.store.create(meta)
            self.store.append(meta, _frame(json.dumps(config.to_json()).encode()), expected_offset=0)
        except BaseException:
            with contextlib.suppress(SegstoreError):
                self.store.delete(config.data_segment)
            raise

    def _confirm(
        self,
        stream: _Stream,
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
            raise StreamConflict(
                f"stream {stream.name!r} was deleted but forks still use it; the name is taken"
            )
        c = stream.config
        _, is_closed = self._tail(stream)
        wanted_type = normalize_content_type(content_type or (c.content_type if forked_from else ""))
        same = (
            (wanted_type or DEFAULT_CONTENT_TYPE) == normalize_content_type(c.content_type)
            and (ttl_s == c.ttl_s or (forked_from is not None and ttl_s is None and expires_at is None))
            and (
                expires_at == c.expires_at
                or (forked_from is not None and ttl_s is None and expires_at is None)
            )
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
        return self.info(stream.name)

    def _sub_offset_prefix(self, source: _Stream, position: int, sub_offset: int) -> bytes:
        """The first ``sub_offset`` bytes (or JSON values) of the source's message at ``position``."""
        c = source.config
        frames, _, _ = self._read_frames(c.data_segment, position, None)
        if not frames:
            raise InvalidArgument("Invalid fork sub-offset: the source has no message at the fork offset")
        first = frames[0]
        if is_json(c.content_type):
            values = json_values(first)
            if sub_offset > len(values):
                raise InvalidArgument(f"Invalid fork sub-offset: the message has {len(values)} values")
            return ",".join(
                json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in values[:sub_offset]
            ).encode()
        if sub_offset > len(first):
            raise InvalidArgument(f"Invalid fork sub-offset: the message has {len(first)} bytes")
        return first[:sub_offset]

    # ------------------------------------------------------------- delete
    def delete(self, name: str) -> None:
        """Delete the stream; with forks it is soft-deleted (410) until the last fork goes."""
        with self._lock:
            self._remove(self._live(name))

    # ------------------------------------------------------------- append
    def append(
        self,
        name: str,
        body: bytes,
        *,
        content_type: str | None,
        seq: str | None = None,
        producer: Producer | None = None,
        close: bool = False,
    ) -> AppendOutcome:
        """Append one message (and close the stream if ``close``); an empty body only closes.

        StreamClosed for a closed stream (unless this is the retry of the
        producer request that closed it), StreamConflict for another content
        type or a ``Stream-Seq`` not above the last one, InvalidArgument for
        bad JSON.
        """
        stream = self._live(name)
        stream.last_access = time.monotonic()
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
                return self._plain_append(stream, payload)
            while True:  # no lock: the append's conditions catch a concurrent change of the state
                with contextlib.suppress(ConditionalCheckFailed):
                    return self._append_checked(stream, payload, None, producer, False)
        with stream.lock:
            while True:
                with contextlib.suppress(ConditionalCheckFailed):
                    return self._append_checked(stream, payload, seq, producer, close)

    def _closed(self, stream: _Stream) -> StreamClosed:
        tail, _ = self._tail(stream)
        return StreamClosed(f"stream {stream.name!r} is closed", format_offset(tail))

    def _plain_append(self, stream: _Stream, payload: bytes) -> AppendOutcome:
        framed = _frame(payload)
        try:
            result = self.store.append(stream.config.data_segment, framed)
        except SegmentSealed:
            raise self._closed(stream) from None
        return AppendOutcome("appended", format_offset(_end_of(result, len(framed))), False)

    def _append_checked(
        self, stream: _Stream, payload: bytes, seq: str | None, producer: Producer | None, close: bool
    ) -> AppendOutcome:
        """One try of a conditional append; ConditionalCheckFailed when a producer's state moved meanwhile.

        ``Stream-Seq`` and closing need the stream's lock held.
        """
        config = stream.config
        segment = config.data_segment
        tail, closed = self._tail(stream)
        if closed and not payload and producer is None:
            return AppendOutcome("appended", format_offset(tail), True)  # closing is idempotent
        if closed:
            if producer is not None and stream.closed_by == (
                producer.producer_id,
                producer.epoch,
                producer.seq,
            ):
                return AppendOutcome("duplicate", format_offset(tail), True, last_seq=producer.seq)
            raise self._closed(stream)
        updates: list[AttributeUpdate] = []
        if producer is not None:
            keys = producer_keys(producer.producer_id)
            state = self.store.get_attributes(segment, list(keys))
            last = (state[keys[0]], state[keys[1]])
            verdict = _producer_verdict(last, producer)
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
            self._record(stream, {"t": "seq", "seq": seq, "generation": generation})
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
                framed = _frame(payload)
                result = self.store.append(segment, framed, attributes=updates)
                tail = _end_of(result, len(framed))
            elif updates:
                self.store.update_attributes(segment, updates)
        except SegmentSealed:
            raise self._closed(stream) from None
        if seq is not None and payload:
            stream.last_seq, stream.seq_generation = seq, stream.seq_generation + 1
        if close:
            if producer is not None:
                closer = {"producer": producer.producer_id, "epoch": producer.epoch, "seq": producer.seq}
                self._record(stream, {"t": "closed_by", **closer})
                stream.closed_by = (producer.producer_id, producer.epoch, producer.seq)
            self.store.seal(segment)
        return AppendOutcome("appended", format_offset(tail), close)


def _end_of(result: AppendResult, length: int) -> int:
    """Where the appended message ends: its own next offset, not the tail (other appends may follow it)."""
    return result.info.length if result.offset is None else result.offset + length


def producer_keys(producer_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The attribute keys of a producer's epoch and last sequence number on a data segment."""
    return (
        uuid.uuid5(_PRODUCER_NAMESPACE, f"epoch\x00{producer_id}"),
        uuid.uuid5(_PRODUCER_NAMESPACE, f"seq\x00{producer_id}"),
    )


def _producer_verdict(last: tuple[int | None, int | None], producer: Producer) -> AppendOutcome | None:
    """None to accept the producer's append, else the outcome refusing it (Kafka-style checks)."""
    epoch, seq = producer.epoch, producer.seq
    last_epoch, last_seq = last
    if last_epoch is None or last_seq is None:
        return None if seq == 0 else AppendOutcome("sequence_gap", "", False, expected_seq=0)
    if epoch < last_epoch:
        return AppendOutcome("stale_epoch", "", False, current_epoch=last_epoch)
    if epoch > last_epoch:
        return None if seq == 0 else AppendOutcome("invalid_epoch_seq", "", False)
    if seq <= last_seq:
        return AppendOutcome("duplicate", "", False, last_seq=last_seq)
    if seq == last_seq + 1:
        return None
    return AppendOutcome("sequence_gap", "", False, expected_seq=last_seq + 1)
