"""Appends over HTTP: plain, conditional on the length, deduplicated, and refused ones."""

from __future__ import annotations

import io
import uuid

import pytest
from flask import Request
from flask.testing import FlaskClient
from werkzeug.test import EnvironBuilder

from tests.app.conftest import MAX_APPEND_BYTES
from tests.app.helpers import assert_problem, segment_state


def _length(client: FlaskClient, url: str) -> int:
    return int(client.head(url).headers["Segment-Length"])


def test_plain_appends_are_contiguous(client: FlaskClient, segment: str) -> None:
    first = client.post(segment, data=b"hello")
    assert first.status_code == 200
    assert first.get_json() == {"offset": 0, "length": 5}
    assert first.headers["Segment-Offset"] == "0"
    assert segment_state(first) == (5, 0, "false")
    second = client.post(segment, data=b" world", content_type="text/plain")
    assert second.get_json() == {"offset": 5, "length": 11}
    assert second.headers["Segment-Offset"] == "5"
    assert second.headers["Segment-Length"] == "11"
    assert client.get(segment).data == b"hello world"


def test_any_content_type_is_stored_as_bytes(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b'{"a": 1}', content_type="application/json")
    client.post(segment, data=b"a=1&b=2", content_type="application/x-www-form-urlencoded")
    assert client.get(segment).data == b'{"a": 1}a=1&b=2'


@pytest.mark.parametrize("coding", [None, "identity"])  # the append shortcut, and the view (a coding named)
def test_append_to_a_missing_segment_says_to_create_it_first(client: FlaskClient, coding: str | None) -> None:
    named = {"HTTP_TRANSFER_ENCODING": coding} if coding else {}
    sent = client.post("/v1/segments/no/such", data=b"x", environ_overrides=named)
    problem = assert_problem(sent, 404, "SegmentNotFound")
    assert problem["detail"].endswith("create it first: PUT /v1/segments/no/such")


def test_expected_offset_appends_only_at_that_length(client: FlaskClient, segment: str) -> None:
    ok = client.post(segment, data=b"abc", headers={"Expected-Offset": "0"})
    assert ok.get_json() == {"offset": 0, "length": 3}
    stale = client.post(segment, data=b"def", headers={"Expected-Offset": "0"})
    assert_problem(stale, 412, "ConditionalCheckFailed")
    assert stale.headers["Segment-Length"] == "3"
    assert client.post(segment, data=b"def", headers={"Expected-Offset": "3"}).status_code == 200
    assert client.get(segment).data == b"abcdef"


def test_writer_event_numbers_deduplicate(client: FlaskClient, segment: str) -> None:
    writer = str(uuid.uuid4())
    first = client.post(segment, data=b"e1", headers={"Writer-Id": writer, "Event-Number": "1"})
    assert first.get_json() == {"offset": 0, "length": 2}
    assert "Segment-Duplicate" not in first.headers

    retry = client.post(segment, data=b"e1", headers={"Writer-Id": writer, "Event-Number": "1"})
    assert retry.status_code == 200
    assert retry.get_json() == {"duplicate": True, "event_number": 1, "length": 2}
    assert retry.headers["Segment-Duplicate"] == "true"
    assert segment_state(retry) == (2, 0, "false")

    nxt = client.post(segment, data=b"e2", headers={"Writer-Id": writer, "Event-Number": "2"})
    assert nxt.get_json() == {"offset": 2, "length": 4}
    older = client.post(segment, data=b"e0", headers={"Writer-Id": writer, "Event-Number": "0"})
    assert older.get_json() == {"duplicate": True, "event_number": 2, "length": 4}

    other = client.post(segment, data=b"x1", headers={"Writer-Id": str(uuid.uuid4()), "Event-Number": "1"})
    assert other.get_json() == {"offset": 4, "length": 6}
    assert client.get(segment).data == b"e1e2x1"


def test_event_count_adds_to_the_event_count(client: FlaskClient, segment: str) -> None:
    writer = str(uuid.uuid4())
    headers = {"Writer-Id": writer, "Event-Number": "5", "Event-Count": "5"}
    assert client.post(segment, data=b"12345", headers=headers).status_code == 200
    assert client.get(segment + ":info").get_json()["event_count"] == 5


