"""A stream's state: its configuration, its live state in memory, and the meta segment's records.

The meta segment is a log of framed JSON records: the configuration first
(content type, TTL or expiry time, fork source and offset, data segment),
then state changes: ``{"t": "seq", "seq", "generation"}`` for a
``Stream-Seq``, ``{"t": "closed_by", "producer", "epoch", "seq"}`` for the
producer request that closed the stream, ``{"t": "soft_deleted"}``, and on
a cluster ``{"t": "fork_ref" | "fork_unref", "fork", "data"}`` counting its
forks (``fork_refs``). The
last record of a kind wins. The stream exists while its meta segment has a
configuration record.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.streams.format import frame, parse_instant


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
class Stream:
    """A stream's live state in memory (rebuilt from its meta segment at load)."""

    name: str
    config: StreamConfig
    last_seq: str | None = None
    seq_generation: int = 0  # how many appends carried a Stream-Seq (an attribute of the data segment)
    closed_by: tuple[str, int, int] | None = None
    soft_deleted: bool = False
    forks: int = 0  # a single node's count of the forks it holds in memory
    fork_refs: set[tuple[str, str]] = field(default_factory=set)  # a cluster's (``fork_refs``): (fork, data)
    last_access: float = field(default_factory=time.monotonic)
    # Looked up at each call: gevent patches ``threading`` after this module is imported
    # (gunicorn's config imports the engine), and an unpatched lock would block the worker.
    lock: threading.Lock = field(default_factory=lambda: threading.Lock())

    @property
    def expires_unix(self) -> float | None:
        return parse_instant(self.config.expires_at) if self.config.expires_at else None

    def expired(self) -> bool:
        expires = self.expires_unix
        if expires is not None and time.time() >= expires:
            return True
        ttl = self.config.ttl_s
        return ttl is not None and time.monotonic() >= self.last_access + ttl


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


def encode_record(record: dict[str, Any]) -> bytes:
    """One framed record of a meta segment."""
    return frame(json.dumps(record).encode())


def replay(name: str, records: list[dict[str, Any]]) -> tuple[Stream, dict[int, str]] | None:
    """The stream a meta segment's records describe, and its ``Stream-Seq`` by generation.

    None when the first record is not a configuration (a create that crashed
    before its record).
    """
    if not records or records[0].get("t") != "config":
        return None
    stream = Stream(name, StreamConfig.from_json(records[0]))
    seqs: dict[int, str] = {}
    for record in records[1:]:
        kind = record["t"]
        if kind == "seq":
            seqs[record["generation"]] = record["seq"]  # a later try of a generation wins
        elif kind == "closed_by":
            stream.closed_by = (record["producer"], record["epoch"], record["seq"])
        elif kind == "soft_deleted":
            stream.soft_deleted = True
        elif kind == "fork_ref":
            stream.fork_refs.add((record["fork"], record["data"]))
        elif kind == "fork_unref":
            stream.fork_refs.discard((record["fork"], record["data"]))
    return stream, seqs
