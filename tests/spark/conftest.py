"""Fixtures for the Spark tests: one local Spark session and one real server for the whole run."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import pytest

from bench.servers import ServerProcess
from client.segment_client import SegmentClient
from tests.processes import killed_at_exit

# Small, so that modest test data crosses appends, GETs and partitions several times.
MAX_APPEND_BYTES = 64 * 1024
MAX_READ_BYTES = 16 * 1024


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("spark-server") / "data"
    env = {
        "SEGSTORE_MAX_APPEND_BYTES": str(MAX_APPEND_BYTES),
        "SEGSTORE_MAX_READ_BYTES": str(MAX_READ_BYTES),
        "SEGSTORE_LOG_LEVEL": "warning",
    }
    with killed_at_exit(ServerProcess(data_dir, env=env)) as running:
        yield running


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """``local[2,2]``: two threads, and a failed task is tried once more (local mode's default is never)."""
    from pyspark.sql import SparkSession

    from client.spark import SegstoreDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("segstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(SegstoreDataSource)
    yield session
    session.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[SegmentClient]:
    with SegmentClient(server.url, retries=2, backoff_s=0.01) as segment_client:
        yield segment_client


@pytest.fixture
def scope() -> str:
    """A fresh name prefix per test, so tests sharing the server never meet."""
    return f"spark/{uuid.uuid4().hex[:12]}/"
