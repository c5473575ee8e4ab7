"""Everything under ``/v1/segments``: create, append, read, state, seal, truncate, delete, list,
transactions and merges.

The segment name is the path after ``/v1/segments/`` (WSGI hands it over
with ``%2F`` already decoded to ``/``). A custom method follows the name after
the first colon (AIP-136: ``.../scope/stream/0:seal``); names never contain
``:``. One catch-all rule takes every method and this module dispatches on
(custom method, HTTP method). Handlers parse, call the store and render;
no storage logic lives here.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState
from werkzeug.exceptions import NotFound
from werkzeug.routing import BaseConverter, Rule

from app import auth, ops, params
from app.errors import method_not_allowed, segment_headers
from app.inputs import read_body
from app.native import append_shortcut, read_shortcut
from app.native.sse import event_stream_response, wants_event_stream
from app.settings import HttpSettings
from engine import (
    ATTRIBUTES_PER_REQUEST_MAX,
    AppendResult,
    InvalidArgument,
    InvalidName,
    MergeResult,
    SegmentInfo,
    SegmentNotFound,
    SegmentStore,
    validate_segment_name,
)

bp = Blueprint("segments", __name__)

LIST_LIMIT_DEFAULT = 1000
LIST_LIMIT_MAX = 10000
PARTITION_BYTES_DEFAULT = 64 * 1024 * 1024
_ROUTE = append_shortcut.ROUTE


class SegmentPathConverter(BaseConverter):
    """Everything after ``/v1/segments/``: slashes (leading, doubled), newlines, anything.

    werkzeug's ``path`` converter refuses a leading ``/`` and a newline, which
    would answer 404; matching all lets the name validator say precisely why
    such a name is wrong (400 InvalidName).
    """

    regex = r"[\s\S]+"
    part_isolating = False


bp.record_once(lambda state: state.app.url_map.converters.update(segment_path=SegmentPathConverter))


def init_app(app: Flask) -> None:
    """Register the routes, and the merge source as a name a merge touches (auth judges it).

    Plain appends and reads take the WSGI shortcuts (``append_shortcut.NativeAppendShortcut``,
    ``read_shortcut.NativeReadShortcut``) in front of Flask.
    """
    app.register_blueprint(bp)
    auth.add_touches(app, "/v1/segments/", _merge_touches)
    app.wsgi_app = append_shortcut.NativeAppendShortcut(app, app.wsgi_app)  # type: ignore[method-assign]
    app.wsgi_app = read_shortcut.NativeReadShortcut(app, app.wsgi_app)  # type: ignore[method-assign]


def _merge_touches(
    environ: dict[str, Any], method: str, name: str, custom: str
) -> Iterable[tuple[auth.Access, str, str]]:
    """A merge deletes its source: it needs write access to it as well."""
    if custom == "merge" and method == "POST":
        source = auth.peek_json_member(environ, "source")
        if isinstance(source, str):
            yield auth.Access.WRITE, source, f"merge away {source!r}"


def store() -> SegmentStore:
    """The store this app serves (built by ``create_app``)."""
    return current_app.extensions["segstore"]


def _rfc3339(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def info_json(info: SegmentInfo) -> dict[str, Any]:
    """The JSON info of docs/api.md "Segments" (times as RFC 3339 UTC)."""
    return {
        "name": info.name,
        "length": info.length,
        "start_offset": info.start_offset,
        "storage_length": info.storage_length,
        "sealed": info.sealed,
        "event_count": info.event_count,
        "created": _rfc3339(info.created),
        "last_modified": _rfc3339(info.last_modified),
    }


def _info_response(info: SegmentInfo, status: int = 200) -> Response:
    response = jsonify(info_json(info))
    response.status_code = status
    response.headers.update(segment_headers(info))
    return response


# ------------------------------------------------------------------ handlers
def create(name: str) -> Response:
    """PUT: create, with an optional ``{"rollover_bytes": n}`` body."""
    body = params.json_object_body(request, {"rollover_bytes"}, required=False)
    rollover_bytes = params.json_int(body, "rollover_bytes", minimum=1)
    return _info_response(store().create(name, rollover_bytes=rollover_bytes), 201)


def _append_with(append_to: Callable[..., AppendResult]) -> Response:
    """Read an append's headers and body, hand them to ``append_to`` and render its answer.

    ``append_to(data, **AppendConditions.as_kwargs())`` is ``SegmentStore.append``
    or ``append_transaction`` with the segment bound.
    """
    conditions = params.append_conditions(request.environ)
    data = read_body(
        request.stream, request.content_length, store().settings.max_append_bytes, "append body"
    )
    if not data:
        raise InvalidArgument("an append needs a body of at least one byte; this one is empty")
    result = append_to(data, **conditions.as_kwargs())
    headers, body = append_shortcut.append_answer(result)
    # The hot path: a direct Response is measurably cheaper than jsonify().
    return Response(body, headers=headers, mimetype="application/json")


def append(name: str) -> Response:
    """POST: append the body bytes, plain, conditional on the length, or deduplicated."""
    with append_shortcut.create_it_first(name):
        return _append_with(functools.partial(store().append, name))


def read(name: str) -> Response:
    """GET: bytes from ``offset``/``length`` or ``Range``; long-poll with ``wait``; or SSE."""
    byte_range = params.byte_range(request)
    offset = params.int_param(request, "offset")
    length = params.int_param(request, "length", minimum=1)
    if byte_range is not None and (offset is not None or length is not None):
        raise InvalidArgument("give either a Range header or offset/length parameters, not both")
    settings = store().settings
    wait_s = params.seconds_param(request, "wait", maximum=settings.tail_wait_max_s)
    if wants_event_stream(request):
        if byte_range is not None or length is not None or wait_s is not None:
            raise InvalidArgument(
                "a live stream (Accept: text/event-stream) takes only offset or Last-Event-ID; "
                "length, Range and wait do not apply"
            )
        resume = params.last_event_id(request)
        start = resume if resume is not None else offset
        first = store().read(name, start)
        http: HttpSettings = current_app.extensions["segstore.http"]
        return event_stream_response(store(), name, first, http.sse_wait_s(settings))
    if byte_range is not None:
        offset, length = byte_range
        if offset is None:  # the last ``length`` bytes (of what is still readable)
            now = store().info(name)
            offset = max(now.start_offset, now.length - (length or 0))
            length = (now.length - offset) or None
    result = store().read(name, offset, length, wait_s=wait_s or 0.0)
    status, headers = read_shortcut.read_answer(result)
    if status == 204:
        return Response(status=204, headers=headers)
    if request.if_none_match.contains_weak(read_shortcut.etag(result)):
        del headers["Content-Length"]
        return Response(status=304, headers=headers)
    if byte_range is not None:
        status = 206
        headers["Content-Range"] = f"bytes {result.offset}-{result.next_offset - 1}/*"
    # The pieces go out one by one: a large read is never joined into one copy.
    return Response(result.pieces, status=status, headers=headers, mimetype="application/octet-stream")


def head(name: str) -> Response:
    """HEAD: the segment's state in headers only."""
    return Response(status=200, headers=segment_headers(store().info(name)))


