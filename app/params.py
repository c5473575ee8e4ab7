"""Strict parsing of request headers, query parameters and small JSON bodies (native and stream APIs).

Python's ``int()`` takes ``" 7"``, ``"+7"``, ``"7_000"`` and non-ASCII digits;
HTTP numbers are plain ASCII digits, so every number here is matched against
a pattern first. A bad header is ``InvalidHeader``, a bad query parameter or
body is ``InvalidArgument``, and each says which input was wrong and why.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask import Request

from app.errors import InvalidHeader
from app.inputs import read_body
from engine import AttributeUpdate, AttributeUpdateType, InvalidArgument, SegstoreError

INT64_MAX = 2**63 - 1
# Small JSON bodies (create options, truncate offset, attribute updates) are read whole up to this size.
MAX_JSON_BODY_BYTES = 256 * 1024

_DIGITS = re.compile(r"[0-9]+")
_SECONDS = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.IGNORECASE)


def _strip_ows(value: str) -> str:
    """Header values may carry optional white space (space, tab) around them."""
    return value.strip(" \t")


def _show(text: str) -> str:
    """An input quoted for an error detail, cut short so a huge one cannot bloat the answer."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _int_in_range(text: str, what: str, minimum: int, error: type[SegstoreError]) -> int:
    if not _DIGITS.fullmatch(text):
        raise error(f"{what} must be a decimal integer >= {minimum}, got {_show(text)}")
    # A long digit string is out of range anyway; int() would refuse past 4300 digits.
    value = int(text) if len(text) <= len(str(INT64_MAX)) else INT64_MAX + 1
    if value < minimum or value > INT64_MAX:
        raise error(f"{what} must be between {minimum} and {INT64_MAX}, got {_show(text)}")
    return value


def parse_uuid(text: str, what: str, error: type[SegstoreError]) -> uuid.UUID:
    """A UUID in its canonical 8-4-4-4-12 hex form."""
    if not _UUID.fullmatch(text):
        raise error(f"{what} must be a UUID like 0f8fad5b-d9cb-469f-a165-70867728950e, got {_show(text)}")
    return uuid.UUID(text)


def _header(request: Request, name: str) -> str | None:
    return _environ_header(request.environ, name)


def _environ_header(environ: Mapping[str, Any], name: str) -> str | None:
    """A request header straight from the WSGI environ (hot path: no scan of all headers).

    A header sent twice arrives joined by a comma, which no parser here accepts.
    """
    value = environ.get("HTTP_" + name.upper().replace("-", "_"))
    return None if value is None else _strip_ows(value)


def _environ_int_header(environ: Mapping[str, Any], name: str, minimum: int = 0) -> int | None:
    raw = _environ_header(environ, name)
    return None if raw is None else _int_in_range(raw, name, minimum, InvalidHeader)


