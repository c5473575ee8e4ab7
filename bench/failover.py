"""Failover under writers: the longest stretch without an acknowledged append on a moved container.

``python -m bench.failover [--kills K] [--pauses P] [--pause-s S] [--lease-s L] [--json PATH]``
starts moto and three nodes (``--containers``, two per node by default)
with Tier 1 and Tier 2 on moto, and one writer per container: a thread that
appends to a segment of that container with ``Writer-Id`` and
``Event-Number`` through a random node, again at once (after 20 ms) on any
answer but 200 or after 2 s without one. Then, one node at a time, taking the nodes in turn:

- ``--kills`` times, kill -9 of a node, then its restart;
- ``--pauses`` times, SIGSTOP of a node for ``--pause-s`` seconds, then SIGCONT.

Figures, each min / median / max over the faults:

- **fault gap**: for each fault, the longest time without an acknowledged
  append on any container the faulty node served (or any other the fault
  held up for over a second: one it was taking over as it failed), from the
  last acknowledgement before the fault to the first after it (the lease
  running out, the claim, the recovery, the writers' next attempt); the
  node comes back once every container is served again;
- **hand-over gap**: after each restart or resume, the node gets its share
  back by graceful hand-overs; for each container that moved then, the
  longest time without an acknowledged append from the restart or resume
  until the cluster is balanced again (not from the last acknowledgement
  before it: a writer may have waited on the paused node until then);
- **recovery**: operations replayed and operations replayed per second, from
  the nodes' "operations replayed" log lines (with moto, most of a recovery
  is its fixed cost: the Tier 1 fence, listings, the new epoch's checkpoint);
- **replay**: in this process, a container's Tier 1 log held in memory with
  ``--replay-ops`` single-byte appends and no checkpoint since the start, then
  its recovery: operations replayed per second, what the log's length costs
  apart from reading it.

Also counted: answers by status over the whole run (200, 503, 502...).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import re
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import requests
from prometheus_client import CollectorRegistry

from bench.common import Spread, progress, run_in_workdir
from bench.local_cluster import LocalCluster, owners, wait_for
from engine import SegmentStore
from engine.config import Settings
from engine.container.segment_container import SegmentContainer
from engine.metrics import EngineMetrics
from engine.naming import container_for
from engine.tier1.memory_log import MemoryDataLog
from engine.tier2.memory import MemoryChunkStorage

_REPLAYED = re.compile(r"(\d+) operations replayed in ([\d.]+)s")
_RETRY_S = 0.02
# A writer gives up on an answer after this long and sends the append again (the same event number:
# deduplicated), as a client with a timeout would; a paused node would hold it for the whole pause.
_READ_S = 2.0
# A writer whose appends stopped for longer than this across a fault counts as moved by it.
_HELD_UP_S = 1.0


class Writer(threading.Thread):
    """Appends to ``segment`` through random nodes; records when each append was acknowledged."""

    def __init__(self, segment: str, urls: list[str], stop: threading.Event, statuses: Counter[str]) -> None:
        super().__init__(name=f"writer-{segment}", daemon=True)
        self.segment = segment
        self.urls = urls
        self.stop = stop
        self.statuses = statuses
        self.acked: list[float] = []

    def run(self) -> None:
        writer_id, event = str(uuid.uuid4()), 0
        session = requests.Session()
        while not self.stop.is_set():
            url = f"{random.choice(self.urls)}/v1/segments/{self.segment}"
            headers = {"Writer-Id": writer_id, "Event-Number": str(event + 1)}
            try:
                answer = session.post(url, data=b"e" * 100, headers=headers, timeout=(0.5, _READ_S))
                status = str(answer.status_code)
            except requests.RequestException as exc:
                status = type(exc).__name__
            self.statuses[status] += 1
            if status == "200":
                event += 1
                self.acked.append(time.monotonic())
            else:
                time.sleep(_RETRY_S)

    def gap(self, start: float, end: float, *, from_start: bool = False) -> tuple[float, float]:
        """The longest time without an acknowledgement in [start, end], and when it began (monotonic).

        Counted from the last acknowledgement before ``start``, or from
        ``start`` itself with ``from_start``.
        """
        times = list(self.acked)
        before = [start] if from_start else [t for t in times if t < start][-1:]
        inside = [t for t in times if start <= t <= end]
        points = before + inside
        if len(points) < 2:
            began = points[0] if points else start
            return end - began, began
        return max((b - a, a) for a, b in itertools.pairwise(points))

    def acked_after(self, moment: float) -> bool:
        return bool(self.acked) and self.acked[-1] > moment


def _owners(cluster: LocalCluster, via: Sequence[str]) -> list[str | None]:
    for node in via:
        with contextlib.suppress(requests.RequestException, ValueError):
            return owners(cluster.nodes[node].url)
    raise RuntimeError("no node answered GET /v1/cluster")


def _settle(cluster: LocalCluster, writers: list[Writer], timeout_s: float) -> None:
    """Wait until the containers are spread over all nodes and every writer was acknowledged since."""
    wait_for(lambda: all(cluster.balanced(n) for n in cluster.nodes), timeout_s, "a balanced cluster")
    now = time.monotonic()
    wait_for(lambda: all(w.acked_after(now) for w in writers), timeout_s, "every writer acknowledged")


def _wall(monotonic: float) -> str:
    """A monotonic moment as the nodes' logs show time (UTC), to the millisecond."""
    at = time.time() - (time.monotonic() - monotonic)
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}"