def delete(name: str) -> Response:
    """DELETE: remove the segment (its Tier 2 data goes in the background)."""
    store().delete(name)
    return Response(status=204)


def info(name: str) -> Response:
    """GET ``:info``: the JSON info."""
    return _info_response(store().info(name))


def seal(name: str) -> Response:
    """POST ``:seal``: no more appends; sealing twice is fine."""
    return _info_response(store().seal(name))


def truncate(name: str) -> Response:
    """POST ``:truncate`` with ``{"offset": n}``: start offset becomes max(current, n)."""
    body = params.json_object_body(request, {"offset"}, required=True)
    offset = params.json_int(body, "offset", minimum=0)
    if offset is None:
        raise InvalidArgument('the body needs "offset": the new start offset')
    return _info_response(store().truncate(name, offset))


def writer(name: str, writer_id_text: str) -> Response:
    """GET ``:writers/{writer_id}``: the last event number stored for that writer."""
    writer_id = params.parse_uuid(writer_id_text, "writer id", InvalidArgument)
    event_number = store().writer_event_number(name, writer_id)
    response = jsonify({"writer_id": str(writer_id), "event_number": event_number})
    response.headers.update(segment_headers(store().info(name)))
    return response


def get_attributes(name: str) -> Response:
    """GET ``:attributes?keys=k1,k2``: the keys' values (null: no value)."""
    text = params.str_param(request, "keys")
    if not text:
        raise InvalidArgument("name the attributes to read: ?keys=k1,k2 (UUIDs)")
    keys = [params.parse_uuid(k, "attribute key", InvalidArgument) for k in text.split(",")]
    if len(keys) > ATTRIBUTES_PER_REQUEST_MAX:
        raise InvalidArgument(f"at most {ATTRIBUTES_PER_REQUEST_MAX} keys per request")
    values = store().get_attributes(name, keys)
    response = jsonify({"attributes": {str(k): v for k, v in values.items()}})
    response.headers.update(segment_headers(store().info(name)))
    return response


