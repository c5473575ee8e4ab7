"""A cluster on one machine: moto (S3 on loopback) and segstore nodes sharing one bucket.

``make cluster`` runs ``python -m bench.local_cluster``: moto on its own
port, a bucket, and three nodes (``a``, ``b``, ``c`` on ports 8080, 8081,
8082) with Tier 1 and Tier 2 in that bucket and the defaults otherwise (any
``SEGSTORE_*`` setting in the environment reaches every node). It prints
the folder of the nodes' data and logs and where each node is, then which
node serves each container once they are spread, and stops everything on
Ctrl-C (or SIGTERM): the nodes first, gracefully (they hand their
containers over), then moto. Each server runs in its own process group, so
a stop reaches a server's every process.

A playground for failover: a node that dies (``python -m
bench.local_cluster kill b`` kills it with SIGKILL, every process of it)
leaves the others serving, and ``python -m bench.local_cluster restart b``
starts it again on its port and data folder. Both find the launcher through
``cluster.json`` in the folder (the same ``--dir``). What a cluster leaves in
the folder is removed when the next one starts, and kept until then.

``LocalCluster`` is the same cluster for the tests and the benchmarks, on a
moto of their own or of the caller's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3
import requests

from bench.servers import FAKE_AWS_ENV, MotoServer, ServerProcess, free_port, group_alive

NODE_IDS = "abcdefghij"
BUCKET = "segstore"
# Where make cluster keeps its nodes' data and logs unless --dir names another folder.
DEFAULT_DIR = Path(tempfile.gettempdir()) / "segstore-cluster"
STATE_FILE = "cluster.json"
RESTART_SUFFIX = ".restart"


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.2) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def cluster_map(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """A node's ``GET /v1/cluster``."""
    answer = requests.get(f"{url}/v1/cluster", timeout=timeout_s)
    answer.raise_for_status()
    return answer.json()


def owners(url: str) -> list[str | None]:
    """The node serving each container, as ``url`` sees it."""
    return [c["owner"] for c in cluster_map(url)["containers"]]


