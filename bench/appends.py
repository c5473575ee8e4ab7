"""Append benchmark: segstore against the framework ceiling and the disk's limits.

``python -m bench.appends [--quick] [--repeat N] [--json PATH]`` measures, in one run:

(a) appends/s of 100-byte appends to a real segstore server (gunicorn + gevent,
    started as ``make run`` does) from 1, 16 and 64 concurrent keep-alive
    clients, each appending in a closed loop, and the mean number of
    operations per Tier 1 write (from ``/metrics``);
(b) the same load against ``bench.bare_app`` under the same gunicorn config:
    the framework's ceiling, and the ratio (a)/(b);
(c) the disk: fdatasync/s of 4 KiB writes, and MiB/s of 1 MiB writes each
    followed by fdatasync, on the filesystem that holds the data directory;
(d) MiB/s of 1 MiB appends from a few clients, against (c)'s bandwidth;
(e) tail latency: a long-poll reader follows a segment while a writer appends
    at a fixed rate; from just before an append is sent to the reader
    receiving its bytes. The writer waits for each answer before it sends
    the next append, so the rate holds only while answers take less than
    the interval: the report gives the rate the appends went out at.
    ``--tail-connections N`` sends append i on connection i mod N, for the
    rate a server's answers cannot keep up with on one;
(f) group commit across containers: 64 clients append to one segment, then
    to 16 segments spread over the 4 containers; operations per Tier 1 sync
    (``segstore_tier1_syncs_total``) of the spread load over the single one.

The load generator is lean on purpose (the server and the generator share the
machine): client processes each run an asyncio loop speaking raw HTTP/1.1 over
keep-alive sockets, with prebuilt requests. The report shows the CPU used by
the server's worker and by the generator, so a generator bottleneck shows.
Everything runs on loopback in a temporary directory and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import requests

from bench.common import (
    TIER1_OPS_METRIC,
    Spread,
    create_segment,
    metric_total,
    percentile,
    progress,
    run_in_workdir,
    spread_of,
    tier1_metric,
    wait_writer_idle,
)
from bench.load import Connection, LoadResult, LoadSpec, request_bytes, run_load
from bench.servers import ServerProcess
from engine.naming import container_for

KiB = 1024
MiB = 1024 * KiB
SMALL_APPEND_BYTES = 100
BIG_APPEND_BYTES = 1 * MiB
CONCURRENCY = (1, 16, 64)
TARGET_FRAMEWORK_RATIO = 0.8
TARGET_TAIL_P50_MS = 1.5
TARGET_TAIL_P99_MS = 3.0
TARGET_SPREAD_SYNC_RATIO = 0.7
SPREAD_CLIENTS = 64
SPREAD_SEGMENTS_PER_CONTAINER = 4
CONTAINERS = 4  # the default container_count
TARGET_BANDWIDTH_RATIO = 0.5
SERVER_ENV = {"SEGSTORE_LOG_LEVEL": "warning"}


@dataclass(frozen=True)
class Plan:
    """How long and how often each measurement runs."""

    repeat: int
    warmup_s: float
    duration_s: float
    big_clients: int
    big_duration_s: float
    disk_s: float
    tail_rate: float
    tail_connections: int
    tail_duration_s: float
    client_processes: int

    @classmethod
    def build(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        return cls(
            repeat=args.repeat or (1 if quick else 3),
            warmup_s=args.warmup or (0.5 if quick else 2.0),
            duration_s=args.duration or (2.0 if quick else 10.0),
            big_clients=args.big_clients,
            big_duration_s=2.0 if quick else 5.0,
            disk_s=0.5 if quick else 2.0,
            tail_rate=args.tail_rate,
            tail_connections=args.tail_connections,
            tail_duration_s=2.0 if quick else 5.0,
            client_processes=args.client_processes,
        )


# ------------------------------------------------------------------------ disk
def fdatasync_rate(directory: Path, seconds: float) -> float:
    """4 KiB appends to a file, each followed by fdatasync: syncs per second."""
    block = b"\xa5" * (4 * KiB)
    with _scratch_fd(directory) as fd:
        count = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            os.write(fd, block)
            os.fdatasync(fd)
            count += 1
    return count / elapsed


def sync_write_bandwidth(directory: Path, seconds: float) -> float:
    """1 MiB sequential writes, each followed by fdatasync: MiB per second."""
    block = os.urandom(BIG_APPEND_BYTES)
    with _scratch_fd(directory) as fd:
        written = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            written += os.write(fd, block)
            os.fdatasync(fd)
    return written / MiB / elapsed


@contextmanager
def _scratch_fd(directory: Path) -> Iterator[int]:
    fd, path = tempfile.mkstemp(dir=directory, prefix="disk-")
    try:
        yield fd
    finally:
        os.close(fd)
        os.unlink(path)


# ----------------------------------------------------------------- tail latency
@dataclass
class TailResult:
    """Milliseconds from just before an append is sent to a long-poll reader getting it."""

    appends: int
    sent_per_s: float  # the rate the appends went out at (below the plan's when the server lags)
    delivered_p50_ms: float
    delivered_p99_ms: float
    delivered_max_ms: float
    ack_p50_ms: float
    ack_p99_ms: float


async def paced_appends(
    port: int, target: str, rate: float, sent: list[float], acked: list[float], connections: int,
    body: Callable[[int], bytes],
) -> None:
    """Append ``body(i)`` to ``target`` for each index of ``sent``, at ``rate`` from 0.2 s on,
    spread over ``connections``; ``sent[i]`` is when append i went out, ``acked[i]`` the seconds
    its answer took."""
    loop = asyncio.get_running_loop()
    first = loop.time() + 0.2

    async def write(lane: int) -> None:
        conn = Connection(port)
        for i in range(lane, len(sent), connections):
            delay = first + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            request = request_bytes("POST", target, body(i))
            sent[i] = loop.time()
            status, _, answer = await conn.request(request)
            acked[i] = loop.time() - sent[i]
            if status != 200:
                raise RuntimeError(f"append {i} to {target}: {status} {answer[:200]!r}")
        conn.close()

    await asyncio.gather(*(write(lane) for lane in range(connections)))


async def _tail_latency(
    port: int, segment: str, rate: float, duration_s: float, connections: int = 1
) -> TailResult:
    loop = asyncio.get_running_loop()
    total = int(rate * duration_s)
    sent = [0.0] * total
    acked = [0.0] * total
    delivered = [0.0] * total
    pad = b"t" * (SMALL_APPEND_BYTES - 8)
    target = f"/v1/segments/{segment}"

    async def read() -> None:
        conn = Connection(port)
        offset = 0
        pending = b""
        got = 0
        while got < total:
            status, headers, body = await conn.request(
                request_bytes("GET", f"{target}?offset={offset}&wait=5")
            )
            now = loop.time()
            if status == 204:
                continue
            if status != 200:
                raise RuntimeError(f"tail read at {offset}: {status} {body[:200]!r}")
            offset = int(headers[b"segment-next-offset"])
            pending += body
            while len(pending) >= SMALL_APPEND_BYTES:
                index = int.from_bytes(pending[:8], "big")
                delivered[index] = now - sent[index]
                pending = pending[SMALL_APPEND_BYTES:]
                got += 1
        conn.close()

    writes = paced_appends(port, target, rate, sent, acked, connections, lambda i: i.to_bytes(8, "big") + pad)
    await asyncio.wait_for(asyncio.gather(writes, read()), duration_s + 60)
    return TailResult(
        appends=total,
        sent_per_s=(total - 1) / (max(sent) - min(sent)),
        delivered_p50_ms=percentile(delivered, 50) * 1000,
        delivered_p99_ms=percentile(delivered, 99) * 1000,
        delivered_max_ms=max(delivered) * 1000,
        ack_p50_ms=percentile(acked, 50) * 1000,
        ack_p99_ms=percentile(acked, 99) * 1000,
    )




# ---------------------------------------------------------------------- report
def _load_summary(runs: list[LoadResult]) -> dict[str, Any]:
    """Min / median / max (and each run) of every rate of a list of load runs."""
    names = (
        "requests_per_s",
        "mib_per_s",
        "throttled_per_s",
        "ops_per_tier1_write",
        "server_cpu",
        "client_cpu",
    )
    return {name: asdict(s) for name in names if (s := spread_of(runs, name)) is not None}


def measure(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Run every measurement of the plan; returns the JSON document.

    Each repetition measures segstore and the bare app back to back at each
    concurrency, and the disk's bandwidth right before the 1 MiB appends, so
    the ratios compare runs made under the same conditions.
    """
    doc: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1m_before": os.getloadavg()[0],
        },
        "plan": asdict(plan),
        "load_generator": (
            f"{plan.client_processes} client process(es), each an asyncio loop of raw "
            "HTTP/1.1 keep-alive connections with prebuilt requests (closed loop)"
        ),
    }
    small: dict[str, dict[int, list[LoadResult]]] = {
        "segstore": {c: [] for c in CONCURRENCY},
        "bare": {c: [] for c in CONCURRENCY},
    }
    fdatasyncs: list[float] = []
    bandwidths: list[float] = []
    big: list[LoadResult] = []
    tails: list[TailResult] = []
    spread_one: list[LoadResult] = []
    spread_many: list[LoadResult] = []
    with (
        ServerProcess(workdir / "data", env=SERVER_ENV) as server,
        ServerProcess(workdir / "bare", env=SERVER_ENV, app="bench.bare_app:create_app()") as bare,
    ):
        for r in range(plan.repeat):
            progress(f"run {r + 1}/{plan.repeat}: disk fdatasync")
            fdatasyncs.append(fdatasync_rate(workdir, plan.disk_s))
            for c in CONCURRENCY:
                progress(f"run {r + 1}/{plan.repeat}: 100-byte appends from {c} client(s)")
                small["segstore"][c].append(_small_run(plan, server, c, f"bench/small-c{c}-r{r}"))
                small["bare"][c].append(_small_run(plan, bare, c, None))
            progress(f"run {r + 1}/{plan.repeat}: disk bandwidth, then 1 MiB appends")
            bandwidths.append(sync_write_bandwidth(workdir, plan.disk_s))
            big.append(_big_run(plan, server, f"bench/big-r{r}"))
            progress(f"run {r + 1}/{plan.repeat}: tail latency")
            segment = f"bench/tail-r{r}"
            create_segment(server, segment)
            tails.append(
                asyncio.run(
                    _tail_latency(
                        server.port, segment, plan.tail_rate, plan.tail_duration_s, plan.tail_connections
                    )
                )
            )
            progress(f"run {r + 1}/{plan.repeat}: {SPREAD_CLIENTS} clients on 1, then 16 segments")
            spread_one.append(_spread_run(plan, server, spread_segments(f"bench/one-r{r}", 1)))
            spread_many.append(_spread_run(plan, server, spread_segments(f"bench/spread-r{r}", 16)))
    doc["machine"]["loadavg_1m_after"] = os.getloadavg()[0]

    doc["disk"] = {
        "fdatasync_per_s": asdict(Spread.of(fdatasyncs)),
        "write_fdatasync_1mib_mib_per_s": asdict(Spread.of(bandwidths)),
    }
    doc["appends_100b"] = {
        "segstore": {str(c): _load_summary(runs) for c, runs in small["segstore"].items()},
        "bare": {str(c): _load_summary(runs) for c, runs in small["bare"].items()},
        "segstore_over_bare": {
            str(c): asdict(
                Spread.of(
                    [
                        s.requests_per_s / b.requests_per_s
                        for s, b in zip(small["segstore"][c], small["bare"][c], strict=True)
                    ]
                )
            )
            for c in CONCURRENCY
        },
    }
    doc["appends_1mib"] = {
        **_load_summary(big),
        "over_raw_bandwidth": asdict(
            Spread.of([run.mib_per_s / raw for run, raw in zip(big, bandwidths, strict=True)])
        ),
    }
    doc["tail_latency"] = {
        "rate_per_s": plan.tail_rate,
        **{
            name: asdict(Spread.of([getattr(t, name) for t in tails]))
            for name in (
                "sent_per_s",
                "delivered_p50_ms",
                "delivered_p99_ms",
                "delivered_max_ms",
                "ack_p50_ms",
                "ack_p99_ms",
            )
        },
    }
    doc["group_commit"] = {
        "clients": SPREAD_CLIENTS,
        "one_segment": _load_summary(spread_one),
        "sixteen_segments": _load_summary(spread_many),
        "ops_per_sync_ratio": asdict(
            Spread.of(
                [
                    (m.ops_per_tier1_write or 0.0) / (o.ops_per_tier1_write or 1.0)
                    for o, m in zip(spread_one, spread_many, strict=True)
                ]
            )
        ),
    }
    return doc


