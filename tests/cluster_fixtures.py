"""Two cluster nodes on moto as real processes (lease 3 s, four containers): the tests' shared setup."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from bench.servers import ServerProcess, cluster_node_env, free_port
from tests.polling import wait_until

LEASE_S = 3
CONTAINERS = 4
TIMEOUT_S = 10


def cluster_map(url: str) -> dict:
    return requests.get(f"{url}/v1/cluster", timeout=TIMEOUT_S).json()



def owners(url: str) -> list[str | None]:
    return [c["owner"] for c in cluster_map(url)["containers"]]


@contextlib.contextmanager
def two_nodes(root: Path, moto_endpoint: str, bucket: str) -> Iterator[dict[str, ServerProcess]]:
    """Nodes a and b on one bucket, each serving two of the four containers."""
    ports = {"a": free_port(), "b": free_port()}
    envs = {n: cluster_node_env(n, p, moto_endpoint, bucket, lease_s=LEASE_S) for n, p in ports.items()}
    servers = {node: ServerProcess(root / node, port=ports[node], env=env) for node, env in envs.items()}
    try:
        for server in servers.values():
            server.start()
        a = servers["a"].url
        wait_until(lambda: sorted(map(str, owners(a))) == ["a", "a", "b", "b"], "two containers each", 30)
        yield servers
    finally:
        for server in servers.values():
            server.kill()


@pytest.fixture
def nodes(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> Iterator[dict[str, ServerProcess]]:
    """Two nodes of a test's own (one that stops a node, or needs an empty store)."""
    with two_nodes(tmp_path, moto_endpoint, s3_bucket) as servers:
        yield servers


@pytest.fixture(scope="module")
def shared_nodes(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_client: Any
) -> Iterator[dict[str, ServerProcess]]:
    """Two nodes for every test of a module that stops no node (starting them takes seconds).

    Each test names its own segments, buckets and streams.
    """
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    with two_nodes(tmp_path_factory.mktemp("nodes"), moto_endpoint, bucket) as servers:
        yield servers
