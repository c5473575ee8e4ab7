"""The stream API (``/v1/scopes``) over HTTP: answers, codes and headers as openapi.yaml and
docs/api.md "Streams" say (every answer is checked against the spec), and access by stream name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.settings import HttpSettings
from client.events import frame
from client.routing import header_value, key_hash
from engine import SegmentStore, Settings
from tests.app.helpers import assert_problem

STREAM = "/v1/scopes/sc/streams/st"
WRITER = "0f8fad5b-d9cb-469f-a165-70867728950e"


@pytest.fixture
def stream(client: FlaskClient) -> FlaskClient:
    assert client.put("/v1/scopes/sc").status_code == 201
    assert client.put(STREAM, json={"segments": 2}).status_code == 201
    return client


def _event(client: FlaskClient, key: str, data: bytes, **headers: str) -> dict:
    headers = {"Routing-Key": header_value(key), **headers}
    response = client.post(f"{STREAM}/events", data=data, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return {**response.get_json(), **dict(response.headers)}


def test_scopes_and_streams_are_created_listed_and_confirmed(client: FlaskClient) -> None:
    created = client.put("/v1/scopes/sc")
    assert (created.status_code, created.headers["Location"]) == (201, "/v1/scopes/sc")
    assert client.put("/v1/scopes/sc").status_code == 200
    assert client.get("/v1/scopes").get_json() == {"scopes": ["sc"]}
    assert client.get("/v1/scopes/sc").get_json() == {"scope": "sc"}
    assert_problem(client.get("/v1/scopes/none"), 404, "SegmentNotFound")
    assert_problem(client.put("/v1/scopes/none/streams/st"), 404, "SegmentNotFound")
    assert_problem(client.put("/v1/scopes/.hidden"), 400, "InvalidName")
    body = {"segments": 3, "scaling": {"type": "events_per_s", "target": 50, "factor": 3, "min_segments": 2}}
    made = client.put(STREAM, json=body)
    assert made.status_code == 201 and made.headers["Location"] == STREAM
    doc = made.get_json()
    config = {"segments": 3, "scaling": {**body["scaling"], "target": 50.0}}
    assert doc == {
        "scope": "sc", "stream": "st", "config": config, "state": "active", "epoch": 0, "pending_scale": None,
    }  # fmt: skip
    assert client.put(STREAM, json=body).status_code == 200
    assert_problem(client.put(STREAM, json={"segments": 3}), 409, "StreamConflict")
    assert client.get(STREAM).get_json() == doc
    assert client.get("/v1/scopes/sc/streams").get_json() == {"streams": ["st"]}
    for bad in (
        {"segments": 1, "scaling": {"min_segments": 2}},
        {"scaling": {"type": "kbytes_per_s"}},
        {"scaling": {"type": "sometimes"}},
        {"segments": 0},
        {"shards": 2},
    ):
        assert_problem(client.put("/v1/scopes/sc/streams/other", json=bad), 400, "InvalidArgument")


def test_events_route_by_key_and_answer_where_they_went(stream: FlaskClient, store: SegmentStore) -> None:
    segments = stream.get(f"{STREAM}/segments").get_json()
    assert segments == {"epoch": 0, "segments": [
        {"id": 0, "name": "sc/st/0", "key_lo": 0.0, "key_hi": 0.5},
        {"id": 1, "name": "sc/st/1", "key_lo": 0.5, "key_hi": 1.0},
    ]}  # fmt: skip
    for key in ("a", "b", "c", "d", "é🌡"):
        answer = _event(stream, key, key.encode())
        name = f"sc/st/{int(key_hash(key) >= 0.5)}"
        assert (answer["segment"], answer["Segment-Name"]) == (name, quote(name, safe="/"))
        assert int(answer["Segment-Offset"]) == answer["offset"]
        assert store.read(name, answer["offset"], len(frame(key.encode()))).data == frame(key.encode())
    random = stream.post(f"{STREAM}/events", data=b"")  # no key: a random one; an empty event
    assert random.status_code == 200
    first = _event(stream, "a", b"x", **{"Writer-Id": WRITER, "Event-Number": "7"})
    again = _event(stream, "a", b"x", **{"Writer-Id": WRITER, "Event-Number": "7"})
    assert again["duplicate"] and again["Segment-Duplicate"] == "true"
    assert again["segment"] == first["segment"]
    for bad in ({"Event-Number": "1"}, {"Routing-Key": "a b"}, {"Routing-Key": "x" * 1025}):
        assert_problem(stream.post(f"{STREAM}/events", data=b"x", headers=bad), 400, "InvalidHeader")
    assert_problem(stream.post("/v1/scopes/sc/streams/none/events", data=b"x"), 404, "SegmentNotFound")


def test_a_scale_answers_its_epoch_and_successors_name_their_predecessors(stream: FlaskClient) -> None:
    body = {"seal": [0, 1], "ranges": [[0.0, 0.3], [0.3, 1.0]]}
    scaled = stream.post(f"{STREAM}:scale", json=body)
    assert scaled.status_code == 200
    assert scaled.get_json() == {"epoch": 1, "segments": [
        {"id": 2, "name": "sc/st/2", "key_lo": 0.0, "key_hi": 0.3},
        {"id": 3, "name": "sc/st/3", "key_lo": 0.3, "key_hi": 1.0},
    ]}  # fmt: skip
    assert stream.post(f"{STREAM}:scale", json=body).get_json() == scaled.get_json()
    successors = stream.get(f"{STREAM}/segments/1/successors").get_json()
    assert successors == {"sealed": True, "successors": [
        {"id": 3, "name": "sc/st/3", "key_lo": 0.3, "key_hi": 1.0, "predecessors": [0, 1]},
    ]}  # fmt: skip
    assert stream.get(f"{STREAM}/segments/3/successors").get_json() == {"successors": [], "sealed": False}
    assert stream.get(f"{STREAM}/segments?epoch=0").get_json()["epoch"] == 0
    assert_problem(stream.get(f"{STREAM}/segments?epoch=2"), 404, "SegmentNotFound")
    assert_problem(stream.get(f"{STREAM}/segments/9/successors"), 404, "SegmentNotFound")
    scale = f"{STREAM}:scale"
    assert_problem(stream.post(scale, json={"seal": [0], "ranges": [[0, 1]]}), 409, "ScaleConflict")
    assert_problem(stream.post(scale, json={"seal": [2], "ranges": [[0, 0.2]]}), 400, "InvalidArgument")
    assert_problem(stream.post(scale, json={"seal": [2]}), 400, "InvalidArgument")


def test_cuts_truncation_seal_and_delete(stream: FlaskClient, store: SegmentStore) -> None:
    for key in "abcdefgh":
        _event(stream, key, b"event")
    tail = stream.get(f"{STREAM}/cut").get_json()
    lengths = {str(i): store.info(f"sc/st/{i}").length for i in range(2)}
    assert tail == {"epoch": 0, "positions": lengths}
    assert stream.get(f"{STREAM}/cut?at=head").get_json() == {"epoch": 0, "positions": {"0": 0, "1": 0}}
    assert_problem(stream.get(f"{STREAM}/cut?at=middle"), 400, "InvalidArgument")
    truncated = stream.post(f"{STREAM}:truncate", json=tail)
    assert truncated.get_json() == {"head": tail}
    assert store.info("sc/st/0").start_offset == tail["positions"]["0"]
    truncate = f"{STREAM}:truncate"
    assert_problem(stream.post(truncate, json={"positions": {"0": 0}}), 400, "InvalidArgument")
    assert_problem(stream.post(truncate, json={"positions": {"0": 0, "1": 10**6}}), 416, "OffsetOutOfRange")
    assert_problem(stream.delete(STREAM), 409, "StreamNotSealed")
    sealed = stream.post(f"{STREAM}:seal")
    assert sealed.get_json()["state"] == "sealed" and stream.post(f"{STREAM}:seal").status_code == 200
    assert_problem(stream.post(f"{STREAM}/events", data=b"x"), 409, "StreamSealed")
    assert_problem(stream.post(f"{STREAM}/transactions"), 409, "StreamSealed")
    assert stream.get(f"{STREAM}/segments/0/successors").get_json() == {"successors": [], "sealed": True}
    assert stream.delete(STREAM).status_code == 204
    assert_problem(stream.get(STREAM), 404, "SegmentNotFound")
    assert stream.get("/v1/scopes/sc/streams").get_json() == {"streams": []}


def test_stream_transactions_over_http(stream: FlaskClient, store: SegmentStore) -> None:
    opened = stream.post(f"{STREAM}/transactions", json={"timeout_s": 30})
    assert opened.status_code == 201
    txn = opened.get_json()
    assert (txn["state"], txn["epoch"]) == ("open", 0)
    url = f"{STREAM}/transactions/{txn['id']}"
    assert opened.headers["Location"] == url
    written = stream.post(f"{url}/events", data=b"in", headers={"Routing-Key": "a"})
    assert written.get_json() == {"segment": f"sc/st/{int(key_hash('a') >= 0.5)}"}
    dup = {"Routing-Key": "a", "Writer-Id": WRITER, "Event-Number": "1"}
    assert stream.post(f"{url}/events", data=b"w", headers=dup).status_code == 200
    assert stream.post(f"{url}/events", data=b"w", headers=dup).get_json()["duplicate"] is True
    assert stream.get(url).get_json()["state"] == "open"
    assert sum(store.info(f"sc/st/{i}").length for i in range(2)) == 0
    assert stream.post(f"{url}:commit").get_json()["state"] == "committed"
    assert stream.post(f"{url}:commit").status_code == 200
    assert sum(store.info(f"sc/st/{i}").length for i in range(2)) == len(frame(b"in")) + len(frame(b"w"))
    assert_problem(stream.post(f"{url}/events", data=b"late"), 409, "TransactionNotOpen")
    assert_problem(stream.post(f"{url}:abort"), 409, "TransactionNotOpen")
    other = stream.post(f"{STREAM}/transactions").get_json()["id"]
    assert stream.post(f"{STREAM}/transactions/{other}:abort").get_json()["state"] == "aborted"
    assert_problem(stream.get(f"{STREAM}/transactions/{uuid.uuid4()}"), 404, "SegmentNotFound")
    assert_problem(stream.get(f"{STREAM}/transactions/not-a-uuid"), 400, "InvalidArgument")


def test_paths_and_methods_outside_the_api(stream: FlaskClient, raw_client: FlaskClient) -> None:
    assert_problem(raw_client.post(f"{STREAM}:split"), 404, "NotFound")
    assert_problem(raw_client.get("/v1/scopes/sc/streams/st/nothing"), 404, "NotFound")
    not_allowed = raw_client.patch(STREAM)
    assert_problem(not_allowed, 405, "MethodNotAllowed")
    assert not_allowed.headers["Allow"] == "DELETE, GET, PUT"


AUTH_FILE = """
[[token]]
name = "stream-writer"
token = "stream-writer-0123456789"
grants = [{prefix = "sc/st", access = "write"}, {prefix = "sc/", access = "read"}]

