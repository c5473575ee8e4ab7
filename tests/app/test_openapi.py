"""openapi.yaml against the app: what the schemathesis run (test_schemathesis.py) does not check.

That run calls every documented operation with generated requests and checks
each answer. It does not look the other way, nor reach every state: here the
spec is valid and in style, every route and custom method the app serves is
documented, a method outside the contract is 405 with the documented
``Allow``, and scripted exercises reach the answers generated requests rarely
do (206, 304, 410, 416, tails, Server-Sent Events), each checked against the
spec (openapi_check.py, as every test of tests/app is).
"""

from __future__ import annotations

import base64
import uuid
from urllib.parse import unquote

import pytest
from flask import Flask, Response, jsonify
from flask.testing import FlaskClient
from openapi_spec_validator import validate
from werkzeug.test import TestResponse

from tests.app.conftest import MAX_APPEND_BYTES
from tests.app.openapi_check import (
    SPEC_FILE,
    check_response,
    registered_routes,
    spec,
    spec_operations,
    spec_path_for,
)

NAME = "scope/stream/0"
URL = f"/v1/segments/{NAME}"
WRITER = "0f8fad5b-d9cb-469f-a165-70867728950e"


@pytest.fixture
def api(app: Flask) -> FlaskClient:
    """A test client of the real app; each test checks its responses itself."""
    return app.test_client()


def checked(response: TestResponse) -> TestResponse:
    """``response`` after checking it against openapi.yaml."""
    check_response(response)
    return response


# ---------------------------------------------------------------- the document
def test_the_spec_is_a_valid_openapi_3_1_document() -> None:
    assert spec()["openapi"] == "3.1.0"
    validate(spec(), base_uri=SPEC_FILE.as_uri())


def test_operation_ids_are_unique_and_camel_case() -> None:
    ids = [spec()["paths"][path][method.lower()]["operationId"] for method, path in spec_operations()]
    assert len(ids) == len(set(ids))
    assert all(i[0].islower() and i.isalnum() for i in ids)


def test_every_concrete_path_maps_to_one_documented_path() -> None:
    cases = {
        "/v1/segments": "/v1/segments",
        "/v1/segments/s": "/v1/segments/{name}",
        "/v1/segments/scope/stream/0": "/v1/segments/{name}",
        "/v1/segments/scope/stream/0:seal": "/v1/segments/{name}:seal",
        "/v1/segments/a/b:info": "/v1/segments/{name}:info",
        "/v1/segments/a/b:truncate": "/v1/segments/{name}:truncate",
        f"/v1/segments/a/b:writers/{WRITER}": "/v1/segments/{name}:writers/{writer_id}",
        "/v1/segments/a/b:transactions": "/v1/segments/{name}:transactions",
        f"/v1/segments/a/b:transactions/{WRITER}": "/v1/segments/{name}:transactions/{txid}",
        f"/v1/segments/a/b:transactions/{WRITER}/commit": "/v1/segments/{name}:transactions/{txid}/commit",
        "/v1/segments/a/b:merge": "/v1/segments/{name}:merge",
        "/healthz": "/healthz",
    }
    for path, template in cases.items():
        assert spec_path_for(path) == template, path
    unknown_paths = [
        "/v1/segments/a:bogus",
        "/v1/segments/a:writers",
        f"/v1/segments/a:transactions/{WRITER}/abort",
        "/v1",
        "/v1/segments/",
    ]
    for unknown in unknown_paths:
        assert spec_path_for(unknown) is None, unknown


# ------------------------------------------------------- routes against the app
def _example(template: str) -> str:
    return template.format(
        name=NAME, writer_id=WRITER, txid=WRITER, op="list", scope="sc", stream="st", segment="0"
    )


def test_every_app_route_and_custom_method_is_documented(app: Flask) -> None:
    routes = registered_routes(app)
    assert any(":" in route.rule for route in routes), "no custom methods found"
    documented = set(spec_operations())
    for route in routes:
        template = spec_path_for(unquote(route.example_path))
        assert template is not None, f"{route.rule} ({route.example_path}) is not in openapi.yaml"
        for method in route.methods:
            assert (method, template) in documented, f"{method} {route.rule} is not in openapi.yaml"


def test_every_documented_path_is_reached_by_an_app_route(app: Flask) -> None:
    reached = {spec_path_for(unquote(route.example_path)) for route in registered_routes(app)}
    assert reached == set(spec()["paths"])


