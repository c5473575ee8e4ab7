"""Overwrites of one key as readers see them: the old object or the new one, whole; also across kill -9.

A writer overwrites a key with PutObject (bodies in hand and staged),
single-part multipart uploads and CopyObject, each body distinct; a reader
GETs the key all the while. Every answer must be one whole body that was
written: never NoSuchKey once the key exists, never an empty or mixed body.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from bench.servers import ServerProcess
from tests.conftest import random_seed
from tests.processes import killed_at_exit
from tests.s3.conftest import ACCESS_KEY, SECRET_KEY, make_client

# Appends of at most this many bytes: bodies above it are staged before they are published.
MAX_APPEND_BYTES = 1024
# Each overwrite races two readers' GETs in a loop: some thousand reads across 200 overwrites.
OVERWRITES = 200
BUCKET = "bucket"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {
        "SEGSTORE_S3_KEYS": f"{ACCESS_KEY}:{SECRET_KEY}",
        "SEGSTORE_MAX_APPEND_BYTES": str(MAX_APPEND_BYTES),
        "SEGSTORE_FLUSH_THRESHOLD_MS": "50",
    }
    with killed_at_exit(ServerProcess(tmp_path / "data", env=env)) as process:
        yield process


def body(i: int, rng: random.Random) -> bytes:
    """A distinct body, in hand (one append) or staged (several), by turns."""
    size = rng.choice([10, 300, 3 * MAX_APPEND_BYTES + 17])
    head = f"body {i}:".encode()
    return head + rng.randbytes(size)


def overwrite(s3: Any, bucket: str, i: int, data: bytes) -> None:
    """Write ``data`` over ``key``: PutObject, a one-part multipart upload or CopyObject, by turns."""
    kind = i % 3
    if kind == 0:
        s3.put_object(Bucket=bucket, Key="key", Body=data)
    elif kind == 1:
        upload = s3.create_multipart_upload(Bucket=bucket, Key="key")["UploadId"]
        part = s3.upload_part(Bucket=bucket, Key="key", UploadId=upload, PartNumber=1, Body=data)
        s3.complete_multipart_upload(
            Bucket=bucket, Key="key", UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
        )  # fmt: skip
    else:
        s3.put_object(Bucket=bucket, Key=f"source-{i}", Body=data)
        s3.copy_object(Bucket=bucket, Key="key", CopySource={"Bucket": bucket, "Key": f"source-{i}"})


@pytest.mark.slow
def test_a_reader_sees_one_whole_written_body_however_often_the_key_is_overwritten(
    server: ServerProcess,
) -> None:
    seed = random_seed()
    rng = random.Random(seed)
    s3 = make_client(server.url)
    s3.create_bucket(Bucket=BUCKET)
    written = [body(0, rng)]
    s3.put_object(Bucket=BUCKET, Key="key", Body=written[0])
    seen: list[bytes] = []
    failures: list[str] = []
    done = threading.Event()

    def read() -> None:
        reader = make_client(server.url)
        while not done.is_set():
            try:
                seen.append(reader.get_object(Bucket=BUCKET, Key="key")["Body"].read())
            except ClientError as err:
                failures.append(str(err))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for i in range(1, OVERWRITES + 1):
            written.append(body(i, rng))
            overwrite(s3, BUCKET, i, written[-1])
    finally:
        done.set()
        for reader in readers:
            reader.join(30)
    bodies = set(written)
    assert not failures, f"seed {seed}: {failures[:3]}"
    assert seen and all(answer in bodies for answer in seen), f"seed {seed}: a body never written"
    assert s3.get_object(Bucket=BUCKET, Key="key")["Body"].read() == written[-1]


class Overwriter:
    """Overwrites the key until stopped or cut off; knows the last body acknowledged and the one in flight."""

    def __init__(self, s3: Any, rng: random.Random, acknowledged: bytes) -> None:
        self.s3, self.rng = s3, rng
        self.acknowledged = acknowledged
        self.in_flight: bytes | None = None
        self.count = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.count += 1
            self.in_flight = body(self.count, self.rng)
            try:
                overwrite(self.s3, BUCKET, self.count, self.in_flight)
            except (ClientError, BotoCoreError, KeyError):
                # The server died under it. KeyError: an answer the kill cut after its head, which
                # botocore parses as far as it came (it does not hold a body to its Content-Length).
                return
            self.acknowledged, self.in_flight = self.in_flight, None


@pytest.mark.slow
def test_after_a_kill_anywhere_in_an_overwrite_the_key_holds_the_old_body_or_the_new(
    server: ServerProcess,
) -> None:
    seed = random_seed()
    rng = random.Random(seed)
    s3 = make_client(server.url)
    s3.create_bucket(Bucket=BUCKET)
    first = body(0, rng)
    s3.put_object(Bucket=BUCKET, Key="key", Body=first)
    writer = Overwriter(s3, rng, first)
    for kill in range(6):
        writer.stop.clear()
        thread = threading.Thread(target=writer.run)
        thread.start()
        time.sleep(rng.uniform(0.05, 0.6))
        server.kill()
        writer.stop.set()
        thread.join(30)
        server.start()
        now = s3.get_object(Bucket=BUCKET, Key="key")["Body"].read()
        assert now in (writer.acknowledged, writer.in_flight), f"seed {seed}, kill {kill}: not old, not new"
        writer.acknowledged, writer.in_flight = now, None
