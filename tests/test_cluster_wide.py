"""Whole-cluster operations between two real nodes on moto: listings, merges, forks and expiry.

Nodes a and b each serve two of four containers (``tests/cluster_fixtures``).
Native requests are forwarded to the node serving their segment; S3 and
Durable Streams requests are sent here to the node serving their subject,
so what is tested is the part that spans nodes: a listing from either node
shows every container's names (ETags included), a bucket is not deleted
while an object on the other node exists, a merge pulls its source from the
other node, a fork copies its source's data from there, each node's reaper
expires its own streams, and a node loads the streams of the containers it
takes over.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

from app.s3.names import s3_state_name
from app.streams.names import stream_meta_segment
from bench.servers import ServerProcess
from engine.naming import container_for
from tests import cluster_fixtures
from tests.cluster_fixtures import CONTAINERS, TIMEOUT_S, owners
from tests.polling import wait_until

pytestmark = pytest.mark.slow
nodes = cluster_fixtures.nodes
shared_nodes = cluster_fixtures.shared_nodes


def _serving(nodes: dict[str, ServerProcess]) -> dict[str, ServerProcess]:
    """The two nodes once each has recovered the containers it holds."""
    for server in nodes.values():
        healthy = lambda url=server.url: requests.get(f"{url}/healthz", timeout=TIMEOUT_S).ok  # noqa: E731
        wait_until(healthy, f"{server.url} serving its containers", 30)
    return nodes


@pytest.fixture
def serving(shared_nodes: dict[str, ServerProcess]) -> dict[str, ServerProcess]:
    """The module's two nodes, serving (for the tests that stop no node)."""
    return _serving(shared_nodes)


@pytest.fixture
def serving_alone(nodes: dict[str, ServerProcess]) -> dict[str, ServerProcess]:
    """Two nodes of the test's own, serving (it kills one)."""
    return _serving(nodes)


def _owner(servers: dict[str, ServerProcess], name: str) -> str:
    """The node serving ``name``'s container."""
    owner = owners(servers["a"].url)[container_for(name, CONTAINERS)]
    assert owner is not None
    return owner


def _spread(make: Any, per_container: int) -> list[str]:
    """Names ``make(i)`` with ``per_container`` of them in each container."""
    names: list[str] = []
    for i in range(10_000):
        name = make(i)
        same = sum(container_for(n, CONTAINERS) == container_for(name, CONTAINERS) for n in names)
        if same < per_container:
            names.append(name)
        if len(names) == per_container * CONTAINERS:
            return names
    raise AssertionError("too few names")


def _s3(url: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", config=Config(retries={"max_attempts": 5})
    )


