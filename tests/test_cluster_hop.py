"""The local hop between real nodes on one machine: requests through a non-owner go over its Unix socket.

Two nodes share a bucket on moto and run on this machine, so each publishes
its Unix socket and machine in its node record and the other sends it the
requests it forwards over that socket (app/hop.py), not HTTP. The forwarder's
``segstore_forwarded_requests_total`` counts them by transport. Bodies
stream in, long-polls are woken and SSE events arrive through the hop; an
owner killed mid-request has its safe request sent to the next owner, and
an unsafe one answered 502 ``OutcomeUnknown``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.hop import this_machine
from bench.servers import ServerProcess
from engine.naming import container_for, node_register_name
from tests.cluster_fixtures import CONTAINERS, TIMEOUT_S, owners
from tests.test_cluster_surfaces import cluster, pick, served_by

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hop_nodes(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_client: Any
) -> Iterator[tuple[dict[str, ServerProcess], str]]:
    """Two nodes for the tests that stop none, and their bucket; each test names its own segments."""
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    with cluster(tmp_path_factory.mktemp("hop"), moto_endpoint, bucket, takeover_wait_s=5.0) as servers:
        yield servers, bucket


def forwarded(url: str) -> dict[str, float]:
    """The node's count of requests it passed on, by transport."""
    text = requests.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    found = re.findall(r'^segstore_forwarded_requests_total\{transport="(\w+)"\} (\S+)$', text, re.M)
    return {transport: float(count) for transport, count in found}


def segment_on(servers: dict[str, ServerProcess], owner: str, prefix: str) -> tuple[str, str, str]:
    """A fresh segment served by ``owner``: its name, its URL through the other node and through the owner."""
    name = pick(f"{prefix}-{uuid.uuid4().hex[:6]}-", served_by(servers["a"].url, owner))
    via = servers["b" if owner == "a" else "a"].url
    return name, f"{via}/v1/segments/{name}", f"{servers[owner].url}/v1/segments/{name}"


def test_each_node_publishes_its_socket_and_machine(
    hop_nodes: tuple[dict[str, ServerProcess], str], s3_client: Any
) -> None:
    _, bucket = hop_nodes
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="tier1/")["Contents"]]
    for node in ("a", "b"):
        (key,) = [k for k in keys if k.endswith("/" + node_register_name(node))]
        record = json.loads(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
        assert record["machine"] == this_machine() != ""
        mode = os.stat(record["hop"]).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_requests_through_a_non_owner_go_over_the_hop_bodies_streamed_in(
    hop_nodes: tuple[dict[str, ServerProcess], str],
) -> None:
    servers, _ = hop_nodes
    _, url, _ = segment_on(servers, "a", "hop")
    before = forwarded(servers["b"].url)

    created = requests.put(url, timeout=TIMEOUT_S)
    assert created.status_code == 201 and created.headers["Segment-Owner"] == "a"
    big = os.urandom(3 * 1024 * 1024 + 7)  # several frames, with its length
    sized = requests.post(url, data=big, headers={"Expected-Offset": "0"}, timeout=TIMEOUT_S)
    assert sized.status_code == 200 and sized.json()["offset"] == 0, sized.text
    chunked = requests.post(url, data=iter([b"wor", b"ld"]), timeout=TIMEOUT_S)  # no length: chunked
    assert chunked.status_code == 200 and chunked.json()["offset"] == len(big)
    refused = requests.post(url, data=b"x", headers={"Expected-Offset": "0"}, timeout=TIMEOUT_S)
    assert refused.status_code == 412 and refused.headers["Content-Type"] == "application/problem+json"
    read = requests.get(url, params={"offset": 0}, timeout=TIMEOUT_S)
    assert read.content == big + b"world" and read.headers["Segment-Owner"] == "a"
    head = requests.head(url, timeout=TIMEOUT_S)
    assert head.status_code == 200 and head.content == b"" and head.headers["Segment-Owner"] == "a"

    after = forwarded(servers["b"].url)
    assert after["hop"] - before.get("hop", 0) == 6
    assert after.get("http", 0) == before.get("http", 0), "no request went over HTTP"


def test_a_long_poll_is_woken_through_the_hop(hop_nodes: tuple[dict[str, ServerProcess], str]) -> None:
    servers, _ = hop_nodes
    _, url, direct = segment_on(servers, "b", "poll")
    assert requests.put(direct, timeout=TIMEOUT_S).status_code == 201
    before = forwarded(servers["a"].url)
    tail: dict[str, Any] = {}

    def long_poll() -> None:
        started = time.monotonic()
        answer = requests.get(url, params={"offset": 0, "wait": 20}, timeout=TIMEOUT_S + 20)
        tail["answer"], tail["took"] = answer, time.monotonic() - started

    reader = threading.Thread(target=long_poll)
    reader.start()
    time.sleep(1.0)  # parked on the owner, through the hop
    assert "answer" not in tail
    assert requests.post(direct, data=b"woken", timeout=TIMEOUT_S).ok
    reader.join(TIMEOUT_S)
    assert tail["answer"].content == b"woken" and tail["answer"].headers["Segment-Owner"] == "b"
    assert 1.0 <= tail["took"] < 10
    assert forwarded(servers["a"].url)["hop"] - before.get("hop", 0) == 1


def test_an_sse_stream_comes_through_the_hop_event_by_event(
    hop_nodes: tuple[dict[str, ServerProcess], str],
) -> None:
    servers, _ = hop_nodes
    _, url, direct = segment_on(servers, "a", "sse")
    assert requests.put(direct, timeout=TIMEOUT_S).status_code == 201
    assert requests.post(direct, data=b"one", timeout=TIMEOUT_S).ok
    headers = {"Accept": "text/event-stream"}
    with requests.get(url, params={"offset": 0}, headers=headers, stream=True, timeout=TIMEOUT_S) as sse:
        assert sse.headers["Content-Type"].startswith("text/event-stream")
        assert sse.headers["Segment-Owner"] == "a"
        lines = sse.iter_lines(decode_unicode=True)
        events: list[tuple[str, str]] = []
        kind = ""
        for line in lines:
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, line.removeprefix("data: ")))
                if len(events) == 1:  # the first event came before any later append: it is live
                    assert requests.post(direct, data=b"two", timeout=TIMEOUT_S).ok
                elif len(events) == 2:
                    assert requests.post(f"{direct}:seal", timeout=TIMEOUT_S).ok
                elif kind == "sealed":
                    break
    data = [base64.b64decode(d) for k, d in events if k == "data"]
    assert data == [b"one", b"two"]
    assert events[-1] == ("sealed", json.dumps({"length": 6}))


