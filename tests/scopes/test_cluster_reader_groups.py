"""A reader group on three real cluster nodes (moto): each reader talks to another node, every request
of the group is served by the node of its record, and every event is read once."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from bench.local_cluster import LocalCluster, wait_for
from client.reader_group import ReaderGroup
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from tests.polling import wait_until
from tests.processes import killed_at_exit
from tests.test_cluster_nodes import MOVE_S, SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.process]

EVENTS = 120


def test_readers_on_different_nodes_share_a_group(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> None:
    nodes = LocalCluster(tmp_path, nodes=3, endpoint=moto_endpoint, bucket=s3_bucket, settings=SETTINGS)
    with killed_at_exit(nodes) as cluster:
        wait_for(lambda: cluster.balanced("a"), MOVE_S, "containers spread over 3 nodes")
        urls = list(cluster.urls.values())
        client = SegmentClient(urls[0], retries=4, backoff_s=0.1)
        streams = StreamClient(client)
        streams.create_scope("sc")
        streams.create_stream("sc", "st", segments=6)
        for n in range(EVENTS):
            streams.write_event("sc", "st", f"e{n}".encode(), routing_key=f"k{n}")
        ReaderGroup(client, "sc", "g").create(["st"], lease_s=5)
        read: list[str] = []
        lock = threading.Lock()
        done = threading.Event()

        def run(url: str, name: str) -> None:
            with SegmentClient(url, retries=4, backoff_s=0.1) as own:
                reader = ReaderGroup(own, "sc", "g").reader(name, wait_s=0.2)
                while not done.is_set():
                    events = reader.fetch()
                    with lock:
                        read.extend(e.data.decode() for e in events)
                reader.close()

        threads = [
            threading.Thread(target=run, args=(url, f"r{i}"), daemon=True) for i, url in enumerate(urls)
        ]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: len(read) >= EVENTS, "every event is read", 60)
            group = ReaderGroup(client, "sc", "g")
            wait_until(
                lambda: sorted(len(r["segments"]) for r in group.state()["readers"]) == [2, 2, 2],
                "the readers hold two segments each",
                30,
            )
        finally:
            done.set()
            for thread in threads:
                thread.join(10)
        assert Counter(read) == Counter(f"e{n}" for n in range(EVENTS))
