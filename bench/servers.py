"""Servers the benchmarks and the tests start: segstore as `make run` starts it, and moto's S3.

- ``ServerProcess``: gunicorn + gevent serving segstore on a loopback port,
  in its own process group (a kill reaches arbiter and worker at once, as a
  machine crash would). Crash tests, generated SDKs, clients and benchmarks
  use it.
- ``MotoServer``: moto in server mode, a real S3 endpoint over HTTP on
  loopback in its own process; boto3 talks to it as to S3 (sockets, signing,
  retries, multipart), which an in-process mock would skip.
- ``FAKE_AWS_ENV``: credentials and settings that keep boto3 off the
  machine's own AWS configuration.

It lives outside ``tests/`` so that benchmarks run without the test suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from engine.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # No profile, config file or endpoint of the machine's own may steer boto3.
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
UNSET_AWS_ENV = ("AWS_PROFILE", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def cluster_node_env(
    node: str, port: int, endpoint: str, bucket: str, *, lease_s: float = 10.0, containers: int = 4
) -> dict[str, str]:
    """The settings of cluster node ``node`` on ``port``, with both tiers in ``bucket`` on ``endpoint``."""
    return {
        **FAKE_AWS_ENV,
        "SEGSTORE_LOG_LEVEL": "warning",
        "SEGSTORE_TIER1": f"s3://{bucket}/tier1",
        "SEGSTORE_TIER2": f"s3://{bucket}/tier2",
        "SEGSTORE_S3_ENDPOINT": endpoint,
        "SEGSTORE_NODE_ID": node,
        "SEGSTORE_ADVERTISE_URL": f"http://127.0.0.1:{port}",
        "SEGSTORE_LEASE_S": str(lease_s),
        "SEGSTORE_CONTAINER_COUNT": str(containers),
        "SEGSTORE_FLUSH_THRESHOLD_MS": "100",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """gunicorn + gevent serving ``app`` (default segstore's) on a loopback port.

    The server runs in its own process group, so a kill reaches the arbiter
    and its worker at the same instant, as a machine crash would.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
        app: str = "app:create_app()",
        processes: int | None = None,
    ):
        """``processes``: the server's processes (``SEGSTORE_PROCESSES``; 0: one per core); None: the
        environment's ``SEGSTORE_PROCESSES``, else 1 (``SEGSTORE_PROCESSES=0 make test`` runs every
        server a test does not pin on one process per core)."""
        self.data_dir = Path(data_dir)
        self.app = app
        self.port = port or free_port()
        chosen = os.environ.get("SEGSTORE_PROCESSES", "1") if processes is None else str(processes)
        self.env = {
            **os.environ,
            "SEGSTORE_DATA_DIR": str(self.data_dir),
            "SEGSTORE_BIND": f"127.0.0.1:{self.port}",
            "SEGSTORE_PROCESSES": chosen,
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"

    @property
    def processes(self) -> int:
        """How many server processes serve the data folder, as gunicorn's configuration counts them."""
        return load_settings(self.env).processes_to_start(os.cpu_count() or 1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 60.0) -> ServerProcess:
        """Start the server and wait until /readyz answers 200."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", self.app],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except (requests.ConnectionError, requests.Timeout):  # not listening, or busy starting
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server not ready in {timeout_s}s: {self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL arbiter and worker at once and wait until both are gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        deadline = time.monotonic() + 10
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, timeout_s: float = 40.0) -> int:
        """SIGTERM and wait for a graceful exit; returns the exit code."""
        if not self.proc:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.stop(15)
            except subprocess.TimeoutExpired:
                self.kill()


def group_alive(pgid: int) -> bool:
    """True while a process of the group is still running (zombies awaiting reaping are dead).

    Every thread counts: a process whose main thread is a zombie while another
    thread still finishes a system call keeps its files, its sockets too, open.
    """
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1 and ``port`` (default a free one), logging to ``log_path``."""

    def __init__(self, log_path: Path, port: int = 0) -> None:
        self.log_path = log_path
        self.fixed_port = port  # 0: a free one
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> MotoServer:
        """Start the server and wait until it answers HTTP; retries on a free port taken meanwhile."""
        for _ in range(1 if self.fixed_port else 3):
            self.port = self.fixed_port or free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._wait_ready(timeout_s):
                return self
        raise RuntimeError(f"moto server did not start: {self.log_tail()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                requests.get(self.url + "/moto-api/", timeout=1)
                return True
            except (requests.ConnectionError, requests.Timeout):  # not listening, or busy starting
                time.sleep(0.05)
        self.stop()
        return False

    def reset(self) -> None:
        """Drop every bucket and object (moto's own reset call)."""
        requests.post(self.url + "/moto-api/reset", timeout=10).raise_for_status()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; waits until the process is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
