"""The Durable Streams surface's reserved names: a stream's meta and data segments.

A stream's configuration and state records live in ``#stream/meta/<escaped
name>``, its messages in ``#stream/data/<escaped name>/<incarnation>`` (a
recreated stream is a new incarnation); neither is longer than the ordinary
name it replaced. A stream name is escaped into one name part: bytes outside
``[A-Za-z0-9_-]`` become ``~HH``; an incarnation is 16 hex digits. Data
folders written before reserved names kept them under ``streams/meta/`` and
``streams/data/`` (the ``LEGACY_*`` prefixes, read once by ``migration``).
"""

from __future__ import annotations

from engine import reserve

STREAMS = reserve("stream")
LEGACY_STREAM_META_PREFIX = "streams/meta/"
LEGACY_STREAM_DATA_PREFIX = "streams/data/"
STREAM_META_PREFIX = STREAMS.prefix("meta")
STREAM_DATA_PREFIX = STREAMS.prefix("data")
_STREAM_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def stream_part(name: str) -> str:
    """A stream name escaped into one name part."""
    return "".join(
        chr(b) if b in _STREAM_SAFE else f"~{b:02X}" for b in name.encode("utf-8", "surrogatepass")
    )


def stream_meta_segment(name: str) -> str:
    """The segment of a stream's configuration and state records."""
    return STREAM_META_PREFIX + stream_part(name)


def stream_data_segment(name: str, incarnation: str) -> str:
    """The segment of the messages of one incarnation of a stream (a recreated stream is a new one)."""
    return f"{STREAM_DATA_PREFIX}{stream_part(name)}/{incarnation}"


def stream_meta_of_data_segment(segment: str) -> str:
    """The meta segment of the stream a data segment (``stream_data_segment``) belongs to."""
    part = segment.removeprefix(STREAM_DATA_PREFIX).rsplit("/", 1)[0]
    return STREAM_META_PREFIX + part


def stream_of_meta_segment(segment: str, prefix: str = STREAM_META_PREFIX) -> str:
    """The stream name a meta segment (under ``prefix``) belongs to."""
    part = segment.removeprefix(prefix)
    out = bytearray()
    i = 0
    while i < len(part):
        if part[i] == "~":
            out.append(int(part[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(part[i]))
            i += 1
    return out.decode("utf-8", "surrogatepass")
