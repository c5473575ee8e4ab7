"""S3 and Durable Streams through a cluster node that does not serve the request's container.

Two real nodes share a bucket on moto. A request is sent to the node that
does not serve the container of its subject (an object's segment, a
bucket's marker, a stream's meta segment): it is forwarded to the node that
does, with its Host header and raw path (Signature V4 verifies there), and
the answer comes back streamed with ``Segment-Owner``. During a takeover a
request waits up to ``takeover_wait_s`` for the new owner, then 503.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import boto3
import pytest
import requests
from botocore.config import Config

from app.s3.names import S3, s3_state_name
from app.streams.names import STREAMS, stream_meta_segment
from bench.servers import ServerProcess, cluster_node_env, free_port
from engine import ReservedNames
from engine.naming import container_for
from tests.polling import wait_until
from tests.s3.conftest import ACCESS_KEY, SECRET_KEY
from tests.s3.test_uploads import _chunk_signature, _signed_headers
from tests.test_cluster import CONTAINERS, LEASE_S, TIMEOUT_S, owners

pytestmark = pytest.mark.slow

AWS = str(Path(sys.executable).parent / "aws")
MiB = 1024 * 1024


@contextlib.contextmanager
def cluster(
    root: Path, endpoint: str, bucket: str, takeover_wait_s: float
) -> Iterator[dict[str, ServerProcess]]:
    """Nodes a and b on one bucket, each serving two of the four containers."""
    ports = {"a": free_port(), "b": free_port()}
    servers = {}
    for node, port in ports.items():
        env = cluster_node_env(node, port, endpoint, bucket, lease_s=LEASE_S, containers=CONTAINERS)
        env["SEGSTORE_S3_KEYS"] = f"{ACCESS_KEY}:{SECRET_KEY}"
        env["SEGSTORE_TAKEOVER_WAIT_S"] = str(takeover_wait_s)
        servers[node] = ServerProcess(root / node, port=port, env=env)
    try:
        for server in servers.values():
            server.start()
        a = servers["a"].url
        wait_until(lambda: sorted(map(str, owners(a))) == ["a", "a", "b", "b"], "two containers each", 30)
        for server in servers.values():
            healthy = f"{server.url}/healthz"
            wait_until(lambda h=healthy: requests.get(h, timeout=TIMEOUT_S).ok, "recovered", 30)
        yield servers
    finally:
        for server in servers.values():
            server.kill()


@pytest.fixture(scope="module")
def nodes(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_client: Any
) -> Iterator[dict[str, ServerProcess]]:
    """One cluster for the tests that stop no node (starting one takes seconds); each names its own things."""
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    with cluster(tmp_path_factory.mktemp("nodes"), moto_endpoint, bucket, takeover_wait_s=5.0) as servers:
        yield servers


def served_by(url: str, node: str) -> Callable[[str], bool]:
    """Whether a segment name's container is served by ``node`` (in ``url``'s view)."""
    map_ = owners(url)
    return lambda name: map_[container_for(name, CONTAINERS)] == node


def roles(servers: dict[str, ServerProcess], surface: ReservedNames) -> tuple[str, str, str]:
    """(id, URL) of the node serving the container of ``surface``'s migration marker, and the other's URL.

    Each surface looks its marker up before any request, so it answers only
    on that node for now (see docs/cluster.md, "Forwarding"); the subjects of
    the test are put there, and requests sent to the other node.
    """
    home = owners(servers["a"].url)[container_for(surface.migrated, CONTAINERS)]
    assert home is not None
    other = "b" if home == "a" else "a"
    return home, servers[home].url, servers[other].url


def pick(prefix: str, ok: Callable[[str], bool]) -> str:
    return next(n for n in (f"{prefix}{i}" for i in range(1000)) if ok(n))


def s3_client(url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


def aws_chunked(url: str, pieces: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """A PUT body in signed aws-chunked encoding, with its signed headers (as tests/s3 builds them)."""
    headers = _signed_headers(
        url,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(sum(map(len, pieces)))},
    )
    previous = headers["Authorization"].rsplit("Signature=", 1)[1]
    body = b""
    for piece in [*pieces, b""]:
        previous = _chunk_signature(headers, previous, piece)
        body += f"{len(piece):x};chunk-signature={previous}\r\n".encode() + piece + b"\r\n"
    return body, headers


def test_s3_through_a_node_that_does_not_serve_the_object(
    nodes: dict[str, ServerProcess], tmp_path: Path
) -> None:
    home, owner_url, via = roles(nodes, S3)
    on_home = served_by(owner_url, home)
    # The bucket's marker and the objects on one node: requests go to the other, which forwards them.
    bucket = pick(f"clu-{uuid.uuid4().hex[:8]}-", lambda n: on_home(s3_state_name("buckets", n)))
    key, copy, big, cli, chunked, streamed = (
        pick(p, lambda k: on_home(f"{bucket}/{k}"))
        for p in ("dir/a b+c~é ", "copy-", "big-", "cli-", "chunked-", "streamed-")
    )
    s3 = s3_client(via)

    created = s3.create_bucket(Bucket=bucket)
    assert created["ResponseMetadata"]["HTTPHeaders"]["segment-owner"] == home
    assert s3.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPHeaders"]["segment-owner"] == home
    data = os.urandom(300_000)
    put = s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert put["ResponseMetadata"]["HTTPHeaders"]["segment-owner"] == home
    ranged = s3.get_object(Bucket=bucket, Key=key, Range="bytes=1000-1999")
    assert (
        ranged["Body"].read() == data[1000:2000] and ranged["ContentRange"] == f"bytes 1000-1999/{len(data)}"
    )
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(data)
    s3.copy_object(Bucket=bucket, Key=copy, CopySource={"Bucket": bucket, "Key": key})
    assert s3.get_object(Bucket=bucket, Key=copy)["Body"].read() == data

    upload = s3.create_multipart_upload(Bucket=bucket, Key=big)["UploadId"]
    parts = [os.urandom(5 * MiB), os.urandom(1234)]
    etags = [
        s3.upload_part(Bucket=bucket, Key=big, UploadId=upload, PartNumber=n, Body=part)["ETag"]
        for n, part in enumerate(parts, 1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=big,
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    assert s3.get_object(Bucket=bucket, Key=big)["Body"].read() == b"".join(parts)

    s3.delete_object(Bucket=bucket, Key=copy)
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key=copy)
    direct = requests.head(f"{owner_url}/{bucket}/{quote(key)}", timeout=TIMEOUT_S)  # unsigned: refused
    assert direct.status_code == 403 and "Segment-Owner" not in direct.headers

    # Signed aws-chunked bodies pass unaltered: with a length, and sent chunked (no length).
    pieces = [os.urandom(64 * 1024), os.urandom(64 * 1024), b"tail"]
    for name, as_stream in ((chunked, False), (streamed, True)):
        url = f"{via}/{bucket}/{quote(name)}"
        body, headers = aws_chunked(url, pieces)
        sent = requests.put(url, data=iter([body]) if as_stream else body, headers=headers, timeout=TIMEOUT_S)
        assert sent.status_code == 200 and sent.headers["Segment-Owner"] == home, sent.text
        assert s3.get_object(Bucket=bucket, Key=name)["Body"].read() == b"".join(pieces)

    source = tmp_path / "up.bin"
    source.write_bytes(os.urandom(200_000))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds",
        "AWS_MAX_ATTEMPTS": "1",
    }
    for args in (
        ["s3", "cp", str(source), f"s3://{bucket}/{cli}"],
        ["s3", "cp", f"s3://{bucket}/{cli}", str(tmp_path / "down.bin")],
    ):
        done = subprocess.run(
            [AWS, "--endpoint-url", via, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "down.bin").read_bytes() == source.read_bytes()


def test_delete_objects_deletes_keys_both_nodes_serve(nodes: dict[str, ServerProcess]) -> None:
    """One DeleteObjects request names keys of both nodes' containers: each is deleted where it lives."""
    home, owner_url, via = roles(nodes, S3)
    on_home = served_by(owner_url, home)
    bucket = pick(f"del-{uuid.uuid4().hex[:8]}-", lambda n: on_home(s3_state_name("buckets", n)))
    here = pick("here-", lambda k: on_home(f"{bucket}/{k}"))
    there = pick("there-", lambda k: not on_home(f"{bucket}/{k}"))
    s3 = s3_client(via)
    s3.create_bucket(Bucket=bucket)
    for key in (here, there):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    keys = [here, there, "missing"]
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    assert "Errors" not in result, result["Errors"]
    assert sorted(d["Key"] for d in result["Deleted"]) == sorted(keys)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_durable_streams_through_a_node_that_does_not_serve_the_stream(
    nodes: dict[str, ServerProcess],
) -> None:
    home, owner_url, via = roles(nodes, STREAMS)
    name = pick("events-", lambda n: served_by(owner_url, home)(stream_meta_segment(n)))
    url = f"{via}/v1/stream/{name}"
    text = {"Content-Type": "text/plain"}

    created = requests.put(url, data=b"one;", headers=text, timeout=TIMEOUT_S)
    assert created.status_code == 201 and created.headers["Segment-Owner"] == home
    plain = requests.post(url, data=b"two;", headers=text, timeout=TIMEOUT_S)  # the append shortcut's path
    assert plain.status_code == 204 and plain.headers["Segment-Owner"] == home
    seq = requests.post(url, data=b"three;", headers={**text, "Stream-Seq": "0001"}, timeout=TIMEOUT_S)
    assert seq.status_code == 204, seq.text
    read = requests.get(url, params={"offset": "-1"}, timeout=TIMEOUT_S)
    assert read.content == b"one;two;three;" and read.headers["Segment-Owner"] == home
    tail = read.headers["Stream-Next-Offset"]

    woken: dict[str, requests.Response] = {}

    def long_poll() -> None:
        woken["answer"] = requests.get(
            url, params={"offset": tail, "live": "long-poll"}, timeout=TIMEOUT_S + 30
        )

    reader = threading.Thread(target=long_poll)
    reader.start()
    time.sleep(0.5)
    assert (
        requests.post(
            f"{owner_url}/v1/stream/{name}", data=b"four;", headers=text, timeout=TIMEOUT_S
        ).status_code
        == 204
    )
    reader.join(TIMEOUT_S + 30)
    assert woken["answer"].status_code == 200 and woken["answer"].content == b"four;"
    assert woken["answer"].headers["Segment-Owner"] == home

    events: list[str] = []
    with requests.get(url, params={"offset": "-1", "live": "sse"}, stream=True, timeout=TIMEOUT_S) as sse:
        assert sse.headers["Content-Type"] == "text/event-stream" and sse.headers["Segment-Owner"] == home
        for line in sse.iter_lines(decode_unicode=True):
            if line.startswith("data:") and not line.startswith("data:{"):
                events.append(line.removeprefix("data:"))
            if line.startswith("data:{") and json.loads(line.removeprefix("data:")).get("upToDate"):
                break
    assert "".join(events) == "one;two;three;four;"


