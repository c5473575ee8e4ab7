"""Reader groups over HTTP (``/v1/scopes/{scope}/reader-groups``): answers as openapi.yaml and docs/api.md
say (each checked against the spec), what is refused, and access by the group's and streams' names."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from app import create_app
from app.settings import HttpSettings
from engine import SegmentStore, Settings
from tests.app.helpers import assert_problem

GROUP = "/v1/scopes/sc/reader-groups/g"


@pytest.fixture
def stream(client: FlaskClient) -> FlaskClient:
    assert client.put("/v1/scopes/sc").status_code == 201
    assert client.put("/v1/scopes/sc/streams/st", json={"segments": 2}).status_code == 201
    for i in range(4):
        headers = {"Routing-Key": f"key{i}"}
        assert (
            client.post("/v1/scopes/sc/streams/st/events", data=f"e{i}".encode(), headers=headers).status_code
            == 200
        )
    return client


def test_a_group_is_created_read_through_and_deleted(stream: FlaskClient) -> None:
    client = stream
    made = client.put(GROUP, json={"streams": ["st"], "lease_s": 5})
    assert made.status_code == 201 and made.headers["Location"] == GROUP
    assert made.get_json()["unassigned"] == {"sc/st/0": 0, "sc/st/1": 0}
    assert client.put(GROUP, json={"streams": ["st"], "lease_s": 5}).status_code == 200
    assert_problem(client.put(GROUP, json={"streams": ["st"]}), 409, "StreamConflict")
    joined = client.post(f"{GROUP}/readers", json={"reader": "r1"})
    assert joined.status_code == 201
    generation = joined.get_json()["generation"]
    assert joined.get_json() == {"reader": "r1", "generation": generation, "lease_s": 5.0}
    answer = client.get(f"{GROUP}/readers/r1/events?generation={generation}")
    doc = answer.get_json()
    assert sorted(base64.b64decode(e["data"]) for e in doc["events"]) == [b"e0", b"e1", b"e2", b"e3"]
    assert doc["checkpoint"] is None
    commit = {"generation": generation, "positions": doc["positions"]}
    assert client.post(f"{GROUP}/readers/r1/positions", json=commit).status_code == 204
    state = client.get(GROUP).get_json()
    assert state["readers"][0]["segments"] == doc["positions"] and state["readers"][0]["lag_bytes"] == 0
    started = client.post(f"{GROUP}/checkpoints")
    assert started.status_code == 201
    checkpoint = started.get_json()["id"]
    pending = client.get(f"{GROUP}/checkpoints/{checkpoint}").get_json()
    assert pending == {"id": checkpoint, "complete": False, "cuts": {}}
    reached = client.get(f"{GROUP}/readers/r1/events?generation={generation}").get_json()
    assert reached["checkpoint"] == checkpoint and reached["events"] == []
    done = client.get(f"{GROUP}/checkpoints/{checkpoint}").get_json()
    cut = done["cuts"]["st"]
    assert done["complete"] and cut["positions"] == {
        k.rsplit("/", 1)[1]: v for k, v in doc["positions"].items()
    }
    reset = client.post(f"{GROUP}:reset", json={"cuts": {"st": {"positions": {"0": 0, "1": 0}}}})
    assert reset.status_code == 200 and reset.get_json()["readers"] == []
    stale = client.get(f"{GROUP}/readers/r1/events?generation={generation}")
    assert_problem(stale, 409, "ReaderFenced")
    assert_problem(client.post(f"{GROUP}/readers/r1/positions", json=commit), 409, "ReaderFenced")
    again = client.post(f"{GROUP}/readers", json={"reader": "r1"}).get_json()["generation"]
    assert again > generation
    assert client.delete(f"{GROUP}/readers/r1?generation={again}").status_code == 204
    assert client.delete(GROUP).status_code == 204
    assert_problem(client.get(GROUP), 404, "SegmentNotFound")


def test_a_fetch_answers_the_frames_as_stored_when_asked(stream: FlaskClient) -> None:
    client = stream
    assert client.put(GROUP, json={"streams": ["st"]}).status_code == 201
    generation = client.post(f"{GROUP}/readers", json={"reader": "r"}).get_json()["generation"]
    answer = client.get(
        f"{GROUP}/readers/r/events?generation={generation}", headers={"Accept": "application/octet-stream"}
    )
    assert answer.status_code == 200 and answer.content_type == "application/octet-stream"
    body = answer.get_data()
    head, _, frames = body.partition(b"\n")
    doc = json.loads(head)
    assert doc["checkpoint"] is None and sum(length for _, _, length in doc["chunks"]) == len(frames)
    payloads = []
    while frames:
        size = int.from_bytes(frames[:4], "big")
        payloads.append(frames[4 : 4 + size])
        frames = frames[4 + size :]
    assert sorted(payloads) == [b"e0", b"e1", b"e2", b"e3"]
    for segment, offset, length in doc["chunks"]:
        assert doc["positions"][segment] == offset + length


def test_what_is_not_served_is_refused(stream: FlaskClient) -> None:
    client = stream
    assert_problem(client.put(GROUP, json={"streams": ["st"], "extra": 1}), 400, "InvalidArgument")
    assert_problem(client.put(GROUP, json={"streams": []}), 400, "InvalidArgument")
    assert_problem(client.put(GROUP, json={"streams": ["st"], "start": "middle"}), 400, "InvalidArgument")
    assert_problem(client.put(GROUP, json={"streams": ["none"]}), 404, "SegmentNotFound")
    assert_problem(client.put(f"{GROUP}?x=1", json={"streams": ["st"]}), 400, "InvalidArgument")
    assert client.put(GROUP, json={"streams": ["st"]}).status_code == 201
    assert_problem(client.post(f"{GROUP}/readers", json={"reader": ".x"}), 400, "InvalidName")
    generation = client.post(f"{GROUP}/readers", json={"reader": "r"}).get_json()["generation"]
    assert_problem(client.get(f"{GROUP}/readers/r/events"), 400, "InvalidArgument")
    events = f"{GROUP}/readers/r/events?generation={generation}"
    assert_problem(client.get(f"{events}&offset=3"), 400, "InvalidArgument")
    assert_problem(client.get(f"{events}&max_bytes=0"), 400, "InvalidArgument")
    body = {"generation": generation, "positions": {"sc/st/0": -1}}
    assert_problem(client.post(f"{GROUP}/readers/r/positions", json=body), 400, "InvalidArgument")
    assert_problem(client.get(f"{GROUP}/checkpoints/nope"), 404, "SegmentNotFound")
    assert_problem(client.delete(f"{GROUP}/readers/nobody"), 404, "SegmentNotFound")


def test_access_is_judged_by_the_group_and_its_streams(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(
        '[[token]]\nname = "admin"\ntoken = "admin-token-0123456789"\n'
        'grants = [{prefix = "", access = "admin"}]\n'
        '[[token]]\nname = "groups"\ntoken = "groups-token-0123456789"\n'
        'grants = [{prefix = "sc/reader-groups/", access = "write"}]\n'
        '[[token]]\nname = "both"\ntoken = "both-token-0123456789"\n'
        'grants = [{prefix = "sc/reader-groups/", access = "write"}, {prefix = "sc/st/", access = "read"}]\n'
    )
    settings = Settings(data_dir=str(tmp_path / "data"), container_count=2)
    app = create_app(settings, HttpSettings(auth_file=str(auth)))
    store: SegmentStore = app.extensions["segstore"]
    try:
        store.wait_ready(30)
        client = app.test_client()

        def as_(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        assert client.put("/v1/scopes/sc", headers=as_("admin-token-0123456789")).status_code == 201
        assert (
            client.put("/v1/scopes/sc/streams/st", headers=as_("admin-token-0123456789")).status_code == 201
        )
        body = {"streams": ["st"]}
        assert_problem(client.put(GROUP, json=body, headers=as_("groups-token-0123456789")), 403, "Forbidden")
        assert client.put(GROUP, json=body, headers=as_("both-token-0123456789")).status_code == 201
        assert client.get(GROUP, headers=as_("groups-token-0123456789")).status_code == 200
        assert_problem(
            client.get("/v1/scopes/sc/streams/st", headers=as_("groups-token-0123456789")), 403, "Forbidden"
        )
    finally:
        store.close()