def spread_segments(prefix: str, count: int) -> tuple[str, ...]:
    """``count`` segment names: one, or as many in each of the containers as the others."""
    if count == 1:
        return (prefix,)
    per = count // CONTAINERS
    names: dict[int, list[str]] = {c: [] for c in range(CONTAINERS)}
    i = 0
    while any(len(v) < per for v in names.values()):
        name = f"{prefix}-{i}"
        bucket = names[container_for(name, CONTAINERS)]
        if len(bucket) < per:
            bucket.append(name)
        i += 1
    return tuple(n for v in names.values() for n in v)


def sync_metric(server: ServerProcess) -> dict[str, float]:
    """Operations logged (``sum``) and Tier 1 syncs made (``count``): ``run_load`` divides them."""
    return {
        "sum": metric_total(server, f"{TIER1_OPS_METRIC}_sum"),
        "count": metric_total(server, "segstore_tier1_syncs_total"),
    }


def _spread_run(plan: Plan, server: ServerProcess, segments: tuple[str, ...]) -> LoadResult:
    """64 clients over ``segments``; its ``ops_per_tier1_write`` is operations per Tier 1 sync."""
    for name in segments:
        create_segment(server, name)
    spec = LoadSpec(
        server.port, segments[0], SMALL_APPEND_BYTES, SPREAD_CLIENTS, plan.warmup_s, plan.duration_s,
        spread=segments,
    )
    return run_load(spec, plan.client_processes, server, partial(sync_metric, server))