def _takeover(tmp_path: Path, endpoint: str, bucket: str, wait_s: float) -> tuple[requests.Response, float]:
    """Kill the node serving a segment's container, then append to it through the other node."""
    with cluster(tmp_path, endpoint, bucket, takeover_wait_s=wait_s) as servers:
        a, b = servers["a"].url, servers["b"].url
        name = pick("taken-", served_by(a, "a"))
        assert requests.put(f"{a}/v1/segments/{name}", timeout=TIMEOUT_S).status_code == 201
        servers["a"].kill()
        started = time.monotonic()
        answer = requests.post(f"{b}/v1/segments/{name}", data=b"after", timeout=wait_s + 60)
        return answer, time.monotonic() - started


def test_a_request_during_a_takeover_waits_for_the_new_owner(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    answer, waited_s = _takeover(tmp_path, moto_endpoint, s3_bucket, wait_s=60.0)
    assert answer.status_code == 200, answer.text
    assert answer.json()["offset"] == 0 and "Segment-Owner" not in answer.headers
    assert waited_s > 1.0, "the lease had to lapse first"


def test_a_request_during_a_takeover_answers_503_past_the_bound(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    answer, waited_s = _takeover(tmp_path, moto_endpoint, s3_bucket, wait_s=0.5)
    assert answer.status_code == 503, answer.text
    assert "container" in answer.json()["detail"]  # ContainerNotReady
    # The expected wait: the rest of the dead owner's lease as this node saw it, then a recovery.
    assert 1 <= int(answer.headers["Retry-After"]) <= LEASE_S + 1, answer.headers["Retry-After"]
    assert 0.5 <= waited_s < 10, waited_s
