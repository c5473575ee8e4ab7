"""Three real nodes on moto under load: a paused node, a joining node and a killed node lose nothing.

Writers append to segments in every container: plain HTTP with
``Expected-Offset`` (to random nodes, or to the owner the map names) and the
Python client with writer ids. After each scenario every acknowledged append
is stored exactly once at its offset (``tests/cluster_writers.py``).
Deadlines are generous: the machine running them may be small and busy.
"""

from __future__ import annotations

import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import requests

from bench.local_cluster import LocalCluster, owners
from engine import container_for
from tests.cluster_writers import (
    ClientWriter,
    HttpWriter,
    finish,
    segments_in,
    send,
    stored,
    wait_progress,
)
from tests.conftest import random_seed
from tests.polling import wait_until
from tests.processes import killed_at_exit

pytestmark = pytest.mark.slow

LEASE_S = 3
CONTAINERS = 4
SETTINGS = {
    "SEGSTORE_LEASE_S": str(LEASE_S),
    "SEGSTORE_CONTAINER_COUNT": str(CONTAINERS),
    "SEGSTORE_LOG_LEVEL": "warning",
    "SEGSTORE_FLUSH_THRESHOLD_MS": "100",
}
MOVE_S = LEASE_S + 60  # a container's move: its lease running out, a claim, and recovery on a busy machine

Cluster = Callable[[int], AbstractContextManager[LocalCluster]]


