"""Closed-loop appends to a cluster: each connection appends to its own segment, through the node
serving the segment's container (routed, as the Python client or a map reader does) or through a random
node per append (forwarded unless it picked the owner), and the CPU each process spent meanwhile.

The request loop is ``bench.load``'s (raw HTTP/1.1 over keep-alive sockets, in forked client
processes); this module adds several target nodes per connection and CPU sampling of every node and
of moto.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests

from bench.common import process_cpu_s, worker_pid
from bench.load import Connection, LoadTally, collect_tallies, request_bytes
from bench.local_cluster import LocalCluster, owners
from engine.naming import container_for


@dataclass(frozen=True)
class Target:
    """A connection's segment and the ports it sends to (one: the owner's; several: a random one each)."""

    segment: str
    ports: tuple[int, ...]


def targets(cluster: LocalCluster, connections: int, containers: int, routed: bool, tag: str) -> list[Target]:
    """One segment per connection, spread evenly over the containers, created through the first node."""
    first = next(iter(cluster.nodes.values()))
    found = owners(first.url)
    ports = {node: server.port for node, server in cluster.nodes.items()}
    names = (f"bench/{tag}/{i}" for i in itertools.count())
    by_container: dict[int, list[str]] = {c: [] for c in range(containers)}
    chosen: list[str] = []
    for name in names:
        container = container_for(name, containers)
        if len(by_container[container]) * containers < connections:
            by_container[container].append(name)
            chosen.append(name)
        if len(chosen) == connections:
            break
    found_targets = []
    for name in chosen:
        _create(cluster, name)
        owner_port = ports[str(found[container_for(name, containers)])]
        found_targets.append(Target(name, (owner_port,) if routed else tuple(ports.values())))
    return found_targets


def _create(cluster: LocalCluster, name: str) -> None:
    url = next(iter(cluster.urls.values()))
    for _ in range(100):
        answer = requests.put(f"{url}/v1/segments/{name}", timeout=30)
        if answer.status_code == 201:
            return
        time.sleep(0.2)
    raise RuntimeError(f"could not create {name}: {answer.status_code} {answer.text}")


async def _loop(conns: list[Connection], request: bytes, start: float, stop: float, tally: LoadTally) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < stop:
        conn = conns[0] if len(conns) == 1 else random.choice(conns)
        status, _, body = await conn.request(request)
        done = loop.time()
        if status == 200:
            tally.ok += start <= done < stop
        elif status == 503:
            tally.throttled += start <= done < stop
            await asyncio.sleep(0.01)
        else:
            tally.errors += 1
            tally.error_sample = tally.error_sample or f"{status} {body[:200]!r}"
    for conn in conns:
        conn.close()


async def _drive(mine: list[Target], body_bytes: int, warmup_s: float, duration_s: float, barrier: Any
                 ) -> LoadTally:
    sets = [[Connection(port) for port in target.ports] for target in mine]
    for conn in itertools.chain.from_iterable(sets):
        await conn.open()
    barrier.wait(60)
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup_s
    stop = start + duration_s
    tally = LoadTally()
    cpu_at_start: list[float] = []
    loop.call_at(start, lambda: cpu_at_start.append(time.process_time()))
    body = b"x" * body_bytes
    await asyncio.gather(*(
        _loop(conns, request_bytes("POST", f"/v1/segments/{t.segment}", body), start, stop, tally)
        for t, conns in zip(mine, sets, strict=True)
    ))
    tally.cpu_s = time.process_time() - cpu_at_start[0]
    return tally


def _client_process(mine: list[Target], body_bytes: int, warmup_s: float, duration_s: float,
                    barrier: Any, results: Any) -> None:
    try:
        results.put(asyncio.run(_drive(mine, body_bytes, warmup_s, duration_s, barrier)))
    except BaseException as exc:  # reported to the parent, which fails the run
        barrier.abort()
        results.put(f"client process failed: {exc!r}")


@dataclass
class Window:
    """One measured window: appends/s, 503s/s, and CPU seconds per second by process."""

    appends_per_s: float
    throttled_per_s: float
    cpu: dict[str, float]


def run_window(cluster: LocalCluster, load: list[Target], *, body_bytes: int, processes: int,
               warmup_s: float, duration_s: float) -> Window:
    """Drive ``load`` from ``processes`` forked client processes; sample every node's and moto's CPU."""
    ctx = mp.get_context("fork")
    processes = max(1, min(processes, len(load)))
    shares = [load[i::processes] for i in range(processes)]
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(share, body_bytes, warmup_s, duration_s, barrier,
                                                       results)) for share in shares]
    for proc in procs:
        proc.start()
    pids = {f"node {node}": worker_pid(server) for node, server in cluster.nodes.items()}
    if cluster.moto is not None and cluster.moto.proc is not None:
        pids["moto"] = cluster.moto.proc.pid
    try:
        barrier.wait(60)
    except threading.BrokenBarrierError:
        _, failures = collect_tallies(results, procs)
        raise RuntimeError(f"load generator did not start: {failures}") from None
    time.sleep(warmup_s)
    before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    time.sleep(duration_s)
    after = {name: process_cpu_s(pid) for name, pid in pids.items()}
    tally, failures = collect_tallies(results, procs)
    if failures:
        raise RuntimeError("; ".join(failures))
    if tally.errors:
        raise RuntimeError(f"{tally.errors} failed appends, e.g. {tally.error_sample}")
    cpu = {name: (after[name] - before[name]) / duration_s for name in pids}
    cpu["clients"] = tally.cpu_s / duration_s
    return Window(tally.ok / duration_s, tally.throttled / duration_s, cpu)
