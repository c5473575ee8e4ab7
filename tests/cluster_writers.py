"""Writers for the real-process cluster tests: each appends numbered records to one segment and keeps
what was acknowledged, so a test can check every acknowledged append is stored exactly once.

- ``HttpWriter``: plain HTTP with ``Expected-Offset``, each append sent to a random node or to the
  owner the cluster map names; it records every answer (node, status, ``Segment-Owner``).
- ``ClientWriter``: the Python client with a writer id and event numbers (it follows ``Segment-Owner``).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from dataclasses import dataclass

import requests

from bench.local_cluster import LocalCluster, owners
from client.segment_client import SegmentClient
from engine.naming import container_for


@dataclass(frozen=True)
class Outcome:
    """One append as the writer saw it; ``status`` None: no answer (connection error or timeout)."""

    sent_at: float
    node: str
    status: int | None
    owner: str | None
    retry_after: str | None
    error: str | None = None  # what the request raised, or the answer's detail when it was not a 200


def segments_in(containers: list[int], count: int, per_container: int, prefix: str) -> list[str]:
    """``per_container`` segment names in each of ``containers`` (of ``count``)."""
    names: list[str] = []
    for container in containers:
        candidates = (f"{prefix}-{container}-{i}" for i in range(100_000))
        mine = (n for n in candidates if container_for(n, count) == container)
        names += itertools.islice(mine, per_container)
    return names


def live_urls(cluster: LocalCluster) -> list[str]:
    return [s.url for s in cluster.nodes.values() if s.proc is not None and s.proc.poll() is None]


def send(cluster: LocalCluster, method: str, name: str, deadline_s: float = 90.0, **kwargs: object
         ) -> requests.Response:
    """``method`` on segment ``name`` through any running node, retried on 503 and lost connections."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        url = random.choice(live_urls(cluster))
        try:
            answer = requests.request(method, f"{url}/v1/segments/{name}", timeout=10, **kwargs)
        except requests.RequestException:
            answer = None
        if answer is not None and answer.status_code != 503:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"no node answered {method} {name} within {deadline_s} s")


def stored(cluster: LocalCluster, name: str) -> bytes:
    answer = send(cluster, "GET", name, params={"offset": 0})
    assert answer.status_code in (200, 204), answer.text  # 204: nothing to read
    return answer.content


