"""Tier 2 on S3, end to end: a real server process over a real S3 endpoint (moto), and failover.

- Restart with Tier 1 truncated: the data lives only in the bucket (checked
  on disk: no Tier 1 file holds it), yet every byte reads back after a
  SIGKILL and a restart, and a retried append is still a duplicate.
- A cold read comes from S3: the bytes a read returns after a restart are
  the bucket's (an object changed behind the server's back shows through; a
  deleted one makes the read fail rather than return data).
- Truncation deletes the objects wholly below the new start offset and keeps
  the rest.
- A Durable Streams fork names its source's objects (none is written for
  the shared bytes); they outlive the source's delete and go with the fork.
- Failover (in-process, on the in-memory twins): a new epoch never writes to
  a chunk an older epoch created, and an old epoch's late bytes never show in
  reads.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import requests
from prometheus_client import CollectorRegistry

from app.streams.names import STREAM_DATA_PREFIX
from bench.servers import FAKE_AWS_ENV, ServerProcess
from engine import SegmentStore, Settings
from engine.container.segment_container import SegmentContainer
from engine.metrics import EngineMetrics
from engine.naming import chunk_name, parse_chunk_name, parse_log_file_name, tier1_dir
from engine.tier1.memory_log import MemoryDataLog
from engine.tier2.chunk_storage import ChunkHandle
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage
from engine.tier2.s3 import S3ChunkStorage
from tests.polling import wait_until

KiB = 1024
MiB = 1024 * KiB
TIMEOUT_S = 10
PREFIX = "tier2/test"
# One container, so a Tier 1 folder and a checkpoint cadence cover every segment.
# Tier 1 rolls every 128 KiB and checkpoints every 64 KiB; the writer flushes within 50 ms.
SMALL_TIER1 = {
    "container_count": 1,
    "flush_threshold_ms": 50,
    "flush_threshold_bytes": 256 * KiB,
    "tier1_file_bytes": 128 * KiB,
    "checkpoint_every_bytes": 64 * KiB,
}


# ------------------------------------------------------------------ helpers
def s3_env(endpoint: str, bucket: str, **settings: object) -> dict[str, str]:
    """The server's environment: Tier 2 in ``bucket`` under PREFIX, the fake AWS credentials."""
    return {
        **FAKE_AWS_ENV,
        "SEGSTORE_LOG_LEVEL": "warning",
        "SEGSTORE_TIER2": f"s3://{bucket}/{PREFIX}",
        "SEGSTORE_S3_ENDPOINT": endpoint,
        **{f"SEGSTORE_{key.upper()}": str(value) for key, value in settings.items()},
    }


@contextlib.contextmanager
def running(data_dir: Path, env: dict[str, str]) -> Iterator[ServerProcess]:
    """A started server, SIGKILLed on the way out whatever happened."""
    server = ServerProcess(data_dir, env=env).start()
    try:
        yield server
    finally:
        server.kill()



class Client:
    """The few HTTP calls these tests make, each checked for its status."""

    def __init__(self, url: str) -> None:
        self.url = url + "/v1/segments/"
        self.http = requests.Session()

    def create(self, name: str) -> None:
        response = self.http.put(self.url + name, timeout=TIMEOUT_S)
        assert response.status_code == 201, response.text

    def append(self, name: str, data: bytes, writer: uuid.UUID | None = None, event: int = 0) -> dict:
        headers = {} if writer is None else {"Writer-Id": str(writer), "Event-Number": str(event)}
        response = self.http.post(self.url + name, data=data, headers=headers, timeout=TIMEOUT_S)
        assert response.status_code == 200, response.text
        return response.json()

    def info(self, name: str) -> dict:
        response = self.http.get(self.url + name + ":info", timeout=TIMEOUT_S)
        assert response.status_code == 200, response.text
        return response.json()

    def flushed(self, name: str) -> bool:
        info = self.info(name)
        return info["storage_length"] == info["length"]

    def get(self, name: str, offset: int, length: int | None = None) -> requests.Response:
        params = {"offset": offset} if length is None else {"offset": offset, "length": length}
        return self.http.get(self.url + name, params=params, timeout=TIMEOUT_S)

    def read_all(self, name: str, offset: int = 0) -> bytes:
        """Every byte from ``offset`` to the length, request after request."""
        length = self.info(name)["length"]
        parts = []
        while offset < length:
            response = self.get(name, offset)
            assert response.status_code == 200, response.text
            assert response.content, f"empty read at {offset} of {length}"
            parts.append(response.content)
            offset = int(response.headers["Segment-Next-Offset"])
        return b"".join(parts)


