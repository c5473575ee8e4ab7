"""Reads over HTTP: offsets, ranges, ETags, the tail (long-poll) and its errors."""

from __future__ import annotations

import threading
import time

import pytest
from flask.testing import FlaskClient

from engine import SegmentStore
from tests.app.conftest import MAX_READ_BYTES, TAIL_WAIT_MAX_S
from tests.app.helpers import assert_problem, segment_state


@pytest.fixture
def filled(client: FlaskClient, segment: str) -> str:
    """The segment holding b"0123456789"."""
    assert client.post(segment, data=b"0123456789").status_code == 200
    return segment


def test_read_everything_by_default(client: FlaskClient, filled: str) -> None:
    response = client.get(filled)
    assert response.status_code == 200
    assert response.data == b"0123456789"
    assert response.mimetype == "application/octet-stream"
    assert response.headers["Segment-Next-Offset"] == "10"
    assert segment_state(response) == (10, 0, "false")
    assert "Content-Range" not in response.headers


def test_read_with_offset_and_length(client: FlaskClient, filled: str) -> None:
    response = client.get(filled + "?offset=3&length=4")
    assert response.status_code == 200
    assert response.data == b"3456"
    assert response.headers["Segment-Next-Offset"] == "7"


def test_read_with_offset_only_goes_to_the_end(client: FlaskClient, filled: str) -> None:
    response = client.get(filled + "?offset=7")
    assert response.data == b"789"
    assert response.headers["Segment-Next-Offset"] == "10"


def test_read_is_capped_at_max_read_bytes(client: FlaskClient, segment: str) -> None:
    for _ in range(3):
        client.post(segment, data=b"y" * 1000)
    response = client.get(segment)
    assert len(response.data) == MAX_READ_BYTES
    assert response.headers["Segment-Next-Offset"] == str(MAX_READ_BYTES)


def test_a_read_of_many_blocks_is_their_bytes_in_order_with_its_length(
    client: FlaskClient, segment: str
) -> None:
    parts = [bytes([i]) * 700 for i in range(3)]  # one cache block each
    for part in parts:
        client.post(segment, data=part)
    response = client.get(segment + "?offset=350")
    assert response.data == b"".join(parts)[350:]
    assert response.headers["Content-Length"] == str(2100 - 350)


def test_range_answers_206_with_content_range(client: FlaskClient, filled: str) -> None:
    response = client.get(filled, headers={"Range": "bytes=2-5"})
    assert response.status_code == 206
    assert response.data == b"2345"
    assert response.headers["Content-Range"] == "bytes 2-5/*"
    assert response.headers["Segment-Next-Offset"] == "6"


def test_open_range_reads_to_the_end(client: FlaskClient, filled: str) -> None:
    response = client.get(filled, headers={"Range": "bytes=6-"})
    assert response.status_code == 206
    assert response.data == b"6789"
    assert response.headers["Content-Range"] == "bytes 6-9/*"


def test_range_past_the_data_returns_what_there_is(client: FlaskClient, filled: str) -> None:
    response = client.get(filled, headers={"Range": "bytes=8-100"})
    assert response.status_code == 206
    assert response.data == b"89"
    assert response.headers["Content-Range"] == "bytes 8-9/*"


@pytest.mark.parametrize(
    "value",
    [
        "bytes=0-1,4-5",
        "bytes=-0",
        "bytes=-",
        "bytes=5-2",
        "bytes=a-b",
        "bytes=0-1x",
        "bytes=99999999999999999999-",
        "bytes",
    ],
)
def test_a_range_that_is_not_one_byte_range_is_ignored(client: FlaskClient, filled: str, value: str) -> None:
    response = client.get(filled, headers={"Range": value})
    assert response.status_code == 200
    assert response.data == b"0123456789" and "Content-Range" not in response.headers


def test_suffix_range_reads_the_last_bytes(client: FlaskClient, filled: str) -> None:
    response = client.get(filled, headers={"Range": "bytes=-3"})
    assert response.status_code == 206
    assert response.data == b"789"
    assert response.headers["Content-Range"] == "bytes 7-9/*"
    whole = client.get(filled, headers={"Range": "bytes=-100"})
    assert whole.status_code == 206 and whole.data == b"0123456789"


@pytest.mark.parametrize("value", ["items=0-1", "lines=-3", "bytes 0-1"])
def test_a_range_of_another_unit_is_ignored(client: FlaskClient, filled: str, value: str) -> None:
    response = client.get(filled, headers={"Range": value})
    assert response.status_code == 200
    assert response.data == b"0123456789" and "Content-Range" not in response.headers


def test_range_and_offset_together_are_400(client: FlaskClient, filled: str) -> None:
    response = client.get(filled + "?offset=1", headers={"Range": "bytes=0-1"})
    assert_problem(response, 400, "InvalidArgument")