@dataclass(frozen=True)
class AppendConditions:
    """The optional headers of an append."""

    expected_offset: int | None
    writer_id: uuid.UUID | None
    event_number: int | None
    event_count: int
    previous_event_number: int | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``SegmentStore.append`` they stand for."""
        return {
            "expected_offset": self.expected_offset,
            "writer_id": self.writer_id,
            "event_number": self.event_number,
            "event_count": self.event_count,
            "previous_event_number": self.previous_event_number,
        }


def append_conditions(environ: Mapping[str, Any]) -> AppendConditions:
    """``Expected-Offset``, ``Writer-Id`` + ``Event-Number`` (both or neither), ``Event-Count``,
    ``Previous-Event-Number`` (with both, and below ``Event-Number``).

    Read from the WSGI environ: the append shortcut has no Flask request.
    """
    writer_id, event_number = writer_and_number(environ)
    event_count = _environ_int_header(environ, "Event-Count", minimum=1)
    previous = _environ_int_header(environ, "Previous-Event-Number")
    if previous is not None and (event_number is None or previous >= event_number):
        raise InvalidHeader(
            "Previous-Event-Number needs Writer-Id and Event-Number, and must be less than Event-Number"
        )
    return AppendConditions(
        expected_offset=_environ_int_header(environ, "Expected-Offset"),
        writer_id=writer_id,
        event_number=event_number,
        event_count=1 if event_count is None else event_count,
        previous_event_number=previous,
    )


def writer_and_number(environ: Mapping[str, Any]) -> tuple[uuid.UUID | None, int | None]:
    """``Writer-Id`` and ``Event-Number``: both, or neither (InvalidHeader naming the missing one)."""
    raw_writer = _environ_header(environ, "Writer-Id")
    writer_id = None if raw_writer is None else parse_uuid(raw_writer, "Writer-Id", InvalidHeader)
    event_number = _environ_int_header(environ, "Event-Number")
    if (writer_id is None) != (event_number is None):
        given, missing = (
            ("Writer-Id", "Event-Number") if writer_id is not None else ("Event-Number", "Writer-Id")
        )
        raise InvalidHeader(f"{given} needs {missing}: send both for a deduplicated append, or neither")
    return writer_id, event_number


def byte_range(request: Request) -> tuple[int | None, int | None] | None:
    """``Range`` as (offset, length or None), or (None, n) for the last n bytes; None when absent.

    ``bytes=a-b``, ``bytes=a-`` and the suffix ``bytes=-n`` (RFC 9110). Any
    other Range is ignored and the whole answer sent, as RFC 9110 lets a
    server do: another unit, several ranges (a segment read returns one run of
    bytes), and one that is malformed, ends before it starts, asks for the
    last 0 bytes or names an offset past int64.
    """
    raw = _header(request, "Range")
    match = None if raw is None else _RANGE.fullmatch(raw)
    if match is None:
        return None
    first, last = (_int64_or_none(text) for text in match.groups())
    if first is None:
        return None if not last else (None, last)
    if not match.group(2):
        return first, None
    if last is None or last < first:
        return None
    return first, last - first + 1


def _int64_or_none(text: str) -> int | None:
    """The number of a Range bound, or None when it is empty or past int64."""
    if not text or len(text) > len(str(INT64_MAX)) or int(text) > INT64_MAX:
        return None
    return int(text)


def last_event_id(request: Request) -> int | None:
    """``Last-Event-ID`` of an SSE reconnect: the offset to resume from."""
    raw = _header(request, "Last-Event-ID")
    return None if raw is None else _int_in_range(raw, "Last-Event-ID", 0, InvalidHeader)


def only_params(request: Request, *allowed: str) -> None:
    """Refuse (400) query parameters the route does not serve.

    Ignored, a misspelt one would change the answer unseen: ``?max_length=100``
    for ``?length=100`` reads the whole segment.
    """
    unknown = sorted(set(request.args) - set(allowed))
    if unknown:
        served = ", ".join(allowed) if allowed else "none"
        raise InvalidArgument(f"unknown query parameter(s) {unknown}; served here: {served}"[:200])


def _param(request: Request, name: str) -> str | None:
    values = request.args.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidArgument(f"query parameter {name} is given {len(values)} times; send it once")
    return values[0]


def int_param(request: Request, name: str, *, minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
    """An integer query parameter within [minimum, maximum], or None when absent."""
    raw = _param(request, name)
    return None if raw is None else int_value(raw, name, minimum=minimum, maximum=maximum)


def int_value(raw: str, name: str, *, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """The value of integer query parameter ``name`` (the read shortcut parses its own query)."""
    value = _int_in_range(raw, f"query parameter {name}", minimum, InvalidArgument)
    if value > maximum:
        raise InvalidArgument(f"query parameter {name} must be at most {maximum}, got {value}")
    return value


def str_param(request: Request, name: str) -> str | None:
    """A text query parameter, or None when absent."""
    return _param(request, name)


def seconds_param(request: Request, name: str, *, maximum: float) -> float | None:
    """A duration in seconds (``1``, ``0.5``, ``2e-3``) within [0, maximum], or None when absent."""
    raw = _param(request, name)
    return None if raw is None else seconds_value(raw, name, maximum=maximum)


def seconds_value(raw: str, name: str, *, maximum: float) -> float:
    """The value of duration query parameter ``name``, as ``seconds_param`` reads it."""
    if not _SECONDS.fullmatch(raw):
        raise InvalidArgument(f"query parameter {name} must be a number of seconds >= 0, got {_show(raw)}")
    value = float(raw)
    if value > maximum:
        raise InvalidArgument(f"query parameter {name} must be at most {maximum:g} seconds, got {_show(raw)}")
    return value


def json_object_body(request: Request, allowed: set[str], *, required: bool) -> dict[str, Any]:
    """A small JSON object body with only ``allowed`` keys; ``{}`` when optional and empty.

    An oversized one is a 400 like any other bad option body.
    """
    data = read_body(
        request.stream,
        request.content_length,
        MAX_JSON_BODY_BYTES,
        "the JSON body",
        too_large=InvalidArgument,
    )
    if not data.strip():
        if required:
            raise InvalidArgument(f"a JSON object body is required with {', '.join(sorted(allowed))}")
        return {}
    try:
        body = json.loads(data)
    except UnicodeDecodeError:
        raise InvalidArgument("body is not UTF-8 JSON") from None
    except ValueError as err:
        raise InvalidArgument(f"body is not valid JSON: {err}") from None
    except RecursionError:
        raise InvalidArgument("body JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidArgument(f"body must be a JSON object, got {_json_type(body)}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidArgument(
            f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
    return body


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {list: "an array", str: "a string", type(None): "null"}.get(type(value), "a value")


def _integer(value: Any) -> int | None:
    """A JSON integer as an int: ``7``, or ``7.0`` (JSON Schema counts it an integer); else None.

    Booleans are not integers here, whatever Python says.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def json_int(body: dict[str, Any], key: str, *, minimum: int, maximum: int = INT64_MAX) -> int | None:
    """An integer member of a JSON body (booleans and fractions refused), or None when absent."""
    if key not in body:
        return None
    value = _integer(body[key])
    if value is None:
        raise InvalidArgument(f"{key} must be an integer, got {json.dumps(body[key])[:60]}")
    if value < minimum or value > maximum:
        raise InvalidArgument(f"{key} must be between {minimum} and {maximum}, got {value}")
    return value