def update_attributes(name: str) -> Response:
    """POST ``:attributes`` with ``{"updates": [...]}``: all applied atomically, or 412 naming the key."""
    body = params.json_object_body(request, {"updates"}, required=True)
    updates = params.attribute_updates(body)
    values = store().update_attributes(name, updates)
    response = jsonify({"attributes": {str(k): v for k, v in values.items()}})
    response.headers.update(segment_headers(store().info(name)))
    return response


def partitions(name: str) -> Response:
    """GET ``:partitions?target_bytes=n``: ranges for parallel readers, on append boundaries."""
    target = params.int_param(request, "target_bytes", minimum=1)
    ranges = store().partitions(name, PARTITION_BYTES_DEFAULT if target is None else target)
    response = jsonify({"partitions": [{"start": a, "end": b} for a, b in ranges]})
    response.headers.update(segment_headers(store().info(name)))
    return response


def _merged_response(result: MergeResult) -> Response:
    """A commit's or merge's answer: where the bytes start and the target's length right after.

    As for an append, the bytes occupy [offset, length); the headers carry the
    target's current state.
    """
    response = jsonify({"offset": result.offset, "length": result.offset + result.length})
    response.headers.update(segment_headers(result.info))
    return response


def _txid(text: str) -> uuid.UUID:
    """The transaction id of a path; 400 unless it is a UUID."""
    return params.parse_uuid(text, "transaction id", InvalidArgument)


@contextmanager
def _transaction_found(name: str, txid: uuid.UUID) -> Iterator[None]:
    """The engine names a missing transaction by its internal segment; say it in the API's terms."""
    try:
        yield
    except SegmentNotFound:
        raise SegmentNotFound(
            f"transaction {txid} of segment {name!r} does not exist "
            "(never opened, committed, aborted or expired)"
        ) from None


def open_transaction(name: str) -> Response:
    """POST ``:transactions``: open a transaction of the segment; 201 ``{"id": txid}``."""
    txid = store().open_transaction(name)
    response = jsonify({"id": str(txid)})
    response.status_code = 201
    response.headers.update(segment_headers(store().info(name)))
    response.headers["Location"] = f"{request.script_root}/v1/segments/{quote(name)}:transactions/{txid}"
    return response


def append_transaction(name: str, txid_text: str) -> Response:
    """POST ``:transactions/{txid}``: an append to the transaction, with an append's headers and answers."""
    txid = _txid(txid_text)
    with _transaction_found(name, txid):
        return _append_with(functools.partial(store().append_transaction, name, txid))


def transaction_info(name: str, txid_text: str) -> Response:
    """GET ``:transactions/{txid}``: the transaction's info, its id and its parent."""
    txid = _txid(txid_text)
    with _transaction_found(name, txid):
        info = store().transaction_info(name, txid)
    response = jsonify({"id": str(txid), "parent": name, **info_json(info)})
    response.headers.update(segment_headers(info))
    return response


def abort_transaction(name: str, txid_text: str) -> Response:
    """DELETE ``:transactions/{txid}``: drop the transaction and its bytes."""
    txid = _txid(txid_text)
    with _transaction_found(name, txid):
        store().abort_transaction(name, txid)
    return Response(status=204)


def commit_transaction(name: str, txid_text: str) -> Response:
    """POST ``:transactions/{txid}/commit``: seal it and merge it at the end of the segment (idempotent)."""
    return _merged_response(store().commit_transaction(name, _txid(txid_text)))


def merge(name: str) -> Response:
    """POST ``:merge`` with ``{"source": name}``: append the whole sealed source at once; it goes away."""
    body = params.json_object_body(request, {"source"}, required=True)
    source = params.json_str(body, "source")
    if source is None:
        raise InvalidArgument('the body needs "source": the name of the sealed segment to merge')
    try:
        validate_segment_name(source)
    except InvalidName as err:
        raise InvalidName(f"source: {err.detail}") from None
    return _merged_response(store().merge(name, source))


# ------------------------------------------------------------------- routing
Handler = Callable[..., Response]

_PLAIN: dict[str, Handler] = {
    "PUT": create,
    "POST": append,
    "GET": read,
    "HEAD": head,
    "DELETE": delete,
}
# custom method -> {form of what follows it: {HTTP method: handler}}. In a form,
# "{id}" stands for one path part, handed to the handler after the segment name.
_CUSTOM: dict[str, dict[str, dict[str, Handler]]] = {
    "info": {"": {"GET": info}},
    "seal": {"": {"POST": seal}},
    "truncate": {"": {"POST": truncate}},
    "writers": {"/{id}": {"GET": writer}},
    "partitions": {"": {"GET": partitions}},
    "attributes": {"": {"GET": get_attributes, "POST": update_attributes}},
    "transactions": {
        "": {"POST": open_transaction},
        "/{id}": {"POST": append_transaction, "GET": transaction_info, "DELETE": abort_transaction},
        "/{id}/commit": {"POST": commit_transaction},
    },
    "merge": {"": {"POST": merge}},
}


