"""The live tail as Server-Sent Events.

Every stream here ends by itself (sealed, deleted or closed, from a timer
thread when needed), so the tests hold whether the client reads the stream
as it comes or all at once.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from collections.abc import Callable, Iterable

import pytest
from flask.testing import FlaskClient

from app.settings import HttpSettings
from engine import SegmentStore, Settings
from tests.app.helpers import assert_problem

NAME = "scope/stream/0"
SSE = {"Accept": "text/event-stream"}


def parse_events(chunks: Iterable[bytes]) -> list[dict[str, str]]:
    """Split an event stream into events: {"event", "id", "data"} or {"comment"}."""
    text = b"".join(chunks).decode()
    assert text.endswith("\n\n"), text[-80:]
    events = []
    for block in text[:-2].split("\n\n"):
        event: dict[str, str] = {}
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            key = field or "comment"
            event[key] = value[1:] if value.startswith(" ") else value
        events.append(event)
    return events


def stream(client: FlaskClient, url: str, headers: dict[str, str] | None = None) -> list[dict]:
    with client.get(url, headers={**SSE, **(headers or {})}, buffered=False) as response:
        assert response.status_code == 200
        assert response.mimetype == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache, no-transform"
        assert response.headers["X-Accel-Buffering"] == "no"
        assert "Segment-Length" in response.headers
        return parse_events(response.response)


def stream_while(
    client: FlaskClient, segment: str, after_s: float, action: Callable[[], object]
) -> list[dict]:
    """The events of a stream during which ``action`` runs once, ``after_s`` seconds in (from a timer)."""
    timer = threading.Timer(after_s, action)
    timer.start()
    events = stream(client, segment)
    timer.join()
    return events


def appended_then_sealed(store: SegmentStore, *pieces: bytes) -> Callable[[], None]:
    def append_and_seal() -> None:
        for piece in pieces:
            store.append(NAME, piece)
        store.seal(NAME)

    return append_and_seal


def data_of(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["data"]) for e in events if e.get("event") == "data")


def test_stream_of_a_sealed_segment_sends_data_then_sealed(
    client: FlaskClient, store: SegmentStore, segment: str
) -> None:
    store.append(NAME, b"hello ")
    store.append(NAME, b"world")
    store.seal(NAME)
    events = stream(client, segment)
    assert events[0]["event"] == "data"
    assert data_of(events) == b"hello world"
    assert events[-1]["event"] == "sealed"
    assert events[-1]["id"] == "11"
    assert json.loads(events[-1]["data"]) == {"length": 11}
    ids = [int(e["id"]) for e in events if e.get("event") == "data"]
    assert ids == sorted(ids) and ids[-1] == 11


def test_stream_starts_at_offset(client: FlaskClient, store: SegmentStore, segment: str) -> None:
    store.append(NAME, b"0123456789")
    store.seal(NAME)
    assert data_of(stream(client, segment + "?offset=4")) == b"456789"


def test_last_event_id_wins_over_offset(client: FlaskClient, store: SegmentStore, segment: str) -> None:
    store.append(NAME, b"0123456789")
    store.seal(NAME)
    events = stream(client, segment + "?offset=2", {"Last-Event-ID": "7"})
    assert data_of(events) == b"789"


def test_stream_follows_appends_as_they_come(client: FlaskClient, store: SegmentStore, segment: str) -> None:
    events = stream_while(client, segment, 0.3, appended_then_sealed(store, b"first ", b"second"))
    assert data_of(events) == b"first second"
    assert events[-1]["event"] == "sealed"
    assert events[0] == {"comment": "keepalive"}


def test_idle_stream_sends_keepalives_and_ends_on_delete(
    client: FlaskClient, store: SegmentStore, segment: str
) -> None:
    events = stream_while(client, segment, 0.9, lambda: store.delete(NAME))
    assert len(events) >= 3
    assert all(e == {"comment": "keepalive"} for e in events)


class TestAKeepaliveLongerThanTheLongestTailWait:
    """The stream waits tail_wait_max_s at a time (a longer wait the store refuses, ending the stream)."""

    @pytest.fixture
    def settings(self, settings: Settings) -> Settings:
        return dataclasses.replace(settings, tail_wait_max_s=0.3)

    @pytest.fixture
    def http(self, http: HttpSettings) -> HttpSettings:
        return http.replace(sse_keepalive_s=15)

    def test_the_stream_keeps_following(self, client: FlaskClient, store: SegmentStore, segment: str) -> None:
        events = stream_while(client, segment, 1.0, appended_then_sealed(store, b"late"))
        assert data_of(events) == b"late" and events[-1]["event"] == "sealed"
        assert events[:3] == [{"comment": "keepalive"}] * 3


def test_stream_ends_when_the_store_closes(client: FlaskClient, store: SegmentStore, segment: str) -> None:
    events = stream_while(client, segment, 0.3, store.close)
    assert events and all("comment" in e for e in events)


def test_stream_of_a_missing_segment_is_a_404_problem(client: FlaskClient) -> None:
    response = client.get("/v1/segments/no/such", headers=SSE)
    assert_problem(response, 404, "SegmentNotFound")


def test_stream_past_the_length_is_416(client: FlaskClient, segment: str) -> None:
    assert_problem(client.get(segment + "?offset=3", headers=SSE), 416, "OffsetOutOfRange")


def test_stream_refuses_length_range_and_wait(client: FlaskClient, segment: str) -> None:
    for query, headers in [("?length=3", {}), ("", {"Range": "bytes=0-"}), ("?wait=1", {})]:
        response = client.get(segment + query, headers={**SSE, **headers})
        assert_problem(response, 400, "InvalidArgument")


def test_bad_last_event_id_is_400(client: FlaskClient, segment: str) -> None:
    response = client.get(segment, headers={**SSE, "Last-Event-ID": "abc"})
    assert_problem(response, 400, "InvalidHeader")


def test_without_the_accept_header_a_read_is_plain_bytes(
    client: FlaskClient, store: SegmentStore, segment: str
) -> None:
    store.append(NAME, b"raw")
    response = client.get(segment, headers={"Accept": "*/*"})
    assert response.mimetype == "application/octet-stream"
    assert response.data == b"raw"