def test_listings_span_both_nodes(serving: dict[str, ServerProcess]) -> None:
    nodes = serving
    urls = {n: s.url for n, s in nodes.items()}
    names = _spread(lambda i: f"wide/seg-{i:04d}", 3)
    for name in names:
        assert requests.put(f"{urls['a']}/v1/segments/{name}", timeout=TIMEOUT_S).status_code == 201
    for url in urls.values():
        whole = requests.get(f"{url}/v1/segments", params={"prefix": "wide/"}, timeout=TIMEOUT_S).json()
        assert [s["name"] for s in whole["segments"]] == sorted(names) and whole["next"] is None
        seen: list[str] = []
        after = None
        while True:
            params = {"prefix": "wide/", "limit": 5, **({"after": after} if after else {})}
            page = requests.get(f"{url}/v1/segments", params=params, timeout=TIMEOUT_S).json()
            assert len(page["segments"]) <= 5
            seen.extend(s["name"] for s in page["segments"])
            after = page["next"]
            if after is None:
                break
        assert seen == sorted(names)

    bucket = "wide-bucket"
    clients = {n: _s3(url) for n, url in urls.items()}
    clients[_owner(nodes, s3_state_name("buckets", bucket))].create_bucket(Bucket=bucket)
    keys = _spread(lambda i: ("top-", "dir1/k-", "dir2/k-")[i % 3] + str(i), 3)
    etags = {}
    for key in keys:
        put = clients[_owner(nodes, f"{bucket}/{key}")].put_object(
            Bucket=bucket, Key=key, Body=key.encode() * 3
        )
        etags[key] = put["ETag"]
    for client in clients.values():
        assert bucket in [b["Name"] for b in client.list_buckets()["Buckets"]]
        listed = {}
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": 2}
        ):
            listed |= {o["Key"]: o["ETag"] for o in page.get("Contents", [])}
        assert listed == etags
        tops: dict[str, str] = {}
        prefixes: list[str] = []
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 2}
        )
        for page in pages:
            tops |= {o["Key"]: o["ETag"] for o in page.get("Contents", [])}
            prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        assert tops == {k: e for k, e in etags.items() if "/" not in k}
        assert prefixes == ["dir1/", "dir2/"]

    source_key = keys[0]
    copy_key = next(
        k
        for k in (f"copy-{i}" for i in range(100))
        if _owner(nodes, f"{bucket}/{k}") != _owner(nodes, f"{bucket}/{source_key}")
    )
    target_client = clients[_owner(nodes, f"{bucket}/{copy_key}")]
    copied = target_client.copy_object(
        Bucket=bucket, Key=copy_key, CopySource={"Bucket": bucket, "Key": source_key}
    )
    assert copied["CopyObjectResult"]["ETag"] == etags[source_key], "the source's bytes, read from its node"
    assert target_client.get_object(Bucket=bucket, Key=copy_key)["Body"].read() == source_key.encode() * 3
    keys.append(copy_key)
    marker_node = _owner(nodes, s3_state_name("buckets", bucket))
    last = next(k for k in keys if _owner(nodes, f"{bucket}/{k}") != marker_node)
    for key in keys:
        if key != last:
            clients[_owner(nodes, f"{bucket}/{key}")].delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ClientError) as refused:
        clients[marker_node].delete_bucket(Bucket=bucket)
    assert refused.value.response["Error"]["Code"] == "BucketNotEmpty"
    clients[_owner(nodes, f"{bucket}/{last}")].delete_object(Bucket=bucket, Key=last)
    clients[marker_node].delete_bucket(Bucket=bucket)
    for client in clients.values():
        assert bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]


def test_a_merge_and_a_commit_across_nodes(serving: dict[str, ServerProcess]) -> None:
    nodes = serving
    a, b = nodes["a"].url, nodes["b"].url
    target = next(n for n in (f"mt-{i}" for i in range(100)) if _owner(nodes, n) == "a")
    source = next(n for n in (f"ms-{i}" for i in range(100)) if _owner(nodes, n) == "b")
    for name, data in ((target, b"target;"), (source, b"source bytes " * 1000)):
        assert requests.put(f"{b}/v1/segments/{name}", timeout=TIMEOUT_S).status_code == 201
        assert requests.post(f"{b}/v1/segments/{name}", data=data, timeout=TIMEOUT_S).ok
    assert requests.post(f"{a}/v1/segments/{source}:seal", timeout=TIMEOUT_S).ok
    merged = requests.post(f"{b}/v1/segments/{target}:merge", json={"source": source}, timeout=TIMEOUT_S)
    assert merged.status_code == 200, merged.text
    assert (merged.json()["offset"], merged.json()["length"]) == (7, 13_007)  # the target's new length
    for url in (a, b):
        read = requests.get(f"{url}/v1/segments/{target}", params={"offset": 0}, timeout=TIMEOUT_S)
        assert read.content == b"target;" + b"source bytes " * 1000
        assert requests.head(f"{url}/v1/segments/{source}", timeout=TIMEOUT_S).status_code == 404

    parent = source.replace("ms-", "mp-")
    assert requests.put(f"{a}/v1/segments/{parent}", timeout=TIMEOUT_S).status_code == 201
    opened = requests.post(f"{a}/v1/segments/{parent}:transactions", timeout=TIMEOUT_S)
    assert opened.status_code == 201
    txid = opened.json()["id"]
    assert requests.post(f"{b}/v1/segments/{parent}:transactions/{txid}", data=b"tx", timeout=TIMEOUT_S).ok
    committed = requests.post(f"{a}/v1/segments/{parent}:transactions/{txid}/commit", timeout=TIMEOUT_S)
    assert committed.status_code == 200 and committed.json()["length"] == 2
    assert requests.get(f"{b}/v1/segments/{parent}", params={"offset": 0}, timeout=TIMEOUT_S).content == b"tx"


def _stream_on(nodes: dict[str, ServerProcess], node: str, stem: str) -> str:
    return next(
        n for n in (f"{stem}-{i}" for i in range(200)) if _owner(nodes, stream_meta_segment(n)) == node
    )


