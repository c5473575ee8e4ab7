"""Streams survive a restart (clean, in-process) and a kill -9 of a real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from app.streams.format import frame
from app.streams.names import stream_meta_segment
from bench.servers import ServerProcess
from engine import Settings
from tests.streams.conftest import close_app, open_app

URL = "/v1/stream/"


def test_state_is_loaded_again_after_a_restart(settings: Settings) -> None:
    app = open_app(settings)
    client = app.test_client()
    client.put(URL + "src", data="AB", headers={"Content-Type": "text/plain"})
    client.put(URL + "fork", headers={"Stream-Forked-From": "src"})
    producer = {"Content-Type": "text/plain", "Producer-Id": "w", "Producer-Epoch": "0", "Producer-Seq": "0"}
    client.post(URL + "fork", data="C", headers=producer)
    client.post(URL + "fork", data="D", headers={"Content-Type": "text/plain", "Stream-Seq": "5"})
    client.delete(URL + "src")
    client.put(URL + "closed", data="x", headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
    close_app(app)

    app = open_app(settings)
    try:
        client = app.test_client()
        assert client.get(URL + "fork?offset=-1").data == b"ABCD"
        assert client.post(URL + "fork", data="C", headers=producer).status_code == 204
        assert (
            client.post(
                URL + "fork", data="E", headers={"Content-Type": "text/plain", "Stream-Seq": "4"}
            ).status_code
            == 409
        )
        assert client.get(URL + "src").status_code == 410
        assert client.head(URL + "closed").headers["Stream-Closed"] == "true"
        again = client.put(URL + "closed", headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
        assert again.status_code == 200
    finally:
        close_app(app)


@pytest.mark.slow
@pytest.mark.process
def test_acknowledged_appends_survive_kill_9(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    url = server.url + URL + "crash"
    try:
        assert requests.put(url, headers={"Content-Type": "text/plain"}, timeout=10).status_code == 201
        for seq in range(50):
            headers = {
                "Content-Type": "text/plain",
                "Producer-Id": "p",
                "Producer-Epoch": "0",
                "Producer-Seq": str(seq),
            }
            assert requests.post(url, data=f"{seq};", headers=headers, timeout=10).status_code == 200
        requests.post(url, headers={"Stream-Closed": "true"}, timeout=10)
    finally:
        server.kill()
    with ServerProcess(tmp_path / "data", port=server.port) as again:
        url = again.url + URL + "crash"
        body = requests.get(url + "?offset=-1", timeout=10)
        assert body.text == "".join(f"{seq};" for seq in range(50))
        assert body.headers["Stream-Closed"] == "true"
        retry = {
            "Content-Type": "text/plain",
            "Producer-Id": "p",
            "Producer-Epoch": "0",
            "Producer-Seq": "49",
        }
        assert requests.post(url, data="49;", headers=retry, timeout=10).status_code == 409


def test_a_seq_record_whose_append_never_happened_does_not_count(settings: Settings) -> None:
    app = open_app(settings)
    client = app.test_client()
    plain = {"Content-Type": "text/plain"}
    client.put(URL + "s", headers=plain)
    assert client.post(URL + "s", data="a", headers={**plain, "Stream-Seq": "5"}).status_code == 204
    # What a crash between the record and its append leaves: a record of the next generation.
    app.extensions["segstore"].append(
        stream_meta_segment("s"), frame(json.dumps({"t": "seq", "seq": "9", "generation": 2}).encode())
    )
    close_app(app)

    app = open_app(settings)
    try:
        client = app.test_client()
        assert client.post(URL + "s", data="b", headers={**plain, "Stream-Seq": "5"}).status_code == 409
        assert client.post(URL + "s", data="c", headers={**plain, "Stream-Seq": "7"}).status_code == 204
        assert client.get(URL + "s?offset=-1").data == b"ac"
    finally:
        close_app(app)
