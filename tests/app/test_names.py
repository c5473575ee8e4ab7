"""Segment names in URLs, custom methods after the colon, and the routing errors."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from flask import Request
from flask.testing import FlaskClient
from werkzeug.test import EnvironBuilder, TestResponse

from tests.app.helpers import assert_problem


def test_slash_may_be_sent_raw_or_encoded(client: FlaskClient) -> None:
    created = client.put("/v1/segments/scope%2Fstream%2F0")
    assert created.status_code == 201
    assert created.get_json()["name"] == "scope/stream/0"
    client.post("/v1/segments/scope/stream/0", data=b"abc")
    assert client.get("/v1/segments/scope%2Fstream%2F0:info").get_json()["length"] == 3


def test_unicode_and_spaces_are_fine(client: FlaskClient) -> None:
    url = "/v1/segments/sc%C3%A9ne/my%20stream/0"
    assert client.put(url).get_json()["name"] == "scéne/my stream/0"
    assert client.get(url + ":info").status_code == 200


def test_a_name_with_an_emoji_part_works_on_every_native_route(client: FlaskClient) -> None:
    """Names are UTF-8: a 4-byte character (outside the BMP) is a character like any other."""
    name = "sensors/🌡/0"
    url = "/v1/segments/" + quote(name, safe="/")
    created = client.put(url)
    assert created.status_code == 201 and created.get_json()["name"] == name
    assert client.post(url, data=b"21.5").get_json() == {"offset": 0, "length": 4}
    assert client.get(url).data == b"21.5"
    assert client.get(url, headers={"Range": "bytes=-2"}).data == b".5"
    listed = client.get("/v1/segments", query_string={"prefix": "sensors/🌡/"}).get_json()
    assert [s["name"] for s in listed["segments"]] == [name]
    opened = client.post(url + ":transactions")
    assert opened.headers["Location"] == f"{url}:transactions/{opened.get_json()['id']}"
    assert client.post(url + ":seal").get_json()["sealed"] is True
    assert client.delete(url).status_code == 204


@pytest.mark.parametrize(
    "path",
    [
        "a%23b",  # '#'
        "a%3Fb",  # '?'
        "a%5Cb",  # '\'
        "a%25b",  # '%'
        "a%00b",
        "a%01b",
        "a%0Ab",
        "a%1Fb",
        "a%7Fb",
        "a/../b",
        "a/./b",
        "..",
        "a//b",
        "/a",
        "a/",
        "x" * 1025,
        "%C3%A9" * 513,  # 1026 bytes of UTF-8
    ],
)
def test_bad_names_are_400_invalid_name(client: FlaskClient, path: str) -> None:
    for method in ("PUT", "POST", "GET", "HEAD", "DELETE"):
        response = client.open(f"/v1/segments/{path}", method=method, data=b"x")
        assert response.status_code == 400, (method, response.status_code)
    assert_problem(client.put(f"/v1/segments/{path}"), 400, "InvalidName")
    assert_problem(client.get(f"/v1/segments/{path}:info"), 400, "InvalidName")


def test_names_up_to_1024_bytes_are_fine(client: FlaskClient) -> None:
    assert client.put("/v1/segments/" + "x" * 1024).status_code == 201
    assert client.put("/v1/segments/" + "%C3%A9" * 512).status_code == 201


def _raw_path(client: FlaskClient, method: str, path: str, body: bytes = b"", **headers: str) -> TestResponse:
    """A request whose path bytes (``PATH_INFO``, latin-1) are sent as given: the test client would
    turn a percent-escape that is not UTF-8 into a replacement character first, as gunicorn does not."""
    environ = EnvironBuilder(path="/", method=method, data=body, headers=headers).get_environ()
    environ["PATH_INFO"] = path
    return client.open(Request(environ))


def test_a_name_that_is_not_utf8_is_400(client: FlaskClient) -> None:
    response = _raw_path(client, "PUT", "/v1/segments/a\xff")
    assert "UTF-8" in assert_problem(response, 400, "InvalidName")["detail"]


@pytest.mark.parametrize("method", ["PUT", "POST", "GET"])
def test_a_stream_name_that_is_not_utf8_is_400_not_a_replacement_character(
    raw_client: FlaskClient, method: str
) -> None:
    """Read with replacement characters, a%FF and a%FE were one stream, a\ufffd."""
    assert raw_client.put("/v1/stream/a%EF%BF%BD", headers={"Content-Type": "text/plain"}).status_code == 201
    for path in ("/v1/stream/a\xff", "/v1/stream/a\xfe"):  # POST with a Content-Length: the shortcut's case
        response = _raw_path(raw_client, method, path, b"x", **{"Content-Type": "text/plain"})
        assert "UTF-8" in assert_problem(response, 400, "InvalidName")["detail"]
    assert raw_client.get("/v1/stream/a%EF%BF%BD?offset=-1").data == b""


def test_an_s3_key_that_is_not_utf8_is_invalid_argument(raw_client: FlaskClient) -> None:
    assert raw_client.put("/bucket-utf8").status_code == 200
    refused = _raw_path(raw_client, "PUT", "/bucket-utf8/k\xff", b"x")
    assert refused.status_code == 400 and b"<Code>InvalidArgument</Code>" in refused.data
    assert b"<Key>" not in raw_client.get("/bucket-utf8?list-type=2").data


def test_a_colon_starts_a_custom_method(raw_client: FlaskClient) -> None:
    """Names never hold ':'; an encoded one still splits name and method."""
    raw_client.put("/v1/segments/a")
    assert raw_client.get("/v1/segments/a%3Ainfo").status_code == 200
    problem = assert_problem(raw_client.put("/v1/segments/a%3Ab"), 400, "InvalidName")
    assert "a segment name cannot hold ':'" in problem["detail"]


@pytest.mark.parametrize("suffix", [":nope", ":", ":Info", ":temp/0"])
def test_a_colon_before_no_custom_method_is_an_invalid_name(
    raw_client: FlaskClient, segment: str, suffix: str
) -> None:
    problem = assert_problem(raw_client.put(segment + suffix), 400, "InvalidName")
    assert ":info" in problem["detail"]  # the custom methods there are


@pytest.mark.parametrize("suffix", [":info/extra", ":seal/x"])
def test_a_custom_method_in_another_form_is_404(raw_client: FlaskClient, segment: str, suffix: str) -> None:
    assert_problem(raw_client.get(segment + suffix), 404, "NotFound")


@pytest.mark.parametrize(
    ("method", "suffix", "allow"),
    [
        ("POST", ":info", "GET"),
        ("DELETE", ":info", "GET"),
        ("GET", ":seal", "POST"),
        ("PUT", ":truncate", "POST"),
        ("POST", ":writers/0f8fad5b-d9cb-469f-a165-70867728950e", "GET"),
        ("PATCH", ":seal", "POST"),
        ("OPTIONS", ":transactions", "POST"),
        ("PATCH", "", "DELETE, GET, HEAD, POST, PUT"),
    ],
)
def test_a_known_method_with_the_wrong_verb_is_405(
    raw_client: FlaskClient, segment: str, method: str, suffix: str, allow: str
) -> None:
    response = raw_client.open(segment + suffix, method=method)
    assert_problem(response, 405, "MethodNotAllowed")
    assert response.headers["Allow"] == allow


def test_head_of_a_custom_get_method(raw_client: FlaskClient, segment: str) -> None:
    response = raw_client.head(segment + ":info")
    assert response.status_code == 200
    assert response.data == b""


def test_unknown_paths_are_404_problems(raw_client: FlaskClient) -> None:
    assert_problem(raw_client.get("/v1/segmentz/a"), 404, "NotFound")  # /v2/... is an S3 bucket
    assert_problem(raw_client.get("/v1/segments/"), 404, "NotFound")


def test_wrong_method_on_the_collection_is_405(raw_client: FlaskClient) -> None:
    response = raw_client.post("/v1/segments")
    assert_problem(response, 405, "MethodNotAllowed")
    assert "GET" in response.headers["Allow"]