def test_an_owner_killed_mid_request_retries_a_read_and_answers_an_unsafe_write_502(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    """The long-poll is sent again to the next owner (no 502); a half-sent chunked append answers 502."""
    with cluster(tmp_path, moto_endpoint, s3_bucket, takeover_wait_s=30.0) as servers:
        read_name, read_url, read_direct = segment_on(servers, "b", "kept")
        _, write_url, write_direct = segment_on(servers, "b", "lost")
        for direct in (read_direct, write_direct):
            assert requests.put(direct, timeout=TIMEOUT_S).status_code == 201
        assert requests.post(read_direct, data=b"acked", timeout=TIMEOUT_S).ok
        answers: dict[str, requests.Response] = {}
        killed = threading.Event()

        def long_poll() -> None:
            answers["read"] = requests.get(read_url, params={"offset": 5, "wait": 30}, timeout=120)

        def slow_body() -> Iterator[bytes]:
            yield b"first half, "
            killed.wait(30)
            yield b"second half"

        def write() -> None:
            answers["write"] = requests.post(write_url, data=slow_body(), timeout=120)

        threads = [threading.Thread(target=long_poll), threading.Thread(target=write)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # both in flight on b, through the hop
        assert not answers
        servers["b"].kill()
        killed.set()
        threads[1].join(60)
        assert answers["write"].status_code == 502, answers["write"].text
        assert answers["write"].json()["code"] == "OutcomeUnknown"
        # The read waits for a to take the container over, then parks at the tail there.
        a = servers["a"].url
        container = container_for(read_name, CONTAINERS)
        deadline = time.monotonic() + 60
        while owners(a)[container] != "a" or not requests.get(f"{a}/v1/segments/{read_name}", timeout=5).ok:
            assert time.monotonic() < deadline, "a never took the container over"
            time.sleep(0.2)
        time.sleep(0.5)
        assert requests.post(f"{a}/v1/segments/{read_name}", data=b"!", timeout=TIMEOUT_S).ok
        threads[0].join(60)
        assert answers["read"].status_code == 200, answers["read"].text
        assert answers["read"].content == b"!" and "Segment-Owner" not in answers["read"].headers
