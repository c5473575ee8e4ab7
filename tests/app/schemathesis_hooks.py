"""What openapi.yaml cannot say, told to schemathesis (``hooks`` in schemathesis.toml).

OpenAPI describes each parameter on its own. A few rules of segstore tie
parameters together, and a request that breaks one is a 400, as the
operations' descriptions and docs/api.md say:

- an append's ``Writer-Id`` and ``Event-Number`` come together, and
  ``Previous-Event-Number`` only with them, below ``Event-Number``;
- a segment read takes either ``Range`` or ``offset``/``length``;
- a stream read with ``live`` needs ``offset``;
- a stream append's ``Producer-Id``, ``Producer-Epoch`` and ``Producer-Seq``
  come together, and an empty one must close the stream (``Stream-Closed:
  true``);
- a stream create takes ``Stream-TTL`` or ``Stream-Expires-At``, not both, and
  ``Stream-Fork-Sub-Offset`` only with ``Stream-Forked-From``;
- an attribute update names each key once;
- a stream (``/v1/scopes``) has at least ``min_segments`` segments, and a
  scaling policy other than ``fixed`` needs a ``target`` above 0; a stream
  event's ``Writer-Id`` and ``Event-Number`` come together;
- ``Stream-Expires-At`` is a day the calendar has (its pattern lets
  February 30 and the year 0 through).

By the schema such a request is valid in each part, so schemathesis would
expect it accepted; it is neither valid nor invalid as a whole, and is left
out (``filter_case``, honoured by the coverage, fuzzing and stateful phases).

Two more kinds are left out, for the run's sake, not the contract's:

- tail reads that may wait longer than ``_WAIT_MAX_S`` (up to 60 s each;
  tests/app/test_reads.py times the waits);
- requests the tool calls valid although a header breaks its documented
  ``pattern``: schemathesis 4.32's coverage phase cannot write a header
  value with characters other than letters and digits (a UUID's ``-``), and
  puts a placeholder such as ``0`` in its place.

Every other request, valid or not, is sent as generated.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import schemathesis
import yaml
from schemathesis.core import NOT_SET

from tests.app.openapi_check import SPEC_FILE

_WAIT_MAX_S = 2.0


def _given(mapping: Mapping[str, Any] | None, name: str) -> bool:
    """Whether a header or query parameter is sent (headers are case-insensitive)."""
    if not mapping:
        return False
    return any(key.lower() == name.lower() for key in mapping)


def _together(mapping: Mapping[str, Any] | None, *names: str) -> bool:
    """All of ``names`` are sent, or none."""
    return len({_given(mapping, name) for name in names}) == 1


def _append(case: Any) -> bool:
    if not _together(case.headers, "Writer-Id", "Event-Number"):
        return False
    if not _given(case.headers, "Previous-Event-Number"):
        return True
    if not _given(case.headers, "Event-Number"):
        return False
    headers = {key.lower(): value for key, value in case.headers.items()}
    try:
        return int(headers["previous-event-number"]) < int(headers["event-number"])
    except (TypeError, ValueError):
        return True  # a malformed number: a 400 the tool expects


def _read_segment(case: Any) -> bool:
    ranged = _given(case.headers, "Range") and (_given(case.query, "offset") or _given(case.query, "length"))
    try:
        long_wait = _WAIT_MAX_S < float((case.query or {}).get("wait", 0)) <= 60
    except (TypeError, ValueError):
        long_wait = False
    return not ranged and not long_wait


def _read_stream(case: Any) -> bool:
    return not _given(case.query, "live") or _given(case.query, "offset")


def _append_stream(case: Any) -> bool:
    headers = case.headers or {}
    closes = any(key.lower() == "stream-closed" and value == "true" for key, value in headers.items())
    empty = case.body is NOT_SET or case.body in ("", b"")
    producer = _together(case.headers, "Producer-Id", "Producer-Epoch", "Producer-Seq")
    return producer and (closes or not empty)


def _create_stream(case: Any) -> bool:
    both_expiries = _given(case.headers, "Stream-TTL") and _given(case.headers, "Stream-Expires-At")
    lone_sub_offset = _given(case.headers, "Stream-Fork-Sub-Offset") and not _given(
        case.headers, "Stream-Forked-From"
    )
    real_instant = _real_instant(_value(case.headers, "Stream-Expires-At"))
    return not both_expiries and not lone_sub_offset and real_instant


def _value(mapping: Mapping[str, Any] | None, name: str) -> Any:
    return next((value for key, value in (mapping or {}).items() if key.lower() == name.lower()), None)


def _real_instant(value: Any) -> bool:
    if not isinstance(value, str):
        return True
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _update_attributes(case: Any) -> bool:
    updates = case.body.get("updates") if isinstance(case.body, dict) else None
    if not isinstance(updates, list):
        return True
    keys = [u.get("key") for u in updates if isinstance(u, dict)]
    return len(keys) == len(set(map(str, keys)))


def _create_scoped_stream(case: Any) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    scaling = body.get("scaling") if isinstance(body.get("scaling"), dict) else {}
    try:
        least = int(scaling.get("min_segments", 1))
        enough = int(body.get("segments", least)) >= least
        targeted = scaling.get("type", "fixed") == "fixed" or float(scaling.get("target", 0)) > 0
    except (TypeError, ValueError):
        return True  # malformed: a 400 the tool expects
    return enough and targeted


def _stream_event(case: Any) -> bool:
    return _together(case.headers, "Writer-Id", "Event-Number")


_SCOPED = "/v1/scopes/{scope}/streams/{stream}"
_RULES: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("POST", "/v1/segments/{name}"): _append,
    ("POST", "/v1/segments/{name}:transactions/{txid}"): _append,
    ("GET", "/v1/segments/{name}"): _read_segment,
    ("GET", "/v1/stream/{name}"): _read_stream,
    ("POST", "/v1/stream/{name}"): _append_stream,
    ("PUT", "/v1/stream/{name}"): _create_stream,
    ("POST", "/v1/segments/{name}:attributes"): _update_attributes,
    ("PUT", _SCOPED): _create_scoped_stream,
    ("POST", f"{_SCOPED}/events"): _stream_event,
    ("POST", f"{_SCOPED}/transactions/{{txid}}/events"): _stream_event,
}


@functools.cache
def _header_patterns() -> dict[str, re.Pattern[str]]:
    """Each documented header parameter's ``pattern`` (by lower-case name)."""
    spec = yaml.safe_load(SPEC_FILE.read_text(encoding="utf-8"))
    schemas = spec["components"]["schemas"]
    patterns = {}
    for parameter in spec["components"]["parameters"].values():
        schema = parameter.get("schema", {})
        if "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
        if parameter["in"] == "header" and "pattern" in schema:
            patterns[parameter["name"].lower()] = re.compile(schema["pattern"])
    return patterns


def _headers_keep_their_patterns(case: Any) -> bool:
    meta = getattr(case, "meta", None)
    if meta is None or not meta.generation.mode.is_positive:
        return True
    patterns = _header_patterns()
    for name, value in (case.headers or {}).items():
        pattern = patterns.get(name.lower())
        if pattern is not None and isinstance(value, str) and not pattern.search(value):
            return False
    return True


@schemathesis.hook
def filter_case(ctx: Any, case: Any) -> bool:
    """Leave out the requests that break a rule tying parameters together."""
    rule = _RULES.get((case.method.upper(), case.operation.path))
    return (rule is None or rule(case)) and _headers_keep_their_patterns(case)
