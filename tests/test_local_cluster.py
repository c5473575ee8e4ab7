"""``make cluster`` (``python -m bench.local_cluster``): moto and three nodes, stopped whole by Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from bench.local_cluster import cluster_map
from bench.servers import ROOT
from tests.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _verb(verb: str, node: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.local_cluster", verb, node, "--dir", str(workdir)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_the_launcher_runs_three_nodes_sharing_containers_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "SEGSTORE_LEASE_S": "3", "SEGSTORE_LOG_LEVEL": "warning"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "bench.local_cluster",
         "--port", "0", "--moto-port", "0", "--dir", str(tmp_path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job is
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout or []), daemon=True)
    reader.start()
    try:
        spread = "the containers spread over the nodes"
        wait_until(lambda: any(line.startswith("containers by node:") for line in lines), spread, 150)
        urls = dict(re.findall(r"^node (\w): (http://\S+)", "".join(lines), re.MULTILINE))
        assert sorted(urls) == ["a", "b", "c"], lines
        assert any(line.startswith("S3 (moto): http://127.0.0.1:") for line in lines)
        for node, url in urls.items():
            doc = cluster_map(url)
            assert doc["node"] == node and {n["id"] for n in doc["nodes"]} == {"a", "b", "c"}
        owners = [c["owner"] for c in cluster_map(urls["a"])["containers"]]
        counts = sorted(owners.count(node) for node in "abc")
        assert counts == [1, 1, 2]  # the default four containers
        for node, url in urls.items():  # any node answers for any segment
            segment = f"{url}/v1/segments/launcher-{node}"
            assert requests.put(segment, timeout=30).status_code == 201
            assert requests.post(segment, data=b"hi", timeout=30).status_code == 200
            assert requests.get(segment, params={"offset": 0}, timeout=30).content == b"hi"
        servers = _children(launcher.pid)
        assert len(servers) == 4  # moto and three gunicorn arbiters, each leading its own group
        assert all(os.getpgid(pid) == pid for pid in servers)

        # The failover playground: a node killed, the others go on, the node started again.
        assert _verb("kill", "b", tmp_path).returncode == 0
        wait_until(lambda: any(line.startswith("node b exited") for line in lines), "b's death seen", 30)
        assert launcher.poll() is None
        for node in "ac":  # every segment still served, by the nodes left (after a takeover if b had it)
            segment = f"{urls['a']}/v1/segments/launcher-{node}"
            wait_until(lambda s=segment: requests.get(s, params={"offset": 0}, timeout=30).content == b"hi",
                       f"{segment} served", 60)
        restarted = _verb("restart", "b", tmp_path)
        assert restarted.returncode == 0 and f"node b: {urls['b']} again" in restarted.stdout, restarted
        assert requests.get(f"{urls['b']}/healthz", timeout=10).status_code in (200, 503)
        servers = _children(launcher.pid)
    finally:
        os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground job
    assert launcher.wait(90) == 0
    reader.join(10)
    assert launcher.stdout is not None
    launcher.stdout.close()
    assert lines[-1].strip() == f"stopped; data and logs stay in {tmp_path}", lines
    assert (tmp_path / "moto.log").exists() and list(tmp_path.glob("server-*.log"))
    wait_until(lambda: all(_group_gone(pid) for pid in servers), "every server's processes gone", 30)
    for url in urls.values():
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{url}/healthz", timeout=5)
