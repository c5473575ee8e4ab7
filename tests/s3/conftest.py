"""A real segstore server with S3 keys and an auth file, and boto3 clients for it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from bench.servers import ServerProcess
from tests.processes import killed_at_exit

ACCESS_KEY = "AKIDSEGSTORETEST"
SECRET_KEY = "segstore-test-secret"
READER_KEY = "AKIDREADONLY"
READER_SECRET = "reader-secret"
TOKEN = "native-admin-token-0123456789"
AUTH_FILE = f"""
[[token]]
name = "admin"
token = "{TOKEN}"
grants = [{{prefix = "", access = "admin"}}]

[[s3_key]]
access_key = "{ACCESS_KEY}"
grants = [{{prefix = "", access = "admin"}}]

[[s3_key]]
access_key = "{READER_KEY}"
grants = [{{prefix = "shared/", access = "read"}}]
"""


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("s3server")
    auth_file = root / "auth.toml"
    auth_file.write_text(AUTH_FILE)
    env = {
        # Two processes, as `make run` serves one per core: a request's keys may span both.
        "SEGSTORE_PROCESSES": os.environ.get("SEGSTORE_PROCESSES", "2"),
        "SEGSTORE_S3_KEYS": f"{ACCESS_KEY}:{SECRET_KEY},{READER_KEY}:{READER_SECRET}",
        "SEGSTORE_AUTH_FILE": str(auth_file),
        "SEGSTORE_FLUSH_THRESHOLD_MS": "100",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
    }
    with killed_at_exit(ServerProcess(root / "data", env=env)) as server:
        yield server


def make_client(url: str, access: str = ACCESS_KEY, secret: str = SECRET_KEY, **config: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, **config),
    )


@pytest.fixture(scope="session")
def s3(s3_server: ServerProcess) -> Any:
    return make_client(s3_server.url)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
