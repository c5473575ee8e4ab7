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
    receiving its bytes.

The load generator is lean on purpose (the server and the generator share the
machine): client processes each run an asyncio loop speaking raw HTTP/1.1 over
keep-alive sockets, with prebuilt requests. The report shows the CPU used by
the server's worker and by the generator, so a generator bottleneck shows.
Everything runs on loopback in a temporary directory and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import requests

from bench.servers import ServerProcess

HOST = "127.0.0.1"
KiB = 1024
MiB = 1024 * KiB
SMALL_APPEND_BYTES = 100
BIG_APPEND_BYTES = 1 * MiB
CONCURRENCY = (1, 16, 64)
# The engine's histogram of operations per Tier 1 write (engine/metrics.py).
TIER1_OPS_METRIC = "segstore_tier1_write_operations"
TARGET_FRAMEWORK_RATIO = 0.7
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
            tail_duration_s=2.0 if quick else 5.0,
            client_processes=args.client_processes,
        )


# --------------------------------------------------------------- raw HTTP/1.1
def _request_bytes(method: str, target: str, body: bytes = b"") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n"
    if method in ("POST", "PUT"):
        head += f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
    return head.encode("ascii") + b"\r\n" + body


class _Connection:
    """One keep-alive HTTP/1.1 connection: send a prebuilt request, read one response.

    Bodies come by Content-Length or chunked (Node servers send those).
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)

    async def request(self, data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        self.writer.write(data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            body = await self.reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                body += (await self.reader.readexactly(size + 2))[:size]
                if size == 0:
                    break
        elif status in (204, 304):
            body = b""
        else:
            raise RuntimeError(f"response without Content-Length: {head!r}")
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, headers, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.reader = None


# ------------------------------------------------------------- closed-loop load
@dataclass(frozen=True)
class LoadSpec:
    """Connections appending ``body_bytes`` to ``segment`` in a closed loop."""

    port: int
    segment: str
    body_bytes: int
    connections: int
    warmup_s: float
    duration_s: float


@dataclass
class LoadTally:
    """What one client process saw inside the measured window."""

    ok: int = 0
    throttled: int = 0
    errors: int = 0
    error_sample: str = ""
    cpu_s: float = 0.0

    def add(self, other: LoadTally) -> None:
        self.ok += other.ok
        self.throttled += other.throttled
        self.errors += other.errors
        self.error_sample = self.error_sample or other.error_sample
        self.cpu_s += other.cpu_s


async def _closed_loop(
    conn: _Connection, request: bytes, start: float, stop: float, tally: LoadTally
) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < stop:
        status, _, body = await conn.request(request)
        done = loop.time()
        if status == 200:
            if start <= done < stop:
                tally.ok += 1
        elif status == 503:
            if start <= done < stop:
                tally.throttled += 1
            await asyncio.sleep(0.01)
        else:
            tally.errors += 1
            tally.error_sample = tally.error_sample or f"{status} {body[:200]!r}"
    conn.close()


async def _drive(spec: LoadSpec, connections: int, barrier: Any) -> LoadTally:
    conns = [_Connection(spec.port) for _ in range(connections)]
    for conn in conns:
        await conn.open()
    barrier.wait(60)
    loop = asyncio.get_running_loop()
    start = loop.time() + spec.warmup_s
    stop = start + spec.duration_s
    tally = LoadTally()
    cpu_at_start: list[float] = []
    loop.call_at(start, lambda: cpu_at_start.append(time.process_time()))
    request = _request_bytes("POST", f"/v1/segments/{spec.segment}", b"x" * spec.body_bytes)
    await asyncio.gather(*(_closed_loop(c, request, start, stop, tally) for c in conns))
    tally.cpu_s = time.process_time() - cpu_at_start[0]
    return tally


def _client_process(spec: LoadSpec, connections: int, barrier: Any, results: Any) -> None:
    try:
        results.put(asyncio.run(_drive(spec, connections, barrier)))
    except BaseException as exc:  # reported to the parent, which fails the run
        barrier.abort()
        results.put(f"client process failed: {exc!r}")


@dataclass
class LoadResult:
    """One closed-loop run: rates over the measured window."""

    connections: int
    requests_per_s: float
    mib_per_s: float
    throttled_per_s: float
    ops_per_tier1_write: float | None
    server_cpu: float
    client_cpu: float


def run_load(
    spec: LoadSpec,
    processes: int,
    server: ServerProcess,
    metrics: Callable[[], dict[str, float]] | None = None,
) -> LoadResult:
    """Run ``spec`` from ``processes`` client processes; sample the server around the window."""
    ctx = mp.get_context("fork")
    processes = max(1, min(processes, spec.connections))
    shares = [spec.connections // processes + (i < spec.connections % processes) for i in range(processes)]
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(spec, n, barrier, results)) for n in shares]
    for p in procs:
        p.start()
    worker = _worker_pid(server)
    try:
        barrier.wait(60)
    except threading.BrokenBarrierError:
        _, failures = _collect(results, procs)
        raise RuntimeError(f"load generator did not start: {failures}") from None
    time.sleep(spec.warmup_s)
    before = metrics() if metrics else {}
    cpu_before = _process_cpu_s(worker)
    time.sleep(spec.duration_s)
    cpu_after = _process_cpu_s(worker)
    after = metrics() if metrics else {}
    tally, failures = _collect(results, procs)
    if failures:
        raise RuntimeError("; ".join(failures))
    if tally.errors:
        raise RuntimeError(f"{tally.errors} failed requests, e.g. {tally.error_sample}")
    ops = None
    if metrics:
        writes = after.get("count", 0.0) - before.get("count", 0.0)
        ops = (after.get("sum", 0.0) - before.get("sum", 0.0)) / writes if writes else None
    window = spec.duration_s
    return LoadResult(
        connections=spec.connections,
        requests_per_s=tally.ok / window,
        mib_per_s=tally.ok * spec.body_bytes / MiB / window,
        throttled_per_s=tally.throttled / window,
        ops_per_tier1_write=ops,
        server_cpu=(cpu_after - cpu_before) / window,
        client_cpu=tally.cpu_s / window,
    )


def _collect(results: Any, procs: list[Any]) -> tuple[LoadTally, list[str]]:
    """Gather every client process's tally (or failure), then reap the processes."""
    tally = LoadTally()
    failures = []
    for _ in procs:
        try:
            got = results.get(timeout=60)
        except queue.Empty:
            failures.append("a client process gave no result")
            break
        if isinstance(got, LoadTally):
            tally.add(got)
        else:
            failures.append(got)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    return tally, failures


