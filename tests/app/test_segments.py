"""Segment lifecycle over HTTP: create, info, HEAD, seal, truncate, delete, list, writers."""

from __future__ import annotations

import itertools
import re
import uuid

import pytest
from flask.testing import FlaskClient

from app.params import MAX_JSON_BODY_BYTES
from tests.app.helpers import assert_problem, segment_state

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
INFO_KEYS = {
    "name",
    "length",
    "start_offset",
    "storage_length",
    "sealed",
    "event_count",
    "created",
    "last_modified",
}


def test_create_answers_201_with_info_and_state_headers(client: FlaskClient) -> None:
    response = client.put("/v1/segments/scope/stream/0")
    assert response.status_code == 201
    info = response.get_json()
    assert set(info) == INFO_KEYS
    assert info["name"] == "scope/stream/0"
    assert (info["length"], info["start_offset"], info["sealed"]) == (0, 0, False)
    assert RFC3339_UTC.fullmatch(info["created"])
    assert RFC3339_UTC.fullmatch(info["last_modified"])
    assert segment_state(response) == (0, 0, "false")


def test_create_with_rollover_bytes(client: FlaskClient) -> None:
    response = client.put("/v1/segments/s/r", json={"rollover_bytes": 1 << 20})
    assert response.status_code == 201


def test_create_of_an_existing_name_is_409(client: FlaskClient, segment: str) -> None:
    assert_problem(client.put(segment), 409, "SegmentExists")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'"x"', "JSON object"),
        (b'{"rollover": 5}', "unknown key"),
        (b'{"rollover_bytes": 0}', "rollover_bytes"),
        (b'{"rollover_bytes": -3}', "rollover_bytes"),
        (b'{"rollover_bytes": "5"}', "integer"),
        (b'{"rollover_bytes": true}', "integer"),
        (b'{"rollover_bytes": 1.5}', "integer"),
        (b"\xff\xfe{", "JSON"),
        (b"[" * 5000 + b"]" * 5000, "JSON"),
        (b'{"rollover_bytes": 1' + b"0" * 5000 + b"}", "JSON"),
    ],
)
def test_create_with_a_bad_body_is_400_saying_why(client: FlaskClient, body: bytes, words: str) -> None:
    response = client.put("/v1/segments/s/bad", data=body, content_type="application/json")
    problem = assert_problem(response, 400, "InvalidArgument")
    assert words in problem["detail"]
    assert_problem(client.get("/v1/segments/s/bad:info"), 404, "SegmentNotFound")


def test_create_with_an_oversized_json_body_is_400(client: FlaskClient) -> None:
    body = b'{"rollover_bytes": 5' + b" " * MAX_JSON_BODY_BYTES + b"}"
    response = client.put("/v1/segments/s/big", data=body)
    assert "limit" in assert_problem(response, 400, "InvalidArgument")["detail"]