@dataclass(frozen=True)
class ChunkObject:
    """An object in the bucket holding bytes [start, start + size) of a segment."""

    key: str
    segment: str
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def chunk_objects(s3: Any, bucket: str) -> list[ChunkObject]:
    """Every chunk object under PREFIX, by segment then start offset (other keys must not exist)."""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX + "/"):
        for obj in page.get("Contents", ()):
            name = obj["Key"].removeprefix(PREFIX + "/")
            parts = parse_chunk_name(name)
            assert parts is not None, f"not a chunk object: {obj['Key']}"
            segment = unquote(name.split("/")[1].rpartition(".")[0])
            found.append(ChunkObject(obj["Key"], segment, parts.offset, int(obj["Size"])))
    return sorted(found, key=lambda c: (c.segment, c.start))


def covers(objects: list[ChunkObject], length: int) -> bool:
    """Whether the objects hold every byte of [0, length) and none past it."""
    reached = 0
    for obj in sorted(objects, key=lambda c: c.start):
        if obj.start > reached:
            return False
        reached = max(reached, obj.end)
    return reached == length and all(obj.end <= length for obj in objects)


def tier1_files(data_dir: Path, container: int = 0) -> list[Path]:
    folder = tier1_dir(data_dir, container)
    return sorted(
        (p for p in folder.iterdir() if parse_log_file_name(p.name) is not None),
        key=lambda p: parse_log_file_name(p.name) or 0,
    )


def tier1_holds(data_dir: Path, samples: list[bytes]) -> list[bytes]:
    """The samples some Tier 1 log file contains (files may vanish while a server truncates)."""
    blobs = []
    for path in tier1_files(data_dir):
        with contextlib.suppress(FileNotFoundError):
            blobs.append(path.read_bytes())
    return [s for s in samples if any(s in blob for blob in blobs)]


