"""Cluster benchmark: how long a container is out of service when its node is killed.

``python -m bench.cluster [--kills N] [--lease-s S] [--json PATH]`` starts moto
and two nodes (Tier 1 and Tier 2 on moto, four containers) as ``make run``
starts servers, then N times: waits until the nodes serve two containers
each, kills one node with SIGKILL (arbiter and worker at once), and appends
to a segment of a container it served through the other node (which
forwards, then serves it) until an append is acknowledged. Failover time is
from the kill to that acknowledgement: the lease running out on the
survivor's clock (``lease_s``), its claim, and the container's recovery from
Tier 1. The killed node restarts before the next round, alternating victims.
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

from bench.common import Spread, progress, run_in_workdir
from bench.servers import FAKE_AWS_ENV, MotoServer, ServerProcess, cluster_node_env, free_port
from engine.naming import container_for

BUCKET = "bench-cluster"
CONTAINERS = 4
NODES = ("a", "b")


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


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
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


def render(doc: dict[str, Any]) -> str:
    spread = Spread(**doc["failover_s"])
    return "\n".join([
        f"segstore cluster failover: 2 nodes, {CONTAINERS} containers, lease_s {doc['lease_s']}, "
        f"{doc['kills']} kills",
        f"  kill -9 -> first acknowledged append in a moved container: {spread.show('{:.2f}')} s "
        "(min / median / max)",
        f"  each: {', '.join(f'{v:.2f}' for v in spread.runs)}",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="nodes killed, one at a time (10)")
    parser.add_argument("--lease-s", type=float, default=10.0, help="the nodes' lease_s (the default, 10)")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folders go")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    return run_in_workdir("segstore-cluster-", args.dir, lambda d: measure(args, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
