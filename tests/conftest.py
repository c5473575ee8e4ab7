"""Fixtures shared by every test package: a local S3 endpoint (moto in server mode), random seeds."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from bench.servers import FAKE_AWS_ENV, UNSET_AWS_ENV, MotoServer


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: MotoServer) -> Iterator[str]:
    """The moto server's URL, with fake AWS credentials in this process's environment."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_AWS_ENV.items():
            patch.setenv(name, value)
        for name in UNSET_AWS_ENV:
            patch.delenv(name, raising=False)
        yield moto_server.url


@pytest.fixture(scope="session")
def s3_client(moto_endpoint: str) -> Any:
    """One boto3 S3 client for the moto server (building a client costs about 0.1 s)."""
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def s3_bucket(moto_server: MotoServer, s3_client: Any) -> Iterator[str]:
    """A fresh, empty bucket; moto forgets everything after the test."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    moto_server.reset()


def random_seed() -> int:
    """A seed for a randomized test: ``SEGSTORE_TEST_SEED`` if set (to replay a failure), else a new one.

    The test names it in its failure message.
    """
    raw = os.environ.get("SEGSTORE_TEST_SEED")
    return int(raw) if raw else random.randrange(2**32)
