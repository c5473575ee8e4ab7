"""``:attributes`` over HTTP: reads, the update verbs, 412 naming the key, strict input."""

from __future__ import annotations

import uuid

from flask.testing import FlaskClient

from tests.app.helpers import assert_problem, segment_state

A, B = str(uuid.uuid4()), str(uuid.uuid4())


def _update(client: FlaskClient, segment: str, *updates: dict) -> object:
    return client.post(f"{segment}:attributes", json={"updates": list(updates)})


def test_read_update_and_read_again(client: FlaskClient, segment: str) -> None:
    response = client.get(f"{segment}:attributes?keys={A},{B}")
    assert response.status_code == 200
    assert response.get_json() == {"attributes": {A: None, B: None}}
    assert segment_state(response) == (0, 0, "false")
    response = _update(
        client,
        segment,
        {"key": A, "type": "replace", "value": 5},
        {"key": B, "type": "accumulate", "value": -2},
    )
    assert response.status_code == 200
    assert response.get_json() == {"attributes": {A: 5, B: -2}}
    response = _update(client, segment, {"key": A, "type": "replace_if_equals", "value": 6, "expected": 5})
    assert response.get_json() == {"attributes": {A: 6}}
    assert client.get(f"{segment}:attributes?keys={A},{B}").get_json() == {"attributes": {A: 6, B: -2}}


def test_a_failed_condition_is_412_naming_the_key_and_changes_nothing(
    client: FlaskClient, segment: str
) -> None:
    _update(client, segment, {"key": A, "type": "replace", "value": 1})
    response = _update(
        client,
        segment,
        {"key": B, "type": "replace", "value": 1},
        {"key": A, "type": "replace_if_greater", "value": 1},
    )
    problem = assert_problem(response, 412, "ConditionalCheckFailed")
    assert A in problem["detail"]
    assert client.get(f"{segment}:attributes?keys={A},{B}").get_json() == {"attributes": {A: 1, B: None}}
    problem = assert_problem(
        _update(client, segment, {"key": B, "type": "replace_if_equals", "value": 2, "expected": 7}),
        412,
        "ConditionalCheckFailed",
    )
    assert B in problem["detail"]
    assert_problem(
        _update(client, segment, {"key": A, "type": "none", "value": 3}), 412, "ConditionalCheckFailed"
    )
    ok = _update(client, segment, {"key": B, "type": "replace_if_equals", "value": 2, "expected": None})
    assert ok.get_json() == {"attributes": {B: 2}}


def test_bad_requests_are_400(client: FlaskClient, segment: str) -> None:
    bad_bodies = [
        {},
        {"updates": []},
        {"updates": [{"key": "nope", "type": "replace", "value": 1}]},
        {"updates": [{"key": A, "type": "set", "value": 1}]},
        {"updates": [{"key": A, "value": 1}]},
        {"updates": [{"key": A, "type": "replace"}]},
        {"updates": [{"key": A, "type": "replace", "value": 2**63}]},
        {"updates": [{"key": A, "type": "replace", "value": True}]},
        {"updates": [{"key": A, "type": "replace", "value": 1, "expected": 1}]},
        {"updates": [{"key": A, "type": "replace", "value": 1, "extra": 1}]},
        {"updates": [{"key": A, "type": "replace", "value": 1}, {"key": A, "type": "replace", "value": 2}]},
        {"updates": ["x"]},
    ]
    for body in bad_bodies:
        assert_problem(client.post(f"{segment}:attributes", json=body), 400, "InvalidArgument")
    assert_problem(client.get(f"{segment}:attributes"), 400, "InvalidArgument")
    assert_problem(client.get(f"{segment}:attributes?keys={A},zz"), 400, "InvalidArgument")
    assert_problem(client.get("/v1/segments/no/such:attributes?keys=" + A), 404, "SegmentNotFound")


def test_writer_state_is_an_attribute(client: FlaskClient, segment: str) -> None:
    writer = str(uuid.uuid4())
    headers = {"Writer-Id": writer, "Event-Number": "4"}
    assert client.post(segment, data=b"e", headers=headers).status_code == 200
    assert client.get(f"{segment}:attributes?keys={writer}").get_json() == {"attributes": {writer: 4}}
    _update(client, segment, {"key": writer, "type": "replace", "value": 9})
    assert client.get(f"{segment}:writers/{writer}").get_json()["event_number"] == 9
    assert client.post(segment, data=b"e", headers={**headers, "Event-Number": "9"}).get_json()["duplicate"]


def test_a_sealed_segment_refuses_updates(client: FlaskClient, segment: str) -> None:
    client.post(f"{segment}:seal")
    assert_problem(_update(client, segment, {"key": A, "type": "replace", "value": 1}), 409, "SegmentSealed")
