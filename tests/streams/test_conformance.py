"""The public Durable Streams conformance suite against a real segstore server.

``@durable-streams/server-conformance-tests`` (npm, pinned with vitest in
``conformance/package.json``) is installed once into ``.cache/conformance``
and run by vitest with ``conformance/vitest.config.mjs``: the package's own
``--run`` finds no test file as shipped, so the config names its runner.
The server is segstore under gunicorn with its default settings, as ``make
run`` serves it: the 20-second long-poll the suite's long-poll tests assume,
which is why the config gives each test the 30 seconds of the suite's own
vitest config.

The suite runs as four vitest processes side by side, each on a part of it
(``SHARDS``, by the names of its top-level groups): run one after the other
they took 100-140 s, mostly waiting (two long-polls of 20 s, property checks,
TTLs running out). Within a process the tests run in the suite's own order;
the processes share the server, as concurrent clients do. Each test runs in
exactly one of them, which the test checks. ``conformance/connections.mjs``
sends each request on a connection of its own (it says why).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.servers import ROOT, ServerProcess
from tests.processes import killed_at_exit

HERE = Path(__file__).resolve().parent / "conformance"
CACHE = ROOT / ".cache" / "conformance"
# Every test but the optional subscriptions group (6 tests, skipped by the suite itself).
EXPECTED_PASSES = 332
SUITE_TIMEOUT_S = 600
# Test name patterns (vitest -t, on "group ... test" names) that split the suite, a process each: the
# groups that wait out long-polls, run property checks, or wait for TTLs, and then all the others.
_OWN_SHARDS = (
    "Offset Validation and Resumability",
    "Property-Based Tests",
    "TTL Expiration Behavior|Fork - TTL and Expiry|Long-Poll Edge Cases|Chunking and Large Payloads",
)
SHARDS = (*_OWN_SHARDS, f"^(?!.*(?:{'|'.join(_OWN_SHARDS)}))")


def install_suite() -> Path:
    """npm install the pinned suite into the cache folder, unless it is there already."""
    if shutil.which("npm") is None:
        pytest.fail("the conformance suite needs node and npm on PATH")
    CACHE.mkdir(parents=True, exist_ok=True)
    wanted = (HERE / "package.json").read_bytes()
    stamp = CACHE / "node_modules" / ".segstore-package.json"
    for name in ("package.json", "vitest.config.mjs", "connections.mjs"):
        shutil.copyfile(HERE / name, CACHE / name)
    if not stamp.exists() or stamp.read_bytes() != wanted:
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-package-lock"],
            cwd=CACHE,
            check=True,
            timeout=SUITE_TIMEOUT_S,
            capture_output=True,
        )
        stamp.write_bytes(wanted)
    return CACHE


def run_suite(url: str, reports: Path) -> list[dict]:
    """Run vitest against ``url``, a process per shard at once; returns their JSON reports."""
    cache = install_suite()
    env = {**os.environ, "CONFORMANCE_TEST_URL": url, "CI": "true"}
    reports.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, pattern in enumerate(SHARDS):
        report, output = reports / f"vitest-{i}.json", reports / f"vitest-{i}.log"
        command = ["npx", "vitest", "run", "--config", "vitest.config.mjs", "--reporter=json",
                   f"--outputFile={report}", f"--testNamePattern={pattern}"]  # fmt: skip
        with output.open("wb") as out:
            proc = subprocess.Popen(command, cwd=cache, env=env, stdout=out, stderr=subprocess.STDOUT)
        runs.append((proc, report, output))
    deadline = time.monotonic() + SUITE_TIMEOUT_S
    try:
        for proc, _, _ in runs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for proc, _, _ in runs:
            proc.kill()
    found = []
    for proc, report, output in runs:
        if not report.exists():
            pytest.fail(f"vitest wrote no report (exit {proc.returncode}):\n{output.read_text()[-3000:]}")
        found.append(json.loads(report.read_text()))
    return found


def results(reports: list[dict], status: str) -> list[dict]:
    """The tests of every report with ``status`` ("passed", "failed")."""
    return [
        test
        for report in reports
        for suite in report["testResults"]
        for test in suite["assertionResults"]
        if test["status"] == status
    ]


@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
@pytest.mark.process
def test_conformance_suite(tmp_path: Path) -> None:
    with killed_at_exit(ServerProcess(tmp_path / "data", processes=0)) as server:  # as `make run` starts it
        reports = run_suite(server.url, tmp_path / "vitest")
    failed = [
        f"{t['fullName']}: {(t['failureMessages'] or [''])[0][:300]}" for t in results(reports, "failed")
    ]
    passed = Counter(test["fullName"] for test in results(reports, "passed"))
    assert not failed, "\n".join(failed)
    assert max(passed.values()) == 1, "a test ran in two shards"
    assert len(passed) >= EXPECTED_PASSES, len(passed)
