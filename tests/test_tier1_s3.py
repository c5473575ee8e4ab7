"""Tier 1 on S3 (moto) with real servers: the loss of a node loses nothing, and a zombie is fenced.

- Node loss: writers with writer ids, and plain appends with
  ``Expected-Offset``, append under load (several Tier 1 writes in flight per
  container); the server is SIGKILLed, its whole data folder deleted, and a
  new server starts on a new folder and the same bucket. Every acknowledged
  append is there exactly once at its offset, and retries of the appends in
  flight are duplicates exactly when they were stored
  (``tests.test_crash.verify``). Tier 1 is truncated between kills.
- Zombie: server A owns the bucket; server B starts on it with a folder of
  its own. B's recovery fences A: A's later appends fail, and none is
  acknowledged; B serves exactly what A acknowledged.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from bench.servers import FAKE_AWS_ENV, ServerProcess
from tests.conftest import random_seed
from tests.test_crash import SEGMENTS, TIMEOUT_S, Ledger, Writer, run_and_kill, verify

pytestmark = pytest.mark.slow

CYCLES = 4


def s3_tiers_env(endpoint: str, bucket: str) -> dict[str, str]:
    return {
        **FAKE_AWS_ENV,
        "SEGSTORE_LOG_LEVEL": "warning",
        "SEGSTORE_TIER1": f"s3://{bucket}/tier1",
        "SEGSTORE_TIER2": f"s3://{bucket}/tier2",
        "SEGSTORE_S3_ENDPOINT": endpoint,
        "SEGSTORE_FLUSH_THRESHOLD_MS": "100",
        "SEGSTORE_CHECKPOINT_EVERY_BYTES": "65536",
    }


class OffsetWriter:
    """Plain appends with ``Expected-Offset`` to a segment of its own, until the server goes away."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.acked: dict[int, bytes] = {}
        self.length = 0
        self.in_flight: bytes | None = None
        self.failure = ""

    def run(self, url: str) -> None:
        with requests.Session() as http:
            while True:
                data = self.in_flight or uuid.uuid4().bytes * 2
                self.in_flight = data
                try:
                    response = http.post(
                        f"{url}/v1/segments/{self.name}",
                        data=data,
                        headers={"Expected-Offset": str(self.length)},
                        timeout=TIMEOUT_S,
                    )
                except requests.RequestException:
                    return
                if response.status_code == 503:
                    time.sleep(0.05)
                    continue
                if response.status_code != 200 or response.json()["offset"] != self.length:
                    self.failure = f"{response.status_code} {response.text}"
                    return
                self.acked[self.length] = data
                self.length += len(data)
                self.in_flight = None

    def verify(self, url: str) -> None:
        """Every acknowledged append at its offset, once; the one in flight there at most once."""
        assert not self.failure, self.failure
        answer = requests.get(f"{url}/v1/segments/{self.name}", params={"offset": 0}, timeout=TIMEOUT_S)
        content = answer.content
        for offset, data in self.acked.items():
            assert content[offset : offset + len(data)] == data, f"{self.name}@{offset} lost"
        if self.in_flight is not None and content[self.length :] == self.in_flight:
            self.acked[self.length] = self.in_flight
            self.length += len(self.in_flight)
        self.in_flight = None
        assert len(content) == self.length, (len(content), self.length)


def test_acknowledged_appends_survive_the_loss_of_the_node(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    env = s3_tiers_env(moto_endpoint, s3_bucket)
    ledger = Ledger([Writer(i) for i in range(4)])
    rng = random.Random(random_seed())
    plain = OffsetWriter("plain/0")
    for cycle in range(CYCLES):
        data_dir = tmp_path / f"node-{cycle}"  # a new machine each time: nothing local survives
        server = ServerProcess(data_dir, env=env).start()
        try:
            if cycle == 0:
                for name in (*SEGMENTS, plain.name):
                    response = requests.put(f"{server.url}/v1/segments/{name}", timeout=TIMEOUT_S)
                    assert response.status_code == 201, response.text
            else:
                verify(server.url, ledger)
                plain.verify(server.url)
            appender = threading.Thread(target=plain.run, args=(server.url,))
            appender.start()
            run_and_kill(server, ledger, rng.uniform(1.0, 2.5), rng)
            appender.join(TIMEOUT_S + 5)
        finally:
            server.kill()
        shutil.rmtree(data_dir)
    server = ServerProcess(tmp_path / "last", env=env).start()
    try:
        verify(server.url, ledger)
        plain.verify(server.url)
        assert len(plain.acked) > CYCLES * 5, f"only {len(plain.acked)} plain appends acknowledged"
        assert server.stop() == 0, server.log_tail()
    finally:
        server.kill()
    assert len(ledger.acked) > CYCLES * 20, f"only {len(ledger.acked)} appends acknowledged"
    pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="tier1/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", ())]
    assert any("/wal/" in key for key in keys), "Tier 1 objects are in the bucket"
    assert any("/start/" in key for key in keys), "Tier 1 was truncated (its start recorded) between kills"


def test_a_second_server_fences_the_first(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> None:
    env = s3_tiers_env(moto_endpoint, s3_bucket)
    first = ServerProcess(tmp_path / "a", env=env).start()
    second: ServerProcess | None = None
    acked: list[tuple[int, bytes]] = []
    sent_at: list[float] = []  # when each acknowledged append was sent
    refused = 0
    stop = threading.Event()
    name = "zombie/0"
    try:
        assert requests.put(f"{first.url}/v1/segments/{name}", timeout=TIMEOUT_S).status_code == 201

        def write() -> None:
            nonlocal refused
            with requests.Session() as http:
                while not stop.is_set():
                    data = uuid.uuid4().bytes * 4
                    sent = time.monotonic()
                    try:
                        response = http.post(f"{first.url}/v1/segments/{name}", data=data, timeout=TIMEOUT_S)
                    except requests.RequestException:
                        continue
                    if response.status_code == 200:
                        acked.append((response.json()["offset"], data))
                        sent_at.append(sent)
                    else:
                        assert response.status_code == 503, response.text
                        refused += 1

        writers = [threading.Thread(target=write) for _ in range(4)]
        for t in writers:
            t.start()
        time.sleep(1.0)
        second = ServerProcess(tmp_path / "b", env=env).start()
        fenced = time.monotonic()  # B is ready: every container of A is fenced
        deadline = time.monotonic() + 30
        while not refused and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        stop.set()
        for t in writers:
            t.join(TIMEOUT_S + 5)
        assert refused > 0, f"the first server kept acknowledging after the fence ({len(acked)} acked)"
        assert all(sent < fenced for sent in sent_at), "an append sent after the fence was acknowledged"
        info = requests.get(f"{second.url}/v1/segments/{name}:info", timeout=TIMEOUT_S).json()
        served = requests.get(f"{second.url}/v1/segments/{name}", params={"offset": 0}, timeout=TIMEOUT_S)
        assert len(served.content) == info["length"] == 64 * len(acked)
        for offset, data in acked:
            assert served.content[offset : offset + 64] == data
        late = requests.post(f"{first.url}/v1/segments/{name}", data=b"late", timeout=TIMEOUT_S)
        assert late.status_code == 503, late.text
        assert requests.get(f"{second.url}/v1/segments/{name}:info", timeout=TIMEOUT_S).json() == info
    finally:
        stop.set()
        first.kill()
        if second is not None:
            second.kill()