# The query parameters each form serves (openapi.yaml); any other is refused (400), not ignored.
_READ_PARAMS = ("offset", "length", "wait")
_PLAIN_PARAMS: dict[str, tuple[str, ...]] = {"GET": _READ_PARAMS, "HEAD": _READ_PARAMS}
_CUSTOM_PARAMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("attributes", "GET"): ("keys",),
    ("partitions", "GET"): ("target_bytes",),
}


def _match(form: str, rest: str) -> list[str] | None:
    """The ``{id}`` parts of ``rest`` (the path after the custom method) if it has ``form``, else None."""
    wanted, given = form.split("/"), rest.split("/")
    if len(wanted) != len(given):
        return None
    args = []
    for want, part in zip(wanted, given, strict=True):
        if want == "{id}":
            args.append(part)
        elif want != part:
            return None
    return args


def _custom_route(verb: str, rest: str) -> tuple[str, dict[str, Handler], list[str]]:
    """The form, handlers and ``{id}`` values that ``:{verb}{rest}`` names; 404 when it names none."""
    forms = _CUSTOM[verb]
    for form, handlers in forms.items():
        args = _match(form, rest)
        if args is not None:
            return form, handlers, args
    written = " or ".join(f":{verb}{form}" for form in forms)
    raise NotFound(f"the custom method is written {written}")


def segment(target: str) -> Response:
    """Dispatch ``{name}`` or ``{name}:{method}[/{id}[/...]]`` to its handler.

    A method the path does not serve is a 405 whose ``Allow`` names the
    methods openapi.yaml documents for it (a GET form answers HEAD too,
    without saying so).
    """
    ops.set_route(_ROUTE)
    name, colon, custom = target.partition(":")
    validate_segment_name(name)
    if not colon:
        if request.method not in _PLAIN:
            return method_not_allowed(_PLAIN)
        params.only_params(request, *_PLAIN_PARAMS.get(request.method, ()))
        return _PLAIN[request.method](name)
    verb = custom.partition("/")[0]
    if verb not in _CUSTOM:  # most often a name with a colon in it, rarely a misspelt method
        known = ", ".join(f":{v}" for v in sorted(_CUSTOM))
        raise InvalidName(
            f"{target.partition('/')[0]!r}: a segment name cannot hold ':', which starts a custom method, "
            f"and :{verb} is none (they are {known})"
        )
    form, handlers, args = _custom_route(verb, custom[len(verb) :])
    ops.set_route(f"{_ROUTE}:{verb}{form}")
    method = "GET" if request.method == "HEAD" and "HEAD" not in handlers else request.method
    if method not in handlers:
        return method_not_allowed(handlers)
    params.only_params(request, *_CUSTOM_PARAMS.get((verb, method), ()))
    return handlers[method](name, *args)


def _add_segment_rule(state: BlueprintSetupState) -> None:
    """The one rule under ``/v1/segments/``, for every method (``methods=None``).

    Flask's routing would answer a method the rule does not list with a 405
    naming the rule's methods, which are not those of a custom method's
    path; so ``segment`` judges every method itself.
    """
    rule = Rule("/v1/segments/<segment_path:target>", endpoint="segments.segment", merge_slashes=False)
    state.app.url_map.add(rule)
    state.app.view_functions[rule.endpoint] = segment


bp.record_once(_add_segment_rule)


@bp.get("/v1/segments", provide_automatic_options=False)
def list_segments() -> Response:
    """List segments in name order: ``prefix``, ``after`` (exclusive), ``limit`` per page."""
    ops.set_route("/v1/segments")
    params.only_params(request, "prefix", "after", "limit")
    prefix = params.str_param(request, "prefix") or ""
    if "#" in prefix:
        raise InvalidName("a listing prefix never contains '#': no segment a user names does")
    after = params.str_param(request, "after") or None
    limit = params.int_param(request, "limit", minimum=1, maximum=LIST_LIMIT_MAX)
    page, next_after = store().list(prefix, after=after, limit=LIST_LIMIT_DEFAULT if limit is None else limit)
    return jsonify({"segments": [info_json(i) for i in page], "next": next_after})
