"""Streams on three real cluster nodes (moto) with the node serving the stream's record killed while
the stream scales: the scale completes on the node that takes the record over, and the writers'
events are all there, once each, in order per key."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from bench.local_cluster import LocalCluster, owners, wait_for
from client.errors import SegstoreClientError
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from engine.naming import container_for
from tests.conftest import random_seed
from tests.processes import killed_at_exit
from tests.scopes.writers import KeyedWriters, assert_exactly_once_in_order, read_in_successor_order
from tests.test_cluster_nodes import CONTAINERS, MOVE_S
from tests.test_cluster_nodes import SETTINGS as NODE_SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.process]

SETTINGS = {**NODE_SETTINGS, "SEGSTORE_STREAM_SCALE_SAMPLE_S": "0.5", "SEGSTORE_STREAM_SCALE_WINDOW_S": "1"}
RECORD = "#scopes/streams/sc/k"


def _scales(streams: StreamClient, stop: threading.Event, done: list[int]) -> Callable[[], None]:
    def run() -> None:
        while not stop.is_set():
            try:
                _, segments = streams.segments("sc", "k")
                ranges = [(0.0, 0.5), (0.5, 1.0)] if len(segments) == 1 else [(0.0, 1.0)]
                epoch, _ = streams.scale("sc", "k", [s.id for s in segments], ranges)
                done.append(epoch)
            except (requests.RequestException, SegstoreClientError):
                time.sleep(0.2)  # the node went away under the request: ask again

    return run


def test_a_scale_survives_the_loss_of_the_node_serving_the_stream(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    seed = random_seed()
    rng = random.Random(seed)
    nodes = LocalCluster(tmp_path, nodes=3, endpoint=moto_endpoint, bucket=s3_bucket, settings=SETTINGS)
    with killed_at_exit(nodes) as cluster:
        wait_for(lambda: cluster.balanced("a"), MOVE_S, "containers spread over 3 nodes")
        endpoints = ",".join(cluster.urls.values())
        client = SegmentClient(endpoints, retries=8, backoff_s=0.1)
        streams = StreamClient(client)
        streams.create_scope("sc")
        streams.create_stream("sc", "k", segments=2)
        keys = [f"key-{i}" for i in range(20)]
        writers = KeyedWriters(client, "sc", "k", keys, threads=2, resend_timeout_s=MOVE_S).start()
        stop, done = threading.Event(), []
        scales = _scales(StreamClient(SegmentClient(endpoints)), stop, done)
        scaler = threading.Thread(target=scales, daemon=True)
        scaler.start()
        wait_for(lambda: len(done) >= 2, MOVE_S, "scales before the kill")
        victim = owners(cluster.urls["a"])[container_for(RECORD, CONTAINERS)]
        assert victim is not None
        time.sleep(rng.uniform(0.0, 0.3))  # a scale is in flight nearly all the time
        scales_before = len(done)
        cluster.nodes[victim].kill()
        survivor = next(url for node, url in cluster.urls.items() if node != victim)
        wait_for(lambda: owners(survivor)[container_for(RECORD, CONTAINERS)] not in (None, victim),
                 MOVE_S, "the stream's record served by another node")
        wait_for(lambda: len(done) >= scales_before + 2, MOVE_S, f"scales after the kill (seed {seed})")
        stop.set()
        scaler.join(MOVE_S)
        survivors = StreamClient(SegmentClient(survivor))
        assert survivors.stream("sc", "k")["pending_scale"] is None
        writers.stop()
        found = read_in_successor_order(SegmentClient(survivor), "sc", "k")
        assert_exactly_once_in_order(found, writers.written)
        assert min(writers.written.values()) > 5, seed
