"""Reader groups under ``/v1/scopes/{scope}/reader-groups/{group}``: HTTP only.

Handlers parse (refusing query parameters and JSON members they do not
serve), call the reader group layer (``readers``, ``fetch``) and render; a
fetch answers JSON (events in base64) or, asked with ``Accept:
application/octet-stream``, the events' frames as stored after a JSON line
that places them (no per-event work on either side);
``routes`` dispatches to them (``FORMS``). Errors are problem+json through
app/errors.py; a stale generation is 409 ``ReaderFenced``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, jsonify, request

from app import params
from app.scopes import cuts, fetch
from app.scopes.names import check_part
from app.scopes.readers import Readers
from engine import InvalidArgument

PREFIX = "/v1/scopes"
LEASE_DEFAULT_S = 10.0
LEASE_MAX_S = 3600.0
MAX_BYTES_DEFAULT = 1 << 20
STREAMS_MAX = 100
JSON = "application/json"
FRAMES = "application/octet-stream"


def _readers() -> Readers:
    return current_app.extensions["scopes"].readers


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = jsonify(body)
    response.status_code = status
    response.headers.update(headers or {})
    return response


def _generation(body: dict[str, Any]) -> int:
    generation = params.json_int(body, "generation", minimum=1)
    if generation is None:
        raise InvalidArgument("generation is required: the one the reader's join answered")
    return generation


def _positions(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise InvalidArgument("positions must be an object {segment name: offset}")
    found = {}
    for name, offset in value.items():
        what = f"the position of {name}"[:80]
        number = params.json_int({what: offset}, what, minimum=0)
        assert number is not None
        found[str(name)] = number
    return found


def _start(value: Any, what: str) -> str | dict[str, Any]:
    if value in ("head", "tail"):
        return str(value)
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        for stream, cut in value.items():
            check_part(stream, "stream")
            positions = cut.get("positions")
            if isinstance(positions, dict):  # JSON's 1.0 is an integer too
                cut["positions"] = {
                    k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in positions.items()
                }
        return value
    raise InvalidArgument(f'{what} is "head", "tail" or {{stream: {{"positions": {{id: offset}}}}}}')


def _cuts_json(readers: Readers, scope: str, found: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for stream, cut in found.items():
        state = readers.ctl.touch(scope, stream).state
        out[stream] = {"epoch": cuts.epoch_of(state, cut), **cut.to_json()}
    return out


# ----------------------------------------------------------------- handlers
def create_group(scope: str, group: str) -> Response:
    params.only_params(request)
    body = params.json_object_body(request, {"streams", "start", "lease_s"}, required=True)
    streams = body.get("streams")
    if not isinstance(streams, list) or not streams or len(streams) > STREAMS_MAX:
        raise InvalidArgument(f"streams must be a list of 1 to {STREAMS_MAX} stream names of the scope")
    names = [check_part(s, "stream") if isinstance(s, str) else "" for s in streams]
    if "" in names or len(set(names)) != len(names):
        raise InvalidArgument("streams must be distinct stream names")
    start = _start(body.get("start", "head"), "start")
    lease_s = LEASE_DEFAULT_S
    if "lease_s" in body:
        lease_s = params.json_number(body["lease_s"], "lease_s", minimum=0.1, maximum=LEASE_MAX_S)
    _, created = _readers().create(scope, group, names, start, lease_s)
    location = {"Location": f"{request.script_root}{PREFIX}/{scope}/reader-groups/{group}"}
    return _json(_readers().describe(scope, group), 201 if created else 200, location if created else None)


def get_group(scope: str, group: str) -> Response:
    params.only_params(request)
    return _json(_readers().describe(scope, group))


def delete_group(scope: str, group: str) -> Response:
    params.only_params(request)
    _readers().delete(scope, group)
    return Response(status=204)


def join(scope: str, group: str) -> Response:
    params.only_params(request)
    body = params.json_object_body(request, {"reader"}, required=True)
    reader = body.get("reader")
    if not isinstance(reader, str):
        raise InvalidArgument('a join names its reader: {"reader": id}')
    check_part(reader, "reader")
    generation, lease_s = _readers().join(scope, group, reader)
    location = {"Location": f"{request.script_root}{PREFIX}/{scope}/reader-groups/{group}/readers/{reader}"}
    return _json({"reader": reader, "generation": generation, "lease_s": lease_s}, 201, location)


def leave(scope: str, group: str, reader: str) -> Response:
    params.only_params(request, "generation")
    generation = params.int_param(request, "generation", minimum=1)
    _readers().leave(scope, group, check_part(reader, "reader"), generation)
    return Response(status=204)


def events(scope: str, group: str, reader: str) -> Response:
    params.only_params(request, "generation", "wait", "max_bytes")
    generation = params.int_param(request, "generation", minimum=1)
    if generation is None:
        raise InvalidArgument("query parameter generation is required: the one the reader's join answered")
    http = current_app.extensions["segstore.http"]
    wait_s = params.seconds_param(request, "wait", maximum=http.stream_long_poll_s) or 0.0
    limit = _readers().ctl.store.settings.max_read_bytes
    max_bytes = min(params.int_param(request, "max_bytes", minimum=1) or MAX_BYTES_DEFAULT, limit)
    found = fetch.fetch(_readers(), scope, group, check_part(reader, "reader"), generation, wait_s, max_bytes)
    if request.accept_mimetypes.best_match([JSON, FRAMES]) == FRAMES:
        return _frames(found)
    return _json({
        "events": [
            {"segment": e.segment, "offset": e.offset, "data": base64.b64encode(e.data).decode()}
            for e in found.events
        ],
        "positions": found.positions,
        "checkpoint": found.checkpoint,
    })  # fmt: skip


def _frames(found: fetch.Fetched) -> Response:
    """The fetch as one JSON line (chunks, positions, checkpoint), then each chunk's frames as stored."""
    chunks = [[c.segment, c.offset, len(c.data)] for c in found.chunks]
    head = json.dumps({"chunks": chunks, "positions": found.positions, "checkpoint": found.checkpoint})
    body = b"".join([head.encode(), b"\n", *(c.data for c in found.chunks)])
    return Response(body, content_type=FRAMES)


