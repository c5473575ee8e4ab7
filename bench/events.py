"""Event benchmark: durable 100-byte events through ``EventWriter`` against Redis Streams, same run.

``python -m bench.events [--quick] [--repeat N] [--json PATH]`` measures:

(a) events/s: 1, 16 and 64 ``EventWriter``s (one thread each, spread over
    client processes) append 100-byte events to one segment of a segstore
    server (gunicorn + gevent, started as ``make run`` does) in a closed loop
    for a fixed time, then ``flush()``; an event counts once acknowledged,
    i.e. durable in Tier 1;
(b) the baseline: ``redis-benchmark -P 16 -c 50 XADD s * f <100 bytes>``
    against a ``redis-server`` started here on loopback with
    ``--appendonly yes --appendfsync always --save ''``, so an XADD is
    answered once fsynced; the ratio (a)/(b);
(c) latency at a fixed 1,000 events/s: from ``EventWriter.write`` to a
    tailing ``EventReader`` (its live stream) yielding the event, against from
    sending an XADD to a reader blocked in ``XREAD BLOCK`` receiving it; with
    the writer's default 5 ms linger, and with none.

``redis-server`` and ``redis-benchmark`` come from Debian's packages
(``apt-get install redis-server``); without them the benchmark says so and
exits with status 2. Everything runs in a temporary directory and stops by
itself.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import Spread, percentile, process_cpu_s, run_in_workdir, worker_pid
from bench.servers import ServerProcess, free_port
from client.events import DEFAULT_LINGER_S, EventReader, EventWriter
from client.segment_client import SegmentClient

EVENT_BYTES = 100
WRITERS = (1, 16, 64)
REDIS_PIPELINE = 16
REDIS_CLIENTS = 50
TARGET_RATIO = 1.0
LINGER_S = DEFAULT_LINGER_S
SERVER_ENV = {"SEGSTORE_LOG_LEVEL": "warning"}
INSTALL_HINT = "redis-server is not installed: run `apt-get update && apt-get install -y redis-server`"


@dataclass(frozen=True)
class Plan:
    repeat: int
    duration_s: float
    latency_rate: float
    latency_s: float
    client_processes: int


# ------------------------------------------------------------------ segstore load
def _writer_process(
    url: str, segment: str, writers: int, duration_s: float, barrier: Any, results: Any
) -> None:
    """``writers`` EventWriter threads appending for ``duration_s``; reports events acknowledged."""
    try:
        payload = b"e" * EVENT_BYTES
        counts = [0] * writers
        client = SegmentClient(url)

        def run(index: int) -> None:
            with EventWriter(client, segment) as writer:
                stop = time.monotonic() + duration_s
                while time.monotonic() < stop:
                    for _ in range(100):
                        writer.write(payload)
                writer.flush()
                counts[index] = writer.last_event_number

        threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
        barrier.wait(60)
        started = time.monotonic()
        cpu = time.process_time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results.put((sum(counts), time.monotonic() - started, time.process_time() - cpu))
    except BaseException as exc:
        barrier.abort()
        results.put(f"writer process failed: {exc!r}")


@dataclass
class WriterRun:
    writers: int
    events_per_s: float
    server_cpu: float
    client_cpu: float


def segstore_run(server: ServerProcess, segment: str, writers: int, plan: Plan) -> WriterRun:
    """One closed-loop run of ``writers`` EventWriters on one segment."""
    SegmentClient(server.url).create(segment)
    ctx = mp.get_context("fork")
    processes = max(1, min(plan.client_processes, writers))
    shares = [writers // processes + (i < writers % processes) for i in range(processes)]
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_writer_process, args=(server.url, segment, n, plan.duration_s, barrier, results))
        for n in shares
    ]
    for proc in procs:
        proc.start()
    worker = worker_pid(server)
    barrier.wait(60)
    cpu_before = process_cpu_s(worker)
    started = time.monotonic()
    outcomes = [results.get(timeout=plan.duration_s + 120) for _ in procs]
    elapsed = time.monotonic() - started
    server_cpu = (process_cpu_s(worker) - cpu_before) / elapsed
    for proc in procs:
        proc.join(30)
    failures = [o for o in outcomes if isinstance(o, str)]
    if failures:
        raise RuntimeError("; ".join(failures))
    events = sum(o[0] for o in outcomes)
    window = max(o[1] for o in outcomes)
    stored = SegmentClient(server.url).info(segment).length
    if stored != events * (EVENT_BYTES + 4):
        raise RuntimeError(f"{segment}: {stored} bytes stored for {events} acknowledged events")
    return WriterRun(writers, events / window, server_cpu, sum(o[2] for o in outcomes) / window)


# ---------------------------------------------------------------------- redis
class RedisServer:
    """redis-server on a loopback port, answering writes only after fsync (AOF, appendfsync always)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--protected-mode", "no", "--daemonize", "no", "--logfile", str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with Resp(self.port) as conn:
                    if conn.call("PING") == "PONG":
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING in 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def config(self, name: str) -> str:
        with Resp(self.port) as conn:
            return conn.call("CONFIG", "GET", name)[1].decode()


