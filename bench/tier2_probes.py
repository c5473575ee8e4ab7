"""What the Tier 2 benchmark reads off both sides: S3's objects and calls, segstore's segments."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from bench.servers import FAKE_AWS_ENV, UNSET_AWS_ENV, ServerProcess
from engine import naming
from engine.config import load_settings

MiB = 1024 * 1024
TAG_BYTES = 16
TIER2_PREFIX = "seg"
WAIT_FLUSHED_S = 600.0

# ------------------------------------------------------------------ S3 side
def fake_aws_environment() -> None:
    """Fake credentials for this process and the servers it starts; no machine AWS settings."""
    os.environ.update(FAKE_AWS_ENV)
    for name in UNSET_AWS_ENV:
        os.environ.pop(name, None)


def chunk_key_prefix(segment: str) -> str:
    """The S3 key prefix of every chunk of ``segment`` (any segment id), per engine/naming.py."""
    count = load_settings({}).container_count
    sample = naming.chunk_name(naming.container_for(segment, count), segment, 0, 0, 0)
    return f"{TIER2_PREFIX}/{sample.rsplit('/', 1)[0].removesuffix('0')}"


def chunk_objects(s3: Any, bucket: str, segment: str) -> list[tuple[str, int]]:
    """The segment's chunk objects as (key, size), in segment offset order; checked contiguous."""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=chunk_key_prefix(segment)):
        for obj in page.get("Contents", ()):
            parts = naming.parse_chunk_name(obj["Key"].removeprefix(TIER2_PREFIX + "/"))
            if parts is None:
                raise RuntimeError(f"not a chunk: {obj['Key']}")
            found.append((parts.offset, obj["Key"], int(obj["Size"])))
    found.sort()
    position = 0
    for offset, key, size in found:
        if offset != position:
            raise RuntimeError(f"chunk {key} starts at {offset}, the one before ends at {position}")
        position += size
    return [(key, size) for _, key, size in found]


# A werkzeug request line; error answers come wrapped in ANSI colour codes.
_LOG_LINE = re.compile(r'"(?:\x1b\[[\d;]*m)*([A-Z]+) (\S+) HTTP/1\.[01](?:\x1b\[[\d;]*m)*" (\d{3})')


class MotoLog:
    """moto's request log: which S3 calls reached keys under a prefix since a mark."""

    def __init__(self, path: Path, bucket: str) -> None:
        self.path = path
        self.bucket = bucket

    def mark(self) -> int:
        return self.path.stat().st_size

    def calls(self, since: int, key_prefix: str) -> Counter[str]:
        """S3 calls (GetObject, PutObject, ...) on keys starting with ``key_prefix``."""
        with open(self.path, "rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", "replace")
        wanted = f"/{self.bucket}/{key_prefix}"
        counts: Counter[str] = Counter()
        for match in _LOG_LINE.finditer(text):
            method, target = match.group(1), match.group(2)
            path, _, query = target.partition("?")
            if path.startswith(wanted):
                counts[_s3_call(method, query)] += 1
        return counts


def _s3_call(method: str, query: str) -> str:
    """The S3 operation a request line names (as botocore sends them)."""
    params = {p.partition("=")[0] for p in query.split("&") if p}
    if method == "PUT":
        return "UploadPart" if "partNumber" in params else "PutObject"
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in params else "CompleteMultipartUpload"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in params else "DeleteObject"
    return {"GET": "GetObject", "HEAD": "HeadObject"}.get(method, method)


# --------------------------------------------------------------- segstore side
def segment_info(server: ServerProcess, segment: str) -> dict[str, Any]:
    response = requests.get(f"{server.url}/v1/segments/{segment}:info", timeout=10)
    response.raise_for_status()
    return response.json()


def wait_flushed(server: ServerProcess, segment: str, timeout_s: float = WAIT_FLUSHED_S) -> int:
    """Wait until Tier 2 holds the whole segment; returns its length."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = segment_info(server, segment)
        if info["storage_length"] == info["length"]:
            return int(info["length"])
        time.sleep(0.02)
    raise RuntimeError(f"{segment}: Tier 2 did not catch up in {timeout_s} s")


def restart(server: ServerProcess) -> None:
    """Graceful stop, then start on the same data directory: the cache starts empty."""
    code = server.stop()
    if code != 0:
        raise RuntimeError(f"segstore exited with {code}: {server.log_tail()}")
    server.start()


class TagCheck:
    """The tag at the start of every 1 MiB of a byte stream fed in order."""

    def __init__(self) -> None:
        self.position = 0
        self.tags: list[bytes] = []
        self._partial = b""

    def feed(self, data: bytes) -> None:
        if self._partial:
            self._partial += data[: TAG_BYTES - len(self._partial)]
            if len(self._partial) == TAG_BYTES:
                self.tags.append(self._partial)
                self._partial = b""
        end = self.position + len(data)
        for boundary in range(-(-self.position // MiB) * MiB, end, MiB):
            tag = data[boundary - self.position : boundary - self.position + TAG_BYTES]
            if len(tag) == TAG_BYTES:
                self.tags.append(tag)
            else:
                self._partial = tag
        self.position = end


def tag(index: int) -> bytes:
    return f"{index:0{TAG_BYTES}d}".encode()


