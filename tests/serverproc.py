"""Start segstore as a real server process, the way `make run` does.

Used by tests that need a real socket: crash tests, generated SDKs, clients.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """gunicorn + gevent serving ``app:create_app()`` on a loopback port."""

    def __init__(self, data_dir: Path, *, port: int | None = None, env: dict[str, str] | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.env = {
            **os.environ,
            "SEGSTORE_DATA_DIR": str(self.data_dir),
            "SEGSTORE_BIND": f"127.0.0.1:{self.port}",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 60.0) -> ServerProcess:
        """Start the server and wait until /readyz answers 200."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "app:create_app()"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except requests.ConnectionError:
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
        """SIGKILL the whole process group (arbiter and worker), as a crash would."""
        if self.proc and self.proc.poll() is None:
            for pid in _children(self.proc.pid) + [self.proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(10)

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


def _children(pid: int) -> list[int]:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    return [int(p) for p in out.split()]
