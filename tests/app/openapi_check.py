"""Check HTTP responses against ``openapi.yaml``, the contract that docs/api.md says in prose.

``check_response`` takes a Flask/werkzeug test-client response (it knows its
``request``), finds the documented operation for the concrete path, and lets
openapi-core validate the status, the headers and the body. A mismatch is an
AssertionError that names the request, the status and every problem.

openapi-core's own path matching cannot place ``/v1/segments/a/b:seal``:
a segment name holds ``/`` and a custom method follows it after a colon. So
the path is mapped here (a name is everything up to the first colon, as the
server reads it) and handed to openapi-core as the documented path pattern.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from flask import Flask
from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.validation.response import V31ResponseHeadersValidator
from openapi_core.validation.response.exceptions import InvalidData, InvalidHeader
from werkzeug.datastructures import Headers, ImmutableMultiDict
from werkzeug.routing import Rule, UnicodeConverter
from werkzeug.test import TestResponse

from app.native import routes as segment_routes
from app.scopes import routes as scopes_routes

SPEC_FILE = Path(__file__).resolve().parents[2] / "openapi.yaml"
HTTP_METHODS = ("get", "put", "post", "delete", "head", "patch", "options", "trace")
EVENT_STREAM = "text/event-stream"
PROBLEM_JSON = "application/problem+json"
# The path parameter that holds a segment name: it may contain "/" but never ":".
_NAME_PARAMETER = "name"
_TEMPLATE_PART = re.compile(r"\{([^}]+)\}")
_SEGMENT_ENDPOINT = "segments.segment"
_SCOPES_ENDPOINT = "scopes.dispatch"
_SCOPES_SAMPLES = {"scope": "sc", "stream": "st", "segment": "0"}
_SAMPLE_NAME = "scope/stream/0"
_SAMPLE_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"


@functools.cache
def spec() -> dict[str, Any]:
    """openapi.yaml as plain data."""
    return yaml.safe_load(SPEC_FILE.read_text(encoding="utf-8"))


def _bytes_as_text(value: bytes, **_parameters: str) -> str:
    """Binary bodies are documented as ``type: string``; every byte maps to one character."""
    return value.decode("latin-1")


def _json(value: bytes, **_parameters: str) -> Any:
    return json.loads(value)


@functools.cache
def openapi() -> OpenAPI:
    """The validating OpenAPI object, built once."""
    config = Config(
        extra_media_type_deserializers={
            "application/octet-stream": _bytes_as_text,
            PROBLEM_JSON: _json,
        }
    )
    return OpenAPI.from_dict(spec(), config=config)


def spec_operations() -> list[tuple[str, str]]:
    """Every documented (HTTP method, path template), e.g. ``("POST", "/v1/segments/{name}:seal")``."""
    return [
        (method.upper(), path)
        for path, item in spec()["paths"].items()
        for method in HTTP_METHODS
        if method in item
    ]


def _template_regex(template: str) -> re.Pattern[str]:
    """A full-match regex for a path template: ``{name}`` stops at ``:``, others at ``/`` and ``:``."""
    pattern, position = [], 0
    for match in _TEMPLATE_PART.finditer(template):
        pattern.append(re.escape(template[position : match.start()]))
        parameter = match.group(1)
        value = "[^:]+" if parameter == _NAME_PARAMETER else "[^/:]+"
        pattern.append(f"(?P<{parameter}>{value})")
        position = match.end()
    pattern.append(re.escape(template[position:]))
    return re.compile("".join(pattern))


@functools.cache
def _templates() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((path, _template_regex(path)) for path in spec()["paths"])


def spec_path_for(path: str) -> str | None:
    """The documented path template a concrete (decoded) path belongs to, or None."""
    found = [template for template, regex in _templates() if regex.fullmatch(path)]
    if len(found) > 1:
        raise AssertionError(f"{path} matches several paths of openapi.yaml: {found}")
    return found[0] if found else None


class _RequestView:
    """The request as openapi-core sees it: the documented path pattern instead of the path."""

    def __init__(self, method: str, path: str, path_pattern: str, headers: Headers) -> None:
        self.host_url = "http://localhost/"
        self.path = path
        self.path_pattern = path_pattern
        self.method = method.lower()
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(), header=headers, cookie=ImmutableMultiDict()
        )
        self.body: bytes | None = None
        self.content_type = "application/octet-stream"


@dataclass
class _ResponseView:
    """The response as openapi-core sees it."""

    status_code: int
    data: bytes
    content_type: str
    headers: Headers


def _schema_errors(err: BaseException) -> Iterator[str]:
    """The causes of an openapi-core error, down to the JSON Schema messages."""
    cause = err.__cause__
    while cause is not None:
        for schema_error in getattr(cause, "schema_errors", ()):
            where = getattr(schema_error, "json_path", "$")
            yield f"{where}: {getattr(schema_error, 'message', schema_error)}"
        cause = cause.__cause__


def _describe(errors: Iterable[BaseException]) -> list[str]:
    lines = []
    for err in errors:
        details = list(_schema_errors(err))
        if isinstance(err, InvalidData):
            lines.append("- the body does not match its schema:")
        elif isinstance(err, InvalidHeader):
            lines.append(f"- header {err.name} does not match its schema:")
        else:
            lines.append(f"- {err}")
        lines.extend(f"    {line}" for line in details)
    return lines


def _body_excerpt(response: TestResponse, streaming: bool) -> str:
    if streaming or response.request.method == "HEAD":
        return ""
    data = response.get_data()
    return f"\nbody: {data[:300]!r}" + ("..." if len(data) > 300 else "")


def check_response(response: TestResponse) -> None:
    """Assert that ``response`` is documented in openapi.yaml for its request.

    The route, the status, the content type, the body schema and the
    documented required headers are all checked. An event stream's body is
    not read (it may never end); its status, content type and headers are.
    """
    request = response.request
    method, path, status = request.method, request.path, response.status_code
    where = f"{method} {path} answered {status}"
    template = spec_path_for(path)
    if template is None:
        raise AssertionError(f"{where}: no path of openapi.yaml matches {path}")
    operation = spec()["paths"][template].get(method.lower())
    if operation is None:
        documented = [m for m, t in spec_operations() if t == template]
        raise AssertionError(f"{where}: {method} {template} is not documented (only {documented})")
    streaming = response.mimetype == EVENT_STREAM
    if str(status) not in operation["responses"]:
        raise AssertionError(
            f"{where}: status {status} is not documented for {method} {template} "
            f"(documented: {', '.join(sorted(operation['responses']))})"
            + _body_excerpt(response, streaming)
        )
    view_request = _RequestView(method, path, template, Headers(request.headers))
    view_response = _ResponseView(
        status_code=status,
        data=b"" if streaming else response.get_data(),
        content_type=response.mimetype or "",
        headers=Headers(response.headers),
    )
    problems = _describe(_validation_errors(view_request, view_response, streaming))
    if streaming and EVENT_STREAM not in _documented_content(operation["responses"][str(status)]):
        problems.append(f"- {EVENT_STREAM} is not documented for status {status}")
    if not streaming and response.mimetype == PROBLEM_JSON and method != "HEAD":
        body_status = (response.get_json(silent=True) or {}).get("status")
        if body_status != status:
            problems.append(f"- the problem's status is {body_status!r}, the response's {status}")
    if problems:
        raise AssertionError(
            f"{where}, which does not match {method} {template} in openapi.yaml:\n"
            + "\n".join(problems)
            + _body_excerpt(response, streaming)
        )


def _validation_errors(
    request: _RequestView, response: _ResponseView, streaming: bool
) -> Iterator[BaseException]:
    if streaming:
        validator = V31ResponseHeadersValidator(openapi().spec)
        return validator.iter_errors(request, response)
    return openapi().iter_response_errors(request, response)


def _documented_content(response_spec: dict[str, Any]) -> set[str]:
    if "$ref" in response_spec:
        name = response_spec["$ref"].rsplit("/", 1)[-1]
        response_spec = spec()["components"]["responses"][name]
    return set(response_spec.get("content", {}))


@dataclass(frozen=True)
class Route:
    """One way into the app: a url rule, or a custom method of the segment rule."""

    rule: str
    methods: frozenset[str]
    example_path: str


def registered_routes(app: Flask) -> list[Route]:
    """The app's url rules (static files aside), the custom methods of its segment rule, and
    the path forms of its stream rule.

    The custom methods (``:seal``, ``:writers/{id}``, ``:transactions/{id}/commit``)
    and the stream paths (``/v1/scopes/{scope}/streams/{stream}:scale``) are
    dispatched inside catch-all rules, so they come from the app's dispatch
    tables. Each route has an example path with sample values for its
    variables.
    """
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith(("s3.", "console.")):
            continue  # S3's API and the console's page and assets are not part of openapi.yaml
        methods = frozenset(rule.methods or ()) - {"HEAD", "OPTIONS"}
        if rule.endpoint == _SCOPES_ENDPOINT:
            for form, handlers in scopes_routes._FORMS.items():
                path = f"{scopes_routes.PREFIX}/{form}"
                sample = path.format(**_SCOPES_SAMPLES, txid=_SAMPLE_ID)
                routes.append(Route(path, frozenset(handlers), sample))
            continue
        example = _example_path(rule)
        routes.append(Route(rule.rule, methods, example))
        if rule.endpoint == _SEGMENT_ENDPOINT:
            for verb, forms in sorted(segment_routes._CUSTOM.items()):
                for form, handlers in forms.items():
                    written = f":{verb}{form}"
                    sample = written.replace("{id}", _SAMPLE_ID)
                    routes.append(Route(rule.rule + written, frozenset(handlers), example + sample))
    return routes


def _example_path(rule: Rule) -> str:
    """The rule's path with a sample value for each variable (a segment name for the path ones)."""
    one_part = _SAMPLE_NAME.split("/")[0]  # a plain <variable> takes no slash
    values = {
        argument: one_part if type(rule._converters[argument]) is UnicodeConverter else _SAMPLE_NAME
        for argument in rule.arguments
    }
    return rule.build(values, append_unknown=False)[1]
