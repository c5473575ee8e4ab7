"""The native read shortcut (``app.native.read_shortcut.NativeReadShortcut``): the same answers as Flask's
view, long-polls woken by appends, errors rendered by Flask's handlers, everything else left to Flask."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from tests.app.test_append_shortcut import flask_requests

URL = "/v1/segments/"
# Not one of the plain Accept values, and preferring raw bytes: Flask's view gives the same answer.
VIEW = {"Accept": "application/octet-stream, text/plain;q=0.1"}


def _same_answer(fast: Any, slow: Any) -> None:
    assert (fast.status_code, fast.data) == (slow.status_code, slow.data)
    assert sorted(fast.headers.items()) == sorted(slow.headers.items())


def test_plain_reads_skip_flask_and_answer_as_flask_does(app: Flask, client: FlaskClient) -> None:
    client.put(URL + "s")
    client.post(URL + "s", data=b"abcdef")
    for query in ("", "?offset=2", "?offset=6", "?offset=6&wait=0.01", "?wait=0&offset=1"):
        with flask_requests(app) as seen:
            fast = client.get(URL + "s" + query, headers={"Accept": "*/*"})
        assert seen == [], query
        with flask_requests(app) as seen:
            slow = client.get(URL + "s" + query, headers=VIEW)
        assert seen == [f"/v1/segments/s{query}"]
        _same_answer(fast, slow)
    assert client.get(URL + "s?offset=2").data == b"cdef"
    empty = client.get(URL + "s?offset=6")
    assert empty.status_code == 204 and "Content-Type" not in empty.headers
    assert empty.headers["Segment-Next-Offset"] == "6"


def test_a_shortcut_long_poll_is_answered_by_the_next_append(client: FlaskClient) -> None:
    client.put(URL + "s")
    answers: list[Any] = []
    poll = threading.Thread(target=lambda: answers.append(client.get(URL + "s?offset=0&wait=3")))
    started = time.monotonic()
    poll.start()
    time.sleep(0.2)
    client.post(URL + "s", data=b"tail")
    poll.join(10)
    assert time.monotonic() - started < 2.5
    assert (answers[0].status_code, answers[0].data) == (200, b"tail")
    assert answers[0].headers["Segment-Next-Offset"] == "4"


def test_errors_of_the_shortcut_are_those_of_the_view(client: FlaskClient) -> None:
    client.put(URL + "s")
    client.post(URL + "s", data=b"abc")
    cases = [
        ("missing", 404, "SegmentNotFound"),
        ("s?offset=9", 416, "OffsetOutOfRange"),
        ("s?offset=-1", 400, "InvalidArgument"),
        ("s?wait=1e9", 400, "InvalidArgument"),
        ("s?wait=soon", 400, "InvalidArgument"),
        ("a/../b", 400, "InvalidName"),
        ("%23s3/buckets/b", 400, "InvalidName"),
    ]
    for target, status, code in cases:
        fast = client.get(URL + target)
        slow = client.get(URL + target, headers=VIEW)
        assert (fast.status_code, fast.get_json()["code"]) == (status, code), target
        assert fast.get_json() == slow.get_json()
        assert sorted(fast.headers.items()) == sorted(slow.headers.items())


def test_what_is_more_than_a_plain_read_goes_to_flask(app: Flask, client: FlaskClient) -> None:
    client.put(URL + "s")
    client.post(URL + "s", data=b"abcdef")
    etag = client.get(URL + "s").headers["ETag"]
    views = [
        (URL + "s?length=2", {}, 200),
        (URL + "s?offset=1&offset=2", {}, 400),  # given twice: Flask names the error
        (URL + "s?offs%65t=1", {}, 200),  # percent-encoded: Flask decodes it
        (URL + "s", {"Range": "bytes=0-1"}, 206),
        (URL + "s", {"If-None-Match": etag}, 304),
        (URL + "s", {"Accept": "text/event-stream"}, 200),
        (URL + "s:info", {}, 200),
    ]
    for target, headers, status in views:
        with flask_requests(app) as seen:
            answer = client.get(target, headers=headers, buffered=False)
            assert answer.status_code == status, (target, headers)
            answer.close()
        assert len(seen) == 1, (target, headers)


def test_shortcut_reads_are_counted_in_the_request_metrics(client: FlaskClient) -> None:
    client.put(URL + "s")
    for _ in range(3):
        client.get(URL + "s")
    line = 'segstore_http_request_duration_seconds_count{method="GET",route="/v1/segments/{name}"}'
    counts = [row for row in client.get("/metrics").text.splitlines() if row.startswith(line)]
    assert counts == [f"{line} 3.0"]
