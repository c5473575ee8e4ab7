"""A cluster of real servers on moto: containers split by lease, and a node's loss (SIGKILL) loses nothing.

Two nodes share a bucket. A client appends with ``Expected-Offset`` to
segments spread over every container, sending each append to the node that
``GET /v1/cluster`` names for the segment's container and refreshing that
map on a refusal or a dead connection. One node is killed mid-load: its
containers move to the other within the lease plus recovery, and every
acknowledged append is there exactly once at its offset. A node that does
not serve a segment's container forwards native requests to the one that
does, bodies and long-polls streamed.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import requests

from bench.servers import ServerProcess
from client.segment_client import SegmentClient
from engine.naming import container_for
from tests import cluster_fixtures
from tests.cluster_fixtures import CONTAINERS, LEASE_S, TIMEOUT_S, cluster_map, owners
from tests.polling import wait_until

pytestmark = pytest.mark.slow
nodes = cluster_fixtures.nodes


class Client:
    """Sends each segment's requests to the node serving its container; refreshes the map on a miss."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.owner_url: dict[int, str] = {}
        self.http = requests.Session()

    def refresh(self) -> None:
        for url in self.urls:
            try:
                doc = cluster_map(url)
            except requests.RequestException:
                continue
            nodes = {n["id"]: n["url"] for n in doc["nodes"]}
            self.owner_url = {c["id"]: nodes[c["owner"]] for c in doc["containers"] if c["owner"] in nodes}
            return

    def send(self, method: str, name: str, deadline_s: float = 30.0, **kwargs: object) -> requests.Response:
        container = container_for(name, CONTAINERS)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            url = self.owner_url.get(container)
            if url is not None:
                try:
                    target = f"{url}/v1/segments/{name}"
                    response = self.http.request(method, target, timeout=TIMEOUT_S, **kwargs)
                except requests.ConnectionError:
                    response = None
                if response is not None and response.status_code != 503:
                    return response
            time.sleep(0.1)
            self.refresh()
        raise AssertionError(f"no node served {name} within {deadline_s} s")


def test_two_nodes_share_the_containers_and_a_killed_node_loses_nothing(
    nodes: dict[str, ServerProcess],
) -> None:
    servers = nodes
    a, b = servers["a"].url, servers["b"].url
    assert cluster_map(b)["node"] == "b" and {n["id"] for n in cluster_map(b)["nodes"]} == {"a", "b"}
    wait_until(lambda: requests.get(f"{b}/healthz", timeout=TIMEOUT_S).ok, "b's containers recovered", 30)
    health = requests.get(f"{b}/healthz", timeout=TIMEOUT_S).json()
    assert [c["id"] for c in health["containers"]] == [i for i, owner in enumerate(owners(b)) if owner == "b"]

    client = Client([a, b])
    client.refresh()
    names: list[str] = []  # three in each container
    for i in range(1000):
        name = f"seg-{i}"
        if sum(container_for(n, CONTAINERS) == container_for(name, CONTAINERS) for n in names) < 3:
            names.append(name)
    assert len(names) == 3 * CONTAINERS
    acked: dict[str, bytes] = {}
    for name in names:
        assert client.send("PUT", name).status_code == 201
        acked[name] = b""

    def append_round(tag: str) -> None:
        for name in names:
            data = f"{name}/{tag};".encode()
            offset = len(acked[name])
            response = client.send("POST", name, data=data, headers={"Expected-Offset": str(offset)})
            if response.status_code == 412:  # the node died after storing it, before answering
                stored = client.send("GET", name, params={"offset": offset}).content
                assert stored == data, (name, offset, stored)
            else:
                assert response.status_code == 200, response.text
                assert response.json()["offset"] == offset
            acked[name] += data

    for round_ in range(3):
        append_round(f"before-{round_}")
    killed_at = time.monotonic()
    servers["a"].kill()
    append_round("during")  # waits out the lease and recovery for a's containers
    failover_s = time.monotonic() - killed_at
    for round_ in range(2):
        append_round(f"after-{round_}")
    assert owners(b) == ["b"] * CONTAINERS
    assert failover_s < LEASE_S + 20, failover_s
    for name, data in acked.items():
        assert client.send("GET", name, params={"offset": 0}).content == data, name


def test_a_node_forwards_native_requests_for_containers_it_does_not_serve(
    nodes: dict[str, ServerProcess],
) -> None:
    servers = nodes
    a = servers["a"].url
    by_node = {"a": servers["a"].url, "b": servers["b"].url}
    map_ = owners(a)
    name = next(n for n in (f"fwd-{i}" for i in range(100)) if map_[container_for(n, CONTAINERS)] == "a")
    other = by_node["b"]  # b does not serve name's container: it forwards
    url = f"{other}/v1/segments/{name}"

    created = requests.put(url, timeout=TIMEOUT_S)
    assert created.status_code == 201 and created.headers["Segment-Owner"] == "a"
    first = requests.post(url, data=b"hello ", headers={"Expected-Offset": "0"}, timeout=TIMEOUT_S)
    assert first.status_code == 200 and first.json()["offset"] == 0
    chunked = requests.post(url, data=iter([b"wor", b"ld"]), timeout=TIMEOUT_S)  # no length: chunked
    assert chunked.status_code == 200 and chunked.json()["offset"] == 6
    refused = requests.post(url, data=b"x", headers={"Expected-Offset": "0"}, timeout=TIMEOUT_S)
    assert refused.status_code == 412 and refused.headers["Content-Type"] == "application/problem+json"
    read = requests.get(url, params={"offset": 0}, timeout=TIMEOUT_S)
    assert read.content == b"hello world" and read.headers["Segment-Owner"] == "a"
    head = requests.head(url, timeout=TIMEOUT_S)
    assert head.status_code == 200 and head.content == b""

    tail: dict[str, bytes] = {}

    def long_poll() -> None:
        answer = requests.get(url, params={"offset": 11, "wait": 20}, timeout=TIMEOUT_S + 20)
        tail["got"] = answer.content

    reader = threading.Thread(target=long_poll)
    reader.start()
    time.sleep(0.5)
    assert requests.post(f"{by_node['a']}/v1/segments/{name}", data=b"!", timeout=TIMEOUT_S).ok
    reader.join(TIMEOUT_S)
    assert tail.get("got") == b"!"

    once = requests.get(url, params={"offset": 0}, headers={"Segstore-Forwarded": "a"}, timeout=TIMEOUT_S)
    assert once.status_code == 503, "a forwarded request is never forwarded again"
    assert "served by node a" in once.json()["detail"]


def test_the_python_client_goes_straight_to_the_serving_node_and_back_when_it_dies(
    nodes: dict[str, ServerProcess],
) -> None:
    a, b = nodes["a"].url, nodes["b"].url
    map_ = owners(a)
    name = next(n for n in (f"direct-{i}" for i in range(100)) if map_[container_for(n, CONTAINERS)] == "a")
    writer = uuid.uuid4()
    with SegmentClient(b, retries=60, backoff_s=0.2) as client:  # b forwards: the client learns a
        client.create(name)
        assert client.route(name) == a
        for event in range(1, 4):
            client.append(name, b"%d;" % event, writer_id=writer, event_number=event)
        nodes["a"].kill()
        for event in range(4, 7):  # a is gone: back to b, which serves the container once it moved
            client.append(name, b"%d;" % event, writer_id=writer, event_number=event)
        assert client.route(name) == b
        assert client.read(name, 0).data == b"1;2;3;4;5;6;"