class LocalCluster:
    """Nodes on loopback sharing ``bucket`` on an S3 endpoint (a moto of its own unless given one).

    ``port``: the first node's port, the next ones follow (0: free ports);
    ``settings``: extra ``SEGSTORE_*`` environment for every node.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 3,
        port: int = 0,
        moto_port: int = 0,
        endpoint: str | None = None,
        bucket: str = BUCKET,
        settings: dict[str, str] | None = None,
    ) -> None:
        assert 1 <= nodes <= len(NODE_IDS)
        self.workdir = Path(workdir)
        self.first_nodes = nodes
        self.port = port
        self.bucket = bucket
        self.settings = dict(settings or {})
        self.moto = None if endpoint else MotoServer(self.workdir / "moto.log", moto_port)
        self.endpoint = endpoint or ""
        self.nodes: dict[str, ServerProcess] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalCluster:
        """Start moto (if it is ours), make the bucket, and start the first nodes."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.moto is not None:
            self.moto.start()
            self.endpoint = self.moto.url
            s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
            s3.create_bucket(Bucket=self.bucket)
        for _ in range(self.first_nodes):
            self.add_node()
        return self

    def add_node(self) -> ServerProcess:
        """Start the next node (``a``, ``b``, ...) and wait until it answers."""
        node = NODE_IDS[len(self.nodes)]
        port = self.port + len(self.nodes) if self.port else free_port()
        env = {
            **FAKE_AWS_ENV,
            "SEGSTORE_TIER1": f"s3://{self.bucket}/tier1",
            "SEGSTORE_TIER2": f"s3://{self.bucket}/tier2",
            "SEGSTORE_S3_ENDPOINT": self.endpoint,
            "SEGSTORE_NODE_ID": node,
            "SEGSTORE_ADVERTISE_URL": f"http://127.0.0.1:{port}",
            **self.settings,
        }
        server = ServerProcess(self.workdir / node, port=port, env=env).start()  # killed if it fails
        self.nodes[node] = server  # listed once it answers: clients pick from the listed nodes
        return server

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every node gracefully (SIGTERM, SIGKILL past ``timeout_s``), then moto."""
        running = [s for s in self.nodes.values() if s.proc is not None and s.proc.poll() is None]
        for server in running:
            assert server.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.proc.pid, signal.SIGCONT)  # a paused node could not stop
            server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for server in running:
            assert server.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(max(0.1, deadline - time.monotonic()))
        for server in self.nodes.values():
            server.kill()  # the whole process group: nothing of a node outlives the cluster
        if self.moto is not None:
            self.moto.stop()

    def kill(self) -> None:
        """SIGKILL every node at once, then stop moto: the end of a cluster whose data nobody reads again.

        A graceful ``stop`` takes seconds (each node hands its containers over); the tests' clusters
        end with this.
        """
        for server in self.nodes.values():
            server.kill()
        if self.moto is not None:
            self.moto.stop()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ views
    @property
    def urls(self) -> dict[str, str]:
        return {node: server.url for node, server in self.nodes.items()}

    def counts(self, via: str) -> dict[str, int] | None:
        """Containers per node as node ``via`` sees them; None while a container has no known owner."""
        found = owners(self.nodes[via].url)
        if any(owner not in self.nodes for owner in found):
            return None
        return {node: found.count(node) for node in self.nodes}

    def balanced(self, via: str, serving: Sequence[str] | None = None) -> bool:
        """Every container owned by ``serving`` (default: every node), their counts one apart at most."""
        try:
            counts = self.counts(via)
        except (requests.RequestException, ValueError):
            return False
        if counts is None:
            return False
        load = [counts[node] for node in (serving if serving is not None else self.nodes)]
        return sum(load) == sum(counts.values()) and max(load) - min(load) <= 1


def _describe(cluster: LocalCluster) -> str:
    first = next(iter(cluster.nodes))
    found = owners(cluster.nodes[first].url)
    return ", ".join(
        f"{node}: {' '.join(str(c) for c, owner in enumerate(found) if owner == node) or '-'}"
        for node in cluster.nodes
    )


def _write_state(cluster: LocalCluster) -> None:
    """``cluster.json``: the launcher's pid and each node's URL, process group and log, for the verbs."""
    nodes = {
        node: {"url": server.url, "pid": server.proc and server.proc.pid, "log": str(server.log_path)}
        for node, server in cluster.nodes.items()
    }
    state = cluster.workdir / STATE_FILE
    state.with_suffix(".tmp").write_text(json.dumps({"launcher": os.getpid(), "nodes": nodes}, indent=2))
    state.with_suffix(".tmp").replace(state)


def _restart_asked(cluster: LocalCluster, node: str, server: ServerProcess) -> None:
    """Start ``node`` again if ``restart`` asked for it (a request file beside the state)."""
    request = cluster.workdir / f"{node}{RESTART_SUFFIX}"
    if not request.exists():
        return
    request.unlink()
    assert server.proc is not None
    if server.proc.poll() is None:
        return  # running: the verb refused already, or it came back meanwhile
    print(f"starting node {node} again", flush=True)
    try:
        server.start()
    except RuntimeError as exc:
        print(f"node {node} did not start: {exc}", flush=True)
        return
    _write_state(cluster)
    print(f"node {node}: {server.url} again", flush=True)


def _serve(cluster: LocalCluster) -> int:
    """Print where everything is, then watch until a signal (0) or moto's death (1).

    A node that dies is reported once, with its log's tail; the others go on,
    and ``restart`` starts it again.
    """
    print(f"data and logs: {cluster.workdir}", flush=True)
    print(f"S3 (moto): {cluster.endpoint}, bucket {cluster.bucket}", flush=True)
    for node, server in cluster.nodes.items():
        print(f"node {node}: {server.url}  (log {server.log_path})", flush=True)
    _write_state(cluster)
    print("Ctrl-C stops the nodes and moto.", flush=True)
    first = next(iter(cluster.nodes))
    shown = False
    reported: set[tuple[str, int]] = set()
    while True:
        for node, server in cluster.nodes.items():
            assert server.proc is not None
            if server.proc.poll() is not None and (node, server.proc.pid) not in reported:
                reported.add((node, server.proc.pid))
                print(f"node {node} exited ({server.proc.returncode}):\n{server.log_tail(10)}", flush=True)
                dir_flag = "" if cluster.workdir == DEFAULT_DIR else f" --dir {cluster.workdir}"
                print(f"the other nodes go on; python -m bench.local_cluster restart {node}{dir_flag} "
                      "starts it again", flush=True)
            _restart_asked(cluster, node, server)
        moto = cluster.moto
        if moto is not None and moto.proc is not None and moto.proc.poll() is not None:
            print(f"moto exited:\n{cluster.moto.log_tail()}", flush=True)
            return 1
        if not shown and cluster.balanced(first):
            print(f"containers by node: {_describe(cluster)}", flush=True)
            shown = True
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _state(workdir: Path) -> dict[str, Any] | None:
    """What the launcher running from ``workdir`` wrote (None if none runs there)."""
    try:
        state = json.loads((workdir / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    return state if _alive(state["launcher"]) else None


def _clear(workdir: Path) -> None:
    """Remove what an earlier cluster left in ``workdir`` (its nodes' folders and logs), nothing else."""
    for path in [workdir / STATE_FILE, workdir / "moto.log", *(workdir / n for n in NODE_IDS),
                 *workdir.glob("server-*.log"), *workdir.glob(f"*{RESTART_SUFFIX}")]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _node_state(workdir: Path, node: str) -> dict[str, Any]:
    """``node``'s entry in the running launcher's state; SystemExit saying why when there is none."""
    state = _state(workdir)
    if state is None:
        raise SystemExit(f"no cluster runs from {workdir} (start one with make cluster, or name its --dir)")
    if node not in state["nodes"]:
        raise SystemExit(f"no node {node!r} in {workdir}; the nodes are {', '.join(state['nodes'])}")
    return state["nodes"][node]


def _kill(workdir: Path, node: str) -> int:
    """SIGKILL every process of ``node`` at once, as a machine crash would."""
    found = _node_state(workdir, node)
    if found["pid"] is None or not group_alive(found["pid"]):
        print(f"node {node} is not running")
        return 1
    os.killpg(found["pid"], signal.SIGKILL)
    print(f"node {node} killed (process group {found['pid']})")
    return 0


def _restart(workdir: Path, node: str, timeout_s: float = 90.0) -> int:
    """Ask the launcher to start ``node`` again, and wait until it serves."""
    found = _node_state(workdir, node)
    if found["pid"] is not None and group_alive(found["pid"]):
        print(f"node {node} is running (process group {found['pid']}); kill it first")
        return 1
    (workdir / f"{node}{RESTART_SUFFIX}").touch()

    def serving() -> bool:
        with contextlib.suppress(requests.RequestException):
            return requests.get(found["url"] + "/readyz", timeout=2).status_code == 200
        return False

    wait_for(serving, timeout_s, f"node {node} to serve again (its log: {found['log']})", every_s=0.5)
    print(f"node {node}: {found['url']} again")
    return 0


class _Stop(Exception):
    """SIGTERM or SIGHUP: stop as on Ctrl-C."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("verb", nargs="?", default="run", choices=("run", "kill", "restart"),
                        help="run a cluster (the default), or kill or restart one of its nodes")
    parser.add_argument("node", nargs="?", help="the node to kill or restart (a, b, ...)")
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (3)")
    parser.add_argument("--port", type=int, default=8080,
                        help="the first node's port, the next ones follow (8080; 0: free ports)")
    parser.add_argument("--moto-port", type=int, default=5000, help="moto's port (5000; 0: a free one)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"the nodes' data folders and logs, kept after a stop (default {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    workdir = args.dir.resolve()
    if args.verb != "run":
        if args.node is None:
            parser.error(f"{args.verb} needs a node (a, b, ...)")
        return (_kill if args.verb == "kill" else _restart)(workdir, args.node)
    running = _state(workdir)
    if running is not None:
        parser.error(f"a cluster runs from {workdir} already (launcher pid {running['launcher']})")
    _clear(workdir)
    cluster = LocalCluster(workdir, nodes=args.nodes, port=args.port, moto_port=args.moto_port)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    code = 0
    try:
        cluster.start()
        code = _serve(cluster)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        print("stopping the nodes and moto", flush=True)
        cluster.stop()
        with contextlib.suppress(FileNotFoundError):
            (workdir / STATE_FILE).unlink()
    print(f"stopped; data and logs stay in {workdir}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
