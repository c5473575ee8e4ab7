"""The benchmarks' load generator: closed-loop clients speaking raw HTTP/1.1 over keep-alive sockets.

The server and the generator share the machine, so the generator is lean on
purpose: client processes each run an asyncio loop over prebuilt requests.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common import process_cpu_s, worker_pids
from bench.servers import ServerProcess

HOST = "127.0.0.1"
MiB = 1024 * 1024
Headers = tuple[tuple[str, str], ...]  # extra request headers (an Authorization), in order


def request_bytes(method: str, target: str, body: bytes = b"", headers: Headers = ()) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    if method in ("POST", "PUT"):
        head += f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
    return head.encode("ascii") + b"\r\n" + body


class Connection:
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
    """Connections appending ``body_bytes`` to ``segment`` in a closed loop.

    With ``spread``, connection ``i`` appends to ``spread[i % len(spread)]`` instead, and
    with ``ports`` (one per name of ``spread``) sends it to that name's port: the owning
    process's, as an owner-aware client does. Every request carries ``headers``.
    """

    port: int
    segment: str
    body_bytes: int
    connections: int
    warmup_s: float
    duration_s: float
    spread: tuple[str, ...] = ()
    headers: Headers = ()
    ports: tuple[int, ...] = ()


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
    conn: Connection, request: bytes, start: float, stop: float, tally: LoadTally
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
    ports = spec.ports or (spec.port,)
    conns = [Connection(ports[i % len(ports)]) for i in range(connections)]
    for conn in conns:
        await conn.open()
    barrier.wait(60)
    loop = asyncio.get_running_loop()
    start = loop.time() + spec.warmup_s
    stop = start + spec.duration_s
    tally = LoadTally()
    cpu_at_start: list[float] = []
    loop.call_at(start, lambda: cpu_at_start.append(time.process_time()))
    body = b"x" * spec.body_bytes
    targets = [
        request_bytes("POST", f"/v1/segments/{name}", body, spec.headers)
        for name in spec.spread or (spec.segment,)
    ]
    await asyncio.gather(
        *(_closed_loop(c, targets[i % len(targets)], start, stop, tally) for i, c in enumerate(conns))
    )
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
    workers = worker_pids(server)
    try:
        barrier.wait(60)
    except threading.BrokenBarrierError:
        _, failures = collect_tallies(results, procs)
        raise RuntimeError(f"load generator did not start: {failures}") from None
    time.sleep(spec.warmup_s)
    before = metrics() if metrics else {}
    cpu_before = sum(process_cpu_s(pid) for pid in workers)
    time.sleep(spec.duration_s)
    cpu_after = sum(process_cpu_s(pid) for pid in workers)
    after = metrics() if metrics else {}
    tally, failures = collect_tallies(results, procs)
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


def collect_tallies(results: Any, procs: list[Any]) -> tuple[LoadTally, list[str]]:
    """Gather every client process's tally (or failure), then reap the processes (also bench.cluster_load)."""
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
