"""Failover with real processes on moto: bounded recovery, and forwarders that send safe requests again.

- a container that took small appends for 20 s since its start is recovered
  by another node in seconds, replaying a small part of them: checkpoints
  by operation count and time bound the log a recovery replays;
- appends with writer ids and reads through a node that does not serve their
  container, whose owner is killed mid-request, never answer 502: the
  forwarder sends them again to the next owner (the owner deduplicates).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from bench.local_cluster import LocalCluster, owners
from tests.cluster_writers import segments_in
from tests.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process]

LEASE_S = 3
CONTAINERS = 4
SETTINGS = {
    "SEGSTORE_LEASE_S": str(LEASE_S),
    "SEGSTORE_CONTAINER_COUNT": str(CONTAINERS),
    "SEGSTORE_LOG_LEVEL": "warning",
}
MOVE_S = LEASE_S + 60  # generous: the machine running the tests may be small and busy
APPENDING_S = 20  # ten times checkpoint_every_s (2 s): a recovery of all of it would show
# A recovery takes about 1-1.5 s on moto on loopback on two busy CPUs (fence, reads, a checkpoint),
# whatever the container's age; the bound leaves room for a machine busier still.
RECOVERY_MAX_S = 3.0


def _owner(cluster: LocalCluster, container: int) -> str:
    for server in cluster.nodes.values():
        if server.proc is not None and server.proc.poll() is None:
            owner = owners(server.url)[container]
            if owner is not None:
                return owner
    raise AssertionError(f"container {container} has no owner")


def _metric(url: str, name: str, container: int) -> float | None:
    """``name``'s value for ``container`` on the node at ``url``, if it has one."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    prefix = f'{name}{{container="{container}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


def test_a_container_that_took_appends_for_long_recovers_elsewhere_in_seconds(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    """Recovery replays the last seconds of the log (checkpoints by time and count), not all of it."""
    with LocalCluster(tmp_path, nodes=2, endpoint=moto_endpoint, bucket=s3_bucket,
                      settings=SETTINGS) as cluster:
        wait_until(lambda: cluster.balanced("a"), "containers spread over 2 nodes", MOVE_S)
        (name,) = segments_in([0], CONTAINERS, 1, "aged")
        victim = _owner(cluster, 0)
        url = cluster.nodes[victim].url
        assert requests.put(f"{url}/v1/segments/{name}", timeout=30).status_code == 201
        until = time.monotonic() + APPENDING_S

        def append_for_long(_: int) -> int:
            count = 0
            with requests.Session() as http:
                while time.monotonic() < until:
                    assert http.post(f"{url}/v1/segments/{name}", data=b"x", timeout=60).status_code == 200
                    count += 1
            return count

        with ThreadPoolExecutor(32) as pool:
            appended = sum(pool.map(append_for_long, range(32)))
        cluster.nodes[victim].kill()
        heir_url = next(s.url for n, s in cluster.nodes.items() if n != victim)
        replayed_metric = "segstore_container_recovery_operations"

        def recovered_there() -> bool:  # an earlier recovery there (at the start) replayed nothing
            return (_metric(heir_url, replayed_metric, 0) or 0) > 0

        wait_until(recovered_there, "container 0 recovered on the other node", MOVE_S)
        recovery_s = _metric(heir_url, "segstore_container_recovery_seconds", 0)
        replayed = _metric(heir_url, replayed_metric, 0)
        assert recovery_s is not None and recovery_s < RECOVERY_MAX_S, recovery_s
        assert replayed is not None and replayed < appended / 4, (replayed, appended)
        info = requests.get(f"{heir_url}/v1/segments/{name}:info", timeout=30)
        assert info.json()["length"] == appended


def test_writer_id_appends_and_reads_through_a_non_owner_whose_owner_is_killed_get_no_502(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    with LocalCluster(tmp_path, nodes=3, endpoint=moto_endpoint, bucket=s3_bucket,
                      settings=SETTINGS) as cluster:
        wait_until(lambda: cluster.balanced("a"), "containers spread over 3 nodes", MOVE_S)
        victim = _owner(cluster, 0)
        via = next(n for n in cluster.nodes if n != victim)
        via_url = cluster.nodes[via].url
        names = segments_in([0], CONTAINERS, 4, "forwarded")
        for name in names:
            assert requests.put(f"{via_url}/v1/segments/{name}", timeout=30).status_code == 201
        statuses: Counter[int] = Counter()
        acked: dict[str, int] = {}
        stop = threading.Event()

        def write(name: str) -> None:
            writer, event = str(uuid.uuid4()), 0
            with requests.Session() as http:
                while not stop.is_set():
                    headers = {"Writer-Id": writer, "Event-Number": str(event + 1)}
                    answer = http.post(f"{via_url}/v1/segments/{name}", data=b"e", headers=headers,
                                       timeout=120)
                    read = http.get(f"{via_url}/v1/segments/{name}", params={"offset": 0}, timeout=120)
                    statuses[answer.status_code] += 1
                    statuses[read.status_code] += 1
                    if answer.status_code == 200:
                        event += 1
                    else:
                        time.sleep(0.05)
            acked[name] = event

        writers = [threading.Thread(target=write, args=(n,), daemon=True) for n in names]
        for thread in writers:
            thread.start()
        wait_until(lambda: statuses[200] > 40, "appends through the non-owner", 60)
        cluster.nodes[victim].kill()
        killed_at = time.monotonic()
        wait_until(lambda: _owner(cluster, 0) != victim, "container 0 moved", MOVE_S)
        moved = statuses[200]
        wait_until(lambda: statuses[200] > moved + 40, "appends after the move", MOVE_S)
        stop.set()
        for thread in writers:
            thread.join(150)
        assert set(statuses) <= {200, 503}, statuses  # no 502: sent again to the next owner
        for name in names:
            info = requests.get(f"{via_url}/v1/segments/{name}:info", timeout=30).json()
            assert info["length"] == acked[name], (name, info, acked[name])  # each event stored once
        assert time.monotonic() - killed_at < MOVE_S + 60
