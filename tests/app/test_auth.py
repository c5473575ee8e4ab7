"""Access control on the native API (401 without a token, 403 outside its grants), the S3
surface's anonymous mode, and the refusal to serve an open bind with auth off."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.auth import Access, Grant, Principal, load_auth
from app.settings import HttpSettings
from engine import InvalidArgument, SegmentStore, Settings

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "admin-token-0123456789abcdef"
WRITER = "writer-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
AUTH_FILE = f"""
[[token]]
name = "admin"
token = "{ADMIN}"
grants = [{{prefix = "", access = "admin"}}]

[[token]]
name = "writer"
token = "{WRITER}"
grants = [{{prefix = "w/", access = "write"}}, {{prefix = "r/", access = "read"}}]

[[token]]
name = "reader"
token = "{READER}"
grants = [{{prefix = "r/", access = "read"}}]
"""


def _app(tmp_path: Path, **changes: Any) -> Iterator[Flask]:
    settings = Settings(data_dir=str(tmp_path / "data"), container_count=2, flush_threshold_ms=50)
    app = create_app(settings, HttpSettings(**changes))
    store: SegmentStore = app.extensions["segstore"]
    try:
        store.wait_ready(30)
        yield app
    finally:
        store.close()


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[FlaskClient]:
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(AUTH_FILE)
    for app in _app(tmp_path, auth_file=str(auth_file)):
        yield app.test_client()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _seed(client: FlaskClient) -> None:
    for name in ("r/seg", "w/seg", "w/src"):
        assert client.put(f"/v1/segments/{name}", headers=bearer(ADMIN)).status_code == 201
        assert client.post(f"/v1/segments/{name}", data=b"data", headers=bearer(ADMIN)).status_code == 200
    assert client.post("/v1/segments/w/src:seal", headers=bearer(ADMIN)).status_code == 200


READS = [
    ("GET", "/v1/segments/r/seg"),
    ("HEAD", "/v1/segments/r/seg"),
    ("GET", "/v1/segments/r/seg?offset=4&wait=0.1"),
    ("GET", "/v1/segments/r/seg:info"),
    ("GET", f"/v1/segments/r/seg:writers/{uuid.UUID(int=1)}"),
    ("GET", "/v1/segments/r/seg:partitions"),
    ("GET", f"/v1/segments/r/seg:attributes?keys={uuid.UUID(int=2)}"),
]
WRITES = [
    ("POST", "/v1/segments/r/seg"),
    ("PUT", "/v1/segments/r/new"),
    ("DELETE", "/v1/segments/r/seg"),
    ("POST", "/v1/segments/r/seg:seal"),
    ("POST", "/v1/segments/r/seg:truncate"),
    ("POST", "/v1/segments/r/seg:transactions"),
    ("POST", f"/v1/segments/r/seg:transactions/{uuid.UUID(int=3)}"),
    ("DELETE", f"/v1/segments/r/seg:transactions/{uuid.UUID(int=4)}"),
    ("POST", f"/v1/segments/r/seg:transactions/{uuid.UUID(int=5)}/commit"),
    ("POST", "/v1/segments/r/seg:attributes"),
    ("POST", "/v1/segments/r/seg:merge"),
]


@pytest.mark.parametrize(("method", "path"), READS + WRITES)
def test_every_route_needs_a_token(authed: FlaskClient, method: str, path: str) -> None:
    response = authed.open(path, method=method)
    assert response.status_code == 401
    assert response.headers.get("WWW-Authenticate") == "Bearer"
    if method != "HEAD":
        assert response.get_json()["code"] == "Unauthorized"
    wrong = authed.open(path, method=method, headers=bearer("not-a-known-token-at-all"))
    assert wrong.status_code == 401


@pytest.mark.parametrize(("method", "path"), READS)
def test_reads_need_read(authed: FlaskClient, method: str, path: str) -> None:
    _seed(authed)
    assert authed.open(path, method=method, headers=bearer(READER)).status_code in (200, 204)
    other = path.replace("/r/seg", "/w/seg")
    response = authed.open(other, method=method, headers=bearer(READER))
    assert response.status_code == 403
    if method != "HEAD":
        assert response.get_json()["code"] == "Forbidden"


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_writes_need_write(authed: FlaskClient, method: str, path: str) -> None:
    _seed(authed)
    response = authed.open(path, method=method, data=b"x", headers=bearer(WRITER))
    assert response.status_code == 403
    assert response.get_json()["code"] == "Forbidden"
    assert authed.get("/v1/segments/r/seg", headers=bearer(ADMIN)).data == b"data"  # untouched


def test_a_writer_appends_reads_and_runs_transactions_in_its_grant(authed: FlaskClient) -> None:
    _seed(authed)
    headers = bearer(WRITER)
    assert authed.post("/v1/segments/w/seg", data=b"more", headers=headers).status_code == 200
    txid = authed.post("/v1/segments/w/seg:transactions", headers=headers).get_json()["id"]
    assert (
        authed.post(f"/v1/segments/w/seg:transactions/{txid}", data=b"tx", headers=headers).status_code == 200
    )
    assert authed.post(f"/v1/segments/w/seg:transactions/{txid}/commit", headers=headers).status_code == 200
    assert authed.get("/v1/segments/w/seg", headers=headers).data == b"datamoretx"


def test_a_merge_needs_write_on_its_source(authed: FlaskClient) -> None:
    _seed(authed)
    json_body = {"source": "r/seg"}
    refused = authed.post("/v1/segments/w/seg:merge", json=json_body, headers=bearer(WRITER))
    assert refused.status_code == 403
    assert "merge away" in refused.get_json()["detail"]
    done = authed.post("/v1/segments/w/seg:merge", json={"source": "w/src"}, headers=bearer(WRITER))
    assert done.status_code == 200, done.get_json()  # the body read for the check still reaches the view
    assert authed.get("/v1/segments/w/seg", headers=bearer(WRITER)).data == b"datadata"


def test_listing_needs_read_on_the_whole_prefix(authed: FlaskClient) -> None:
    _seed(authed)
    assert authed.get("/v1/segments", headers=bearer(READER)).status_code == 403
    assert authed.get("/v1/segments?prefix=w/", headers=bearer(READER)).status_code == 403
    listed = authed.get("/v1/segments?prefix=r/", headers=bearer(READER))
    assert [s["name"] for s in listed.get_json()["segments"]] == ["r/seg"]
    assert len(authed.get("/v1/segments", headers=bearer(ADMIN)).get_json()["segments"]) == 3


def test_sse_tail_needs_a_grant(authed: FlaskClient) -> None:
    _seed(authed)
    headers = {"Accept": "text/event-stream"}
    assert authed.get("/v1/segments/r/seg?offset=0", headers=headers).status_code == 401
    assert authed.get("/v1/segments/w/seg?offset=0", headers={**headers, **bearer(READER)}).status_code == 403


def test_probes_are_open_and_metrics_needs_a_token(authed: FlaskClient) -> None:
    assert authed.get("/healthz").status_code == 200
    assert authed.get("/readyz").status_code == 200
    assert authed.get("/metrics").status_code == 401
    metrics = authed.get("/metrics", headers=bearer(READER))
    assert metrics.status_code == 200
    assert READER.encode() not in metrics.data


def test_tokens_are_never_logged(authed: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    authed.get("/v1/segments/r/seg", headers=bearer("a-wrong-token-that-must-not-leak"))
    authed.get("/v1/segments/w/seg", headers=bearer(READER))
    assert "a-wrong-token" not in caplog.text
    assert READER not in caplog.text


def test_grants_and_config_parsing(tmp_path: Path) -> None:
    principal = Principal("p", (Grant("a/", Access.WRITE),))
    assert principal.allows(Access.READ, "a/b") and principal.allows(Access.WRITE, "a/b")
    assert not principal.allows(Access.ADMIN, "a/b") and not principal.allows(Access.READ, "ab")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[token]]\ntoken = "short"\n')
    with pytest.raises(InvalidArgument):
        load_auth(HttpSettings(auth_file=str(bad)))
    bad.write_text(f'[[token]]\ntoken = "{ADMIN}"\ngrants = [{{prefix = "", access = "root"}}]\n')
    with pytest.raises(InvalidArgument):
        load_auth(HttpSettings(auth_file=str(bad)))
    keys = load_auth(HttpSettings(s3_keys="AK1:secret1, AK2:secret2"))
    assert keys.s3_secrets == {"AK1": "secret1", "AK2": "secret2"}
    assert keys.s3_principals["AK1"].allows(Access.ADMIN, "any/name")  # no auth file: keys are admins
    with pytest.raises(InvalidArgument):
        load_auth(HttpSettings(s3_keys="AK1"))
    assert "secret1" not in repr(keys)
    with pytest.raises(InvalidArgument):
        load_auth(HttpSettings(auth_file=str(tmp_path / "missing.toml")))
    bad.write_text("[[token]\n")
    with pytest.raises(InvalidArgument):
        load_auth(HttpSettings(auth_file=str(bad)))


def test_s3_is_anonymous_only_on_loopback_without_keys(tmp_path: Path) -> None:
    for app in _app(tmp_path / "loopback"):
        client = app.test_client()
        assert client.put("/anon-bucket").status_code == 200
        assert client.put("/anon-bucket/key", data=b"v").status_code == 200
        assert client.get("/anon-bucket/key").data == b"v"
    for app in _app(tmp_path / "open", bind="0.0.0.0:8080", allow_unauthenticated=1):
        response = app.test_client().put("/anon-bucket")
        assert response.status_code == 403
        assert b"<Code>AccessDenied</Code>" in response.data


def _gunicorn_conf() -> Any:
    spec = importlib.util.spec_from_file_location(
        "segstore_gunicorn_conf", ROOT / "deploy" / "gunicorn.conf.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("changes", "refused"),
    [
        ({"bind": "127.0.0.1:8080"}, False),
        ({"bind": "[::1]:8080"}, False),
        ({"bind": "0.0.0.0:8080"}, True),
        ({"bind": "10.0.0.5:8080"}, True),
        ({"bind": "0.0.0.0:8080", "allow_unauthenticated": 1}, False),
        ({"bind": "0.0.0.0:8080", "auth_file": "/etc/segstore/auth.toml"}, False),
    ],
)
def test_an_open_bind_with_auth_off_is_refused(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], refused: bool
) -> None:
    monkeypatch.delenv("SEGSTORE_BIND", raising=False)
    monkeypatch.delenv("SEGSTORE_CONFIG", raising=False)
    conf = _gunicorn_conf()
    reason = conf.unauthenticated_bind_refusal(HttpSettings(**changes))
    assert (reason is not None) == refused
    if refused:
        assert "SEGSTORE_ALLOW_UNAUTHENTICATED=1" in reason


def test_durable_streams_routes_are_checked_by_stream_name(authed: FlaskClient) -> None:
    assert authed.put("/v1/stream/w/events", data=b"").status_code == 401
    assert authed.put("/v1/stream/r/events", data=b"", headers=bearer(WRITER)).status_code == 403
    created = authed.put(
        "/v1/stream/w/events",
        data=b"",
        headers={**bearer(WRITER), "Content-Type": "application/octet-stream"},
    )
    assert created.status_code in (200, 201), created.get_data(as_text=True)
    assert authed.get("/v1/stream/w/events?offset=-1", headers=bearer(READER)).status_code == 403
    assert authed.get("/v1/stream/w/events?offset=-1", headers=bearer(WRITER)).status_code == 200


def test_a_stream_fork_needs_read_on_its_source(authed: FlaskClient) -> None:
    octets = {"Content-Type": "application/octet-stream"}
    assert authed.put("/v1/stream/secret", data=b"x", headers={**bearer(ADMIN), **octets}).status_code == 201
    assert authed.put("/v1/stream/r/open", data=b"y", headers={**bearer(ADMIN), **octets}).status_code == 201
    for source in ("secret", "/v1/stream/secret", "http://elsewhere/v1/stream/secret"):
        fork = authed.put("/v1/stream/w/copy", headers={**bearer(WRITER), "Stream-Forked-From": source})
        assert fork.status_code == 403, (source, fork.get_data(as_text=True))
    fork = authed.put("/v1/stream/w/copy", headers={**bearer(WRITER), "Stream-Forked-From": "r/open"})
    assert fork.status_code == 201, fork.get_data(as_text=True)
    assert authed.get("/v1/stream/w/copy?offset=-1", headers=bearer(WRITER)).data == b"y"
