"""Fixtures for the client tests: one real server for all of them (each test names its own segments)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from bench.servers import ServerProcess
from client.segment_client import SegmentClient
from tests.processes import killed_at_exit

# Small enough that the tests cross it cheaply.
MAX_APPEND_BYTES = 64 * 1024


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("client-server") / "data"
    env = {"SEGSTORE_MAX_APPEND_BYTES": str(MAX_APPEND_BYTES)}
    with killed_at_exit(ServerProcess(data_dir, env=env)) as running:
        yield running


@pytest.fixture
def client(server: ServerProcess) -> Iterator[SegmentClient]:
    with SegmentClient(server.url, retries=2, backoff_s=0.01) as segment_client:
        yield segment_client


@pytest.fixture
def name() -> str:
    """A fresh segment name per test, so tests sharing a server never meet."""
    return f"test/{uuid.uuid4().hex[:12]}/0"
