"""The error table: every engine error code to its status, with its headers.

Errors the engine only raises under load or failure (back-pressure, a full
Tier 1, corruption) are injected by replacing one store method.
"""

from __future__ import annotations

import logging
import time

import pytest
from flask.testing import FlaskClient

from engine import (
    BadOffset,
    ConditionalCheckFailed,
    ContainerNotReady,
    DataCorrupted,
    InvalidArgument,
    InvalidName,
    PayloadTooLarge,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
    SegmentTruncated,
    SegstoreError,
    StorageFull,
    Throttled,
)
from tests.app.helpers import assert_problem, segment_state

INFO = SegmentInfo(
    name="s/t/0",
    segment_id=9,
    length=42,
    start_offset=7,
    storage_length=20,
    sealed=True,
    event_count=3,
    created=time.time(),
    last_modified=time.time(),
)


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (InvalidName("bad"), 400, "InvalidName"),
        (InvalidArgument("bad"), 400, "InvalidArgument"),
        (SegmentNotFound("gone"), 404, "SegmentNotFound"),
        (SegmentExists("taken"), 409, "SegmentExists"),
        (SegmentSealed("sealed"), 409, "SegmentSealed"),
        (SegmentTruncated("below"), 410, "SegmentTruncated"),
        (ConditionalCheckFailed("no"), 412, "ConditionalCheckFailed"),
        (PayloadTooLarge("big"), 413, "PayloadTooLarge"),
        (BadOffset("past"), 416, "OffsetOutOfRange"),
        (Throttled("slow down"), 503, "Throttled"),
        (ContainerNotReady("recovering"), 503, "Throttled"),
        (StorageFull("full"), 507, "StorageFull"),
        (DataCorrupted("bad frame"), 500, "DataCorrupted"),
    ],
)
def test_each_engine_error_maps_to_its_status(
    raw_client: FlaskClient,
    store: SegmentStore,
    monkeypatch: pytest.MonkeyPatch,
    error: SegstoreError,
    status: int,
    code: str,
) -> None:
    def fail(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr(store, "info", fail)
    problem = assert_problem(raw_client.get("/v1/segments/s/t/0:info"), status, code)
    assert problem["detail"] == error.detail
    assert problem["type"].endswith(code)


def test_segment_headers_ride_on_errors_that_know_the_segment(
    raw_client: FlaskClient, store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_args: object, **_kwargs: object) -> None:
        raise SegmentSealed("sealed", segment=INFO)

    monkeypatch.setattr(store, "seal", fail)
    response = raw_client.post("/v1/segments/s/t/0:seal")
    assert_problem(response, 409, "SegmentSealed")
    assert segment_state(response) == (42, 7, "true")


@pytest.mark.parametrize(("retry_after_s", "header"), [(1.0, "1"), (1.2, "2"), (0.0, "0")])
def test_throttled_carries_retry_after_rounded_up(
    raw_client: FlaskClient,
    store: SegmentStore,
    monkeypatch: pytest.MonkeyPatch,
    retry_after_s: float,
    header: str,
) -> None:
    def fail(*_args: object, **_kwargs: object) -> None:
        raise Throttled("Tier 2 is behind", retry_after_s=retry_after_s)

    monkeypatch.setattr(store, "append", fail)
    response = raw_client.post("/v1/segments/s/t/0", data=b"x")
    assert_problem(response, 503, "Throttled")
    assert response.headers["Retry-After"] == header


def test_an_unexpected_error_is_a_500_problem_without_internals(
    raw_client: FlaskClient,
    store: SegmentStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("secret internal state")

    monkeypatch.setattr(store, "info", fail)
    with caplog.at_level(logging.ERROR):
        response = raw_client.get("/v1/segments/s/t/0:info")
    body = assert_problem(response, 500, "Internal")
    assert "secret" not in response.get_data(as_text=True)
    assert "Traceback" not in body["detail"]
    assert "secret internal state" in caplog.text
    request_id = body["detail"].rsplit(" ", 1)[-1]
    assert f"GET /v1/segments/{{name}}:info request {request_id}" in caplog.text


def test_a_logged_engine_error_names_its_request(
    raw_client: FlaskClient,
    store: SegmentStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail(*_args: object, **_kwargs: object) -> None:
        raise DataCorrupted("bad frame")

    monkeypatch.setattr(store, "seal", fail)
    with caplog.at_level(logging.ERROR):
        assert_problem(raw_client.post("/v1/segments/s/t/0:seal"), 500, "DataCorrupted")
    [line] = [r.getMessage() for r in caplog.records if "bad frame" in r.getMessage()]
    assert line.startswith("POST /v1/segments/")
    assert " request " in line and line.endswith("DataCorrupted: bad frame")


def test_names_in_problem_details_are_utf8_not_escapes(raw_client: FlaskClient) -> None:
    response = raw_client.get("/v1/segments/sensors/🌡/0:info")
    assert_problem(response, 404, "SegmentNotFound")
    assert "🌡" in response.get_data(as_text=True)