# ------------------------------------------------------------ servers and /proc
def _worker_pid(server: ServerProcess) -> int:
    """The gunicorn worker: the arbiter's only child."""
    assert server.proc is not None
    arbiter = server.proc.pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == arbiter:
                return int(entry.name)
    raise RuntimeError(f"no worker process under gunicorn {arbiter}")


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metric_total(server: ServerProcess, name: str) -> float:
    """The sum of a Prometheus sample over all its labels."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def tier1_metric(server: ServerProcess) -> dict[str, float]:
    """Sum and count of the operations-per-Tier-1-write histogram."""
    return {kind: _metric_total(server, f"{TIER1_OPS_METRIC}_{kind}") for kind in ("sum", "count")}


def create_segment(server: ServerProcess, name: str) -> None:
    response = requests.put(f"{server.url}/v1/segments/{name}", timeout=10)
    if response.status_code != 201:
        raise RuntimeError(f"create {name}: {response.status_code} {response.text}")


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
    delivered_p50_ms: float
    delivered_p99_ms: float
    delivered_max_ms: float
    ack_p50_ms: float
    ack_p99_ms: float


async def _tail_latency(port: int, segment: str, rate: float, duration_s: float) -> TailResult:
    loop = asyncio.get_running_loop()
    total = int(rate * duration_s)
    sent = [0.0] * total
    acked = [0.0] * total
    delivered = [0.0] * total
    pad = b"t" * (SMALL_APPEND_BYTES - 8)
    target = f"/v1/segments/{segment}"

    async def write() -> None:
        conn = _Connection(port)
        first = loop.time() + 0.2
        for i in range(total):
            delay = first + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            request = _request_bytes("POST", target, i.to_bytes(8, "big") + pad)
            sent[i] = loop.time()
            status, _, body = await conn.request(request)
            acked[i] = loop.time() - sent[i]
            if status != 200:
                raise RuntimeError(f"tail append {i}: {status} {body[:200]!r}")
        conn.close()

    async def read() -> None:
        conn = _Connection(port)
        offset = 0
        pending = b""
        got = 0
        while got < total:
            status, headers, body = await conn.request(
                _request_bytes("GET", f"{target}?offset={offset}&wait=5")
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

    await asyncio.wait_for(asyncio.gather(write(), read()), duration_s + 60)
    return TailResult(
        appends=total,
        delivered_p50_ms=_percentile(delivered, 50) * 1000,
        delivered_p99_ms=_percentile(delivered, 99) * 1000,
        delivered_max_ms=max(delivered) * 1000,
        ack_p50_ms=_percentile(acked, 50) * 1000,
        ack_p99_ms=_percentile(acked, 99) * 1000,
    )


def _percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * pct / 100)) - 1]


# ---------------------------------------------------------------------- report
@dataclass
class Spread:
    """Min, median and max of repeated runs."""

    min: float
    median: float
    max: float
    runs: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(min(values), statistics.median(values), max(values), list(values))

    def show(self, fmt: str = "{:,.0f}") -> str:
        return " / ".join(fmt.format(v) for v in (self.min, self.median, self.max))


def run_in_workdir(
    prefix: str,
    parent: str | Path | None,
    measure: Callable[[Path], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    json_path: str | Path | None,
) -> int:
    """A benchmark's main: ``measure`` in a temporary folder (always removed), print, save as JSON."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        doc = measure(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(doc))
    if json_path:
        Path(json_path).write_text(json.dumps(doc, default=lambda o: o.__dict__, indent=2) + "\n")
    return 0


