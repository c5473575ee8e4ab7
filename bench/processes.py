"""Processes per node: what a second process gains, against what it gains a bare Flask app.

``python -m bench.processes [--rounds N] [--duration S] [--json PATH]`` measures, paired
in each round (the order of the servers rotates from round to round):

(a) 100-byte appends from 64 keep-alive connections to the public port
    (clients that do not know owners), spread over 16 segments in every
    container, against segstore with ``processes`` 1 and 2, and against
    ``bench.bare_app`` under the same gunicorn settings with 1 and 2 workers:
    segstore's gain (2 over 1) over bare Flask's gain, target at least 0.85;
(b) the same load sent by owner-aware clients, each connection to the port
    its segment's ``Segment-Owner`` names, over one process sending to the
    public port: target at least 1.6;
(c) tail latency on two processes: a long-poll reader at its segment's owner
    while 1,000 appends/s go out over 4 connections (bench.appends' tail
    measurement), target p50 at most 1.5 ms and p99 at most 3 ms; and
    ``EventWriter`` with linger 0 to a following ``EventReader`` at 1,000
    events/s (bench.events'), target p50 at most 2 ms and p99 at most 5 ms;
    next to their floor in the same run: the same appends at the same rate
    to bare Flask on one worker, answered without storing anything, which
    no append's acknowledgement (and so no delivery) goes under here.

Everything runs on loopback in a temporary folder and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from bench.appends import SMALL_APPEND_BYTES, _tail_latency, paced_appends, spread_segments
from bench.common import Spread, create_segment, percentile, progress, run_in_workdir
from bench.events import segstore_latency
from bench.load import LoadResult, LoadSpec, run_load
from bench.servers import ServerProcess
from engine import container_for

CONNECTIONS = 64
SEGMENTS = 16
CLIENT_PROCESSES = 2
TAIL_RATE = 1000.0
TAIL_CONNECTIONS = 4
TARGET_GAIN_SHARE = 0.85
TARGET_OWNER_AWARE = 1.6
SERVER_ENV = {"SEGSTORE_LOG_LEVEL": "warning"}
CONFIGS = ("segstore-1", "segstore-2", "bare-1", "bare-2")


def _server(workdir: Path, config: str) -> ServerProcess:
    kind, processes = config.rsplit("-", 1)
    env = {**SERVER_ENV, "SEGSTORE_PROCESSES": processes}
    if kind == "bare":
        return ServerProcess(workdir / config, env=env, app="bench.bare_app:create_app()")
    return ServerProcess(workdir / config, env=env)


def owner_ports(server: ServerProcess, segments: Sequence[str]) -> tuple[int, ...]:
    """The port of each segment's owning process, as an owner-aware client finds it.

    ``Segment-Owner`` names the owning member; ``GET /v1/cluster`` gives its URL
    (as ``SegmentClient`` does). The public port where no process serves it.
    """
    found = requests.get(f"{server.url}/v1/cluster", timeout=10)
    found.raise_for_status()
    cluster = found.json()
    urls = {node["id"]: node["url"] for node in cluster["nodes"]}
    owners = {c["id"]: c["owner"] for c in cluster["containers"]}
    ports = []
    for name in segments:
        url = urls.get(owners.get(container_for(name, cluster["container_count"])) or "")
        ports.append(urlsplit(url).port or server.port if url else server.port)
    return tuple(ports)


async def paced_acks(port: int, path: str, rate: float, duration_s: float, connections: int) -> list[float]:
    """Milliseconds from sending each 100-byte append to ``path`` to its answer, at ``rate`` over
    ``connections`` (the tail measurement's writers, without its reader)."""
    total = int(rate * duration_s)
    sent, acked = [0.0] * total, [0.0] * total
    await paced_appends(port, path, rate, sent, acked, connections, lambda _: b"r" * SMALL_APPEND_BYTES)
    return [seconds * 1000 for seconds in acked]


def _load(
    server: ServerProcess, segments: tuple[str, ...], ports: tuple[int, ...], plan: argparse.Namespace
) -> LoadResult:
    spec = LoadSpec(
        server.port,
        segments[0],
        SMALL_APPEND_BYTES,
        CONNECTIONS,
        plan.warmup,
        plan.duration,
        spread=segments,
        ports=ports,
    )
    return run_load(spec, CLIENT_PROCESSES, server)


def measure(plan: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every round runs each server's load back to back, then the owner-aware and tail runs."""
    doc: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_before": os.getloadavg()[0]},
        "plan": {"rounds": plan.rounds, "duration_s": plan.duration, "connections": CONNECTIONS},
    }
    rates: dict[str, list[float]] = {config: [] for config in CONFIGS}
    owner_aware: list[float] = []
    tails: list[Any] = []
    events: list[Any] = []
    floors: list[list[float]] = []
    servers = {config: _server(workdir, config) for config in CONFIGS}
    try:
        for server in servers.values():
            server.start()
        for r in range(plan.rounds):
            segments = spread_segments(f"bench/p-r{r}", SEGMENTS)
            for name in segments:
                for config in ("segstore-1", "segstore-2"):
                    create_segment(servers[config], name)
            order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
            for config in order:
                progress(f"round {r + 1}/{plan.rounds}: {config}, public port")
                server = servers[config]
                named = segments if config.startswith("segstore") else ("bench/bare",)
                rates[config].append(_load(server, named, (), plan).requests_per_s)
            progress(f"round {r + 1}/{plan.rounds}: segstore-2, owner-aware")
            two = servers["segstore-2"]
            owner_aware.append(_load(two, segments, owner_ports(two, segments), plan).requests_per_s)
            progress(f"round {r + 1}/{plan.rounds}: tail latency on two processes")
            tail = f"bench/tail-r{r}"
            create_segment(two, tail)
            (port,) = owner_ports(two, [tail])
            tails.append(asyncio.run(_tail_latency(port, tail, TAIL_RATE, plan.tail_s, TAIL_CONNECTIONS)))
            events.append(segstore_latency(two, f"bench/events-r{r}", TAIL_RATE, plan.tail_s, 0.0))
            bare = servers["bare-1"].port
            floors.append(asyncio.run(paced_acks(bare, "/v1/segments/bench/bare", TAIL_RATE, plan.tail_s,
                                                 TAIL_CONNECTIONS)))
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)
    doc["machine"]["loadavg_1m_after"] = os.getloadavg()[0]
    seg_gain = [b / a for a, b in zip(rates["segstore-1"], rates["segstore-2"], strict=True)]
    bare_gain = [b / a for a, b in zip(rates["bare-1"], rates["bare-2"], strict=True)]
    doc["appends_per_s"] = {config: asdict(Spread.of(values)) for config, values in rates.items()}
    doc["segstore_gain"] = asdict(Spread.of(seg_gain))
    doc["bare_gain"] = asdict(Spread.of(bare_gain))
    doc["gain_share"] = asdict(Spread.of([s / b for s, b in zip(seg_gain, bare_gain, strict=True)]))
    doc["owner_aware_over_one"] = asdict(
        Spread.of([o / one for o, one in zip(owner_aware, rates["segstore-1"], strict=True)])
    )
    doc["tail"] = {
        name: asdict(Spread.of([getattr(t, name) for t in tails]))
        for name in ("sent_per_s", "delivered_p50_ms", "delivered_p99_ms")
    }
    doc["events_linger_0"] = {
        name: asdict(Spread.of([getattr(e, name) for e in events])) for name in ("p50_ms", "p99_ms")
    }
    doc["tail"]["ack_p50_ms"] = asdict(Spread.of([t.ack_p50_ms for t in tails]))
    doc["bare_acks"] = {
        "p50_ms": asdict(Spread.of([percentile(f, 50) for f in floors])),
        "p99_ms": asdict(Spread.of([percentile(f, 99) for f in floors])),
    }
    return doc


