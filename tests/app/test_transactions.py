"""Transactions and merges over HTTP: open, append, info, commit, abort; merge of a sealed segment."""

from __future__ import annotations

import uuid

import pytest
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.app.helpers import assert_problem, segment_state

WRITER = "0f8fad5b-d9cb-469f-a165-70867728950e"
# Every (method, path after the transaction id) that addresses one transaction.
TRANSACTION_CALLS = [("GET", ""), ("POST", ""), ("DELETE", ""), ("POST", "/commit")]


def _open(client: FlaskClient, segment: str) -> str:
    """Open a transaction of ``segment``; returns its URL."""
    response = client.post(segment + ":transactions")
    assert response.status_code == 201, response.get_data(as_text=True)
    return f"{segment}:transactions/{response.get_json()['id']}"


def _sealed_segment(client: FlaskClient, url: str, data: bytes) -> None:
    assert client.put(url).status_code == 201
    if data:
        assert client.post(url, data=data).status_code == 200
    assert client.post(url + ":seal").status_code == 200


def _merge(client: FlaskClient, target: str, source: str) -> TestResponse:
    return client.post(target + ":merge", json={"source": source})


# ----------------------------------------------------------------- transactions
def test_open_answers_201_with_the_id_location_and_parent_state(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"head")
    response = client.post(segment + ":transactions")
    assert response.status_code == 201
    txid = response.get_json()["id"]
    assert str(uuid.UUID(txid)) == txid
    assert response.headers["Location"] == f"{segment}:transactions/{txid}"
    assert segment_state(response) == (4, 0, "false")
    assert client.get(response.headers["Location"]).get_json()["id"] == txid


def test_two_opens_give_two_transactions(client: FlaskClient, segment: str) -> None:
    assert _open(client, segment) != _open(client, segment)


def test_the_location_of_a_name_with_a_space_is_percent_encoded(client: FlaskClient) -> None:
    client.put("/v1/segments/scope/my stream/0")
    response = client.post("/v1/segments/scope/my stream/0:transactions")
    location = response.headers["Location"]
    assert location.startswith("/v1/segments/scope/my%20stream/0:transactions/")
    assert client.get(location).get_json()["parent"] == "scope/my stream/0"


def test_appends_to_a_transaction_answer_like_appends(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"parent bytes")
    tx = _open(client, segment)
    first = client.post(tx, data=b"abc")
    assert first.status_code == 200
    assert first.get_json() == {"offset": 0, "length": 3}
    assert first.headers["Segment-Offset"] == "0"
    assert segment_state(first) == (3, 0, "false")  # the transaction's own state
    second = client.post(tx, data=b"defg", headers={"Expected-Offset": "3"})
    assert second.get_json() == {"offset": 3, "length": 7}
    assert second.headers["Segment-Offset"] == "3"


def test_transaction_info_has_the_info_fields_its_id_and_parent(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"12345", headers={"Writer-Id": WRITER, "Event-Number": "4", "Event-Count": "5"})
    response = client.get(tx)
    assert response.status_code == 200
    info = response.get_json()
    assert info["id"] == tx.rsplit("/", 1)[1]
    assert info["parent"] == "scope/stream/0"
    assert (info["length"], info["start_offset"], info["sealed"], info["event_count"]) == (5, 0, False, 5)
    assert {"name", "storage_length", "created", "last_modified"} <= set(info)
    assert segment_state(response) == (5, 0, "false")


def test_head_of_a_transaction_is_its_state_without_a_body(raw_client: FlaskClient, segment: str) -> None:
    tx = _open(raw_client, segment)
    raw_client.post(tx, data=b"abc")
    response = raw_client.head(tx)
    assert response.status_code == 200
    assert response.data == b""
    assert segment_state(response) == (3, 0, "false")


def test_open_bytes_are_invisible_until_commit_then_contiguous(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"head")
    tx = _open(client, segment)
    client.post(tx, data=b"txn-")
    client.post(segment, data=b"|mid|")  # the parent moves on while the transaction is open
    client.post(tx, data=b"bytes")
    assert client.get(segment).data == b"head|mid|"
    assert client.head(segment).headers["Segment-Length"] == "9"
    assert client.get(segment + ":info").get_json()["event_count"] == 2

    committed = client.post(tx + "/commit")
    assert committed.status_code == 200
    assert committed.get_json() == {"offset": 9, "length": 18}
    assert segment_state(committed) == (18, 0, "false")  # the parent's state
    assert client.get(segment + "?offset=9").data == b"txn-bytes"
    assert client.get(segment).data == b"head|mid|txn-bytes"
    assert client.get(segment + ":info").get_json()["event_count"] == 4