class Resp:
    """A minimal RESP2 connection: send a command, read one reply."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def __enter__(self) -> Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        self.sock.close()

    def send(self, *args: str | bytes) -> None:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else arg
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self.sock.sendall(b"".join(parts))

    def reply(self) -> Any:
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self.file.read(size + 2)[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self.reply() for _ in range(size)]
        raise RuntimeError(f"unexpected RESP line {line!r}")

    def call(self, *args: str | bytes) -> Any:
        self.send(*args)
        return self.reply()


def redis_benchmark_run(redis: RedisServer, key: str, duration_s: float) -> float:
    """XADD rate from redis-benchmark (-P 16 -c 50), sized to run about ``duration_s``."""

    def run(requests: int) -> float:
        out = subprocess.run(
            [
                "redis-benchmark", "-h", "127.0.0.1", "-p", str(redis.port),
                "-P", str(REDIS_PIPELINE), "-c", str(REDIS_CLIENTS), "-n", str(requests), "--csv",
                "XADD", key, "*", "f", "v" * EVENT_BYTES,
            ],
            check=True, capture_output=True, text=True, timeout=duration_s * 10 + 120,
        ).stdout  # fmt: skip
        row = [line for line in out.splitlines() if line.startswith('"XADD')][-1]
        return float(row.split('","')[1].strip('"'))

    estimate = run(20_000)
    return run(max(20_000, int(estimate * duration_s)))


# -------------------------------------------------------------------- latency
@dataclass
class LatencyRun:
    events: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def _paced(rate: float, total: int, send: Any) -> list[float]:
    """Call ``send(i)`` ``total`` times at ``rate``/s; returns when each call started."""
    sent = [0.0] * total
    first = time.perf_counter() + 0.2
    for i in range(total):
        delay = first + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent[i] = time.perf_counter()
        send(i)
    return sent


def _latency(sent: list[float], seen: list[float]) -> LatencyRun:
    delays = [b - a for a, b in zip(sent, seen, strict=True)]
    return LatencyRun(
        len(delays),
        percentile(delays, 50) * 1000,
        percentile(delays, 99) * 1000,
        max(delays) * 1000,
    )


def segstore_latency(
    server: ServerProcess, segment: str, rate: float, seconds: float, linger_s: float
) -> LatencyRun:
    """EventWriter.write -> a tailing EventReader yields it, at ``rate`` events/s."""
    total = int(rate * seconds)
    seen = [0.0] * total
    with SegmentClient(server.url) as client, SegmentClient(server.url) as reader_client:
        client.create(segment)

        def follow() -> None:
            events = EventReader(reader_client, segment, offset=0, follow=True)
            for count, event in enumerate(events, start=1):
                seen[int.from_bytes(event.payload[:8], "big")] = time.perf_counter()
                if count == total:
                    return

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        pad = b"l" * (EVENT_BYTES - 8)
        with EventWriter(client, segment, linger_s=linger_s) as writer:
            sent = _paced(rate, total, lambda i: writer.write(i.to_bytes(8, "big") + pad))
        reader.join(60)
        if reader.is_alive():
            raise RuntimeError("the tailing reader did not see every event in time")
    return _latency(sent, seen)


def redis_latency(redis: RedisServer, key: str, rate: float, seconds: float) -> LatencyRun:
    """XADD -> a reader blocked in XREAD BLOCK receives it, at ``rate`` events/s."""
    total = int(rate * seconds)
    seen = [0.0] * total
    ready = threading.Event()

    def follow() -> None:
        with Resp(redis.port) as conn:
            last = "0-0"
            count = 0
            ready.set()
            while count < total:
                reply = conn.call("XREAD", "BLOCK", "5000", "STREAMS", key, last)
                now = time.perf_counter()
                if reply is None:
                    continue
                for entry_id, fields in reply[0][1]:
                    seen[int.from_bytes(fields[1][:8], "big")] = now
                    last = entry_id.decode()
                    count += 1

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    ready.wait(10)
    pad = b"l" * (EVENT_BYTES - 8)
    with Resp(redis.port) as conn:
        sent = _paced(rate, total, lambda i: conn.call("XADD", key, "*", "f", i.to_bytes(8, "big") + pad))
    reader.join(60)
    if reader.is_alive():
        raise RuntimeError("the blocked XREAD did not see every event in time")
    return _latency(sent, seen)


# ---------------------------------------------------------------------- report
def measure(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Every measurement of the plan, segstore and Redis back to back in each repetition."""
    doc: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_before": os.getloadavg()[0]},
        "plan": asdict(plan),
    }
    segstore: dict[int, list[WriterRun]] = {n: [] for n in WRITERS}
    redis_rates: list[float] = []
    latency: dict[str, list[LatencyRun]] = {"segstore": [], "segstore_linger0": [], "redis": []}
    with (
        ServerProcess(workdir / "data", env=SERVER_ENV) as server,
        RedisServer(workdir / "redis") as redis,
    ):
        doc["redis"] = {
            "appendonly": redis.config("appendonly"),
            "appendfsync": redis.config("appendfsync"),
            "version": subprocess.run(
                ["redis-server", "--version"], capture_output=True, text=True
            ).stdout.strip(),
        }
        for r in range(plan.repeat):
            for n in WRITERS:
                progress(f"run {r + 1}/{plan.repeat}: segstore, {n} EventWriter(s)")
                segstore[n].append(segstore_run(server, f"bench/events-w{n}-r{r}", n, plan))
            progress(f"run {r + 1}/{plan.repeat}: redis-benchmark XADD -P 16 -c 50")
            redis_rates.append(redis_benchmark_run(redis, f"bench-r{r}", plan.duration_s))
            progress(f"run {r + 1}/{plan.repeat}: latency at {plan.latency_rate:g} events/s")
            latency["segstore"].append(
                segstore_latency(server, f"bench/latency-r{r}", plan.latency_rate, plan.latency_s, LINGER_S)
            )
            latency["segstore_linger0"].append(
                segstore_latency(server, f"bench/latency0-r{r}", plan.latency_rate, plan.latency_s, 0.0)
            )
            latency["redis"].append(redis_latency(redis, f"latency-r{r}", plan.latency_rate, plan.latency_s))
    doc["machine"]["loadavg_1m_after"] = os.getloadavg()[0]
    doc["segstore_events_per_s"] = {
        str(n): {
            "events_per_s": asdict(Spread.of([run.events_per_s for run in runs])),
            "server_cpu": statistics.median(run.server_cpu for run in runs),
            "client_cpu": statistics.median(run.client_cpu for run in runs),
        }
        for n, runs in segstore.items()
    }
    doc["redis_xadd_per_s"] = asdict(Spread.of(redis_rates))
    doc["segstore_over_redis"] = {
        str(n): asdict(
            Spread.of([run.events_per_s / rate for run, rate in zip(runs, redis_rates, strict=True)])
        )
        for n, runs in segstore.items()
    }
    doc["latency_ms"] = {
        kind: {
            field: asdict(Spread.of([getattr(run, field) for run in runs]))
            for field in ("p50_ms", "p99_ms", "max_ms")
        }
        for kind, runs in latency.items()
    }
    return doc


