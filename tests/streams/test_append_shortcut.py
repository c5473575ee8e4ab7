"""The stream append shortcut (``app.streams.append_shortcut.StreamAppendShortcut``): the same answers as
Flask's view, errors rendered by the blueprint, metrics counted, and everything else left to Flask."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask, request, request_started
from flask.testing import FlaskClient

from tests.streams.test_protocol import URL, post, put


@contextmanager
def flask_requests(app: Flask) -> Iterator[list[str]]:
    """The methods of the requests Flask dispatched meanwhile (the shortcut dispatches none)."""
    seen: list[str] = []

    def started(sender: Flask, **extra: Any) -> None:
        seen.append(request.method)

    with request_started.connected_to(started, app):
        yield seen


def test_a_plain_append_skips_flask_and_answers_as_flask_does(app: Flask, client: FlaskClient) -> None:
    put(client, "s")
    with flask_requests(app) as seen:
        fast = post(client, "s", "abc")
    assert seen == []
    with flask_requests(app) as seen:
        slow = post(client, "s", "defg", Stream_Closed="false")  # not plain: Flask's view answers
    assert seen == ["POST"]
    assert fast.status_code == slow.status_code == 204
    assert fast.headers["Stream-Next-Offset"] == "0000000000000000_0000000000000007"
    assert slow.headers["Stream-Next-Offset"] == "0000000000000000_0000000000000015"
    assert fast.data == slow.data == b""
    ignore = {"Stream-Next-Offset"}
    assert sorted((k, v) for k, v in fast.headers.items() if k not in ignore) == sorted(
        (k, v) for k, v in slow.headers.items() if k not in ignore
    )
    assert client.get(URL + "s?offset=-1").data == b"abcdefg"


def test_appends_with_more_than_a_body_go_to_flask(app: Flask, client: FlaskClient) -> None:
    put(client, "s")
    variants = [
        {"Producer_Id": "p", "Producer_Epoch": "0", "Producer_Seq": "0"},
        {"Stream_Seq": "a"},
        {"Stream_Closed": "true"},
    ]
    for headers in variants:
        with flask_requests(app) as seen:
            assert post(client, "s", "x", **headers).status_code in (200, 204)
        assert seen == ["POST"], headers
    with flask_requests(app) as seen:
        assert client.post(URL + "s", data=b"").status_code == 400  # no body, no Content-Type
    assert seen == ["POST"]


def test_errors_of_the_shortcut_are_the_blueprints(app: Flask, client: FlaskClient) -> None:
    put(client, "j", Content_Type="application/json")
    put(client, "c", Stream_Closed="true")
    with flask_requests(app) as seen:
        missing = post(client, "nope", "x")
        bad_json = post(client, "j", "{", Content_Type="application/json")
        other_type = post(client, "j", "x")
        closed = post(client, "c", "x")
    assert seen == []
    assert (missing.status_code, missing.json["code"]) == (404, "SegmentNotFound")
    assert (bad_json.status_code, bad_json.json["code"]) == (400, "InvalidArgument")
    assert (other_type.status_code, other_type.json["code"]) == (409, "StreamConflict")
    assert (closed.status_code, closed.json["code"]) == (409, "StreamClosed")
    assert closed.headers["Stream-Closed"] == "true"
    assert closed.headers["Stream-Next-Offset"] == "0000000000000000_0000000000000000"
    for response in (missing, bad_json, other_type, closed):
        assert response.content_type == "application/problem+json"
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_a_body_shorter_than_its_content_length_is_refused(client: FlaskClient) -> None:
    put(client, "s")
    short = client.post(
        URL + "s",
        data=b"abc",
        headers={"Content-Type": "text/plain"},
        environ_overrides={"CONTENT_LENGTH": "10"},
    )
    assert (short.status_code, short.json["code"]) == (400, "InvalidArgument")
    assert client.get(URL + "s?offset=-1").data == b""


def test_json_appends_keep_message_boundaries_through_the_shortcut(client: FlaskClient) -> None:
    put(client, "j", Content_Type="application/json")
    post(client, "j", '{"a": 1}', Content_Type="application/json")
    post(client, "j", "[2, 3]", Content_Type="application/json; charset=utf-8")
    assert json.loads(client.get(URL + "j?offset=-1").data) == [{"a": 1}, 2, 3]


def test_shortcut_appends_are_counted_in_the_request_metrics(client: FlaskClient) -> None:
    put(client, "s")
    for _ in range(3):
        post(client, "s", "x")
    line = 'segstore_http_request_duration_seconds_count{method="POST",route="/v1/stream/<stream_path:name>"}'
    counts = [row for row in client.get("/metrics").text.splitlines() if row.startswith(line)]
    assert counts == [f"{line} 3.0"]


def test_concurrent_appends_each_answer_where_their_own_message_ends(client: FlaskClient) -> None:
    """Appends committed in one batch each get their own next offset, not the batch's tail."""
    put(client, "s")
    answers: list[str] = []

    def append_some() -> None:
        for _ in range(10):
            answers.append(post(client, "s", "x" * 6).headers["Stream-Next-Offset"])

    threads = [threading.Thread(target=append_some) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ends = {f"{0:016d}_{10 * i:016d}" for i in range(1, 81)}  # a 4-byte frame length + 6 bytes each
    assert sorted(answers) == sorted(ends)