@pytest.fixture
def cluster_of(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> Cluster:
    @contextmanager
    def start(nodes: int) -> Iterator[LocalCluster]:
        with killed_at_exit(LocalCluster(tmp_path, nodes=nodes, endpoint=moto_endpoint, bucket=s3_bucket,
                                         settings=SETTINGS)) as cluster:
            wait_until(lambda: cluster.balanced("a"), f"containers spread over {nodes} nodes", MOVE_S)
            yield cluster

    return start


def _writers(cluster: LocalCluster, names: list[str], stop: threading.Event, clients: list[str]
             ) -> list[HttpWriter | ClientWriter]:
    """One HTTP writer per name (alternately to random nodes and to owners), and client writers."""
    writers: list[HttpWriter | ClientWriter] = [
        HttpWriter(cluster, name, CONTAINERS, stop, route="random" if i % 2 else "owner",
                   timeout_s=120 if i % 2 else 5)
        for i, name in enumerate(names)
    ]
    writers += [ClientWriter(url, f"{names[i]}-client", stop) for i, url in enumerate(clients)]
    for writer in writers:
        assert send(cluster, "PUT", writer.segment).status_code == 201
    for writer in writers:
        writer.start()
    return writers


def _held(cluster: LocalCluster, via: str, node: str) -> list[int]:
    return [c for c, owner in enumerate(owners(cluster.urls[via])) if owner == node]


def _taken_over(cluster: LocalCluster, via: str, node: str) -> bool:
    """Whether every container is owned, none by ``node``, as ``via`` sees it."""
    found = owners(cluster.urls[via])
    return None not in found and node not in found


def _group_signal(cluster: LocalCluster, node: str, signum: int) -> None:
    proc = cluster.nodes[node].proc
    assert proc is not None
    os.killpg(proc.pid, signum)  # arbiter and worker together


def test_a_paused_node_acknowledges_nothing_it_lost_and_rejoins_owning_nothing(cluster_of: Cluster) -> None:
    with cluster_of(3) as cluster:
        counts = cluster.counts("a")
        assert counts is not None
        victim = max(counts, key=lambda n: (counts[n], n))
        others = [n for n in cluster.nodes if n != victim]
        lost = _held(cluster, others[0], victim)
        names = segments_in(list(range(CONTAINERS)), CONTAINERS, 2, "paused")
        probes = segments_in(lost, CONTAINERS, 1, "probe")
        for probe in probes:
            assert send(cluster, "PUT", probe).status_code == 201
        stop = threading.Event()
        writers = _writers(cluster, names, stop, [cluster.urls[others[0]], cluster.urls[others[1]]])
        wait_progress(writers, 3, 120)

        _group_signal(cluster, victim, signal.SIGSTOP)
        paused_at = time.monotonic()
        answers: dict[str, requests.Response] = {}

        def probe_append(name: str) -> None:  # queued at the paused node, answered when it resumes
            answers[name] = requests.post(f"{cluster.urls[victim]}/v1/segments/{name}", data=b"probe;",
                                          headers={"Expected-Offset": "0"}, timeout=180)

        probing = [threading.Thread(target=probe_append, args=(p,), daemon=True) for p in probes]
        for thread in probing:
            thread.start()
        wait_until(lambda: _taken_over(cluster, others[0], victim), f"{victim}'s containers moving", MOVE_S)
        moved = time.monotonic()
        owner_writers = [w for w in writers if isinstance(w, HttpWriter) and w.route == "owner"
                         and w.container in lost]
        wait_progress(owner_writers, 2, MOVE_S, since=moved)  # the moved containers serve meanwhile

        _group_signal(cluster, victim, signal.SIGCONT)
        resumed_at = time.monotonic()
        health = f"{cluster.urls[victim]}/healthz"
        wait_until(
            lambda: requests.get(health, timeout=30).json()["containers"] == [],
            f"{victim} serving nothing after it resumed", 60,
        )
        for thread in probing:
            thread.join(60)
        for probe in probes:  # never taken from its old log: refused, passed on to the new owner, or
            # taken by the resumed node once a hand-over gave it the container back (its next epoch)
            answer = answers[probe]
            owner = answer.headers.get("Segment-Owner")
            if answer.status_code == 200 and owner in (None, victim):
                container = container_for(probe, CONTAINERS)
                back = f"{victim} holding container {container} again"
                wait_until(lambda c=container: c in _held(cluster, victim, victim), back, 10)
            else:
                assert answer.status_code == 503 or owner not in (None, victim), (answer.status_code, owner)
            assert stored(cluster, probe) == (b"probe;" if answer.status_code == 200 else b"")
        wait_until(lambda: cluster.balanced(others[0]), f"{victim} getting its share back", MOVE_S)
        assert _held(cluster, victim, victim)
        wait_progress(writers, 2, MOVE_S)
        finish(writers, stop, cluster)

    for writer in writers:
        if not isinstance(writer, HttpWriter):
            continue
        # Sent while paused, to the paused node, for a container it lost: refused, or of unknown outcome
        # (its Tier 1 write was in flight when it was fenced), never acknowledged.
        for seen in writer.outcomes:
            if seen.node == victim and paused_at < seen.sent_at < resumed_at and writer.container in lost:
                assert seen.status in (None, 502, 503) or seen.owner not in (None, victim), seen


def test_a_joining_node_gets_its_share_by_hand_overs_and_clients_see_200s_and_few_503s(
    cluster_of: Cluster,
) -> None:
    with cluster_of(2) as cluster:
        names = segments_in(list(range(CONTAINERS)), CONTAINERS, 2, "join")
        stop = threading.Event()
        writers = _writers(cluster, names, stop, [cluster.urls["a"], cluster.urls["b"]])
        wait_progress(writers, 3, 120)
        cluster.add_node()
        wait_until(lambda: cluster.balanced("c") and cluster.balanced("a"), "containers rebalanced", MOVE_S)
        assert sorted((cluster.counts("c") or {}).values()) == [1, 1, 2]
        joined = time.monotonic()
        wait_progress(writers, 3, MOVE_S, since=joined)
        finish(writers, stop, cluster)
    seen = [o for w in writers if isinstance(w, HttpWriter) for o in w.outcomes]
    assert {o.status for o in seen} <= {200, 503}, [o for o in seen if o.status not in (200, 503)]
    assert all(o.retry_after for o in seen if o.status == 503)
    assert any(o.node == "c" and o.status == 200 for o in seen)  # random writers used the new node


def test_a_killed_nodes_containers_serve_on_the_others_within_lease_and_recovery(cluster_of: Cluster) -> None:
    with cluster_of(3) as cluster:
        victim = random.Random(random_seed()).choice(list(cluster.nodes))
        others = [n for n in cluster.nodes if n != victim]
        lost = _held(cluster, others[0], victim)
        names = segments_in(list(range(CONTAINERS)), CONTAINERS, 2, "killed")
        stop = threading.Event()
        writers = _writers(cluster, names, stop, [cluster.urls[n] for n in others])
        wait_progress(writers, 3, 120)

        http_writers = [w for w in writers if isinstance(w, HttpWriter)]
        for writer in http_writers:  # an append in flight through or at the victim has an unknown outcome
            writer.unknown_before = math.inf
        cluster.nodes[victim].kill()
        killed_at = time.monotonic()
        for writer in http_writers:
            writer.unknown_before = killed_at
        wait_until(lambda: _taken_over(cluster, others[0], victim), f"{victim}'s containers moving", MOVE_S)
        moved = [w for w in writers if isinstance(w, HttpWriter) and w.container in lost]
        wait_progress(moved, 1, MOVE_S, since=killed_at)
        first_ack_s = min(t for w in moved for t in w.acked_at if t > killed_at) - killed_at
        assert first_ack_s < LEASE_S + 45, first_ack_s
        wait_progress(writers, 2, MOVE_S, since=killed_at)
        finish(writers, stop, cluster)