def _spread_of(runs: Sequence[Any], attr: str) -> Spread | None:
    values = [getattr(r, attr) for r in runs if getattr(r, attr) is not None]
    return Spread.of(values) if values else None


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
    return {name: asdict(s) for name in names if (s := _spread_of(runs, name)) is not None}


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
    with (
        ServerProcess(workdir / "data", env=SERVER_ENV) as server,
        ServerProcess(workdir / "bare", env=SERVER_ENV, app="bench.bare_app:create_app()") as bare,
    ):
        for r in range(plan.repeat):
            _progress(f"run {r + 1}/{plan.repeat}: disk fdatasync")
            fdatasyncs.append(fdatasync_rate(workdir, plan.disk_s))
            for c in CONCURRENCY:
                _progress(f"run {r + 1}/{plan.repeat}: 100-byte appends from {c} client(s)")
                small["segstore"][c].append(_small_run(plan, server, c, f"bench/small-c{c}-r{r}"))
                small["bare"][c].append(_small_run(plan, bare, c, None))
            _progress(f"run {r + 1}/{plan.repeat}: disk bandwidth, then 1 MiB appends")
            bandwidths.append(sync_write_bandwidth(workdir, plan.disk_s))
            big.append(_big_run(plan, server, f"bench/big-r{r}"))
            _progress(f"run {r + 1}/{plan.repeat}: tail latency")
            segment = f"bench/tail-r{r}"
            create_segment(server, segment)
            tails.append(
                asyncio.run(_tail_latency(server.port, segment, plan.tail_rate, plan.tail_duration_s))
            )
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
                "delivered_p50_ms",
                "delivered_p99_ms",
                "delivered_max_ms",
                "ack_p50_ms",
                "ack_p99_ms",
            )
        },
    }
    return doc


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
    _wait_writer_idle(server)
    return result


def _wait_writer_idle(server: ServerProcess, timeout_s: float = 120.0) -> None:
    """Wait until no acknowledged byte waits for Tier 2, so the next run starts quiet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _metric_total(server, "segstore_writer_lag_bytes") == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"Tier 2 did not catch up in {timeout_s} s")


def _progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


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
        f"{plan['tail_duration_s']:g} s, one long-poll reader follows",
        f"  append sent -> reader has it: p50 {spread(tail['delivered_p50_ms'], '{:.2f}')}, "
        f"p99 {spread(tail['delivered_p99_ms'], '{:.2f}')}, "
        f"max {spread(tail['delivered_max_ms'], '{:.2f}')}",
        f"  append sent -> acknowledged:  p50 {spread(tail['ack_p50_ms'], '{:.2f}')}, "
        f"p99 {spread(tail['ack_p99_ms'], '{:.2f}')}",
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
    parser.add_argument("--tail-rate", type=float, default=200.0, help="appends/s for tail latency")
    parser.add_argument("--client-processes", type=int, default=1, help="load generator processes")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary data dir goes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    plan = Plan.build(args)
    return run_in_workdir("segstore-bench-", args.dir, lambda d: measure(plan, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