# A method the contract does not have for a path answers 405, and Allow names the path's methods.
OTHER_METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE", "QUERY")


def test_a_method_outside_the_contract_is_405_allowing_the_documented_ones(api: FlaskClient) -> None:
    assert api.put(URL).status_code == 201
    checked_paths = 0
    for template in spec()["paths"]:
        if not template.startswith("/v1/"):
            continue  # /healthz, /readyz and /metrics answer OPTIONS as Flask does
        documented = {m for m, t in spec_operations() if t == template}
        for method in sorted(set(OTHER_METHODS) - documented):
            response = api.open(_example(template), method=method)
            assert response.status_code == 405, (method, template)
            assert response.get_json()["code"] == "MethodNotAllowed"
            allowed = set(response.headers["Allow"].split(", "))
            assert allowed <= documented, (method, template, allowed)
            assert documented - {"HEAD", "OPTIONS"} <= allowed, (method, template, allowed)
        checked_paths += 1
    assert checked_paths == len([t for t in spec()["paths"] if t.startswith("/v1/")])


# ------------------------------------------------------ a scripted exercise
def test_segment_lifecycle_answers_as_documented(api: FlaskClient) -> None:
    created = checked(api.put(URL))
    assert created.status_code == 201
    assert created.get_json()["name"] == NAME
    encoded = checked(api.put("/v1/segments/scope%2Fstream%2F1", json={"rollover_bytes": 1 << 20}))
    assert encoded.status_code == 201
    assert encoded.get_json()["name"] == "scope/stream/1"
    assert checked(api.put(URL)).status_code == 409
    assert checked(api.put("/v1/segments/bad%25name")).get_json()["code"] == "InvalidName"

    assert checked(api.head(URL)).headers["Segment-Length"] == "0"
    assert checked(api.head("/v1/segments/no/such")).status_code == 404
    info = checked(api.get(URL + ":info")).get_json()
    assert (info["length"], info["sealed"]) == (0, False)

    listed = checked(api.get("/v1/segments?prefix=scope/&limit=1")).get_json()
    assert [s["name"] for s in listed["segments"]] == [NAME]
    assert listed["next"] == NAME
    rest = checked(api.get(f"/v1/segments?prefix=scope/&after={NAME}")).get_json()
    assert ([s["name"] for s in rest["segments"]], rest["next"]) == (["scope/stream/1"], None)
    assert checked(api.get("/v1/segments?limit=0")).status_code == 400

    assert checked(api.delete("/v1/segments/scope/stream/1")).status_code == 204
    assert checked(api.get("/v1/segments/scope/stream/1:info")).status_code == 404
    assert checked(api.delete("/v1/segments/scope/stream/1")).status_code == 404


def test_appends_answer_as_documented(api: FlaskClient) -> None:
    checked(api.put(URL))
    plain = checked(api.post(URL, data=b"hello "))
    assert plain.get_json() == {"offset": 0, "length": 6}
    assert plain.headers["Segment-Offset"] == "0"
    dedup = {"Writer-Id": WRITER, "Event-Number": "1", "Event-Count": "2"}
    first = checked(api.post(URL, data=b"world", headers=dedup))
    assert first.get_json() == {"offset": 6, "length": 11}
    again = checked(api.post(URL, data=b"world", headers=dedup))
    assert again.get_json() == {"duplicate": True, "event_number": 1, "length": 11}
    assert again.headers["Segment-Duplicate"] == "true"
    refused = checked(api.post(URL, data=b"x", headers={"Expected-Offset": "3"}))
    assert (refused.status_code, refused.headers["Segment-Length"]) == (412, "11")
    conditional = checked(api.post(URL, data=b"!", headers={"Expected-Offset": "11"}))
    assert conditional.get_json() == {"offset": 11, "length": 12}
    assert checked(api.post(URL, data=b"x", headers={"Event-Number": "2"})).status_code == 400
    too_large = checked(api.post(URL, data=b"x" * (MAX_APPEND_BYTES + 1)))
    assert too_large.status_code == 413
    assert checked(api.post("/v1/segments/no/such", data=b"x")).status_code == 404

    writer = checked(api.get(f"{URL}:writers/{WRITER}")).get_json()
    assert writer == {"writer_id": WRITER, "event_number": 1}
    stranger = checked(api.get(f"{URL}:writers/{uuid.uuid4()}")).get_json()
    assert stranger["event_number"] is None
    assert checked(api.get(f"{URL}:writers/not-a-uuid")).status_code == 400
    assert checked(api.get(URL + ":info")).get_json()["event_count"] == 4


