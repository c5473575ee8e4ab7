"""What the Durable Streams protocol writes and parses: offsets, frames, content types, JSON mode.

A stream offset is ``<16 digits>_<16 digits>``: zero, then the message's byte
position in the stream's data segment; it sorts as a string. Messages are
framed in the data segment as a 4-byte big-endian length then the payload,
so message boundaries survive (JSON mode and fork sub-offsets need them).
A JSON-mode message is stored as its values joined by commas, so a read
answers ``[`` + messages joined by commas + ``]``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from datetime import datetime
from typing import Any

from engine import InvalidArgument

FRAME = struct.Struct(">I")
_OFFSET = re.compile(r"^(\d+)_(\d+)$")
DEFAULT_CONTENT_TYPE = "application/octet-stream"
JSON_TYPE = "application/json"


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


# ------------------------------------------------------------------- frames
def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload)) + payload


def unframe(data: bytes) -> tuple[list[bytes], int]:
    """The whole frames at the start of ``data`` and how many bytes they take."""
    frames: list[bytes] = []
    i = 0
    while i + FRAME.size <= len(data):
        (size,) = FRAME.unpack_from(data, i)
        end = i + FRAME.size + size
        if end > len(data):
            break
        frames.append(bytes(data[i + FRAME.size : end]))
        i = end
    return frames, i


# ------------------------------------------------------------ content types
def normalize_content_type(content_type: str | None) -> str:
    """The media type alone, lower case (``text/plain; charset=utf-8`` -> ``text/plain``)."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str | None) -> bool:
    return normalize_content_type(content_type) == JSON_TYPE


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
        return json_join(values)
    except (UnicodeDecodeError, ValueError):
        raise InvalidArgument("Invalid JSON: the body is not a JSON document") from None
    except RecursionError:
        raise InvalidArgument("Invalid JSON: the body is nested too deeply") from None


def json_join(values: list[Any]) -> bytes:
    """JSON values as stored in one message: compact, joined by commas."""
    return ",".join(json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in values).encode()


def json_values(payload: bytes) -> list[Any]:
    return json.loads(b"[" + payload + b"]")


# ------------------------------------------------------------------ instants
def parse_instant(text: str) -> float:
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
    parse_instant(text)
