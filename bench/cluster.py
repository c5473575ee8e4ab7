"""Cluster benchmarks: failover time after a kill -9, and appends/s through 1, 2 and 3 nodes.

``python -m bench.cluster [--quick] [--repeat R] [--json PATH] ...`` runs both
(``--only failover`` or ``--only appends`` runs one), with servers started as
``make run`` starts them and Tier 1 and Tier 2 on moto.

Failover: moto and two nodes (four containers), then ``--kills`` times: wait
until the nodes serve two containers each, kill one node with SIGKILL
(arbiter and worker at once), and append to a segment of a container it
served through the other node (which forwards, then serves it) until an
append is acknowledged. Failover time is from the kill to that
acknowledgement: the lease running out on the survivor's clock
(``lease_s``), its claim, and the container's recovery from Tier 1. The
killed node restarts before the next round, alternating victims.

Appends: for 1, 2 and 3 nodes (six containers, so each node serves an equal
share), ``--clients`` connections each append ``--body-bytes`` to a segment
of its own in a closed loop, the segments spread evenly over the
containers: **routed**, each connection to the node serving its segment (as
the Python client does once it learnt the owner, or a client reading
``GET /v1/cluster``), and **random**, each append to a random node (which
forwards it unless it serves the segment). Reported: appends/s min / median
/ max over ``--repeat`` runs, and the median CPU seconds per second of each
node's worker, of moto and of the client processes (all on one machine:
their sum is what the machine's cores gave).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import requests

from bench.cluster_load import Window, run_window, targets
from bench.common import Spread, progress, run_in_workdir
from bench.local_cluster import LocalCluster
from bench.servers import FAKE_AWS_ENV, MotoServer, ServerProcess, cluster_node_env, free_port
from engine.naming import container_for

BUCKET = "bench-cluster"
CONTAINERS = 4
NODES = ("a", "b")
APPEND_CONTAINERS = 6  # an equal share on 1, 2 and 3 nodes
MODES = ("routed", "random")


def _owners(url: str) -> list[str | None]:
    doc = requests.get(f"{url}/v1/cluster", timeout=10).json()
    return [c["owner"] for c in doc["containers"]]


def _balanced(url: str) -> bool:
    try:
        return sorted(map(str, _owners(url))) == ["a", "a", "b", "b"]
    except (requests.RequestException, ValueError):
        return False


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def measure_failover(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    os.environ.update(FAKE_AWS_ENV)
    with MotoServer(workdir / "moto.log") as moto:
        boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        servers = {}
        for node in NODES:
            port = free_port()
            env = cluster_node_env(node, port, moto.url, BUCKET, lease_s=args.lease_s, containers=CONTAINERS)
            servers[node] = ServerProcess(workdir / node, port=port, env=env).start()
        failovers: list[float] = []
        try:
            for kill in range(args.kills):
                victim, survivor = NODES[kill % 2], NODES[(kill + 1) % 2]
                survivor_url = servers[survivor].url
                _wait(partial(_balanced, survivor_url), 4 * args.lease_s + 60, "two containers each")
                owners = _owners(servers[survivor].url)
                name = next(
                    n for n in (f"fo-{kill}-{uuid.uuid4().hex[:6]}" for _ in range(1000))
                    if owners[container_for(n, CONTAINERS)] == victim
                )
                url = f"{servers[survivor].url}/v1/segments/{name}"
                requests.put(url, timeout=10).raise_for_status()
                progress(f"kill {kill + 1}/{args.kills}: node {victim}")
                servers[victim].kill()
                killed = time.monotonic()
                while True:
                    try:
                        if requests.post(url, data=b"x", timeout=10).status_code == 200:
                            break
                    except requests.RequestException:
                        pass
                    time.sleep(0.02)
                failovers.append(time.monotonic() - killed)
                servers[victim].start()
        finally:
            for server in servers.values():
                server.kill()
    return {"lease_s": args.lease_s, "kills": args.kills, "failover_s": asdict(Spread.of(failovers))}


def measure_appends(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Appends/s and CPU by process through each node count, routed and random."""
    settings = {
        "SEGSTORE_LOG_LEVEL": "warning",
        "SEGSTORE_LEASE_S": str(args.lease_s),
        "SEGSTORE_CONTAINER_COUNT": str(APPEND_CONTAINERS),
    }
    found: dict[str, Any] = {}
    for count in args.nodes:
        with LocalCluster(workdir / f"nodes-{count}", nodes=count, settings=settings) as cluster:
            _wait(lambda c=cluster: all(c.balanced(n) for n in c.nodes), 4 * args.lease_s + 60,
                  f"containers spread over {count} nodes")
            windows: dict[str, list[Window]] = {mode: [] for mode in MODES}
            for run in range(args.repeat):
                for mode in MODES:
                    progress(f"{count} node(s), {mode}, run {run + 1}/{args.repeat}")
                    routed = mode == "routed"
                    load = targets(cluster, args.clients, APPEND_CONTAINERS, routed, f"{mode}-{run}")
                    windows[mode].append(run_window(
                        cluster, load, body_bytes=args.body_bytes, processes=args.client_processes,
                        warmup_s=args.warmup_s, duration_s=args.duration_s,
                    ))
        found[str(count)] = {
            mode: {
                "appends_per_s": asdict(Spread.of([w.appends_per_s for w in runs])),
                "throttled_per_s": asdict(Spread.of([w.throttled_per_s for w in runs])),
                "cpu_s_per_s": {name: Spread.of([w.cpu[name] for w in runs]).median for name in runs[0].cpu},
            }
            for mode, runs in windows.items()
        }
    return {"clients": args.clients, "body_bytes": args.body_bytes, "duration_s": args.duration_s,
            "repeat": args.repeat, "containers": APPEND_CONTAINERS, "by_nodes": found}


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {"lease_s": args.lease_s}
    if args.only in (None, "appends"):
        doc["appends"] = measure_appends(args, workdir / "appends")
    if args.only in (None, "failover"):
        (workdir / "failover").mkdir()
        doc["failover"] = measure_failover(args, workdir / "failover")
    return doc


