"""Auto-scaling on a real server with windows of seconds: a hot stream splits, a cold one merges,
and ``min_segments`` holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.servers import ServerProcess
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from client.stream_writer import StreamWriter
from tests.processes import killed_at_exit

pytestmark = [pytest.mark.slow, pytest.mark.process]

WINDOW_S = 2.0
ENV = {
    "SEGSTORE_LOG_LEVEL": "warning",
    "SEGSTORE_STREAM_SCALE_SAMPLE_S": "0.5",
    "SEGSTORE_STREAM_SCALE_WINDOW_S": str(WINDOW_S),
    "SEGSTORE_STREAM_SCALE_COOLDOWN_S": "2",
}
TIMEOUT_S = 30


@pytest.fixture
def streams(tmp_path: Path) -> Iterator[StreamClient]:
    with (
        killed_at_exit(ServerProcess(tmp_path / "data", env=ENV)) as server,
        SegmentClient(server.url) as client,
    ):
        stream_client = StreamClient(client)
        stream_client.create_scope("sc")
        yield stream_client


def _count(streams: StreamClient, stream: str) -> int:
    return len(streams.segments("sc", stream)[1])


def test_a_hot_stream_splits_and_a_cold_one_merges_down_to_min_segments(streams: StreamClient) -> None:
    policy = {"type": "events_per_s", "target": 20, "factor": 2}
    streams.create_stream("sc", "hot", segments=1, scaling={**policy, "min_segments": 1})
    streams.create_stream("sc", "cold", segments=4, scaling={**policy, "min_segments": 2})
    deadline = time.monotonic() + TIMEOUT_S
    with StreamWriter(streams.client, "sc", "hot", linger_s=0.01) as writer:
        i = 0
        while _count(streams, "hot") < 2:  # about 200 events/s, ten times the target
            assert time.monotonic() < deadline, "the hot stream did not split"
            for _ in range(10):
                writer.write(b"event", f"key-{i % 64}")
                i += 1
            writer.flush()
            time.sleep(0.05)
    assert streams.stream("sc", "hot")["epoch"] >= 1
    while _count(streams, "cold") > 2:
        assert time.monotonic() < deadline, "the cold stream did not merge"
        time.sleep(0.2)
    time.sleep(2 * WINDOW_S + 1)  # long enough for another round to merge, were it allowed
    assert _count(streams, "cold") == 2
    epoch, segments = streams.segments("sc", "cold")
    assert epoch == 2 and [(s.key_lo, s.key_hi) for s in segments] in (
        [(0.0, 0.5), (0.5, 1.0)], [(0.0, 0.75), (0.75, 1.0)], [(0.0, 0.25), (0.25, 1.0)],
    )  # fmt: skip