def samples_of(payload: bytes) -> list[bytes]:
    """Three 32-byte windows of a random payload (a frame header could split one, not all three)."""
    return [payload[i : i + 32] for i in (len(payload) // 4, len(payload) // 2, 3 * len(payload) // 4)]


def push_data_out_of_tier1(client: Client, data_dir: Path, samples: list[bytes]) -> None:
    """Append to another segment until Tier 1 has moved past every sample (flushed, checkpointed, truncated).

    The newest tick is always in Tier 1 (nothing truncates past the newest
    checkpoint), which shows that the scan would see the samples if they were there.
    """
    client.create("tier2/tick")
    rng = random.Random(7)
    deadline = time.monotonic() + 20
    tick = b""
    while tier1_holds(data_dir, samples):
        assert time.monotonic() < deadline, "Tier 1 still holds flushed data after 20 s"
        tick = rng.randbytes(8 * KiB)
        client.append("tier2/tick", tick)
        time.sleep(0.01)
    wait_until(lambda: client.flushed("tier2/tick"), "the ticks are in S3")
    assert tier1_holds(data_dir, samples_of(tick)), "the Tier 1 scan does not see the newest append"
    first = parse_log_file_name(tier1_files(data_dir)[0].name)
    assert first is not None and first > 0, "Tier 1 was not truncated"


# ------------------------------------------------------------ 1. restart
@pytest.mark.slow
def test_restart_reads_back_data_held_only_in_s3(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    data_dir = tmp_path / "data"
    env = s3_env(moto_endpoint, s3_bucket, **SMALL_TIER1)
    rng = random.Random(1)
    writers = {"tier2/a": uuid.uuid4(), "tier2/b/0": uuid.uuid4()}
    sent: dict[str, list[bytes]] = {name: [] for name in writers}
    with running(data_dir, env) as server:
        client = Client(server.url)
        for name in writers:
            client.create(name)
        for event in range(1, 25):  # 2 x 24 appends of 64 KiB: 3 MiB
            for name, writer in writers.items():
                payload = rng.randbytes(64 * KiB)
                answer = client.append(name, payload, writer, event)
                assert answer["offset"] == sum(map(len, sent[name])), answer
                sent[name].append(payload)
        for name in writers:
            wait_until(lambda name=name: client.flushed(name), f"{name} is in S3")
        samples = [s for payloads in sent.values() for p in payloads for s in samples_of(p)]
        push_data_out_of_tier1(client, data_dir, samples)
        server.kill()

    # Tier 1 stays as the server left it: rolled, truncated, without the data.
    assert len(tier1_files(data_dir)) >= 1
    assert not tier1_holds(data_dir, samples)
    objects = chunk_objects(s3_client, s3_bucket)
    for name, payloads in sent.items():
        mine = [o for o in objects if o.segment == name]
        assert len(mine) > 1 and covers(mine, sum(map(len, payloads))), (name, mine)

    with running(data_dir, env) as server:
        client = Client(server.url)
        for name, writer in writers.items():
            expected = b"".join(sent[name])
            info = client.info(name)
            assert (info["length"], info["storage_length"]) == (len(expected), len(expected)), info
            assert client.read_all(name) == expected
            for _ in range(5):  # ranges that start and end inside chunks
                start = rng.randrange(len(expected))
                response = client.get(name, start, rng.randint(1, 300 * KiB))
                assert response.status_code == 200, response.text
                assert response.content == expected[start : start + len(response.content)]
                assert response.content
            # The writer's last event is known after the restart: its retry is a duplicate.
            state = client.http.get(f"{client.url}{name}:writers/{writer}", timeout=TIMEOUT_S)
            assert state.json()["event_number"] == len(sent[name])
            for event in (len(sent[name]), 1):
                retry = client.append(name, sent[name][event - 1], writer, event)
                assert retry["duplicate"] is True and retry["length"] == len(expected), retry
            assert client.info(name)["length"] == len(expected)
            fresh = client.append(name, b"after the restart", writer, len(sent[name]) + 1)
            assert fresh["offset"] == len(expected), fresh
            assert client.read_all(name, len(expected)) == b"after the restart"


# -------------------------------------------------------- 2. cold reads
@pytest.mark.slow
def test_a_cold_read_comes_from_s3(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    """After a restart, with Tier 1 truncated and a cache of 64 KiB, reads show the bucket's bytes."""
    data_dir = tmp_path / "data"
    env = s3_env(
        moto_endpoint,
        s3_bucket,
        **SMALL_TIER1,
        cache_max_bytes=64 * KiB,
        cache_block_bytes=16 * KiB,
        storage_read_block_bytes=32 * KiB,
        defrag_min_chunks=1000,
    )
    name = "tier2/cold"
    rng = random.Random(2)
    payloads = [rng.randbytes(96 * KiB) for _ in range(8)]
    with running(data_dir, env) as server:
        client = Client(server.url)
        client.create(name)
        for payload in payloads:  # one flush, so one object, per append
            client.append(name, payload)
            wait_until(lambda: client.flushed(name), "the append is in S3")
        push_data_out_of_tier1(client, data_dir, [s for p in payloads for s in samples_of(p)])
    expected = b"".join(payloads)
    objects = chunk_objects(s3_client, s3_bucket)
    mine = [o for o in objects if o.segment == name]
    assert [(o.start, o.size) for o in mine] == [(i * 96 * KiB, 96 * KiB) for i in range(8)]

    with running(data_dir, env) as server:
        client = Client(server.url)
        assert client.read_all(name) == expected
        # Change the first object behind the server's back, delete the fourth: the
        # first is long evicted from the 64 KiB cache, so its read must go to S3.
        changed = bytes(b ^ 0xFF for b in payloads[0])
        s3_client.put_object(Bucket=s3_bucket, Key=mine[0].key, Body=changed)
        s3_client.delete_object(Bucket=s3_bucket, Key=mine[3].key)
        response = client.get(name, 0, mine[0].size)
        assert response.status_code == 200, response.text
        assert response.content == changed
        # The objects still there read as before.
        assert client.get(name, mine[5].start, mine[5].size).content == payloads[5]
        # A lost object is an error, not data; and not "no such segment": the segment exists.
        lost = client.get(name, mine[3].start + 10, 100)
        assert lost.headers["Content-Type"] == "application/problem+json", lost.headers
        assert expected[mine[3].start + 10 : mine[3].start + 110] not in lost.content
        assert client.info(name)["length"] == len(expected)
        assert lost.status_code >= 500, (lost.status_code, lost.text)


# ----------------------------------------------------------- 3. truncation
@pytest.mark.slow
def test_truncation_deletes_the_objects_below_the_start_offset(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    data_dir = tmp_path / "data"
    env = s3_env(
        moto_endpoint,
        s3_bucket,
        flush_threshold_ms=50,
        cache_max_bytes=64 * KiB,
        cache_block_bytes=16 * KiB,
        storage_read_block_bytes=32 * KiB,
        defrag_min_chunks=1000,
    )
    name = "tier2/truncated"
    rng = random.Random(3)
    payloads = [rng.randbytes(rng.randint(40 * KiB, 120 * KiB)) for _ in range(8)]
    expected = b"".join(payloads)
    with running(data_dir, env) as server:
        client = Client(server.url)
        client.create(name)
        for payload in payloads:  # one flush, so one object, per append
            client.append(name, payload)
            wait_until(lambda: client.flushed(name), "the append is in S3")
        before = chunk_objects(s3_client, s3_bucket)
        assert len(before) == len(payloads) and covers(before, len(expected)), before
        cut = before[4].start + before[4].size // 2  # past four whole objects, inside the fifth
        kept = {o.key for o in before if o.end > cut}
        assert len(kept) == 4

        response = client.http.post(f"{client.url}{name}:truncate", json={"offset": cut}, timeout=TIMEOUT_S)
        assert response.status_code == 200, response.text
        assert response.json()["start_offset"] == cut
        wait_until(
            lambda: {o.key for o in chunk_objects(s3_client, s3_bucket)} == kept,
            "exactly the objects below the start offset are gone",
        )
        for attempt in range(2):
            if attempt:  # and again after a restart, with a cold cache
                server.kill()
                server.start()
            assert client.read_all(name, cut) == expected[cut:]
            response = client.get(name, cut + 1000, 5000)
            assert response.content == expected[cut + 1000 : cut + 6000]
            assert client.get(name, before[6].start, before[6].size).content == payloads[6]
            for below in (0, before[3].end, cut - 1):
                response = client.get(name, below, 10)
                assert response.status_code == 410, (below, response.status_code, response.text)
                assert response.headers["Segment-Start-Offset"] == str(cut)
            default = client.http.get(client.url + name, timeout=TIMEOUT_S)
            assert default.status_code == 200 and default.content == expected[cut:]
        assert {o.key for o in chunk_objects(s3_client, s3_bucket)} == kept


# ----------------------------------------------------------------- 4. forks
@pytest.mark.slow
def test_a_stream_fork_names_the_sources_objects_and_outlives_its_source(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    """Forking flushed bytes writes no object; deleting the source keeps them; the last delete frees them."""
    data_dir = tmp_path / "data"
    env = s3_env(moto_endpoint, s3_bucket, flush_threshold_ms=50, defrag_min_chunks=1000)
    # One process: a fork whose source another process serves copies the bytes (README's "Limits").
    env["SEGSTORE_PROCESSES"] = "1"
    rng = random.Random(4)
    with running(data_dir, env) as server:
        client = Client(server.url)
        streams = server.url + "/v1/stream/"

        def data_objects(stream: str) -> list[ChunkObject]:
            """The stream's data segment's objects (stream state is out of the native API's reach)."""
            prefix = f"{STREAM_DATA_PREFIX}{stream}/"
            return [o for o in chunk_objects(s3_client, s3_bucket) if o.segment.startswith(prefix)]

        def flushed(stream: str, length: int) -> bool:
            return sum(o.size for o in data_objects(stream)) == length

        client.http.headers["Content-Type"] = "application/octet-stream"
        assert client.http.put(streams + "src", timeout=TIMEOUT_S).status_code == 201
        messages = [rng.randbytes(32 * KiB) for _ in range(6)]
        for i, message in enumerate(messages):
            assert client.http.post(streams + "src", data=message, timeout=TIMEOUT_S).status_code == 204
            length = sum(4 + len(m) for m in messages[: i + 1])  # each message is framed
            wait_until(lambda length=length: flushed("src", length), "the message is in S3")

        before = data_objects("src")
        assert len(before) == len(messages)
        fork = client.http.put(streams + "fork", headers={"Stream-Forked-From": "src"}, timeout=TIMEOUT_S)
        assert fork.status_code == 201, fork.text
        assert client.http.post(streams + "fork", data=b"own", timeout=TIMEOUT_S).status_code == 204
        wait_until(lambda: flushed("fork", 4 + 3), "the fork's own message is in S3")
        assert data_objects("src") == before
        assert [o.size for o in data_objects("fork")] == [4 + 3]  # only its own message: a frame

        assert client.http.delete(streams + "src", timeout=TIMEOUT_S).status_code == 204
        assert client.http.get(streams + "src", timeout=TIMEOUT_S).status_code == 410
        server.kill()
        server.start()
        read = client.http.get(streams + "fork", params={"offset": "-1"}, timeout=TIMEOUT_S)
        assert read.status_code == 200 and read.content == b"".join(messages) + b"own"

        assert client.http.delete(streams + "fork", timeout=TIMEOUT_S).status_code == 204
        wait_until(lambda: not chunk_objects(s3_client, s3_bucket), "every object is gone")


# ------------------------------------------------------------- 5. failover
class Node:
    """One in-process container on a memory Tier 1 and the given Tier 2, restartable like a process."""

    def __init__(self, settings: Settings, storage: Any) -> None:
        self.settings = settings
        self.data_log = MemoryDataLog(max_frame_bytes=settings.max_frame_bytes)
        self.storage = storage
        self.store = self._start()

    def _start(self) -> SegmentStore:
        self.container = SegmentContainer(
            0, self.settings, self.data_log, self.storage, EngineMetrics(CollectorRegistry())
        )
        store = SegmentStore(self.settings, containers=[self.container])
        store.start(wait=True)
        return store

    def restart(self) -> None:
        self.store.close()
        self.data_log = self.data_log.reopen()
        self.store = self._start()

    @property
    def epoch(self) -> int:
        return self.container.metadata.epoch

    def layout(self, name: str) -> list[Any]:
        with self.container.metadata.lock:
            return list(self.container.metadata.by_name(name).chunks)

    def chunk(self, name: str) -> bytes:
        return bytes(self.storage.chunks[name])


def test_a_new_epoch_never_writes_to_an_old_chunk_and_never_reads_late_bytes(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=str(tmp_path),
        container_count=1,
        max_frame_bytes=4096,
        tier1_file_bytes=8192,
        flush_threshold_ms=20,
        cache_max_bytes=2048,
        cache_block_bytes=1024,
        storage_read_block_bytes=1024,
    )
    rng = random.Random(4)
    a1, a2, b1, b2, b3 = (rng.randbytes(3000) for _ in range(5))
    late = b"LATE BYTES OF THE OLD EPOCH" * 10
    node = Node(settings, MemoryChunkStorage())  # can append: the case where fencing matters
    try:
        name = "failover/seg"
        node.store.create(name)
        # Epoch N: its second flush appends to the chunk its first flush created.
        node.store.append(name, a1)
        node.store.flush()
        node.store.append(name, a2)
        node.store.flush()
        epoch_n = node.epoch
        [old] = node.layout(name)
        assert parse_chunk_name(old.name).epoch == epoch_n
        assert (old.start, old.length, node.chunk(old.name)) == (0, 6000, a1 + a2)

        # Epoch N+1 starts; the old chunk still looks writable (appendable, under rollover).
        node.restart()
        assert node.epoch == epoch_n + 1
        node.store.append(name, b1)
        node.store.flush()
        assert node.chunk(old.name) == a1 + a2, "the new epoch wrote to the old epoch's chunk"
        first, new = node.layout(name)
        assert first == old
        assert parse_chunk_name(new.name).epoch == epoch_n + 1
        assert (new.start, new.length) == (6000, 3000)

        # The old epoch's delayed write lands now, at the end of its chunk.
        node.storage.write(ChunkHandle(old.name, read_only=False), 6000, late)
        # So does a chunk the old epoch created whose layout update never happened.
        segment_id = parse_chunk_name(old.name).segment_id
        stray = chunk_name(0, name, segment_id, epoch_n, 9000)
        node.storage.create(stray, late)
        node.store.append(name, b2)
        node.store.flush()
        assert node.layout(name) == [old, new._replace(length=6000)]
        assert node.chunk(old.name) == a1 + a2 + late
        assert node.chunk(new.name) == b1 + b2
        expected = a1 + a2 + b1 + b2
        assert node.container.chunked.read(node.layout(name), 0, len(expected)) == expected
        assert node.store.read(name, 0).data == expected
        assert node.store.read(name, 5990, 20).data == a2[-10:] + b1[:10]

        # Epoch N+2: the stray chunk is collected, the named ones stay; still no late byte.
        node.restart()
        assert node.epoch == epoch_n + 2
        assert not node.storage.exists(stray)
        assert node.chunk(old.name) == a1 + a2 + late
        assert node.store.read(name, 0).data == expected
        node.store.append(name, b3)
        node.store.flush()
        *_, newest = node.layout(name)
        assert parse_chunk_name(newest.name).epoch == epoch_n + 2
        assert node.chunk(new.name) == b1 + b2
        assert node.store.read(name, 0).data == expected + b3
        assert late not in node.store.read(name, 0).data
    finally:
        node.store.close()


# ------------------------------------------------------ 5. reads and defrag
def test_a_cold_read_racing_a_defrag_returns_the_bytes(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    """A read that took the layout before a defrag replaced its chunks still returns the bytes.

    Defrag joins small S3 objects into one and deletes them once the new
    layout is durable; a read already on its way to the old objects finds
    them gone and must read through the new layout, not report the segment
    missing.
    """
    settings = Settings(
        data_dir=str(tmp_path),
        container_count=1,
        max_frame_bytes=4096,
        tier1_file_bytes=8192,
        flush_threshold_ms=20,
        cache_max_bytes=2048,
        cache_block_bytes=1024,
        storage_read_block_bytes=1024,
        read_ahead_bytes=0,
        defrag_min_chunks=4,
    )
    storage = FaultyChunkStorage(S3ChunkStorage(s3_bucket, PREFIX, endpoint_url=moto_endpoint))
    node = Node(settings, storage)
    try:
        name = "defrag/seg"
        rng = random.Random(5)
        payloads = [rng.randbytes(3000) for _ in range(5)]
        node.store.create(name)
        for payload in payloads[:4]:  # four objects: one short of a defrag
            node.store.append(name, payload)
            node.store.flush()
        before = node.layout(name)
        assert len(before) == 4
        expected = b"".join(payloads[:4])

        result: list[object] = []
        storage.hold("read")  # the reader's first GetObject waits until the defrag is done
        reader = threading.Thread(target=lambda: result.append(_read_or_error(node.store, name, 12000)))
        reader.start()
        wait_until(lambda: storage.calls["read"] > 0, "the reader reached Tier 2")
        node.store.append(name, payloads[4])  # the fifth object: the first four are joined
        node.store.flush()
        after = node.layout(name)
        assert len(after) == 2 and not {c.name for c in before} & {c.name for c in after}, after
        assert reader.is_alive(), "the read ended before it reached its first object"
        storage.release("read")
        reader.join(10)
        [got] = result
        assert not isinstance(got, Exception), f"the read failed: {got!r}"
        assert got == expected
        assert node.store.read(name, 0).data == expected + payloads[4]
    finally:
        node.store.close()


def _read_or_error(store: SegmentStore, name: str, length: int) -> object:
    try:
        return store.read(name, 0, length).data
    except Exception as exc:
        return exc