def render(doc: dict[str, Any]) -> str:
    machine, plan = doc["machine"], doc["plan"]

    def show(d: dict[str, float], fmt: str = "{:,.0f}") -> str:
        return Spread(d["min"], d["median"], d["max"]).show(fmt)

    lines = [
        f"event benchmark: {machine['cpus']} CPUs, 1-minute load average "
        f"{machine['loadavg_1m_before']:.2f} before, {machine['loadavg_1m_after']:.2f} after; "
        f"{plan['repeat']} run(s), figures min / median / max",
        f"redis: {doc['redis']['version']}; appendonly {doc['redis']['appendonly']}, "
        f"appendfsync {doc['redis']['appendfsync']}",
        "",
        f"(a) durable {EVENT_BYTES}-byte events/s through EventWriter, one segment, "
        f"{plan['duration_s']:g} s runs from {plan['client_processes']} client process(es)",
    ]
    for n, run in doc["segstore_events_per_s"].items():
        lines.append(
            f"  {n:>3} writer(s): {show(run['events_per_s']):>30}   server CPU {run['server_cpu']:.0%}, "
            f"client CPU {run['client_cpu']:.0%}"
        )
    lines += [
        f"(b) redis-benchmark XADD, -P {REDIS_PIPELINE} -c {REDIS_CLIENTS}: "
        f"{show(doc['redis_xadd_per_s'])} /s",
        "    segstore / redis, paired runs:",
    ]
    for n, ratio in doc["segstore_over_redis"].items():
        met = "met" if ratio["median"] >= TARGET_RATIO else "NOT met"
        lines.append(f"  {n:>3} writer(s): {show(ratio, '{:.2f}'):>30}   [target >= {TARGET_RATIO}: {met}]")
    lines += ["", f"(c) latency at {plan['latency_rate']:g} events/s for {plan['latency_s']:g} s, ms"]
    labels = {
        "segstore": f"EventWriter.write -> tailing EventReader (linger {LINGER_S * 1000:g} ms, default)",
        "segstore_linger0": "the same, EventWriter linger 0",
        "redis": "XADD -> blocked XREAD",
    }
    for kind, run in doc["latency_ms"].items():
        lines.append(
            f"  {labels[kind]:<58} p50 {show(run['p50_ms'], '{:.2f}')}, p99 {show(run['p99_ms'], '{:.2f}')}, "
            f"max {show(run['max_ms'], '{:.2f}')}"
        )
    return "\n".join(lines)


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.events", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--repeat", type=int, default=0, help="runs per measurement (3, quick: 1)")
    parser.add_argument(
        "--duration", type=float, default=0.0, help="seconds per throughput run (10, quick: 2)"
    )
    parser.add_argument("--latency-rate", type=float, default=1000.0, help="events/s for the latency runs")
    parser.add_argument("--client-processes", type=int, default=2, help="processes the EventWriters run in")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary directory goes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None or shutil.which("redis-benchmark") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    plan = Plan(
        repeat=args.repeat or (1 if args.quick else 3),
        duration_s=args.duration or (2.0 if args.quick else 10.0),
        latency_rate=args.latency_rate,
        latency_s=2.0 if args.quick else 10.0,
        client_processes=args.client_processes,
    )
    return run_in_workdir("segstore-bench-events-", args.dir, lambda d: measure(plan, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