@pytest.mark.parametrize(
    "query",
    [
        "offset=-1",
        "offset=abc",
        "offset=1.5",
        "length=0",
        "length=x",
        "offset=1&offset=2",
        "offset=" + "9" * 5000,
        "length=99999999999999999999",
        "wait=-1",
        "wait=abc",
        "wait=nan",
        f"wait={TAIL_WAIT_MAX_S + 1:g}",
    ],
)
def test_bad_read_parameters_are_400(client: FlaskClient, filled: str, query: str) -> None:
    assert_problem(client.get(f"{filled}?{query}"), 400, "InvalidArgument")


def test_read_at_the_end_is_204_with_the_next_offset(client: FlaskClient, filled: str) -> None:
    response = client.get(filled + "?offset=10")
    assert response.status_code == 204
    assert response.data == b""
    assert response.headers["Segment-Next-Offset"] == "10"
    assert response.headers["Segment-Sealed"] == "false"


def test_read_past_the_length_is_416(client: FlaskClient, filled: str) -> None:
    response = client.get(filled + "?offset=11")
    assert_problem(response, 416, "OffsetOutOfRange")
    assert response.headers["Segment-Length"] == "10"
    assert response.headers["Content-Range"] == "bytes */10"


def test_read_of_a_missing_segment_is_404(client: FlaskClient) -> None:
    assert_problem(client.get("/v1/segments/no/such"), 404, "SegmentNotFound")


def test_etag_names_segment_and_range(client: FlaskClient, store: SegmentStore, filled: str) -> None:
    segment_id = store.info("scope/stream/0").segment_id
    response = client.get(filled + "?offset=2&length=3")
    assert response.headers["ETag"] == f'"{segment_id}-2-5"'
    ranged = client.get(filled, headers={"Range": "bytes=0-"})
    assert ranged.headers["ETag"] == f'"{segment_id}-0-10"'


@pytest.mark.parametrize("form", ["{tag}", "W/{tag}", '"other", {tag}', "*"])
def test_if_none_match_answers_304(client: FlaskClient, filled: str, form: str) -> None:
    etag = client.get(filled).headers["ETag"]
    response = client.get(filled, headers={"If-None-Match": form.format(tag=etag)})
    assert response.status_code == 304
    assert response.data == b""
    assert response.headers["ETag"] == etag
    assert response.headers["Segment-Next-Offset"] == "10"


def test_if_none_match_compares_the_range_actually_read(client: FlaskClient, filled: str) -> None:
    etag = client.get(filled).headers["ETag"]
    client.post(filled, data=b"AB")
    response = client.get(filled, headers={"If-None-Match": etag})
    assert response.status_code == 200
    assert response.data == b"0123456789AB"
    assert response.headers["ETag"] != etag


def test_etag_changes_when_the_name_is_recreated(client: FlaskClient, filled: str) -> None:
    etag = client.get(filled).headers["ETag"]
    client.delete(filled)
    client.put(filled)
    client.post(filled, data=b"0123456789")
    assert client.get(filled).headers["ETag"] != etag


def test_long_poll_returns_data_as_soon_as_it_arrives(
    client: FlaskClient, store: SegmentStore, filled: str
) -> None:
    appender = threading.Timer(0.3, lambda: store.append("scope/stream/0", b"late"))
    appender.start()
    started = time.monotonic()
    response = client.get(filled + "?offset=10&wait=4")
    elapsed = time.monotonic() - started
    appender.join()
    assert response.status_code == 200
    assert response.data == b"late"
    assert response.headers["Segment-Next-Offset"] == "14"
    assert 0.2 < elapsed < 3.5


def test_long_poll_times_out_with_204(client: FlaskClient, filled: str) -> None:
    started = time.monotonic()
    response = client.get(filled + "?offset=10&wait=0.5")
    elapsed = time.monotonic() - started
    assert response.status_code == 204
    assert response.headers["Segment-Next-Offset"] == "10"
    assert 0.4 < elapsed < 3


def test_end_of_a_sealed_segment_is_204_at_once(client: FlaskClient, filled: str) -> None:
    client.post(filled + ":seal")
    started = time.monotonic()
    response = client.get(filled + f"?offset=10&wait={TAIL_WAIT_MAX_S:g}")
    assert time.monotonic() - started < 1
    assert response.status_code == 204
    assert response.headers["Segment-Sealed"] == "true"
    assert response.headers["Segment-Next-Offset"] == "10"


def test_a_sealed_segment_still_reads(client: FlaskClient, filled: str) -> None:
    client.post(filled + ":seal")
    response = client.get(filled + "?offset=4")
    assert response.data == b"456789"
    assert response.headers["Segment-Sealed"] == "true"
