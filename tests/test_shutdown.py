"""Graceful shutdown of a real server: SIGTERM ends parked tails at once, nothing is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import requests

from bench.servers import ServerProcess


@pytest.mark.process
def test_sigterm_ends_tails_promptly_and_keeps_data(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    url = server.url + "/v1/segments/a/b/0"
    assert requests.put(url, timeout=5).status_code == 201
    assert requests.post(url, data=b"kept", timeout=5).status_code == 200
    outcome: dict[str, object] = {}

    def long_poll() -> None:
        outcome["long_poll"] = requests.get(url + "?offset=4&wait=50", timeout=60).status_code

    def live_stream() -> None:
        with requests.get(url, headers={"Accept": "text/event-stream"}, stream=True, timeout=60) as r:
            outcome["events"] = [line for line in r.iter_lines() if line.startswith(b"event:")]

    tails = [threading.Thread(target=long_poll), threading.Thread(target=live_stream)]
    for tail in tails:
        tail.start()
    time.sleep(1.0)  # both are parked at the tail now
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 10, "parked tails held the shutdown"
    for tail in tails:
        tail.join(5)
    assert outcome["long_poll"] == 204
    assert outcome["events"] == [b"event: data"]

    with ServerProcess(tmp_path / "data") as again:
        assert requests.get(again.url + "/v1/segments/a/b/0", timeout=5).content == b"kept"