class HttpWriter(threading.Thread):
    """Appends ``<segment>#<n>;`` with ``Expected-Offset``; ``route``: "random" node or map "owner"."""

    def __init__(self, cluster: LocalCluster, segment: str, containers: int, stop: threading.Event, *,
                 route: str = "random", timeout_s: float = 120.0) -> None:
        super().__init__(name=f"writer-{segment}", daemon=True)
        self.cluster, self.segment, self.stop = cluster, segment, stop
        self.route, self.timeout_s = route, timeout_s
        self.container = container_for(segment, containers)
        self.acked = bytearray()
        self.acked_at: list[float] = []
        self.outcomes: list[Outcome] = []
        self.failures: list[str] = []
        self.http = requests.Session()
        self._owner: str | None = None
        # Answers other than 200 to appends sent before this instant say nothing of their outcome:
        # set around a kill, when a forwarder may answer for an owner that died with the request.
        self.unknown_before = 0.0

    def _pick(self) -> str:
        nodes = dict(self.cluster.nodes)
        if self.route == "owner":
            if self._owner not in nodes:
                self._learn_owner(nodes)
            if self._owner in nodes:
                return self._owner
        return random.choice(list(nodes))

    def _learn_owner(self, nodes: dict) -> None:
        for node in random.sample(list(nodes), len(nodes)):
            try:
                self._owner = owners(nodes[node].url)[self.container]
            except (requests.RequestException, ValueError):
                continue
            if self._owner is not None:
                return

    def run(self) -> None:
        try:
            self._write()
        except Exception as exc:  # the test reports it
            self.failures.append(repr(exc))

    def _write(self) -> None:
        uncertain = False
        while not self.stop.is_set():
            data = f"{self.segment}#{len(self.acked_at)};".encode()
            offset = len(self.acked)
            node = self._pick()
            sent_at = time.monotonic()
            try:
                answer = self.http.post(f"{self.cluster.urls[node]}/v1/segments/{self.segment}", data=data,
                                        headers={"Expected-Offset": str(offset)}, timeout=self.timeout_s)
            except requests.RequestException as exc:
                self.outcomes.append(Outcome(sent_at, node, None, None, None, repr(exc)[:300]))
                uncertain, self._owner = True, None
                time.sleep(0.1)
                continue
            status = answer.status_code
            self.outcomes.append(Outcome(sent_at, node, status, answer.headers.get("Segment-Owner"),
                                         answer.headers.get("Retry-After"),
                                         None if status == 200 else answer.text[:300]))
            if status == 502 or (status != 200 and sent_at < self.unknown_before):
                uncertain, self._owner = True, None  # 502 OutcomeUnknown: the owner failed during it
                continue
            if status == 200 and answer.json()["offset"] == offset:
                self._acked(data)
                uncertain = False
            elif status == 412 and uncertain:  # the lost attempt landed if its bytes are there
                if stored(self.cluster, self.segment)[offset:offset + len(data)] != data:
                    self.failures.append(f"412 at {offset} and the lost append is not there; {self._last()}")
                    return
                self._acked(data)
                uncertain = False
            elif status == 503:
                self._owner = None
                time.sleep(0.1)
            else:
                self.failures.append(f"{node}: {status} {answer.text[:300]}; {self._last()}")
                return

    def _last(self) -> str:
        """The answers before the latest, for a failure's message."""
        return f"answers before: {self.outcomes[-6:-1]}"

    def _acked(self, data: bytes) -> None:
        self.acked += data
        self.acked_at.append(time.monotonic())


class ClientWriter(threading.Thread):
    """Appends ``<segment>@<n>;`` through ``SegmentClient`` with a writer id and event numbers."""

    def __init__(self, endpoint: str, segment: str, stop: threading.Event) -> None:
        super().__init__(name=f"client-{segment}", daemon=True)
        self.endpoint, self.segment, self.stop = endpoint, segment, stop
        self.acked = bytearray()
        self.acked_at: list[float] = []
        self.failures: list[str] = []

    def run(self) -> None:
        writer = uuid.uuid4()
        with SegmentClient(self.endpoint, retries=400, backoff_s=0.05, timeout_s=20) as client:
            event = 1
            while not self.stop.is_set():
                data = f"{self.segment}@{event};".encode()
                try:
                    client.append(self.segment, data, writer_id=writer, event_number=event)
                except Exception as exc:  # every failure is the test's business
                    self.failures.append(repr(exc))
                    return
                self.acked += data
                self.acked_at.append(time.monotonic())
                event += 1


def _acks(writer: HttpWriter | ClientWriter, since: float | None) -> int:
    return sum(1 for t in writer.acked_at if since is None or t > since)


def wait_progress(writers: list[HttpWriter | ClientWriter], more: int, timeout_s: float,
                  since: float | None = None) -> None:
    """Wait until each writer has ``more`` acknowledgements more (after ``since``, if given), or failed."""
    target = {w: (0 if since is not None else _acks(w, None)) + more for w in writers}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(w.failures or _acks(w, since) >= target[w] for w in writers):
            return
        time.sleep(0.2)
    slow = [w.name for w in writers if not w.failures and _acks(w, since) < target[w]]
    raise AssertionError(f"writers made no progress in {timeout_s} s: {slow}")


def finish(writers: list[HttpWriter | ClientWriter], stop: threading.Event, cluster: LocalCluster) -> None:
    """Stop the writers, and check every acknowledged append is stored once, at its offset."""
    stop.set()
    for writer in writers:
        writer.join(180)
        assert not writer.is_alive(), writer.name
    failures = [f"{w.name}: {f}" for w in writers for f in w.failures]
    assert not failures, failures
    for writer in writers:
        assert stored(cluster, writer.segment) == bytes(writer.acked), writer.segment
