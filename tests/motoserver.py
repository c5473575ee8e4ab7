"""moto in server mode: a real S3 endpoint over HTTP on loopback, in its own process.

Tests talk to it through boto3 exactly as they would to S3 (sockets,
signing, retries, multipart), which an in-process mock would skip.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.serverproc import free_port


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1 and a free port, logging to ``log_path``."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> MotoServer:
        """Start the server and wait until it answers HTTP; retries on a port taken meanwhile."""
        for _ in range(3):
            self.port = free_port()
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