def render(doc: dict[str, Any]) -> str:
    def show(spread: dict[str, Any], fmt: str = "{:.2f}") -> str:
        return " / ".join(fmt.format(spread[k]) for k in ("min", "median", "max"))

    machine = doc["machine"]
    lines = [
        f"processes per node: {machine['cpus']} cores, load {machine['loadavg_1m_before']:.1f} -> "
        f"{machine['loadavg_1m_after']:.1f}, {doc['plan']['rounds']} paired rounds (min / median / max)",
    ]
    for config, spread in doc["appends_per_s"].items():
        lines.append(f"  {config:>11}: {show(spread, '{:,.0f}')} appends/s, 64 connections, public port")
    lines += [
        f"  gain 2 over 1: segstore {show(doc['segstore_gain'])}, bare Flask {show(doc['bare_gain'])}",
        f"  segstore's gain over bare Flask's: {show(doc['gain_share'])} (target >= {TARGET_GAIN_SHARE})",
        f"  owner-aware clients on 2 over public port on 1: {show(doc['owner_aware_over_one'])} "
        f"(target >= {TARGET_OWNER_AWARE})",
        f"  tail at {TAIL_RATE:,.0f}/s over {TAIL_CONNECTIONS} connections: sent "
        f"{show(doc['tail']['sent_per_s'], '{:,.0f}')}/s, p50 {show(doc['tail']['delivered_p50_ms'])} ms "
        f"(target <= 1.5), p99 {show(doc['tail']['delivered_p99_ms'])} ms (target <= 3)",
        f"  EventWriter linger 0 -> EventReader: p50 {show(doc['events_linger_0']['p50_ms'])} ms "
        f"(target <= 2), p99 {show(doc['events_linger_0']['p99_ms'])} ms (target <= 5)",
        f"  the floor: appends at {TAIL_RATE:,.0f}/s over {TAIL_CONNECTIONS} connections to bare Flask "
        f"on one worker answered in p50 {show(doc['bare_acks']['p50_ms'])} ms, "
        f"p99 {show(doc['bare_acks']['p99_ms'])} ms "
        f"(segstore's in the tail run: p50 {show(doc['tail']['ack_p50_ms'])} ms)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per load run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--tail-s", type=float, default=4.0, help="seconds of each latency run")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--workdir", help="parent folder of the temporary data folders")
    plan = parser.parse_args(argv)
    return run_in_workdir("segstore-processes-", plan.workdir, lambda w: measure(plan, w), render, plan.json)


if __name__ == "__main__":
    sys.exit(main())
