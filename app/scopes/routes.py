"""Everything under ``/v1/scopes``: scopes, streams, segments, events, scaling, cuts, transactions. HTTP only.

One rule takes every path and method under ``/v1/scopes/`` and this module
dispatches on the path's form and the method (a custom method follows a
stream or transaction id after a colon, as on the native API): a method a
path does not serve is a 405 naming the ones it does. Handlers parse,
call the stream layer (``controller``, ``scaling``, ``events``,
``transactions``, ``cuts``) and render; errors are problem+json through
app/errors.py.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState
from werkzeug.exceptions import NotFound
from werkzeug.routing import BaseConverter, Rule

from app import ops, params
from app.errors import InvalidHeader, method_not_allowed, segment_headers
from app.inputs import read_body
from app.scopes import cuts, events, ranges, records, scaling, transactions
from app.scopes.controller import Controller
from app.scopes.errors import StreamNotFound
from app.scopes.keeper import Keeper
from app.scopes.names import check_part, segment_name
from client.events import HEADER_BYTES
from client.routing import header_key
from engine import InvalidArgument, SegmentStore

bp = Blueprint("scopes", __name__)

PREFIX = "/v1/scopes"
SEGMENTS_MAX = 1000
_POLICY_KEYS = {"type", "target", "factor", "min_segments"}
_ROUTING_KEY = re.compile(r"[!-~]{1,1024}")


class ScopesPathConverter(BaseConverter):
    """Everything after ``/v1/scopes/``; the dispatcher reads its parts."""

    regex = r"[\s\S]+"
    part_isolating = False


bp.record_once(lambda state: state.app.url_map.converters.update(scopes_path=ScopesPathConverter))


@dataclass(frozen=True)
class Layer:
    """The stream layer of one app: its controller, the writers' numbers it remembers, its keeper."""

    ctl: Controller
    numbers: events.WriterNumbers
    keeper: Keeper


def init_app(app: Flask, store: SegmentStore) -> None:
    """Build the stream layer over ``store``, start its keeper and register the routes."""
    ctl = Controller(store, app.extensions["segstore.http"])
    layer = Layer(ctl, events.WriterNumbers(store), Keeper(ctl))
    layer.keeper.start()
    app.extensions["scopes"] = layer
    app.register_blueprint(bp)


def _ctl() -> Controller:
    return current_app.extensions["scopes"].ctl


def _numbers() -> events.WriterNumbers:
    return current_app.extensions["scopes"].numbers


