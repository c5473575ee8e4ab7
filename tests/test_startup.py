"""Start-up as an operator sees it, on real server processes (gunicorn arbiter and gevent worker).

A store that must not start says why in one line and the whole server exits
non-zero, with no traceback and no worker started, however many it would run: a data folder
opened with another Tier 2 than it was created with (the README's own order,
`make run` then the moto example on the same folder), a bucket that does not
exist, credentials S3 refuses. A start that works names the data folder,
both tiers and each container's recovery time; the access log is a setting.
"""

from __future__ import annotations

import re
import select
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests

from bench.servers import FAKE_AWS_ENV, MotoServer, ServerProcess, free_port
from tests.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process]

REFUSED_EXIT = 3  # a misconfiguration: the arbiter stops, it does not start another worker
LATER_EXIT = 4  # what it needs may come: the arbiter stops too, a service manager may start it again


def refused_start(data: Path, env: dict[str, str]) -> tuple[int, str]:
    """Start a server that must refuse; its exit status and its log."""
    server = ServerProcess(data, env=env)
    with pytest.raises(RuntimeError, match="server exited"):
        server.start(timeout_s=60)
    assert server.proc is not None
    return server.proc.wait(10), server.log_path.read_text(errors="replace")


def assert_one_line_refusal(log: str, *words: str) -> None:
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if "segstore cannot start" in line]
    assert len(lines) == 1, log
    for word in words:
        assert word in lines[0], lines[0]
    # Found before any worker boots, so said once whatever the worker count (``processes``).
    assert "Booting worker" not in log, "a refused start starts no worker"


@pytest.fixture
def moto_env(moto_endpoint: str, s3_client: Any, s3_bucket: str) -> Iterator[dict[str, str]]:
    yield {
        **FAKE_AWS_ENV,
        "SEGSTORE_TIER2": f"s3://{s3_bucket}/data",
        "SEGSTORE_S3_ENDPOINT": moto_endpoint,
    }


def test_the_readme_order_is_refused_in_one_line(tmp_path: Path, moto_env: dict[str, str]) -> None:
    data = tmp_path / "data"
    with ServerProcess(data) as server:  # `make run`: Tier 2 in ./data/tier2
        assert requests.put(server.url + "/v1/segments/kept", timeout=10).status_code == 201
        assert requests.post(server.url + "/v1/segments/kept", data=b"bytes", timeout=10).status_code == 200
    status, log = refused_start(data, moto_env)  # then the moto example on the same ./data
    assert status == REFUSED_EXIT
    assert_one_line_refusal(log, "Tier 2", moto_env["SEGSTORE_TIER2"], "<data folder>/tier2")
    with ServerProcess(data) as server:  # its own Tier 2 still opens it, nothing lost
        assert requests.get(server.url + "/v1/segments/kept", timeout=10).content == b"bytes"


@pytest.mark.parametrize("processes", [1, 2])
def test_a_missing_bucket_is_refused_in_one_line(
    tmp_path: Path, moto_env: dict[str, str], processes: int
) -> None:
    env = {**moto_env, "SEGSTORE_TIER2": "s3://no-such-bucket-here/data",
           "SEGSTORE_PROCESSES": str(processes)}
    status, log = refused_start(tmp_path / "data", env)
    assert status == REFUSED_EXIT
    assert_one_line_refusal(log, "s3://no-such-bucket-here/data/", "NoSuchBucket")
    assert not (tmp_path / "data" / "store.json").exists(), "a refused start binds the folder to nothing"
    with ServerProcess(tmp_path / "data", env=moto_env) as server:  # the bucket's name, corrected
        assert requests.put(server.url + "/v1/segments/s", timeout=10).status_code == 201


def test_refused_credentials_are_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")  # this moto checks every signature
    with MotoServer(tmp_path / "moto.log") as moto:
        env = {**FAKE_AWS_ENV, "SEGSTORE_TIER2": "s3://segs/data", "SEGSTORE_S3_ENDPOINT": moto.url}
        status, log = refused_start(tmp_path / "data", env)
    assert status == REFUSED_EXIT
    assert_one_line_refusal(log, "s3://segs/data/", "cannot be used")


@pytest.mark.parametrize("processes", [1, 2])
def test_a_locked_data_folder_is_refused_in_one_line(tmp_path: Path, processes: int) -> None:
    data = tmp_path / "data"
    with ServerProcess(data, processes=processes):  # a server of one process, or of several
        status, log = refused_start(data, {"SEGSTORE_PROCESSES": str(processes)})
    assert status == LATER_EXIT
    assert_one_line_refusal(log, "owns the data directory " + str(data.resolve()))
    assert re.search(r"another process \(pid [0-9]+\)", log)


