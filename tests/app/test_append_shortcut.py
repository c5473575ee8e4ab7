"""The native append shortcut (``app.native.append_shortcut.NativeAppendShortcut``): the same answers as
Flask's view, errors rendered by Flask's handlers, metrics counted, and everything else left to Flask."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask, request, request_started
from flask.testing import FlaskClient
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

URL = "/v1/segments/"


@contextmanager
def flask_requests(app: Flask) -> Iterator[list[str]]:
    """The paths of the requests Flask dispatched meanwhile (the shortcut dispatches none)."""
    seen: list[str] = []

    def started(sender: Flask, **extra: Any) -> None:
        seen.append(request.full_path.rstrip("?"))

    with request_started.connected_to(started, app):
        yield seen


def chunked_post(client: FlaskClient, url: str, data: bytes, headers: dict[str, str] | None = None) -> Any:
    """The same append with a chunked body (no Content-Length): always Flask's view."""
    environ = EnvironBuilder(path=url, method="POST", headers=headers).get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    environ["wsgi.input"] = io.BytesIO(data)
    environ["wsgi.input_terminated"] = True
    return client.open(Request(environ))


def _same_answer(fast: Any, slow: Any, ignore: set[str]) -> None:
    assert fast.status_code == slow.status_code
    assert sorted((k, v) for k, v in fast.headers.items() if k not in ignore) == sorted(
        (k, v) for k, v in slow.headers.items() if k not in ignore
    )


def test_a_plain_append_skips_flask_and_answers_as_flask_does(app: Flask, client: FlaskClient) -> None:
    assert client.put(URL + "s").status_code == 201
    with flask_requests(app) as seen:
        fast = client.post(URL + "s", data=b"abc")
    assert seen == []
    with flask_requests(app) as seen:  # chunked: Flask's view answers
        slow = chunked_post(client, URL + "s", b"defg")
    assert seen == ["/v1/segments/s"]
    assert fast.get_json() == {"offset": 0, "length": 3}
    assert slow.get_json() == {"offset": 3, "length": 7}
    _same_answer(fast, slow, {"Segment-Offset", "Segment-Length", "Content-Length"})
    assert fast.headers["Segment-Offset"] == "0" and fast.headers["Segment-Length"] == "3"
    assert client.get(URL + "s").data == b"abcdefg"


def test_conditions_and_duplicates_through_the_shortcut(app: Flask, client: FlaskClient) -> None:
    client.put(URL + "s")
    writer = str(uuid.uuid4())
    with flask_requests(app) as seen:
        first = client.post(URL + "s", data=b"a", headers={"Writer-Id": writer, "Event-Number": "1"})
        again = client.post(URL + "s", data=b"a", headers={"Writer-Id": writer, "Event-Number": "1"})
        placed = client.post(URL + "s", data=b"b", headers={"Expected-Offset": "1", "Event-Count": "3"})
        refused = client.post(URL + "s", data=b"c", headers={"Expected-Offset": "0"})
    assert seen == []  # the refusal too: Flask's error handler renders it, nothing is dispatched
    assert first.status_code == again.status_code == placed.status_code == 200
    assert again.get_json() == {"duplicate": True, "event_number": 1, "length": 1}
    assert again.headers["Segment-Duplicate"] == "true"
    assert placed.get_json() == {"offset": 1, "length": 2}
    assert refused.status_code == 412
    assert refused.get_json()["code"] == "ConditionalCheckFailed"
    assert client.get(URL + "s").data == b"ab"


def test_errors_of_the_shortcut_are_those_of_the_view(app: Flask, client: FlaskClient) -> None:
    client.put(URL + "s")
    cases = [
        ("missing", {}, 404, "SegmentNotFound"),
        ("s", {"Writer-Id": str(uuid.uuid4())}, 400, "InvalidHeader"),
        ("s", {"Expected-Offset": "-1"}, 400, "InvalidHeader"),
        ("a/../b", {}, 400, "InvalidName"),
    ]
    for name, headers, status, code in cases:
        fast = client.post(URL + name, data=b"x", headers=headers)
        slow = chunked_post(client, URL + name, b"x", headers)
        assert (fast.status_code, fast.get_json()["code"]) == (status, code), name
        assert fast.get_json() == slow.get_json()
        _same_answer(fast, slow, set())


def test_what_is_more_than_a_plain_append_goes_to_flask(app: Flask, client: FlaskClient) -> None:
    client.put(URL + "s")
    with flask_requests(app) as seen:
        assert client.post(URL + "s?x=1", data=b"x").status_code == 400  # a query: Flask refuses it
        assert client.post(URL + "s:seal").status_code == 200
        assert client.post(URL + "s", data=b"").status_code == 400  # no body
    assert seen == ["/v1/segments/s?x=1", "/v1/segments/s:seal", "/v1/segments/s"]


def test_reserved_names_are_refused_by_the_shortcut_too(client: FlaskClient) -> None:
    response = client.post(URL + "%23s3/buckets/b", data=b"x")
    assert response.status_code == 400 and response.get_json()["code"] == "InvalidName"


def test_shortcut_appends_are_counted_in_the_request_metrics(client: FlaskClient) -> None:
    client.put(URL + "s")
    for _ in range(3):
        client.post(URL + "s", data=b"x")
    line = 'segstore_http_request_duration_seconds_count{method="POST",route="/v1/segments/{name}"}'
    counts = [row for row in client.get("/metrics").text.splitlines() if row.startswith(line)]
    assert counts == [f"{line} 3.0"]
