"""``schemathesis run openapi.yaml --checks all`` against a real server reports nothing.

The server is gunicorn as ``make run`` starts it (bench/servers.py). The
run's settings are schemathesis.toml at the repository root, which a plain
``schemathesis run openapi.yaml --url http://127.0.0.1:8080`` reads too: a
fixed seed and number of examples, so a run is reproducible and takes a few
minutes; the hooks (tests/app/schemathesis_hooks.py) say the rules that tie
parameters together, which OpenAPI cannot. The one setting changed here is
the Durable Streams long-poll, 1 s instead of 20 s, so that a long-poll at a
stream's tail ends within the run's request timeout.

Every check runs: server errors, status codes, content types, headers and
bodies against their schemas, valid requests accepted and invalid ones
refused, methods outside the contract answered 405 with a matching
``Allow``, and the stateful checks over the links schemathesis infers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.servers import ROOT, ServerProcess
from tests.processes import killed_at_exit

RUN_TIMEOUT_S = 540


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.process
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    with killed_at_exit(ServerProcess(tmp_path / "data", env={"SEGSTORE_STREAM_LONG_POLL_S": "1"})) as server:
        command = [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            "openapi.yaml",
            "--url",
            server.url,
            "--checks",
            "all",
            "--no-color",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        ran = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    report = ran.stdout[-20000:] + ran.stderr[-5000:]
    assert ran.returncode == 0, report
    assert "No issues found" in ran.stdout or " passed" in ran.stdout, report