WRITER = "0f8fad5b-d9cb-469f-a165-70867728950e"


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({"Writer-Id": WRITER}, "Event-Number"),
        ({"Event-Number": "1"}, "Writer-Id"),
        ({"Writer-Id": "not-a-uuid", "Event-Number": "1"}, "UUID"),
        ({"Writer-Id": "0f8fad5bd9cb469fa16570867728950e", "Event-Number": "1"}, "UUID"),
        ({"Writer-Id": WRITER, "Event-Number": "-1"}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "+1"}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "1.0"}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "1_000"}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "0x10"}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": str(2**63)}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "7" * 5000}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": ""}, "Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "1", "Event-Count": "0"}, "Event-Count"),
        ({"Event-Count": "many"}, "Event-Count"),
        ({"Expected-Offset": "-1"}, "Expected-Offset"),
        ({"Expected-Offset": "abc"}, "Expected-Offset"),
        ({"Expected-Offset": "1e3"}, "Expected-Offset"),
        ([("Expected-Offset", "0"), ("Expected-Offset", "0")], "Expected-Offset"),
        ({"Previous-Event-Number": "1"}, "Previous-Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "3", "Previous-Event-Number": "3"}, "Previous-Event-Number"),
        ({"Writer-Id": WRITER, "Event-Number": "3", "Previous-Event-Number": "-1"}, "Previous-Event-Number"),
    ],
)
def test_bad_append_headers_are_400_and_append_nothing(
    client: FlaskClient, segment: str, headers: object, words: str
) -> None:
    response = client.post(segment, data=b"payload", headers=headers)
    assert words in assert_problem(response, 400, "InvalidHeader")["detail"]
    assert _length(client, segment) == 0


def test_header_values_may_carry_white_space(client: FlaskClient, segment: str) -> None:
    response = client.post(segment, data=b"x", headers={"Expected-Offset": " 0\t"})
    assert response.status_code == 200


def test_an_empty_append_is_400_saying_so(client: FlaskClient, segment: str) -> None:
    response = client.post(segment, data=b"")
    assert "empty" in assert_problem(response, 400, "InvalidArgument")["detail"]


def test_an_append_of_exactly_the_limit_is_accepted(client: FlaskClient, segment: str) -> None:
    response = client.post(segment, data=b"x" * MAX_APPEND_BYTES)
    assert response.get_json() == {"offset": 0, "length": MAX_APPEND_BYTES}


def test_an_append_over_the_limit_is_413_by_content_length(client: FlaskClient, segment: str) -> None:
    response = client.post(segment, data=b"x" * (MAX_APPEND_BYTES + 1))
    assert str(MAX_APPEND_BYTES) in assert_problem(response, 413, "PayloadTooLarge")["detail"]
    assert _length(client, segment) == 0


class EndlessBody(io.RawIOBase):
    """A chunked request body that never ends, counting what the server reads of it."""

    def __init__(self) -> None:
        self.served = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        buffer[:] = b"x" * len(buffer)
        self.served += len(buffer)
        return len(buffer)


def _chunked_post(client: FlaskClient, url: str, body: io.RawIOBase):
    """POST with no Content-Length, as a chunked request arrives from gunicorn."""
    environ = EnvironBuilder(path=url, method="POST").get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    environ["wsgi.input"] = body
    environ["wsgi.input_terminated"] = True
    return client.open(Request(environ))


def test_a_chunked_append_over_the_limit_is_413_without_reading_it_all(
    client: FlaskClient, segment: str
) -> None:
    body = EndlessBody()
    response = _chunked_post(client, segment, body)
    assert_problem(response, 413, "PayloadTooLarge")
    assert MAX_APPEND_BYTES < body.served <= MAX_APPEND_BYTES + 1
    assert _length(client, segment) == 0


def test_a_chunked_append_within_the_limit_is_stored(client: FlaskClient, segment: str) -> None:
    response = _chunked_post(client, segment, io.BytesIO(b"chunked bytes"))
    assert response.get_json() == {"offset": 0, "length": 13}
    assert client.get(segment).data == b"chunked bytes"


def test_a_conditional_append_lands_only_after_the_writers_previous_batch(
    client: FlaskClient, segment: str
) -> None:
    """Batches pipelined out of order: the one that overtakes is refused (412), then lands in order."""

    def send(number: int, previous: int | None, data: bytes) -> object:
        headers = {"Writer-Id": WRITER, "Event-Number": str(number)}
        if previous is not None:
            headers["Previous-Event-Number"] = str(previous)
        return client.post(segment, data=data, headers=headers)

    early = send(4, 2, b"second")  # the batch of events 3-4 arrives before that of 1-2
    assert_problem(early, 412, "ConditionalCheckFailed")
    assert "Writer-Event-Number" not in early.headers  # nothing stored for the writer yet
    assert send(2, None, b"first").get_json() == {"offset": 0, "length": 5}
    wrong = send(6, 3, b"third")
    assert_problem(wrong, 412, "ConditionalCheckFailed")
    assert wrong.headers["Writer-Event-Number"] == "2"
    assert send(4, 2, b"second").get_json() == {"offset": 5, "length": 11}
    retried = send(4, 2, b"second")
    assert retried.headers["Segment-Duplicate"] == "true"
    assert retried.get_json() == {"duplicate": True, "event_number": 4, "length": 11}
    assert client.get(segment).data == b"firstsecond"
