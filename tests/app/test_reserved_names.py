"""No native request reaches the S3 or Durable Streams state; the names they used to take are free."""

from __future__ import annotations

import hashlib
import json
import uuid
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient

from engine import SegmentStore

ATTRIBUTE = str(uuid.UUID(int=1))
TXID = str(uuid.UUID(int=2))


State = dict[str, tuple[int, int, bool]]


def _state(store: SegmentStore) -> State:
    """Every reserved segment: its start offset, length and seal."""
    return {
        i.name: (i.start_offset, i.length, i.sealed)
        for prefix in ("#s3/", "#stream/")
        for i in store.list(prefix)[0]
    }


@pytest.fixture
def reserved(raw_client: FlaskClient, store: SegmentStore) -> State:
    """A bucket with an object and a stream, made through their surfaces; their state by name."""
    assert raw_client.put("/bk1").status_code == 200
    assert raw_client.put("/bk1/k", data=b"object").status_code == 200
    created = raw_client.put("/v1/stream/s", data=b"m", headers={"Content-Type": "text/plain"})
    assert created.status_code == 201
    state = _state(store)
    expected = {"#s3/buckets/bk1", "#s3/etags/bk1/k", "#s3/migrated", "#stream/meta/s", "#stream/migrated"}
    assert expected <= set(state)
    assert any(name.startswith("#stream/data/s/") for name in state)
    return state


def _url(name: str, custom: str = "") -> str:
    return "/v1/segments/" + quote(name, safe="/") + custom


REQUESTS = [
    ("PUT", "", None),
    ("POST", "", b"x"),
    ("GET", "", None),
    ("HEAD", "", None),
    ("DELETE", "", None),
    ("GET", ":info", None),
    ("POST", ":seal", None),
    ("POST", ":truncate", b'{"offset": 1}'),
    ("GET", f":attributes?keys={ATTRIBUTE}", None),
    ("POST", ":attributes", json.dumps({"updates": [{"key": ATTRIBUTE, "type": "replace", "value": 1}]})),
    ("GET", ":partitions", None),
    ("GET", f":writers/{ATTRIBUTE}", None),
    ("POST", ":transactions", None),
    ("POST", f":transactions/{TXID}", b"x"),
    ("POST", f":transactions/{TXID}/commit", None),
    ("DELETE", f":transactions/{TXID}", None),
    ("POST", ":merge", b'{"source": "bk1/k"}'),
]


@pytest.mark.parametrize(("method", "custom", "body"), REQUESTS, ids=[f"{m} {c}" for m, c, _ in REQUESTS])
def test_no_native_request_reaches_a_reserved_name(
    raw_client: FlaskClient,
    store: SegmentStore,
    reserved: State,
    method: str,
    custom: str,
    body: bytes | None,
) -> None:
    for name in reserved:
        response = raw_client.open(_url(name, custom), method=method, data=body)
        assert response.status_code == 400, (name, response.data)
        if method != "HEAD":
            assert response.json["code"] == "InvalidName"
    assert _state(store) == reserved


def test_a_merge_cannot_take_a_reserved_source(
    client: FlaskClient, store: SegmentStore, reserved: State
) -> None:
    assert client.put("/v1/segments/target").status_code == 201
    for name in reserved:
        response = client.post("/v1/segments/target:merge", json={"source": name})
        assert response.status_code == 400 and response.json["code"] == "InvalidName"
    assert store.info("target").length == 0
    assert _state(store) == reserved


def test_native_listings_hide_reserved_names_and_refuse_reserved_prefixes(
    client: FlaskClient, raw_client: FlaskClient, reserved: State
) -> None:
    listed = client.get("/v1/segments").json["segments"]
    assert [s["name"] for s in listed] == ["bk1/k"]
    after_mark = client.get("/v1/segments", query_string={"after": "#"}).json["segments"]
    assert [s["name"] for s in after_mark] == ["bk1/k"]  # the storage writer may flush in between
    for prefix in ("#", "#s3/", "#stream/meta/", "bk1/k#"):
        response = raw_client.get("/v1/segments", query_string={"prefix": prefix})
        assert response.status_code == 400 and response.json["code"] == "InvalidName"


def test_the_names_the_surfaces_used_to_take_are_ordinary_now(
    client: FlaskClient, raw_client: FlaskClient, reserved: State
) -> None:
    for name in (".s3/buckets/bk2", ".s3/etags/bk1/k", "streams/meta/s2", "streams/data/s/0123"):
        assert client.put(_url(name)).status_code == 201
        assert client.post(_url(name), data=b"user bytes").status_code == 200
    assert raw_client.head("/bk2").status_code == 404
    assert b"<Name>bk2</Name>" not in raw_client.get("/").data
    assert raw_client.get("/v1/stream/s2").status_code == 404
    object_head = raw_client.head("/bk1/k")
    assert object_head.status_code == 200
    assert object_head.headers["ETag"].strip('"') == hashlib.md5(b"object").hexdigest()
    assert raw_client.get("/v1/stream/s", query_string={"offset": "-1"}).data == b"m"


def test_a_stream_fork_or_an_s3_copy_cannot_name_reserved_state(
    raw_client: FlaskClient, store: SegmentStore, reserved: State
) -> None:
    fork = raw_client.put(
        "/v1/stream/f", headers={"Stream-Forked-From": "/v1/stream/%23streams/meta/s"}
    )
    assert fork.status_code == 404
    copy = raw_client.put("/bk1/copy", headers={"x-amz-copy-source": "/%23s3/etags/bk1/k"})
    assert copy.status_code in (400, 404)
    assert raw_client.head("/bk1/copy").status_code == 404
