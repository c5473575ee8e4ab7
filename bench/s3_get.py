"""S3 GetObject benchmark: MB/s of one 256 MiB object through boto3, segstore against moto.

``python -m bench.s3_get [--size-mib N] [--repeat N]`` starts, in one run, a
segstore server (gunicorn + gevent, as ``make run``; S3 keys configured, so
every request is checked with Signature V4) and a moto server (S3 over HTTP
on loopback, as the Tier 2 benchmark uses it). The same random object is
uploaded to both with boto3's managed upload (8 MiB parts: a multipart
upload), read back once and compared byte for byte (not timed), then
GetObject is timed ``--repeat`` times on each, alternating, one streamed
response read in 1 MiB pieces by one client. Reported: MB/s (10^6 bytes/s)
as min / median / max. Both servers run on this machine and share its
cores with the client; segstore serves the object from its Tier 2 folder
and read cache, moto from memory.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from bench.servers import MotoServer, ServerProcess

MiB = 1024 * 1024
ACCESS_KEY = "AKIDBENCH"
SECRET_KEY = "bench-secret"
BUCKET = "bench"
KEY = "objects/big.bin"
FAKE_AWS_ENV = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


def client(url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(max_pool_connections=4, retries={"max_attempts": 2}),
    )


def upload(s3: Any, data: bytes) -> None:
    s3.create_bucket(Bucket=BUCKET)
    config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
    s3.upload_fileobj(io.BytesIO(data), BUCKET, KEY, Config=config)


def read_whole(s3: Any) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()


def timed_get(s3: Any, size: int) -> float:
    """One GetObject streamed in 1 MiB pieces; returns MB/s."""
    start = time.perf_counter()
    body = s3.get_object(Bucket=BUCKET, Key=KEY)["Body"]
    got = 0
    for piece in body.iter_chunks(MiB):
        got += len(piece)
    elapsed = time.perf_counter() - start
    if got != size:
        raise RuntimeError(f"read {got} bytes of {size}")
    return size / elapsed / 1e6


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.update(FAKE_AWS_ENV)
    size = args.size_mib * MiB
    data = os.urandom(size)
    digest = hashlib.sha256(data).hexdigest()
    results: dict[str, list[float]] = {"segstore": [], "moto": []}
    with tempfile.TemporaryDirectory(prefix="bench-s3-get-") as tmp:
        root = Path(tmp)
        env = {"SEGSTORE_S3_KEYS": f"{ACCESS_KEY}:{SECRET_KEY}", **FAKE_AWS_ENV}
        with ServerProcess(root / "data", env=env) as segstore, MotoServer(root / "moto.log") as moto:
            clients = {"segstore": client(segstore.url), "moto": client(moto.url)}
            for name, s3 in clients.items():
                started = time.perf_counter()
                upload(s3, data)
                print(
                    f"  .. {name}: uploaded {args.size_mib} MiB in {time.perf_counter() - started:.1f} s",
                    file=sys.stderr,
                )
                if hashlib.sha256(read_whole(s3)).hexdigest() != digest:
                    raise RuntimeError(f"{name} returned other bytes than were uploaded")
            del data
            for run in range(args.repeat):
                for name, s3 in clients.items():
                    rate = timed_get(s3, size)
                    results[name].append(rate)
                    print(f"  .. run {run + 1} {name}: {rate:,.0f} MB/s", file=sys.stderr)
    print(
        f"GetObject of a {args.size_mib} MiB object through boto3, one client, MB/s min / median / max "
        f"over {args.repeat} runs"
    )
    for name, values in results.items():
        print(f"  {name:9s} {spread(values)}")
    ratio = statistics.median(results["segstore"]) / statistics.median(results["moto"])
    print(f"  segstore / moto (medians): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
