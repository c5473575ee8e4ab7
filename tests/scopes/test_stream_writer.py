"""StreamWriter and conditional appends against a real server: per-key order and exactly once across
scalings (1 -> 2 -> 4 -> 1 segments) and a restart, pipelined batches that overtake one another."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.servers import ServerProcess
from client.errors import ConditionalCheckFailed
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from tests.conftest import random_seed
from tests.processes import killed_at_exit
from tests.scopes.writers import KeyedWriters, assert_exactly_once_in_order, read_in_successor_order

KEYS = [f"key-{i}" for i in range(50)]
BATCHES = 60
ENV = {"SEGSTORE_LOG_LEVEL": "warning", "SEGSTORE_FLUSH_THRESHOLD_MS": "100"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with killed_at_exit(ServerProcess(tmp_path_factory.mktemp("streams") / "data", env=ENV)) as running:
        yield running


@pytest.fixture
def client(server: ServerProcess) -> Iterator[SegmentClient]:
    with SegmentClient(server.url) as segment_client:
        yield segment_client


def _stream(client: SegmentClient, segments: int = 1) -> str:
    streams = StreamClient(client)
    streams.create_scope("sc")
    name = f"st-{uuid.uuid4().hex[:8]}"
    streams.create_stream("sc", name, segments=segments)
    return name


@pytest.mark.slow
def test_every_key_keeps_its_order_across_splits_and_merges(client: SegmentClient) -> None:
    stream = _stream(client)
    streams = StreamClient(client)
    writers = KeyedWriters(client, "sc", stream, KEYS, threads=4).start()
    steps = [
        ([0], [(0.0, 0.5), (0.5, 1.0)]),  # 1 -> 2: 1, 2
        ([1], [(0.0, 0.25), (0.25, 0.5)]),  # 3, 4
        ([2], [(0.5, 0.75), (0.75, 1.0)]),  # 4 segments: 3, 4, 5, 6
        ([3, 4], [(0.0, 0.5)]),  # 7
        ([5, 6], [(0.5, 1.0)]),  # 8
        ([7, 8], [(0.0, 1.0)]),  # back to 1: 9
    ]
    for seal, ranges in steps:
        time.sleep(0.4)
        streams.scale("sc", stream, seal, ranges)
    time.sleep(0.4)
    writers.stop()
    assert [s.id for s in streams.segments("sc", stream)[1]] == [9]
    assert min(writers.written.values()) > 10
    assert_exactly_once_in_order(read_in_successor_order(client, "sc", stream), writers.written)


def test_pipelined_conditional_batches_land_in_order_whatever_their_arrival(client: SegmentClient) -> None:
    name = f"pipe/{uuid.uuid4().hex[:8]}"
    client.create(name)
    writer = uuid.uuid4()

    def send(batch: int, previous: int | None) -> None:
        data = b"%03d;" % batch
        client.append(name, data, writer_id=writer, event_number=batch, previous_event_number=previous)

    with pytest.raises(ConditionalCheckFailed) as refused:
        send(2, 1)  # overtook batch 1
    assert refused.value.writer_event_number is None
    send(1, None)
    with pytest.raises(ConditionalCheckFailed) as refused:
        send(3, 2)
    assert refused.value.writer_event_number == 1
    send(2, 1)
    assert client.append(name, b"002;", writer_id=writer, event_number=2, previous_event_number=1).duplicate
    seed = random_seed()
    rng = random.Random(seed)
    queue = list(range(3, BATCHES + 1))
    lock = threading.Lock()
    refusals = [0]

    def sender() -> None:
        while True:
            with lock:
                if not queue:
                    return
                batch = queue.pop(rng.randrange(min(len(queue), 4)))  # one of the next few: out of order
            try:
                send(batch, batch - 1)
            except ConditionalCheckFailed:
                with lock:
                    refusals[0] += 1
                    queue.append(batch)  # sent again once the batch before it landed
                time.sleep(0.001)

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    data = client.read(name).data
    assert data == b"".join(b"%03d;" % i for i in range(1, BATCHES + 1)), seed
    assert refusals[0] > 0, seed  # some batches did overtake others
    assert client.writer_event_number(name, writer) == BATCHES


@pytest.mark.slow
@pytest.mark.process
def test_a_writer_goes_on_exactly_once_across_a_restart_and_a_scale(tmp_path: Path) -> None:
    with (
        killed_at_exit(ServerProcess(tmp_path / "data", env=ENV)) as server,
        SegmentClient(server.url) as client,
    ):
        stream = _stream(client, segments=2)
        writers = KeyedWriters(client, "sc", stream, KEYS, threads=2).start()
        time.sleep(0.5)
        server.kill()
        server.start()
        StreamClient(client).scale("sc", stream, [0, 1], [(0.0, 1.0)])
        time.sleep(0.5)
        writers.stop()
        assert_exactly_once_in_order(read_in_successor_order(client, "sc", stream), writers.written)