def _peer_list(url: str, secret: str, containers: list[int], prefix: str) -> requests.Response:
    doc = {"containers": containers, "prefix": prefix, "after": None, "limit": 1000}
    return requests.post(
        f"{url}/v1/peer/list", json=doc, headers={"Segstore-Peer-Secret": secret}, timeout=TIMEOUT_S
    )


def test_forks_copy_across_nodes_and_each_reaper_expires_its_own(
    serving_alone: dict[str, ServerProcess], s3_client: Any, s3_bucket: str
) -> None:
    nodes = serving_alone
    urls = {n: s.url for n, s in nodes.items()}
    source = _stream_on(nodes, "b", "src")
    fork = _stream_on(nodes, "a", "fork")
    on_b = f"{urls['b']}/v1/stream/{source}"
    binary = {"Content-Type": "application/octet-stream"}
    assert requests.put(on_b, data=b"one;", headers=binary, timeout=TIMEOUT_S).status_code == 201
    assert requests.post(on_b, data=b"two;", headers=binary, timeout=TIMEOUT_S).status_code == 204
    tail = requests.head(on_b, timeout=TIMEOUT_S).headers["Stream-Next-Offset"]
    assert requests.post(on_b, data=b"after the fork;", headers=binary, timeout=TIMEOUT_S).status_code == 204
    on_a = f"{urls['a']}/v1/stream/{fork}"
    headers = {"Stream-Forked-From": f"/v1/stream/{source}", "Stream-Fork-Offset": tail}
    created = requests.put(on_a, headers=headers, timeout=TIMEOUT_S)
    assert created.status_code == 201, created.text
    assert requests.head(on_a, timeout=TIMEOUT_S).headers["Stream-Next-Offset"] == tail, "offsets stay equal"
    assert requests.post(on_a, data=b"fork;", headers=binary, timeout=TIMEOUT_S).status_code == 204
    assert requests.get(on_a, params={"offset": "-1"}, timeout=TIMEOUT_S).content == b"one;two;fork;"
    assert (
        requests.get(on_b, params={"offset": "-1"}, timeout=TIMEOUT_S).content == b"one;two;after the fork;"
    )
    assert requests.get(on_a, params={"offset": tail}, timeout=TIMEOUT_S).content == b"fork;"

    record = s3_client.get_object(Bucket=s3_bucket, Key="tier1/cluster.json")["Body"].read()
    secret = json.loads(record)["secret"]
    served = {n: [c for c, owner in enumerate(owners(urls["a"])) if owner == n] for n in urls}
    assert _peer_list(urls["a"], "", served["a"], "").status_code == 403
    assert _peer_list(urls["a"], secret + "x", served["a"], "").status_code == 403
    assert _peer_list(urls["a"], secret, served["b"], "").status_code == 503, "a serves not b's containers"
    expiring = {n: _stream_on(nodes, n, f"ttl-{n}") for n in urls}
    for node, name in expiring.items():
        put = requests.put(f"{urls[node]}/v1/stream/{name}", headers={"Stream-TTL": "1"}, timeout=TIMEOUT_S)
        assert put.status_code == 201

    def metas(node: str) -> set[str]:
        answer = _peer_list(urls[node], secret, served[node], "#stream/meta/")
        assert answer.status_code == 200, answer.text
        return {i["name"] for i in answer.json()["page"]}

    for node, name in expiring.items():
        assert stream_meta_segment(name) in metas(node)
    for node, name in expiring.items():  # nobody touches them: only each node's reaper can take them
        wait_until(lambda n=node, s=name: stream_meta_segment(s) not in metas(n), f"{node}'s reaper", 30)
    assert stream_meta_segment(source) in metas("b") and stream_meta_segment(fork) in metas("a")

    nodes["a"].kill()  # b takes a's containers over, and loads their streams as it starts serving them
    wait_until(lambda: owners(urls["b"]) == ["b"] * CONTAINERS, "b serving every container", 30)
    on_b_fork = f"{urls['b']}/v1/stream/{fork}"
    served_by_b = lambda: requests.head(on_b_fork, timeout=TIMEOUT_S).status_code == 200  # noqa: E731
    wait_until(served_by_b, "the fork served by b", 30)
    assert requests.get(on_b_fork, params={"offset": "-1"}, timeout=TIMEOUT_S).content == b"one;two;fork;"