def test_info_reports_the_state(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abcdef")
    response = client.get(segment + ":info")
    assert response.status_code == 200
    info = response.get_json()
    assert set(info) == INFO_KEYS
    assert info["length"] == 6
    assert info["event_count"] == 1
    assert 0 <= info["storage_length"] <= info["length"]
    assert segment_state(response) == (6, 0, "false")


def test_info_of_a_missing_segment_is_404(client: FlaskClient) -> None:
    assert_problem(client.get("/v1/segments/no/such:info"), 404, "SegmentNotFound")


def test_head_gives_state_in_headers_only(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"12345")
    response = client.head(segment)
    assert response.status_code == 200
    assert response.data == b""
    assert segment_state(response) == (5, 0, "false")


def test_head_of_a_missing_segment_is_404(client: FlaskClient) -> None:
    response = client.head("/v1/segments/no/such")
    assert response.status_code == 404
    assert response.data == b""


def test_seal_is_idempotent_and_stops_appends(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    first = client.post(segment + ":seal")
    assert first.status_code == 200
    assert first.get_json()["sealed"] is True
    assert segment_state(first) == (3, 0, "true")
    second = client.post(segment + ":seal")
    assert second.status_code == 200
    assert second.get_json()["sealed"] is True
    refused = client.post(segment, data=b"more")
    assert_problem(refused, 409, "SegmentSealed")
    assert segment_state(refused) == (3, 0, "true")


def test_seal_of_a_missing_segment_is_404(client: FlaskClient) -> None:
    assert_problem(client.post("/v1/segments/no/such:seal"), 404, "SegmentNotFound")


def test_truncate_moves_the_start_offset_forward_only(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"0123456789")
    response = client.post(segment + ":truncate", json={"offset": 4})
    assert response.status_code == 200
    assert response.get_json()["start_offset"] == 4
    assert segment_state(response) == (10, 4, "false")
    back = client.post(segment + ":truncate", json={"offset": 2})
    assert back.status_code == 200
    assert back.get_json()["start_offset"] == 4


def test_truncate_past_the_length_is_416(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    assert_problem(client.post(segment + ":truncate", json={"offset": 4}), 416, "OffsetOutOfRange")


def test_read_below_the_start_offset_is_410(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"0123456789")
    client.post(segment + ":truncate", json={"offset": 6})
    response = client.get(segment + "?offset=2")
    assert_problem(response, 410, "SegmentTruncated")
    assert response.headers["Segment-Start-Offset"] == "6"
    assert client.get(segment).data == b"6789"


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b"[]", b'{"offset": -1}', b'{"offset": "3"}', b'{"offset": 1, "x": 2}', b"{"],
)
def test_truncate_with_a_bad_body_is_400(client: FlaskClient, segment: str, body: bytes) -> None:
    response = client.post(segment + ":truncate", data=body, content_type="application/json")
    assert_problem(response, 400, "InvalidArgument")


def test_delete_then_404(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    response = client.delete(segment)
    assert response.status_code == 204
    assert response.data == b""
    assert "Content-Type" not in response.headers
    assert_problem(client.get(segment + ":info"), 404, "SegmentNotFound")
    assert_problem(client.get(segment), 404, "SegmentNotFound")
    assert_problem(client.delete(segment), 404, "SegmentNotFound")


def test_a_deleted_name_can_be_created_again_empty(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    client.delete(segment)
    assert client.put(segment).get_json()["length"] == 0


def test_list_pages_in_name_order_with_prefix_after_and_limit(client: FlaskClient) -> None:
    for name in ["p/c", "p/a", "q/a", "p/b", "pz/a"]:
        assert client.put(f"/v1/segments/{name}").status_code == 201
    everything = client.get("/v1/segments").get_json()
    assert [s["name"] for s in everything["segments"]] == ["p/a", "p/b", "p/c", "pz/a", "q/a"]
    assert everything["next"] is None
    assert set(everything["segments"][0]) == INFO_KEYS

    page = client.get("/v1/segments?prefix=p/&limit=2").get_json()
    assert [s["name"] for s in page["segments"]] == ["p/a", "p/b"]
    assert page["next"] == "p/b"
    rest = client.get(f"/v1/segments?prefix=p/&limit=2&after={page['next']}").get_json()
    assert [s["name"] for s in rest["segments"]] == ["p/c"]
    assert rest["next"] is None
    assert client.get("/v1/segments?prefix=none/").get_json() == {"segments": [], "next": None}


@pytest.mark.parametrize("query", ["limit=0", "limit=10001", "limit=abc", "limit=-1", "limit=1&limit=2"])
def test_list_with_a_bad_limit_is_400(client: FlaskClient, query: str) -> None:
    assert_problem(client.get(f"/v1/segments?{query}"), 400, "InvalidArgument")


def test_list_accepts_the_maximum_limit(client: FlaskClient) -> None:
    assert client.get("/v1/segments?limit=10000").status_code == 200


def test_writers_reports_the_last_event_number(client: FlaskClient, segment: str) -> None:
    writer = uuid.uuid4()
    client.post(segment, data=b"e", headers={"Writer-Id": str(writer), "Event-Number": "7"})
    response = client.get(f"{segment}:writers/{writer}")
    assert response.status_code == 200
    assert response.get_json() == {"writer_id": str(writer), "event_number": 7}
    assert segment_state(response) == (1, 0, "false")
    other = uuid.uuid4()
    assert client.get(f"{segment}:writers/{other}").get_json() == {
        "writer_id": str(other),
        "event_number": None,
    }


def test_writers_with_a_bad_uuid_is_400(client: FlaskClient, segment: str) -> None:
    response = client.get(f"{segment}:writers/not-a-uuid")
    assert "UUID" in assert_problem(response, 400, "InvalidArgument")["detail"]


def test_writers_needs_a_writer_id(raw_client: FlaskClient, segment: str) -> None:
    assert_problem(raw_client.get(f"{segment}:writers"), 404, "NotFound")


def test_writers_of_a_missing_segment_is_404(client: FlaskClient) -> None:
    response = client.get(f"/v1/segments/no/such:writers/{uuid.uuid4()}")
    assert_problem(response, 404, "SegmentNotFound")


def test_partitions_cover_the_segment_on_append_boundaries(client: FlaskClient, segment: str) -> None:
    block = b"x" * 4096
    for _ in range(40):  # appends of 4 KiB; boundaries are remembered 64 KiB apart
        assert client.post(f"{segment}", data=block).status_code == 200
    response = client.get(f"{segment}:partitions?target_bytes=65536")
    assert response.status_code == 200
    assert segment_state(response) == (40 * 4096, 0, "false")
    ranges = response.get_json()["partitions"]
    assert ranges[0]["start"] == 0 and ranges[-1]["end"] == 40 * 4096
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(ranges))
    assert all(r["start"] % 4096 == 0 for r in ranges)
    assert [r["start"] for r in ranges] == [0, 65536, 131072]
    whole = client.get(f"{segment}:partitions").get_json()
    assert whole == {"partitions": [{"start": 0, "end": 40 * 4096}]}
    assert_problem(client.get(f"{segment}:partitions?target_bytes=0"), 400, "InvalidArgument")
    assert_problem(client.get("/v1/segments/no/such:partitions"), 404, "SegmentNotFound")


def test_answers_without_a_body_have_no_content_type(client: FlaskClient, segment: str) -> None:
    tail = client.get(segment, query_string={"offset": 0, "wait": 0})
    assert tail.status_code == 204 and "Content-Type" not in tail.headers
    stream = client.put("/v1/stream/no-type/s", content_type="text/plain")
    assert stream.status_code == 201
    appended = client.post("/v1/stream/no-type/s", data=b"x", content_type="text/plain")
    assert appended.status_code == 204 and "Content-Type" not in appended.headers


@pytest.mark.parametrize(
    ("method", "suffix", "query"),
    [
        ("GET", "", "offset=0&max_length=4"),  # a misspelt length would read the whole segment
        ("HEAD", "", "verbose=1"),
        ("POST", "", "offset=0"),
        ("PUT", "", "rollover=1"),
        ("DELETE", "", "force=true"),
        ("GET", ":info", "fields=length"),
        ("POST", ":seal", "now=1"),
        ("GET", ":attributes", "keys=00000000-0000-0000-0000-000000000001&all=1"),
        ("GET", ":partitions", "target=1"),
    ],
)
def test_a_query_parameter_a_route_does_not_serve_is_refused_and_changes_nothing(
    client: FlaskClient, segment: str, method: str, suffix: str, query: str
) -> None:
    assert client.post(segment, data=b"0123456789").status_code == 200
    body = b"more" if method == "POST" else None
    response = client.open(f"{segment}{suffix}?{query}", method=method, data=body)
    assert response.status_code == 400
    if method != "HEAD":
        problem = assert_problem(response, 400, "InvalidArgument")
        assert "unknown query parameter" in problem["detail"]
    assert client.get(f"{segment}:info").get_json()["length"] == 10
    assert client.get(f"{segment}?offset=2&length=4").data == b"2345"


def test_a_listing_refuses_a_parameter_it_does_not_serve(client: FlaskClient, segment: str) -> None:
    body = assert_problem(client.get("/v1/segments?prefix=scope/&max=1"), 400, "InvalidArgument")
    assert "['max']" in body["detail"] and "prefix, after, limit" in body["detail"]
    page = client.get("/v1/segments?prefix=scope/&limit=1").get_json()
    assert page["segments"][0]["name"] == "scope/stream/0"
