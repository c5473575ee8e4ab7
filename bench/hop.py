"""The local hop's cost: a request forwarded over the owner's Unix socket against one forwarded over HTTP.

``python -m bench.hop [--quick] [--requests N] [--repeat R] [--json PATH]``
starts moto and two nodes (four containers) on this machine twice: with
``local_hop=1`` (a node hands a request for the other over its Unix socket)
and with ``local_hop=0`` (over HTTP, as to a node on another machine). A
client reads 100 bytes from a segment of node a's, one request at a time on
one kept-alive connection: sent to a itself (**direct**), and sent to b,
which forwards it (**hop** or **http**). Reported per mode, as min / median
/ max over ``--repeat`` runs: the median and 99th percentile latency in
microseconds, the forwarding's added median (forwarded minus direct), and
the CPU microseconds per request of the owner's worker serving it directly,
and of the forwarding node's worker and the owner's for a forwarded one.
Then **exchange**: the hop alone, in this process: a forwarder's
connection and an owner's socket whose app answers 100 bytes at once, the
CPU and wall microseconds of one exchange (both ends). On a machine other
work shares the figures are only indicative; the CPU per request is the
steadier of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3
import requests

from app.hop import HopClient, HopServer
from app.hop_frames import RequestHead
from bench.common import Spread, percentile, process_cpu_s, progress, run_in_workdir, worker_pid
from bench.servers import FAKE_AWS_ENV, MotoServer, ServerProcess, cluster_node_env, free_port
from engine.naming import container_for

CONTAINERS = 4
BODY = b"x" * 100


def _owners(url: str) -> list[str | None]:
    doc = requests.get(f"{url}/v1/cluster", timeout=10).json()
    return [c["owner"] for c in doc["containers"]]


def _forwarded(server: ServerProcess) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in requests.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("segstore_forwarded_requests_total{"):
            transport = line.split('transport="', 1)[1].split('"', 1)[0]
            found[transport] = float(line.rsplit(" ", 1)[1])
    return found


def _timed(session: requests.Session, url: str, count: int) -> list[float]:
    """Seconds of each of ``count`` reads, one after the other."""
    took = []
    for _ in range(count):
        started = time.perf_counter()
        answer = session.get(url, params={"offset": 0}, timeout=10)
        took.append(time.perf_counter() - started)
        if answer.content != BODY:
            raise RuntimeError(f"read {url}: {answer.status_code} {answer.text[:200]}")
    return took


def _run(args: argparse.Namespace, workdir: Path, moto: MotoServer, hop: bool) -> list[dict[str, float]]:
    """``--repeat`` runs on a fresh cluster of two nodes, with or without the local hop."""
    bucket = f"bench-hop-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1").create_bucket(Bucket=bucket)
    servers: dict[str, ServerProcess] = {}
    for node in ("a", "b"):
        port = free_port()
        env = cluster_node_env(node, port, moto.url, bucket, lease_s=10.0, containers=CONTAINERS)
        env["SEGSTORE_LOCAL_HOP"] = "1" if hop else "0"
        servers[node] = ServerProcess(workdir / f"{bucket}-{node}", port=port, env=env)
    try:
        for server in servers.values():
            server.start()
        a, b = servers["a"], servers["b"]
        deadline = time.monotonic() + 60
        while sorted(map(str, _owners(a.url))) != ["a", "a", "b", "b"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not split the containers")
            time.sleep(0.2)
        owned = _owners(a.url)
        name = next(n for n in (f"read-{i}" for i in range(99)) if owned[container_for(n, CONTAINERS)] == "a")
        if requests.put(f"{a.url}/v1/segments/{name}", timeout=10).status_code != 201:
            raise RuntimeError("create failed")
        requests.post(f"{a.url}/v1/segments/{name}", data=BODY, timeout=10).raise_for_status()
        pids = {node: worker_pid(server) for node, server in servers.items()}
        session = requests.Session()
        runs = []
        for _ in range(args.repeat):
            owner_before = process_cpu_s(pids["a"])
            direct = _timed(session, f"{a.url}/v1/segments/{name}", args.requests)
            direct_cpu = process_cpu_s(pids["a"]) - owner_before
            before = {node: process_cpu_s(pid) for node, pid in pids.items()}
            via = _timed(session, f"{b.url}/v1/segments/{name}", args.requests)
            cpu = {node: process_cpu_s(pid) - before[node] for node, pid in pids.items()}
            runs.append({
                "direct_median_us": statistics.median(direct) * 1e6,
                "direct_p99_us": percentile(direct, 99) * 1e6,
                "forwarded_median_us": statistics.median(via) * 1e6,
                "forwarded_p99_us": percentile(via, 99) * 1e6,
                "added_median_us": (statistics.median(via) - statistics.median(direct)) * 1e6,
                "direct_cpu_us": direct_cpu / args.requests * 1e6,
                "forwarder_cpu_us": cpu["b"] / args.requests * 1e6,
                "owner_cpu_us": cpu["a"] / args.requests * 1e6,
            })
        carried = _forwarded(b)
        expected = "hop" if hop else "http"
        if carried.get(expected, 0) < args.requests * args.repeat:
            raise RuntimeError(f"the reads were not forwarded over {expected}: {carried}")
        return runs
    finally:
        for server in servers.values():
            server.kill()


def _exchange(workdir: Path, count: int) -> dict[str, float]:
    """CPU and wall microseconds of one exchange over the hop, both ends in this process."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Length", str(len(BODY)))])
        return [BODY]

    server = HopServer.bind(workdir / "run")
    if server is None:
        raise RuntimeError("no socket in the run folder")
    server.start(app)
    client = HopClient(connect_s=1, silence_s=10)
    head = RequestHead({"REQUEST_METHOD": "GET", "PATH_INFO": "/v1/segments/read", "QUERY_STRING": "offset=0",
                        "HTTP_HOST": "127.0.0.1", "HTTP_ACCEPT": "*/*", "REMOTE_ADDR": "127.0.0.1"})
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(count):
            _, pieces = client.send(server.address, head, ())
            if b"".join(pieces) != BODY:
                raise RuntimeError("a wrong answer over the hop")
        return {"cpu_us": (time.process_time() - cpu) / count * 1e6,
                "wall_us": (time.perf_counter() - wall) / count * 1e6}
    finally:
        client.close()
        server.close()


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    os.environ.update(FAKE_AWS_ENV)
    with MotoServer(workdir / "moto.log") as moto:
        doc: dict[str, Any] = {"requests": args.requests, "repeat": args.repeat, "modes": {}}
        for mode, hop in (("hop", True), ("http", False)):
            progress(f"{mode}: {args.repeat} x {args.requests} reads, direct and forwarded")
            runs = _run(args, workdir, moto, hop)
            doc["modes"][mode] = {key: Spread.of([r[key] for r in runs]) for key in runs[0]}
    progress(f"exchange: {args.repeat} x {args.requests * 5} in this process")
    exchanges = [_exchange(workdir, args.requests * 5) for _ in range(args.repeat)]
    doc["exchange"] = {key: Spread.of([e[key] for e in exchanges]) for key in exchanges[0]}
    return doc


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"100-byte reads, {doc['requests']} a run, one at a time; min / median / max of {doc['repeat']} runs"
        " (microseconds; indicative only on a shared machine)",
    ]
    for mode, figures in doc["modes"].items():
        lines.append(f"forwarded over {mode}:")
        for key, spread in figures.items():
            lines.append(f"  {key:22} {spread.show('{:,.0f}')}")
    lines.append("one exchange over the hop alone (both ends in one process):")
    for key, spread in doc["exchange"].items():
        lines.append(f"  {key:22} {spread.show('{:,.0f}')}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hop", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="reads per run and target (2000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (3)")
    parser.add_argument("--quick", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folder goes")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.repeat = 50, 1
    return run_in_workdir("segstore-bench-hop-", args.dir, lambda w: measure(args, w), render, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