[[token]]
name = "admin"
token = "admin-token-0123456789ab"
grants = [{prefix = "", access = "admin"}]
"""


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[FlaskClient]:
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(AUTH_FILE)
    settings = Settings(data_dir=str(tmp_path / "data"), container_count=2)
    app: Flask = create_app(settings, HttpSettings(auth_file=str(auth_file)))
    try:
        app.extensions["segstore"].wait_ready(30)
        yield app.test_client()
    finally:
        app.extensions["segstore"].close()


def test_access_is_judged_by_the_stream_name(authed: FlaskClient) -> None:
    admin = {"Authorization": "Bearer admin-token-0123456789ab"}
    writer = {"Authorization": "Bearer stream-writer-0123456789"}
    assert authed.put("/v1/scopes/sc", headers=admin).status_code == 201
    assert_problem(authed.put(STREAM), 401, "Unauthorized")
    assert authed.put(STREAM, headers=writer).status_code == 201
    assert authed.post(f"{STREAM}/events", data=b"x", headers=writer).status_code == 200
    assert authed.post("/v1/segments/sc/st/0", data=b"raw", headers=writer).status_code == 200  # its segments
    assert authed.get("/v1/scopes/sc/streams", headers=writer).status_code == 200
    assert_problem(authed.put("/v1/scopes/sc/streams/other", headers=writer), 403, "Forbidden")
    assert_problem(authed.put("/v1/scopes/sc2", headers=writer), 403, "Forbidden")
    assert_problem(authed.get("/v1/scopes", headers=writer), 403, "Forbidden")
    assert authed.get("/v1/scopes", headers=admin).status_code == 200