def _small_run(plan: Plan, server: ServerProcess, clients: int, segment: str | None) -> LoadResult:
    """One run of 100-byte appends; ``segment`` None means the bare app (no segment, no metrics)."""
    if segment is None:
        return run_load(
            LoadSpec(server.port, "bench/bare", SMALL_APPEND_BYTES, clients, plan.warmup_s, plan.duration_s),
            plan.client_processes,
            server,
        )
    create_segment(server, segment)
    return run_load(
        LoadSpec(server.port, segment, SMALL_APPEND_BYTES, clients, plan.warmup_s, plan.duration_s),
        plan.client_processes,
        server,
        partial(tier1_metric, server),
    )


def _big_run(plan: Plan, server: ServerProcess, segment: str) -> LoadResult:
    """One run of 1 MiB appends; then the segment is deleted and Tier 2 left to catch up."""
    create_segment(server, segment)
    result = run_load(
        LoadSpec(server.port, segment, BIG_APPEND_BYTES, plan.big_clients, 1.0, plan.big_duration_s),
        plan.client_processes,
        server,
        partial(tier1_metric, server),
    )
    requests.delete(f"{server.url}/v1/segments/{segment}", timeout=30).raise_for_status()
    wait_writer_idle(server)
    return result


def render(doc: dict[str, Any]) -> str:
    """The human-readable report of a ``measure`` document."""
    plan = doc["plan"]
    machine = doc["machine"]
    small = doc["appends_100b"]
    disk = doc["disk"]
    big = doc["appends_1mib"]
    tail = doc["tail_latency"]

    def spread(d: dict[str, float], fmt: str = "{:,.0f}") -> str:
        return Spread(d["min"], d["median"], d["max"]).show(fmt)

    def verdict(value: float, target: float) -> str:
        return f"[target >= {target}: {'met' if value >= target else 'NOT met'}]"

    def verdict_below(value: float, target: float) -> str:
        return f"[target <= {target} ms: {'met' if value <= target else 'NOT met'}]"

    lines = [
        f"segstore append benchmark: {machine['cpus']} CPUs, Python {machine['python']}, "
        f"1-minute load average {machine['loadavg_1m_before']:.2f} before, "
        f"{machine['loadavg_1m_after']:.2f} after",
        f"{plan['repeat']} run(s) of each; 100-byte runs last {plan['duration_s']:g} s after "
        f"{plan['warmup_s']:g} s of warm-up; figures are min / median / max over runs",
        f"load generator: {doc['load_generator']}",
        "",
        "(a, b) 100-byte appends per second (CPU: share of one core, median)",
        f"  {'server':<10}{'clients':>8}  {'appends/s':>24}  {'ops/T1 write':>12}  "
        f"{'server CPU':>10}  {'client CPU':>10}",
    ]
    for kind in ("segstore", "bare"):
        for c, s in small[kind].items():
            ops = f"{s['ops_per_tier1_write']['median']:.1f}" if "ops_per_tier1_write" in s else "-"
            lines.append(
                f"  {kind:<10}{c:>8}  {spread(s['requests_per_s']):>24}  {ops:>12}  "
                f"{s['server_cpu']['median']:>10.0%}  {s['client_cpu']['median']:>10.0%}"
            )
    lines.append("  segstore / bare, paired runs:")
    for c, ratio in small["segstore_over_bare"].items():
        target = f"  {verdict(ratio['median'], TARGET_FRAMEWORK_RATIO)}" if c == "64" else ""
        lines.append(f"  {c:>18}  {spread(ratio, '{:.2f}'):>24}{target}")
    big_ops = big["ops_per_tier1_write"]["median"] if "ops_per_tier1_write" in big else float("nan")
    lines += [
        "",
        "(c) disk, same filesystem as the data directory",
        f"  4 KiB write + fdatasync:   {spread(disk['fdatasync_per_s'])} /s",
        f"  1 MiB write + fdatasync:   {spread(disk['write_fdatasync_1mib_mib_per_s'])} MiB/s",
        "",
        f"(d) 1 MiB appends from {plan['big_clients']} clients for {plan['big_duration_s']:g} s",
        f"  segstore:                  {spread(big['mib_per_s'])} MiB/s "
        f"(median: {big['throttled_per_s']['median']:.1f} throttled/s, {big_ops:.1f} ops/T1 write, "
        f"server CPU {big['server_cpu']['median']:.0%})",
        f"  over raw bandwidth:        {spread(big['over_raw_bandwidth'], '{:.2f}')}  "
        + verdict(big["over_raw_bandwidth"]["median"], TARGET_BANDWIDTH_RATIO),
        "",
        f"(e) tail latency, ms: a writer appends 100 bytes {tail['rate_per_s']:g} times/s for "
        f"{plan['tail_duration_s']:g} s over {plan['tail_connections']} connection(s), one long-poll reader "
        f"follows; sent at {spread(tail['sent_per_s'])} /s",
        f"  append sent -> reader has it: p50 {spread(tail['delivered_p50_ms'], '{:.2f}')}, "
        f"p99 {spread(tail['delivered_p99_ms'], '{:.2f}')}, "
        f"max {spread(tail['delivered_max_ms'], '{:.2f}')}",
        f"  append sent -> acknowledged:  p50 {spread(tail['ack_p50_ms'], '{:.2f}')}, "
        f"p99 {spread(tail['ack_p99_ms'], '{:.2f}')}",
        f"  p50 {verdict_below(tail['delivered_p50_ms']['median'], TARGET_TAIL_P50_MS)}, "
        f"p99 {verdict_below(tail['delivered_p99_ms']['median'], TARGET_TAIL_P99_MS)}",
    ]
    group = doc["group_commit"]
    one, many = group["one_segment"], group["sixteen_segments"]
    lines += [
        "",
        f"(f) group commit across containers: {group['clients']} clients of 100-byte appends",
        f"  1 segment:      {spread(one['requests_per_s'])} appends/s, "
        f"{spread(one['ops_per_tier1_write'], '{:.1f}')} ops per Tier 1 sync",
        f"  16 segments:    {spread(many['requests_per_s'])} appends/s, "
        f"{spread(many['ops_per_tier1_write'], '{:.1f}')} ops per Tier 1 sync",
        f"  16 / 1, paired: {spread(group['ops_per_sync_ratio'], '{:.2f}')}  "
        + verdict(group["ops_per_sync_ratio"]["median"], TARGET_SPREAD_SYNC_RATIO),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the report, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.appends", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--repeat", type=int, default=0, help="runs per measurement (3, quick: 1)")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds per 100-byte run")
    parser.add_argument("--warmup", type=float, default=0.0, help="warm-up seconds per run")
    parser.add_argument("--big-clients", type=int, default=4, help="clients for 1 MiB appends")
    parser.add_argument("--tail-rate", type=float, default=1000.0, help="appends/s for tail latency")
    parser.add_argument(
        "--tail-connections", type=int, default=1, help="writer connections for tail latency (see (e))"
    )
    parser.add_argument("--client-processes", type=int, default=1, help="load generator processes")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary data dir goes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    plan = Plan.build(args)
    return run_in_workdir("segstore-bench-", args.dir, lambda d: measure(plan, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