def test_reads_answer_as_documented(api: FlaskClient) -> None:
    checked(api.put(URL))
    checked(api.post(URL, data=b"hello world"))
    full = checked(api.get(URL))
    assert (full.status_code, full.data, full.headers["Segment-Next-Offset"]) == (200, b"hello world", "11")
    etag = full.headers["ETag"]
    assert checked(api.get(URL, headers={"If-None-Match": etag})).status_code == 304
    ranged = checked(api.get(URL, headers={"Range": "bytes=6-10"}))
    assert (ranged.status_code, ranged.data) == (206, b"world")
    assert ranged.headers["Content-Range"].startswith("bytes 6-10/")
    assert checked(api.get(URL + "?offset=6&length=3")).data == b"wor"
    assert checked(api.get(URL + "?offset=11")).status_code == 204
    tail = checked(api.get(URL + "?offset=11&wait=0.05"))
    assert (tail.status_code, tail.headers["Segment-Next-Offset"]) == (204, "11")
    assert checked(api.get(URL + "?offset=12")).status_code == 416
    assert checked(api.get(URL + "?wait=61")).status_code == 400
    assert checked(api.get("/v1/segments/no/such")).status_code == 404

    assert checked(api.post(URL + ":truncate", json={"offset": 12})).status_code == 416
    truncated = checked(api.post(URL + ":truncate", json={"offset": 6}))
    assert truncated.get_json()["start_offset"] == 6
    below = checked(api.get(URL + "?offset=0"))
    assert (below.status_code, below.headers["Segment-Start-Offset"]) == (410, "6")
    assert checked(api.post(URL + ":truncate", json={"offset": "6"})).status_code == 400

    sealed = checked(api.post(URL + ":seal"))
    assert sealed.get_json()["sealed"] is True
    assert checked(api.post(URL + ":seal")).status_code == 200
    assert checked(api.post(URL, data=b"late")).get_json()["code"] == "SegmentSealed"
    end = checked(api.get(URL + "?offset=11&wait=5"))
    assert (end.status_code, end.headers["Segment-Sealed"]) == (204, "true")

    stream = checked(api.get(URL + "?offset=6", headers={"Accept": "text/event-stream"}))
    assert stream.status_code == 200
    assert stream.headers["Cache-Control"] == "no-cache, no-transform"
    assert stream.headers["X-Accel-Buffering"] == "no"
    text = stream.get_data(as_text=True)
    assert f"data: {base64.b64encode(b'world').decode()}" in text
    assert "event: sealed" in text


def test_operations_answer_as_documented(api: FlaskClient) -> None:
    assert checked(api.get("/healthz")).status_code == 200
    assert checked(api.get("/readyz")).status_code == 200
    metrics = checked(api.get("/metrics"))
    assert metrics.status_code == 200
    assert b"segstore_http_requests" in metrics.data


# --------------------------------------------------- the checker catches drift
@pytest.fixture
def wrong_app() -> Flask:
    """An app that answers the documented paths the wrong way."""
    wrong = Flask(__name__)

    @wrong.route("/v1/segments/<path:target>", methods=["GET", "POST"])
    def segment(target: str) -> Response | tuple[Response, int]:
        if target.endswith(":info"):
            return jsonify({"name": 7})
        if target.endswith(":seal"):
            return jsonify({"status": "sealed"}), 202
        return Response(b"abc", mimetype="application/octet-stream")

    @wrong.route("/v1/nothing")
    def nothing() -> str:
        return "nothing"

    return wrong


@pytest.mark.parametrize(
    ("method", "path", "words"),
    [
        ("GET", "/v1/nothing", "no path of openapi.yaml matches"),
        ("GET", "/v1/segments/a/b:info", r"\$\.name: 7 is not of type 'string'"),
        ("POST", "/v1/segments/a/b:seal", "status 202 is not documented"),
        ("GET", "/v1/segments/a/b", "Missing required header: Segment-Length"),
    ],
)
def test_check_response_reports_a_mismatch(wrong_app: Flask, method: str, path: str, words: str) -> None:
    response = wrong_app.test_client().open(path, method=method)
    with pytest.raises(AssertionError, match=words) as raised:
        check_response(response)
    assert f"{method} {path} answered {response.status_code}" in str(raised.value)