# ------------------------------------------------------------------ answers
def _rfc3339(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _segment_json(state: records.StreamState, segment: records.Segment) -> dict[str, Any]:
    name = segment_name(state.scope, state.stream, segment.id)
    return {"id": segment.id, "name": name, "key_lo": segment.lo, "key_hi": segment.hi}


def _stream_json(state: records.StreamState) -> dict[str, Any]:
    pending = state.scaling
    return {
        "scope": state.scope,
        "stream": state.stream,
        "config": state.config.to_json(),
        "state": "sealed" if state.sealing else "active",
        "epoch": state.epoch,
        "pending_scale": None if pending is None else {
            "epoch": pending.epoch,
            "seal": list(pending.seal),
            "ranges": [[s.lo, s.hi] for s in pending.new],
        },
    }


def _cut_json(state: records.StreamState, cut: records.Cut) -> dict[str, Any]:
    return {"epoch": cuts.epoch_of(state, cut), **cut.to_json()}


def _transaction_json(txn: records.Transaction) -> dict[str, Any]:
    return {"id": txn.id, "state": txn.state, "epoch": txn.epoch, "expires": _rfc3339(txn.deadline)}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = jsonify(body)
    response.status_code = status
    response.headers.update(headers or {})
    return response


# ------------------------------------------------------------------ inputs
def _config(body: dict[str, Any]) -> records.StreamConfig:
    """A stream's configuration from a create's body (every member optional: one segment, fixed)."""
    raw = body.get("scaling", {})
    if not isinstance(raw, dict):
        raise InvalidArgument("scaling must be an object {type, target, factor, min_segments}")
    unknown = sorted(set(raw) - _POLICY_KEYS)
    if unknown:
        raise InvalidArgument(f"unknown scaling key(s) {unknown}; allowed: {sorted(_POLICY_KEYS)}")
    kind = raw.get("type", "fixed")
    if kind not in records.POLICIES:
        raise InvalidArgument(f"scaling type must be one of {', '.join(records.POLICIES)}, got {kind!r}")
    target = 0.0
    if "target" in raw:
        target = params.json_number(raw["target"], "scaling.target", minimum=0, maximum=1e15)
    if kind != "fixed" and target <= 0:
        raise InvalidArgument(f"a {kind} policy needs a target above 0")
    factor = params.json_int(raw, "factor", minimum=1, maximum=SEGMENTS_MAX)
    least = params.json_int(raw, "min_segments", minimum=1, maximum=SEGMENTS_MAX)
    policy = records.ScalingPolicy(kind, target, factor or 2, least or 1)
    segments = params.json_int(body, "segments", minimum=1, maximum=SEGMENTS_MAX)
    segments = policy.min_segments if segments is None else segments
    if segments < policy.min_segments:
        raise InvalidArgument(f"segments ({segments}) must be at least min_segments ({policy.min_segments})")
    return records.StreamConfig(segments, policy)


def _ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value or len(value) > SEGMENTS_MAX:
        raise InvalidArgument(f"{what} must be a list of 1 to {SEGMENTS_MAX} segment ids")
    found = []
    for item in value:
        number = params.json_int({what: item}, what, minimum=0)
        assert number is not None  # the key is there
        found.append(number)
    return found


def _ranges(value: Any) -> list[ranges.Range]:
    if not isinstance(value, list) or not value or len(value) > SEGMENTS_MAX:
        raise InvalidArgument(f"ranges must be a list of 1 to {SEGMENTS_MAX} [lo, hi] pairs")
    found = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise InvalidArgument(f"each range is a [lo, hi] pair, got {pair!r}"[:120])
        lo, hi = (params.json_number(v, "a range bound", minimum=0, maximum=1) for v in pair)
        found.append((lo, hi))
    return found


def _routing_key() -> str:
    """The ``Routing-Key`` header's key (percent-encoded UTF-8), or a random key when absent."""
    raw = request.environ.get("HTTP_ROUTING_KEY")
    if raw is None:
        return uuid.uuid4().hex
    if not _ROUTING_KEY.fullmatch(raw):
        raise InvalidHeader(
            "Routing-Key is 1 to 1024 printable ASCII characters: the key's UTF-8, percent-encoded"
        )
    return header_key(raw)


def _event_body() -> bytes:
    limit = _ctl().store.settings.max_append_bytes - HEADER_BYTES
    return read_body(request.stream, request.content_length, limit, "event")


def _txid(text: str) -> str:
    return str(params.parse_uuid(text, "transaction id", InvalidArgument))


def _seconds(body: dict[str, Any], key: str) -> float | None:
    return None if key not in body else params.json_number(body[key], key, minimum=0, maximum=1e9)


# ----------------------------------------------------------------- handlers
def list_scopes() -> Response:
    return _json({"scopes": _ctl().scopes()})


def create_scope(scope: str) -> Response:
    created = _ctl().create_scope(scope)
    location = {"Location": f"{request.script_root}{PREFIX}/{scope}"}
    return _json({"scope": scope}, 201 if created else 200, location if created else None)


def get_scope(scope: str) -> Response:
    _ctl().require_scope(scope)
    return _json({"scope": scope})


def list_streams(scope: str) -> Response:
    return _json({"streams": _ctl().stream_names(scope)})


def create_stream(scope: str, stream: str) -> Response:
    config = _config(params.json_object_body(request, {"segments", "scaling"}, required=False))
    loaded, created = _ctl().create_stream(scope, stream, config)
    location = {"Location": f"{request.script_root}{PREFIX}/{scope}/streams/{stream}"}
    return _json(_stream_json(loaded.state), 201 if created else 200, location if created else None)


def get_stream(scope: str, stream: str) -> Response:
    return _json(_stream_json(_ctl().touch(scope, stream).state))


def delete_stream(scope: str, stream: str) -> Response:
    _ctl().delete(scope, stream)
    return Response(status=204)


def seal_stream(scope: str, stream: str) -> Response:
    return _json(_stream_json(_ctl().seal(scope, stream).state))


def scale_stream(scope: str, stream: str) -> Response:
    body = params.json_object_body(request, {"seal", "ranges"}, required=True)
    if "seal" not in body or "ranges" not in body:
        raise InvalidArgument('a scale names "seal" (segment ids) and "ranges" ([lo, hi] pairs)')
    answer = scaling.scale(_ctl(), scope, stream, _ids(body["seal"], "seal"), _ranges(body["ranges"]))
    made = [
        {"id": s.id, "name": segment_name(scope, stream, s.id), "key_lo": s.lo, "key_hi": s.hi}
        for s in answer.segments
    ]
    return _json({"epoch": answer.epoch, "segments": made}, 200 if answer.done else 202)


def segments(scope: str, stream: str) -> Response:
    state = _ctl().touch(scope, stream).state
    epoch = params.int_param(request, "epoch")
    if epoch is None:
        epoch = state.epoch
    if epoch > state.epoch:
        raise StreamNotFound(f"stream {scope}/{stream} is at epoch {state.epoch}, not yet {epoch}")
    return _json({"epoch": epoch, "segments": [_segment_json(state, s) for s in state.of_epoch(epoch)]})


def successors(scope: str, stream: str, segment_text: str) -> Response:
    state = _ctl().touch(scope, stream).state
    segment_id = params.int_value(segment_text, "segment id")
    segment = state.segments.get(segment_id)
    if segment is None or segment.epoch > state.epoch:
        raise StreamNotFound(f"stream {scope}/{stream} has no segment {segment_id}")
    found = [
        {**_segment_json(state, s), "predecessors": [p.id for p in state.predecessors(s)]}
        for s in state.successors(segment)
    ]
    sealed = segment.sealed_in is not None or state.sealing
    return _json({"successors": found, "sealed": sealed})


def write_event(scope: str, stream: str) -> Response:
    key = _routing_key()
    writer_id, event_number = params.writer_and_number(request.environ)
    payload = _event_body()
    answer = events.write(_ctl(), _numbers(), scope, stream, key, payload, writer_id, event_number)
    headers = {"Segment-Name": quote(answer.segment, safe="/")}
    if answer.duplicate:
        headers["Segment-Duplicate"] = "true"
        body = {"segment": answer.segment, "duplicate": True, "event_number": answer.event_number}
        return _json(body, headers=headers)
    assert answer.info is not None and answer.offset is not None
    headers.update(segment_headers(answer.info))
    headers["Segment-Offset"] = str(answer.offset)
    return _json({"segment": answer.segment, "offset": answer.offset}, headers=headers)


def cut(scope: str, stream: str) -> Response:
    at = params.str_param(request, "at")
    at = "tail" if at is None else at
    if at not in ("head", "tail"):
        raise InvalidArgument(f"at is head or tail, got {at!r}"[:80])
    state = _ctl().touch(scope, stream).state
    found = cuts.head(state) if at == "head" else cuts.tail(_ctl(), state)
    return _json(_cut_json(state, found))


def truncate_stream(scope: str, stream: str) -> Response:
    body = params.json_object_body(request, {"epoch", "positions"}, required=True)
    params.json_int(body, "epoch", minimum=0)  # informative (the cut's segments say it): checked, not used
    positions = body.get("positions")
    if not isinstance(positions, dict) or not positions:
        raise InvalidArgument('a truncation takes a stream cut: {"positions": {segment id: offset}}')
    head = cuts.truncate(_ctl(), scope, stream, positions)
    return _json({"head": _cut_json(_ctl().touch(scope, stream).state, head)})


def open_transaction(scope: str, stream: str) -> Response:
    body = params.json_object_body(request, {"timeout_s"}, required=False)
    txn = transactions.open_transaction(_ctl(), scope, stream, _seconds(body, "timeout_s"))
    location = f"{request.script_root}{PREFIX}/{scope}/streams/{stream}/transactions/{txn.id}"
    return _json(_transaction_json(txn), 201, {"Location": location})


def get_transaction(scope: str, stream: str, txid: str) -> Response:
    return _json(_transaction_json(transactions.find(_ctl(), scope, stream, _txid(txid))[1]))


def write_transaction_event(scope: str, stream: str, txid: str) -> Response:
    key = _routing_key()
    writer_id, event_number = params.writer_and_number(request.environ)
    payload = _event_body()
    event = transactions.write(_ctl(), scope, stream, _txid(txid), key, payload, writer_id, event_number)
    headers = {"Segment-Name": quote(event.segment, safe="/")}
    body: dict[str, Any] = {"segment": event.segment}
    if event.result.duplicate:
        headers["Segment-Duplicate"] = "true"
        body.update(duplicate=True, event_number=event.result.event_number)
    return _json(body, headers=headers)


def commit_transaction(scope: str, stream: str, txid: str) -> Response:
    return _json(_transaction_json(transactions.commit(_ctl(), scope, stream, _txid(txid))))


def abort_transaction(scope: str, stream: str, txid: str) -> Response:
    return _json(_transaction_json(transactions.abort(_ctl(), scope, stream, _txid(txid))))


# ------------------------------------------------------------------- routing
Handler = Callable[..., Response]

# Path forms under /v1/scopes/ -> {HTTP method: handler}. "{x}" is one path part, handed to the
# handler in order; "{x}:verb" is a part carrying a custom method.
_FORMS: dict[str, dict[str, Handler]] = {
    "{scope}": {"PUT": create_scope, "GET": get_scope},
    "{scope}/streams": {"GET": list_streams},
    "{scope}/streams/{stream}": {"PUT": create_stream, "GET": get_stream, "DELETE": delete_stream},
    "{scope}/streams/{stream}:seal": {"POST": seal_stream},
    "{scope}/streams/{stream}:scale": {"POST": scale_stream},
    "{scope}/streams/{stream}:truncate": {"POST": truncate_stream},
    "{scope}/streams/{stream}/segments": {"GET": segments},
    "{scope}/streams/{stream}/segments/{segment}/successors": {"GET": successors},
    "{scope}/streams/{stream}/events": {"POST": write_event},
    "{scope}/streams/{stream}/cut": {"GET": cut},
    "{scope}/streams/{stream}/transactions": {"POST": open_transaction},
    "{scope}/streams/{stream}/transactions/{txid}": {"GET": get_transaction},
    "{scope}/streams/{stream}/transactions/{txid}/events": {"POST": write_transaction_event},
    "{scope}/streams/{stream}/transactions/{txid}:commit": {"POST": commit_transaction},
    "{scope}/streams/{stream}/transactions/{txid}:abort": {"POST": abort_transaction},
}
_NAMED = {"{scope}": "scope", "{stream}": "stream"}


def _match(form: str, parts: list[str]) -> list[str] | None:
    """The values of ``form``'s placeholders in ``parts``, or None when ``parts`` has another form."""
    wanted = form.split("/")
    if len(wanted) != len(parts):
        return None
    values = []
    for want, part in zip(wanted, parts, strict=True):
        if not want.startswith("{"):
            if want != part:
                return None
            continue
        placeholder, colon, verb = want.partition(":")
        name, given_colon, given_verb = part.partition(":")
        if (colon, verb) != (given_colon, given_verb) or not name:
            return None
        values.append(check_part(name, _NAMED[placeholder]) if placeholder in _NAMED else name)
    return values


def dispatch(rest: str) -> Response:
    """Serve ``/v1/scopes/{rest}``: the form it has, the handler of the method (405 for another)."""
    parts = rest.split("/")
    for form, handlers in _FORMS.items():
        values = _match(form, parts)
        if values is None:
            continue
        ops.set_route(f"{PREFIX}/{form}")
        method = "GET" if request.method == "HEAD" and "HEAD" not in handlers else request.method
        if method not in handlers:
            return method_not_allowed(handlers)
        return handlers[method](*values)
    raise NotFound(f"no resource at {request.path}: see docs/api.md \"Streams\"")


def _add_rule(state: BlueprintSetupState) -> None:
    """One rule under ``/v1/scopes/`` for every method: ``dispatch`` judges the method itself."""
    rule = Rule(f"{PREFIX}/<scopes_path:rest>", endpoint="scopes.dispatch", merge_slashes=False)
    state.app.url_map.add(rule)
    state.app.view_functions[rule.endpoint] = dispatch


bp.record_once(_add_rule)
bp.add_url_rule(PREFIX, "list_scopes", list_scopes, methods=["GET"], provide_automatic_options=False)