def commit(scope: str, group: str, reader: str) -> Response:
    params.only_params(request)
    body = params.json_object_body(request, {"generation", "positions"}, required=True)
    positions = _positions(body.get("positions", {}))
    _readers().commit(scope, group, check_part(reader, "reader"), _generation(body), positions)
    return Response(status=204)


def start_checkpoint(scope: str, group: str) -> Response:
    params.only_params(request)
    params.json_object_body(request, set(), required=False)
    checkpoint_id, started = _readers().start_checkpoint(scope, group)
    location = f"{request.script_root}{PREFIX}/{scope}/reader-groups/{group}/checkpoints/{checkpoint_id}"
    return _json({"id": checkpoint_id}, 201 if started else 200, {"Location": location})


def get_checkpoint(scope: str, group: str, checkpoint_id: str) -> Response:
    params.only_params(request)
    complete, found = _readers().checkpoint(scope, group, checkpoint_id)
    return _json({"id": checkpoint_id, "complete": complete, "cuts": _cuts_json(_readers(), scope, found)})


def reset(scope: str, group: str) -> Response:
    params.only_params(request)
    body = params.json_object_body(request, {"cuts"}, required=True)
    start = _start(body.get("cuts"), "cuts")
    _readers().reset(scope, group, start)
    return _json(_readers().describe(scope, group))


Handler = Callable[..., Response]
FORMS: dict[str, dict[str, Handler]] = {
    "{scope}/reader-groups/{group}": {"PUT": create_group, "GET": get_group, "DELETE": delete_group},
    "{scope}/reader-groups/{group}:reset": {"POST": reset},
    "{scope}/reader-groups/{group}/readers": {"POST": join},
    "{scope}/reader-groups/{group}/readers/{reader}": {"DELETE": leave},
    "{scope}/reader-groups/{group}/readers/{reader}/events": {"GET": events},
    "{scope}/reader-groups/{group}/readers/{reader}/positions": {"POST": commit},
    "{scope}/reader-groups/{group}/checkpoints": {"POST": start_checkpoint},
    "{scope}/reader-groups/{group}/checkpoints/{checkpoint}": {"GET": get_checkpoint},
}