def _sample(found: dict[str, list[dict[str, Any]]], key: str, writer: Writer, start: float, end: float,
            fault: str) -> None:
    # A hand-over's gap counts from the restart or resume: a writer that waited on the paused node
    # before it resumed (its 2 s timeouts, its random next node) is not the hand-over's doing.
    gap_s, began = writer.gap(start, end, from_start=key == "handover_gap_s")
    found[key].append({"gap_s": gap_s, "from": _wall(began), "segment": writer.segment, "fault": fault})


def _fault(cluster: LocalCluster, writers: list[Writer], victim: str, kind: str, args: argparse.Namespace,
           found: dict[str, list[dict[str, Any]]]) -> None:
    others = [n for n in cluster.nodes if n != victim]
    before = _owners(cluster, [victim])  # what it serves now, as it says: another's view may lag
    moved = [w for w, owner in zip(writers, before, strict=True) if owner == victim]
    if not moved:
        progress(f"node {victim} serves no container now: no fault")
        return
    server = cluster.nodes[victim]
    assert server.proc is not None
    at = time.monotonic()
    if kind == "kill":
        server.kill()
    else:
        os.killpg(server.proc.pid, signal.SIGSTOP)
    # Every container served again before the node comes back: one it was taking over as it failed
    # (which it did not yet name as its own) would otherwise wait for its restarted owner's old lease.
    wait_for(lambda: all(w.acked_after(at) for w in writers), 120, "every container served again", 0.05)
    end = time.monotonic()
    fault = f"{kind} of node {victim} at {_wall(at)}"
    # Its containers, and any other the fault held up for over a second (from the last acknowledgement
    # before the fault).
    moved += [w for w in writers if w not in moved and w.gap(at, end)[0] > _HELD_UP_S]
    worst = max(moved, key=lambda w: w.gap(at, end)[0])
    _sample(found, f"{kind}_gap_s", worst, at, end, fault)
    if kind == "kill":
        back = time.monotonic()
        server.start()
    else:
        time.sleep(max(0.0, at + args.pause_s - time.monotonic()))
        back = time.monotonic()
        os.killpg(server.proc.pid, signal.SIGCONT)
    during = _owners(cluster, others)
    _settle(cluster, writers, 6 * args.lease_s + 60)
    after = _owners(cluster, others)
    end = time.monotonic()
    for writer, old, new in zip(writers, during, after, strict=True):
        if old != new:
            _sample(found, "handover_gap_s", writer, back, end, f"hand-over after the {kind} of {victim}")


def _recoveries(workdir: Path) -> tuple[list[int], list[float]]:
    operations: list[int] = []
    rates: list[float] = []
    for log in workdir.glob("server-*.log"):
        for match in _REPLAYED.finditer(log.read_text(errors="replace")):
            count, seconds = int(match.group(1)), float(match.group(2))
            operations.append(count)
            if count:
                rates.append(count / max(seconds, 1e-3))
    return operations, rates


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    settings = {
        "SEGSTORE_LOG_LEVEL": "info",
        "SEGSTORE_LEASE_S": str(args.lease_s),
        "SEGSTORE_CONTAINER_COUNT": str(args.containers),
    }
    found: dict[str, list[dict[str, Any]]] = {"kill_gap_s": [], "pause_gap_s": [], "handover_gap_s": []}
    statuses: Counter[str] = Counter()
    with LocalCluster(workdir, nodes=3, settings=settings) as cluster:
        urls = list(cluster.urls.values())
        segments = [
            next(n for n in (f"w{c}-{uuid.uuid4().hex[:8]}" for _ in range(10_000))
                 if container_for(n, args.containers) == c)
            for c in range(args.containers)
        ]
        for segment in segments:
            requests.put(f"{urls[0]}/v1/segments/{segment}", timeout=30).raise_for_status()
        stop = threading.Event()
        writers = [Writer(s, urls, stop, statuses) for s in segments]
        for writer in writers:
            writer.start()
        try:
            _settle(cluster, writers, 6 * args.lease_s + 60)
            time.sleep(args.warmup_s)
            faults = ["kill"] * args.kills + ["pause"] * args.pauses
            nodes = list(cluster.nodes)
            for i, kind in enumerate(faults):
                victim = nodes[i % len(nodes)]
                progress(f"fault {i + 1}/{len(faults)}: {kind} of node {victim}")
                _fault(cluster, writers, victim, kind, args, found)
                time.sleep(args.between_s)
        finally:
            stop.set()
            for writer in writers:
                writer.join(60)
        operations, rates = _recoveries(workdir)
        doc_replay = measure_replay(args.replay_ops) if args.replay_ops else None
        if args.logs:
            Path(args.logs).mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, Path(args.logs) / log.name)
    doc: dict[str, Any] = {
        "lease_s": args.lease_s, "containers": args.containers, "kills": args.kills,
        "pauses": args.pauses, "pause_s": args.pause_s, "answers": dict(statuses), "replay": doc_replay,
    }
    for key, samples in found.items():
        doc[key] = asdict(Spread.of([s["gap_s"] for s in samples])) if samples else None
        doc[f"{key}_longest"] = max(samples, key=lambda s: s["gap_s"]) if samples else None
    doc["recovery_operations"] = asdict(Spread.of(operations)) if operations else None
    doc["recovery_operations_per_s"] = asdict(Spread.of(rates)) if rates else None
    return doc


