"""Durable Streams benchmark: segstore against the protocol's reference server, in one run.

``python -m bench.streams [--quick] [--repeat N] [--json PATH]`` measures, for
segstore (gunicorn + gevent, started as ``make run`` does) and for
``@durable-streams/server`` 0.3.7 from npm with its file backend (which
fdatasyncs every append before answering, as segstore acknowledges only
durable appends):

(a) appends/s of 100-byte ``POST /v1/stream/{name}`` from 16 keep-alive clients
    in a closed loop, all to one stream;
(b) the same with each client on a stream of its own (16 streams);
(c) tail latency: a ``live=long-poll`` reader follows a stream while a writer
    appends at a fixed rate; milliseconds from just before an append is sent
    to the reader holding its bytes (p50 and p99).

Every part starts with segstore's Tier 2 backlog drained (the storage writer
would otherwise still be flushing the previous part's appends).

Each figure is min / median / max over ``--repeat`` runs, servers measured
alternately. The reference server is installed into ``.cache/streams-reference``
with npm the first time. The load generator is ``bench.appends``'s: asyncio
client processes speaking raw HTTP/1.1 over keep-alive sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from bench.common import Spread, percentile, wait_writer_idle
from bench.load import Connection, request_bytes
from bench.servers import ROOT, ServerProcess, free_port

HOST = "127.0.0.1"
APPEND_BYTES = 100
CLIENTS = 16
REFERENCE_PACKAGE = "@durable-streams/server@0.3.7"
REFERENCE_DIR = ROOT / ".cache" / "streams-reference"
REFERENCE_SCRIPT = """\
import { DurableStreamTestServer } from "@durable-streams/server"
const [port, dataDir] = process.argv.slice(2)
const server = new DurableStreamTestServer({
  port: Number(port), host: "127.0.0.1", dataDir, longPollTimeout: 20000, compression: false,
})
await server.start()
console.log(`listening ${server.url}`)
"""


# ------------------------------------------------------------------ servers
class ReferenceServer:
    """The protocol's Node.js reference server with its file backend, on a loopback port."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> ReferenceServer:
        install_reference()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / "reference.log", "ab")
        self.proc = subprocess.Popen(
            ["node", "server.mjs", str(self.port), str(self.data_dir)],
            cwd=REFERENCE_DIR,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        _wait_listening(self.url, self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def install_reference() -> None:
    """npm install the reference server once into the cache folder."""
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    (REFERENCE_DIR / "server.mjs").write_text(REFERENCE_SCRIPT)
    if not (REFERENCE_DIR / "node_modules" / "@durable-streams" / "server").exists():
        (REFERENCE_DIR / "package.json").write_text('{"private": true, "type": "module"}\n')
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", REFERENCE_PACKAGE],
            cwd=REFERENCE_DIR,
            check=True,
            capture_output=True,
            timeout=600,
        )


def _wait_listening(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reference server exited with {proc.returncode}")
        try:
            requests.head(url + "/v1/stream/none", timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"reference server not listening in {timeout_s}s")


def create_stream(url: str, name: str) -> None:
    response = requests.put(
        f"{url}/v1/stream/{name}", headers={"Content-Type": "application/octet-stream"}, timeout=10
    )
    if response.status_code not in (200, 201):
        raise RuntimeError(f"create {name}: {response.status_code} {response.text[:200]}")


# --------------------------------------------------------------------- load
@dataclass(frozen=True)
class LoadSpec:
    """``connections`` clients appending ``APPEND_BYTES`` to ``streams`` (client i to stream i mod n)."""

    port: int
    streams: tuple[str, ...]
    first_connection: int
    connections: int
    warmup_s: float
    duration_s: float


async def _closed_loop(
    conn: Connection, request: bytes, start: float, stop: float, tally: list[int]
) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < stop:
        status, _, body = await conn.request(request)
        if status not in (200, 204):
            raise RuntimeError(f"append answered {status} {body[:200]!r}")
        if start <= loop.time() < stop:
            tally[0] += 1
    conn.close()


async def _drive(spec: LoadSpec, barrier: Any) -> int:
    conns = [Connection(spec.port) for _ in range(spec.connections)]
    for conn in conns:
        await conn.open()
    barrier.wait(60)
    loop = asyncio.get_running_loop()
    start = loop.time() + spec.warmup_s
    stop = start + spec.duration_s
    tally = [0]
    body = b"x" * APPEND_BYTES
    requests_ = [
        request_bytes(
            "POST", f"/v1/stream/{spec.streams[(spec.first_connection + i) % len(spec.streams)]}", body
        )
        for i in range(spec.connections)
    ]
    await asyncio.gather(
        *(_closed_loop(c, r, start, stop, tally) for c, r in zip(conns, requests_, strict=True))
    )
    return tally[0]


def _client_process(spec: LoadSpec, barrier: Any, results: Any) -> None:
    try:
        results.put(asyncio.run(_drive(spec, barrier)))
    except BaseException as exc:  # reported to the parent, which fails the run
        barrier.abort()
        results.put(f"client process failed: {exc!r}")


def appends_per_s(port: int, streams: Sequence[str], plan: Plan) -> float:
    """Closed-loop appends/s of ``CLIENTS`` clients over ``streams``, from ``plan.processes`` processes."""
    ctx = mp.get_context("fork")
    shares = [CLIENTS // plan.processes + (i < CLIENTS % plan.processes) for i in range(plan.processes)]
    barrier = ctx.Barrier(len(shares))
    results = ctx.Queue()
    procs = []
    first = 0
    for share in shares:
        spec = LoadSpec(port, tuple(streams), first, share, plan.warmup_s, plan.duration_s)
        procs.append(ctx.Process(target=_client_process, args=(spec, barrier, results)))
        first += share
    for p in procs:
        p.start()
    total = 0
    failures = []
    for _ in procs:
        try:
            got = results.get(timeout=plan.warmup_s + plan.duration_s + 120)
        except queue.Empty:
            failures.append("a client process gave no result")
            break
        if isinstance(got, int):
            total += got
        else:
            failures.append(got)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    if failures:
        raise RuntimeError("; ".join(failures))
    return total / plan.duration_s


async def _tail_latency(port: int, stream: str, rate: float, duration_s: float) -> tuple[float, float]:
    """(p50, p99) milliseconds from just before an append is sent to a long-poll reader receiving it."""
    loop = asyncio.get_running_loop()
    total = int(rate * duration_s)
    sent = [0.0] * total
    delivered = [0.0] * total
    pad = b"t" * (APPEND_BYTES - 8)
    target = f"/v1/stream/{stream}"

    async def write() -> None:
        conn = Connection(port)
        first = loop.time() + 0.3
        for i in range(total):
            delay = first + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[i] = loop.time()
            status, _, body = await conn.request(request_bytes("POST", target, i.to_bytes(8, "big") + pad))
            if status not in (200, 204):
                raise RuntimeError(f"tail append {i}: {status} {body[:200]!r}")
        conn.close()

    async def read() -> None:
        conn = Connection(port)
        offset = "now"
        pending = b""
        got = 0
        while got < total:
            status, headers, body = await conn.request(
                request_bytes("GET", f"{target}?offset={offset}&live=long-poll")
            )
            now = loop.time()
            if status not in (200, 204):
                raise RuntimeError(f"tail read at {offset}: {status} {body[:200]!r}")
            offset = headers[b"stream-next-offset"].decode()
            pending += body
            while len(pending) >= APPEND_BYTES:
                index = int.from_bytes(pending[:8], "big")
                delivered[index] = now - sent[index]
                pending = pending[APPEND_BYTES:]
                got += 1
        conn.close()

    await asyncio.wait_for(asyncio.gather(write(), read()), duration_s + 60)
    return percentile(delivered, 50) * 1000, percentile(delivered, 99) * 1000


# -------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Plan:
    repeat: int
    warmup_s: float
    duration_s: float
    tail_rate: float
    tail_duration_s: float
    processes: int


@dataclass
class Run:
    one_stream_per_s: float
    many_streams_per_s: float
    tail_p50_ms: float
    tail_p99_ms: float


def measure_server(url: str, port: int, plan: Plan, tag: str, settle: Callable[[], None]) -> Run:
    """One run against one server: the tail first, each part from a quiet server (``settle``)."""
    one = f"bench-one-{tag}"
    many = [f"bench-many-{tag}-{i}" for i in range(CLIENTS)]
    tail = f"bench-tail-{tag}"
    for name in [one, *many, tail]:
        create_stream(url, name)
    settle()
    p50, p99 = asyncio.run(_tail_latency(port, tail, plan.tail_rate, plan.tail_duration_s))
    settle()
    one_rate = appends_per_s(port, [one], plan)
    settle()
    many_rate = appends_per_s(port, many, plan)
    return Run(one_rate, many_rate, p50, p99)


def measure(plan: Plan, workdir: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    runs: dict[str, list[Run]] = {"segstore": [], "reference": []}
    with (
        ServerProcess(workdir / "segstore" / "data", env={"SEGSTORE_LOG_LEVEL": "warning"}) as segstore,
        ReferenceServer(workdir / "reference" / "data") as reference,
    ):
        for i in range(plan.repeat):
            # segstore's storage writer moves the last run's appends to Tier 2 in the
            # background; the reference server has no such work to wait for.
            settles = {"segstore": lambda: wait_writer_idle(segstore), "reference": lambda: None}
            for name, server in (("segstore", segstore), ("reference", reference)):
                progress(f"run {i + 1}/{plan.repeat}: {name}")
                runs[name].append(measure_server(server.url, server.port, plan, f"r{i}", settles[name]))
    summary = {
        name: {field: asdict(Spread.of([getattr(r, field) for r in rs])) for field in asdict(rs[0])}
        for name, rs in runs.items()
    }
    return {"plan": asdict(plan), "summary": summary}


def render(doc: dict[str, Any]) -> str:
    s, r = doc["summary"]["segstore"], doc["summary"]["reference"]
    rows = [
        ("appends/s, 16 clients, 1 stream", "one_stream_per_s", "{:,.0f}", True),
        ("appends/s, 16 clients, 16 streams", "many_streams_per_s", "{:,.0f}", True),
        ("long-poll tail p50 ms", "tail_p50_ms", "{:.2f}", False),
        ("long-poll tail p99 ms", "tail_p99_ms", "{:.2f}", False),
    ]
    lines = [
        f"{'(min / median / max)':36} {'segstore':>28} {'reference 0.3.7 (file)':>28}  segstore/reference"
    ]
    for label, key, fmt, _higher_better in rows:
        mine, theirs = Spread(**s[key]), Spread(**r[key])
        ratio = mine.median / theirs.median if theirs.median else float("nan")
        lines.append(f"{label:36} {mine.show(fmt):>28} {theirs.show(fmt):>28}  {ratio:.2f}")
    plan = doc["plan"]
    lines.append(
        f"{plan['repeat']} runs; load {plan['duration_s']} s after {plan['warmup_s']} s warm-up; "
        f"tail at {plan['tail_rate']:.0f} appends/s for {plan['tail_duration_s']} s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test, not a measurement)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if shutil.which("node") is None or shutil.which("npm") is None:
        print("bench.streams needs node and npm on PATH", file=sys.stderr)
        return 2
    plan = Plan(
        repeat=1 if args.quick else args.repeat,
        warmup_s=0.5 if args.quick else 1.0,
        duration_s=1.5 if args.quick else 5.0,
        tail_rate=100.0,
        tail_duration_s=2.0 if args.quick else 5.0,
        processes=max(1, min(2, os.cpu_count() or 1)),
    )
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:
        doc = measure(plan, Path(tmp), lambda m: print(f"... {m}", file=sys.stderr, flush=True))
    print(render(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