def test_commit_is_idempotent(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"ab")
    tx = _open(client, segment)
    client.post(tx, data=b"xyz")
    first = client.post(tx + "/commit")
    assert first.get_json() == {"offset": 2, "length": 5}
    client.post(segment, data=b"later")
    again = client.post(tx + "/commit")
    assert again.status_code == 200
    assert again.get_json() == first.get_json()
    assert again.headers["Segment-Length"] == "10"  # the headers carry the parent's state now
    assert client.get(segment).data == b"abxyzlater"


def test_a_committed_transaction_is_gone(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"abc")
    client.post(tx + "/commit")
    assert_problem(client.get(tx), 404, "SegmentNotFound")
    assert_problem(client.post(tx, data=b"late"), 404, "SegmentNotFound")
    assert client.get(segment).data == b"abc"


def test_an_empty_transaction_commits_nothing(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    tx = _open(client, segment)
    assert client.post(tx + "/commit").get_json() == {"offset": 3, "length": 3}
    assert client.get(segment).data == b"abc"


def test_abort_drops_the_bytes(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"keep")
    tx = _open(client, segment)
    client.post(tx, data=b"drop")
    response = client.delete(tx)
    assert response.status_code == 204
    assert response.data == b""
    assert client.get(segment).data == b"keep"
    detail = assert_problem(client.get(tx), 404, "SegmentNotFound")["detail"]
    assert "transaction" in detail and "#" not in detail
    assert_problem(client.post(tx, data=b"x"), 404, "SegmentNotFound")
    assert_problem(client.delete(tx), 404, "SegmentNotFound")


def test_commit_after_abort_is_404(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"abc")
    client.delete(tx)
    detail = assert_problem(client.post(tx + "/commit"), 404, "SegmentNotFound")["detail"]
    assert tx.rsplit("/", 1)[1] in detail
    assert client.head(segment).headers["Segment-Length"] == "0"


def test_append_deduplicates_inside_a_transaction(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    headers = {"Writer-Id": WRITER, "Event-Number": "1"}
    first = client.post(tx, data=b"e1", headers=headers)
    assert first.get_json() == {"offset": 0, "length": 2}
    assert "Segment-Duplicate" not in first.headers
    retry = client.post(tx, data=b"e1", headers=headers)
    assert retry.status_code == 200
    assert retry.get_json() == {"duplicate": True, "event_number": 1, "length": 2}
    assert retry.headers["Segment-Duplicate"] == "true"
    assert "Segment-Offset" not in retry.headers
    assert client.post(tx, data=b"e2", headers={**headers, "Event-Number": "2"}).status_code == 200
    assert client.post(tx + "/commit").get_json() == {"offset": 0, "length": 4}
    assert client.get(segment).data == b"e1e2"


def test_expected_offset_in_a_transaction_is_checked_against_its_length(
    client: FlaskClient, segment: str
) -> None:
    client.post(segment, data=b"parent")
    tx = _open(client, segment)
    stale = client.post(tx, data=b"x", headers={"Expected-Offset": "6"})
    assert_problem(stale, 412, "ConditionalCheckFailed")
    assert stale.headers["Segment-Length"] == "0"
    assert client.post(tx, data=b"x", headers={"Expected-Offset": "0"}).status_code == 200


@pytest.mark.parametrize(
    ("data", "headers", "code"),
    [
        (b"x", {"Event-Number": "1"}, "InvalidHeader"),
        (b"x", {"Writer-Id": "nope", "Event-Number": "1"}, "InvalidHeader"),
        (b"", {}, "InvalidArgument"),
    ],
)
def test_bad_transaction_appends_are_400_and_append_nothing(
    client: FlaskClient, segment: str, data: bytes, headers: dict[str, str], code: str
) -> None:
    tx = _open(client, segment)
    assert_problem(client.post(tx, data=data, headers=headers), 400, code)
    assert client.get(tx).get_json()["length"] == 0


def test_a_transaction_append_over_the_limit_is_413(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    assert_problem(client.post(tx, data=b"x" * 5000), 413, "PayloadTooLarge")


def test_open_on_a_missing_parent_is_404(client: FlaskClient) -> None:
    assert_problem(client.post("/v1/segments/no/such:transactions"), 404, "SegmentNotFound")


def test_open_on_a_sealed_parent_is_409(client: FlaskClient, segment: str) -> None:
    client.post(segment + ":seal")
    response = client.post(segment + ":transactions")
    assert_problem(response, 409, "SegmentSealed")
    assert response.headers["Segment-Sealed"] == "true"


def test_commit_into_a_parent_sealed_meanwhile_is_409(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"abc")
    client.post(segment + ":seal")
    assert_problem(client.post(tx + "/commit"), 409, "SegmentSealed")
    assert client.head(segment).headers["Segment-Length"] == "0"


@pytest.mark.parametrize(("method", "suffix"), TRANSACTION_CALLS)
def test_an_unknown_transaction_is_404(client: FlaskClient, segment: str, method: str, suffix: str) -> None:
    url = f"{segment}:transactions/{uuid.uuid4()}{suffix}"
    assert_problem(client.open(url, method=method, data=b"x"), 404, "SegmentNotFound")


@pytest.mark.parametrize("txid", ["not-a-uuid", "0f8fad5bd9cb469fa16570867728950e", "7" * 100])
@pytest.mark.parametrize(("method", "suffix"), TRANSACTION_CALLS)
def test_a_transaction_id_that_is_not_a_uuid_is_400(
    client: FlaskClient, segment: str, txid: str, method: str, suffix: str
) -> None:
    response = client.open(f"{segment}:transactions/{txid}{suffix}", method=method, data=b"x")
    assert "transaction id must be a UUID" in assert_problem(response, 400, "InvalidArgument")["detail"]


def test_an_empty_transaction_id_is_400_as_for_writers(raw_client: FlaskClient, segment: str) -> None:
    for path in [":transactions/", ":transactions//commit", ":writers/"]:
        response = raw_client.open(segment + path, method="GET" if "writers" in path else "POST")
        assert "must be a UUID" in assert_problem(response, 400, "InvalidArgument")["detail"]


def test_transactions_are_not_listed(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"abc")
    names = [s["name"] for s in client.get("/v1/segments").get_json()["segments"]]
    assert names == ["scope/stream/0"]


def test_deleting_the_parent_drops_its_transactions(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"abc")
    assert client.delete(segment).status_code == 204
    assert_problem(client.get(tx), 404, "SegmentNotFound")


# ----------------------------------------------------------------------- merges
def test_merge_appends_a_sealed_segment_and_removes_it(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"target|")
    _sealed_segment(client, "/v1/segments/scope/other/1", b"source")
    response = _merge(client, segment, "scope/other/1")
    assert response.status_code == 200
    assert response.get_json() == {"offset": 7, "length": 13}
    assert segment_state(response) == (13, 0, "false")
    assert client.get(segment).data == b"target|source"
    assert client.get(segment + "?offset=7").data == b"source"
    assert_problem(client.get("/v1/segments/scope/other/1:info"), 404, "SegmentNotFound")


def test_a_merge_retry_answers_the_same(client: FlaskClient, segment: str) -> None:
    _sealed_segment(client, "/v1/segments/src", b"abc")
    first = _merge(client, segment, "src")
    assert first.get_json() == {"offset": 0, "length": 3}
    again = _merge(client, segment, "src")
    assert again.status_code == 200
    assert again.get_json() == first.get_json()
    assert client.get(segment).data == b"abc"


def test_merge_of_an_unsealed_source_is_409_and_changes_nothing(client: FlaskClient, segment: str) -> None:
    client.put("/v1/segments/src")
    client.post("/v1/segments/src", data=b"abc")
    assert_problem(_merge(client, segment, "src"), 409, "SegmentNotSealed")
    assert client.get("/v1/segments/src").data == b"abc"
    assert client.head(segment).headers["Segment-Length"] == "0"


def test_merge_into_a_sealed_target_is_409(client: FlaskClient, segment: str) -> None:
    _sealed_segment(client, "/v1/segments/src", b"abc")
    client.post(segment + ":seal")
    response = _merge(client, segment, "src")
    assert_problem(response, 409, "SegmentSealed")
    assert segment_state(response) == (0, 0, "true")
    assert client.get("/v1/segments/src").data == b"abc"


def test_merge_of_a_missing_source_or_into_a_missing_target_is_404(client: FlaskClient, segment: str) -> None:
    assert_problem(_merge(client, segment, "no/such"), 404, "SegmentNotFound")
    _sealed_segment(client, "/v1/segments/src", b"abc")
    assert_problem(_merge(client, "/v1/segments/no/such", "src"), 404, "SegmentNotFound")


def test_merge_of_a_segment_into_itself_is_400(client: FlaskClient, segment: str) -> None:
    client.post(segment + ":seal")
    assert_problem(_merge(client, segment, "scope/stream/0"), 400, "InvalidArgument")


def test_merge_of_a_truncated_source_is_400(client: FlaskClient, segment: str) -> None:
    client.put("/v1/segments/src")
    client.post("/v1/segments/src", data=b"abcdef")
    client.post("/v1/segments/src:truncate", json={"offset": 2})
    client.post("/v1/segments/src:seal")
    assert "truncated" in assert_problem(_merge(client, segment, "src"), 400, "InvalidArgument")["detail"]


def test_merge_without_a_body_is_400(client: FlaskClient, segment: str) -> None:
    response = client.post(segment + ":merge")
    assert "source" in assert_problem(response, 400, "InvalidArgument")["detail"]


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (b"{}", "InvalidArgument", '"source"'),
        (b"[]", "InvalidArgument", "JSON object"),
        (b"{not json", "InvalidArgument", "not valid JSON"),
        (b'{"source": 7}', "InvalidArgument", "must be a string"),
        (b'{"source": "src", "at": 0}', "InvalidArgument", "unknown key"),
        (b'{"source": "a#b"}', "InvalidName", "'#'"),
        (b'{"source": ""}', "InvalidName", "source: "),
    ],
)
def test_bad_merge_bodies_are_400(
    client: FlaskClient, segment: str, body: bytes, code: str, words: str
) -> None:
    response = client.post(segment + ":merge", data=body, content_type="application/json")
    assert words in assert_problem(response, 400, code)["detail"]


# ---------------------------------------------------------------------- routing
@pytest.mark.parametrize(
    ("method", "suffix", "allow"),
    [
        ("GET", ":transactions", "POST"),
        ("PUT", ":transactions", "POST"),
        ("PUT", f":transactions/{WRITER}", "DELETE, GET, POST"),
        ("GET", f":transactions/{WRITER}/commit", "POST"),
        ("DELETE", f":transactions/{WRITER}/commit", "POST"),
        ("GET", ":merge", "POST"),
        ("DELETE", ":merge", "POST"),
    ],
)
def test_wrong_methods_are_405_with_allow(
    raw_client: FlaskClient, segment: str, method: str, suffix: str, allow: str
) -> None:
    response = raw_client.open(segment + suffix, method=method)
    assert_problem(response, 405, "MethodNotAllowed")
    assert response.headers["Allow"] == allow


@pytest.mark.parametrize(
    "suffix",
    [
        f":transactions/{WRITER}/foo",
        f":transactions/{WRITER}/commit/x",
        f":transactions/{WRITER}/commit/",
        ":merge/x",
    ],
)
def test_unknown_transaction_sub_paths_are_404(raw_client: FlaskClient, segment: str, suffix: str) -> None:
    assert_problem(raw_client.post(segment + suffix), 404, "NotFound")


def test_requests_are_labelled_by_their_route_pattern(client: FlaskClient, segment: str) -> None:
    tx = _open(client, segment)
    client.post(tx, data=b"abc")
    client.post(tx + "/commit")
    metrics = client.get("/metrics").get_data(as_text=True)
    for route in ["{name}:transactions", "{name}:transactions/{id}", "{name}:transactions/{id}/commit"]:
        assert f'route="/v1/segments/{route}"' in metrics
    assert tx.rsplit("/", 1)[1] not in metrics