def measure_replay(operations: int) -> dict[str, float]:
    """Seconds and operations/s of the recovery of ``operations`` appends held in a memory Tier 1."""
    settings = Settings(
        data_dir="unused", container_count=1, checkpoint_every_bytes=1 << 40,
        checkpoint_every_operations=1 << 40, checkpoint_every_s=1e9, flush_threshold_ms=1 << 30,
        flush_threshold_bytes=1 << 40, tier1_backlog_max_bytes=1 << 40,
    )
    data_log, storage = MemoryDataLog(max_frame_bytes=settings.max_frame_bytes), MemoryChunkStorage()

    def store_on(log: MemoryDataLog) -> SegmentStore:
        container = SegmentContainer(0, settings, log, storage, EngineMetrics(CollectorRegistry()))
        return SegmentStore(settings, containers=[container])

    store = store_on(data_log)
    store.start(wait=True)
    store.create("replayed")
    with ThreadPoolExecutor(16) as pool:  # group commits of several appends, as under load
        list(pool.map(lambda _: [store.append("replayed", b"x") for _ in range(operations // 16)], range(16)))
    store.close()
    store = store_on(data_log.reopen())
    began = time.monotonic()
    store.start(wait=True)
    took = time.monotonic() - began
    assert store.info("replayed").length == operations // 16 * 16
    store.close()
    return {"operations": operations // 16 * 16, "seconds": took, "per_s": operations // 16 * 16 / took}


def render(doc: dict[str, Any]) -> str:
    lines = [f"failover, lease_s {doc['lease_s']}, {doc['containers']} containers on 3 nodes "
             f"({doc['kills']} kill -9, {doc['pauses']} SIGSTOP of {doc['pause_s']:g} s)"]
    for key, label in (("kill_gap_s", "kill -9 gap"), ("pause_gap_s", "SIGSTOP gap"),
                       ("handover_gap_s", "hand-over gap")):
        spread = doc[key]
        if spread is not None:
            values = (spread["min"], spread["median"], spread["max"])
            lines.append(f"  {label:<16} s, min / median / max: " + " / ".join(f"{v:.2f}" for v in values)
                         + f"  ({len(spread['runs'])} samples)")
            longest = doc[f"{key}_longest"]
            lines.append(f"  {'':<16}    longest from {longest['from']} on {longest['segment']} "
                         f"({longest['fault']})")
    for key, label, fmt in (("recovery_operations", "ops replayed", "{:,.0f}"),
                            ("recovery_operations_per_s", "replayed ops/s", "{:,.0f}")):
        spread = doc[key]
        if spread is not None:
            values = (spread["min"], spread["median"], spread["max"])
            lines.append(f"  {label:<16}    min / median / max: " + " / ".join(fmt.format(v) for v in values))
    lines.append("  answers: " + ", ".join(f"{k} {v}" for k, v in sorted(doc["answers"].items())))
    if doc.get("replay"):
        replay = doc["replay"]
        lines.append(f"  replay of {replay['operations']:,} operations held in memory: "
                     f"{replay['seconds']:.2f} s, {replay['per_s']:,.0f} operations/s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--pauses", type=int, default=10)
    parser.add_argument("--pause-s", type=float, default=10.0)
    parser.add_argument("--lease-s", type=float, default=5.0)
    parser.add_argument("--containers", type=int, default=6)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--between-s", type=float, default=2.0)
    parser.add_argument("--replay-ops", type=int, default=100_000, help="0: no replay measure")
    parser.add_argument("--json", default=None)
    parser.add_argument("--logs", default=None, help="copy the nodes' and moto's logs to this folder")
    parser.add_argument("--dir", default=None, help="parent of the temporary folder")
    args = parser.parse_args(argv)
    return run_in_workdir("segstore-failover-", args.dir, lambda w: measure(args, w), render, args.json)


if __name__ == "__main__":
    raise SystemExit(main())