def json_number(value: Any, what: str, *, minimum: float, maximum: float) -> float:
    """A JSON number (an integer or a fraction; booleans refused) within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not minimum <= value <= maximum:
        shown = json.dumps(value)[:60]
        raise InvalidArgument(f"{what} must be a number from {minimum:g} to {maximum:g}, got {shown}")
    return float(value)


def json_str(body: dict[str, Any], key: str) -> str | None:
    """A string member of a JSON body, or None when absent."""
    if key not in body:
        return None
    value = body[key]
    if not isinstance(value, str):
        raise InvalidArgument(f"{key} must be a string, got {json.dumps(value)[:60]}")
    return value


_UPDATE_KEYS = {"key", "type", "value", "expected"}


def _int64(value: Any, what: str) -> int:
    number = _integer(value)
    if number is None or not -(2**63) <= number <= INT64_MAX:
        raise InvalidArgument(f"{what} must be an int64, got {json.dumps(value)[:60]}")
    return number


def attribute_updates(body: dict[str, Any]) -> list[AttributeUpdate]:
    """``{"updates": [{"key", "type", "value", "expected"}, ...]}`` as engine updates."""
    raw = body.get("updates")
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument('the body needs "updates": a non-empty array of attribute updates')
    updates = []
    for i, item in enumerate(raw):
        where = f"updates[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgument(f"{where} must be an object, got {_json_type(item)}")
        unknown = sorted(set(item) - _UPDATE_KEYS)
        if unknown:
            raise InvalidArgument(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}")
        key = item.get("key")
        if not isinstance(key, str):
            raise InvalidArgument(f"{where}.key must be a UUID string")
        kind_name = item.get("type")
        try:
            kind = AttributeUpdateType(kind_name if isinstance(kind_name, str) else "")
        except ValueError:
            known = ", ".join(t.value for t in AttributeUpdateType)
            got = json.dumps(item.get("type"))[:60]
            raise InvalidArgument(f"{where}.type must be one of {known}, got {got}") from None
        if "value" not in item:
            raise InvalidArgument(f"{where} needs a value")
        expected = item.get("expected")
        if kind is not AttributeUpdateType.REPLACE_IF_EQUALS and "expected" in item:
            raise InvalidArgument(f"{where}: only replace_if_equals takes an expected value")
        updates.append(
            AttributeUpdate(
                parse_uuid(key, f"{where}.key", InvalidArgument),
                kind,
                _int64(item["value"], f"{where}.value"),
                None if expected is None else _int64(expected, f"{where}.expected"),
            )
        )
    return updates