def test_the_start_up_line_and_the_access_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, env={"SEGSTORE_ACCESS_LOG": "1"}, processes=1)
    with server:
        assert requests.put(server.url + "/v1/segments/a/b", timeout=10).status_code == 201
        metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert "process_resident_memory_bytes" in metrics and "segstore_build_info{" in metrics
    assert not re.search(r"^\w+_created[{ ]", metrics, re.M), "a _created series"
    log = server.log_path.read_text()
    started = [line for line in log.splitlines() if "segstore store: data folder" in line]
    assert len(started) == 1, log
    line = started[0]
    assert f"data folder {data.absolute()}," in line, line
    assert f"Tier 1 {data.absolute()}/tier1, Tier 2 {data.absolute()}/tier2;" in line, line
    for container in range(4):
        assert f"{container}: " in line.partition("recovered in")[2], line
    assert '"PUT /v1/segments/a/b HTTP/1.1" 201' in log, log


def test_a_node_of_processes_says_its_start_up_line_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, processes=2)
    with server:  # ready once each process has recovered; the line once the first sees each container's owner
        wait_until(lambda: "containers served by" in server.log_path.read_text(), "the start-up line", 10)
    log = server.log_path.read_text()
    started = [line for line in log.splitlines() if "segstore store: data folder" in line]
    assert len(started) == 1, log
    line = started[0]
    folder = data.absolute()
    assert f"data folder {folder}, Tier 1 {folder}/tier1, Tier 2 {folder}/tier2;" in line, line
    parts = line.partition("containers served by 2 processes: ")[2].split(", ")
    served = dict(part.split(": ") for part in parts)
    assert sorted(served) == ["0", "1", "2", "3"] and set(served.values()) == {"p0", "p1"}, line


def test_without_the_setting_there_is_no_access_log(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data")
    with server:
        requests.put(server.url + "/v1/segments/a/b", timeout=10)
    assert "/v1/segments/a/b HTTP/1.1" not in server.log_path.read_text()


class Forwarder(socketserver.ThreadingTCPServer):
    """A TCP port that forwards each connection to ``target``: an endpoint that starts answering later."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, target: int) -> None:
        class Pipe(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with socket.create_connection(("127.0.0.1", target)) as upstream:
                    sockets = [self.request, upstream]
                    while True:
                        readable, _, _ = select.select(sockets, [], [], 30)
                        if not readable:
                            return
                        for sock in readable:
                            data = sock.recv(65536)
                            if not data:
                                return
                            (upstream if sock is self.request else self.request).sendall(data)

        super().__init__(("127.0.0.1", port), Pipe)


def test_a_tier2_that_does_not_answer_yet_is_waited_for(tmp_path: Path) -> None:
    """Connection refused is an outage, not a misconfiguration: the server waits, unhealthy, then serves."""
    port = free_port()
    env = {**FAKE_AWS_ENV, "SEGSTORE_TIER2": "s3://segs/data", "SEGSTORE_S3_ENDPOINT": f"http://127.0.0.1:{port}"}
    server = ServerProcess(tmp_path / "data", env=env)
    started = threading.Thread(target=server.start, kwargs={"timeout_s": 90})
    started.start()
    try:
        with MotoServer(tmp_path / "moto.log") as moto:
            keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
            s3 = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1", **keys)
            s3.create_bucket(Bucket="segs")
            deadline = time.monotonic() + 30
            while "Tier 2 does not answer" not in server.log_tail():
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.2)
            health = requests.get(server.url + "/healthz", timeout=10)
            assert health.status_code == 503
            assert {c["state"] for c in health.json()["containers"]} == {"recovering"}
            with Forwarder(port, moto.port) as endpoint:  # Tier 2 answers from now on
                threading.Thread(target=endpoint.serve_forever, daemon=True).start()
                started.join(90)
                assert server.proc is not None and server.proc.poll() is None, server.log_tail()
                assert requests.get(server.url + "/healthz", timeout=10).status_code == 200
                assert requests.put(server.url + "/v1/segments/s", timeout=10).status_code == 201
                server.stop()
                endpoint.shutdown()
    finally:
        started.join(90)
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
    assert "Traceback" not in server.log_path.read_text()