def render(doc: dict[str, Any]) -> str:
    lines = []
    if "appends" in doc:
        appends = doc["appends"]
        lines.append(
            f"segstore cluster appends: {appends['clients']} clients, {appends['body_bytes']} B each, "
            f"{appends['containers']} containers, {appends['duration_s']:g} s windows, "
            f"{appends['repeat']} run(s); appends/s min / median / max; CPU s per s (median)"
        )
        for count, modes in appends["by_nodes"].items():
            for mode, got in modes.items():
                spread = Spread(**got["appends_per_s"])
                cpu = ", ".join(f"{name} {value:.2f}" for name, value in got["cpu_s_per_s"].items())
                throttled = Spread(**got["throttled_per_s"]).median
                lines.append(f"  {count} node(s), {mode:>6}: {spread.show()} appends/s"
                             f" ({throttled:,.0f} 503/s); CPU: {cpu}")
    if "failover" in doc:
        failover = doc["failover"]
        spread = Spread(**failover["failover_s"])
        lines += [
            f"segstore cluster failover: 2 nodes, {CONTAINERS} containers, lease_s {failover['lease_s']}, "
            f"{failover['kills']} kills",
            f"  kill -9 -> first acknowledged append in a moved container: {spread.show('{:.2f}')} s "
            "(min / median / max)",
            f"  each: {', '.join(f'{v:.2f}' for v in spread.runs)}",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("failover", "appends"), default=None, help="run one of the two")
    parser.add_argument("--kills", type=int, default=10, help="nodes killed, one at a time (10)")
    parser.add_argument("--lease-s", type=float, default=10.0, help="the nodes' lease_s (the default, 10)")
    parser.add_argument("--nodes", type=lambda t: [int(n) for n in t.split(",")], default=[1, 2, 3],
                        help="node counts for appends (1,2,3)")
    parser.add_argument("--clients", type=int, default=24, help="connections appending (24)")
    parser.add_argument("--client-processes", type=int, default=2, help="processes driving them (2)")
    parser.add_argument("--body-bytes", type=int, default=100, help="bytes per append (100)")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="unmeasured start of each window (3)")
    parser.add_argument("--duration-s", type=float, default=15.0, help="measured window (15)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per node count and mode (3)")
    parser.add_argument("--quick", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folders go")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.lease_s, args.clients, args.repeat = 1, 3.0, 6, 1
        args.warmup_s, args.duration_s = 0.5, 1.5
    return run_in_workdir("segstore-cluster-", args.dir, lambda d: measure(args, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
