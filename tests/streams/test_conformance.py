"""The public Durable Streams conformance suite against a real segstore server.

``@durable-streams/server-conformance-tests`` (npm, pinned with vitest in
``conformance/package.json``) is installed once into ``.cache/conformance``
and run by vitest with ``conformance/vitest.config.mjs``: the package's own
``--run`` finds no test file as shipped, so the config names its runner.
The server is segstore under gunicorn with its default settings, as ``make
run`` serves it: the 20-second long-poll the suite's long-poll tests assume,
which is why the config gives each test the 30 seconds of the suite's own
vitest config.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.servers import ROOT, ServerProcess

HERE = Path(__file__).resolve().parent / "conformance"
CACHE = ROOT / ".cache" / "conformance"
# Every test but the optional subscriptions group (6 tests, skipped by the suite itself).
EXPECTED_PASSES = 332
SUITE_TIMEOUT_S = 600


def install_suite() -> Path:
    """npm install the pinned suite into the cache folder, unless it is there already."""
    if shutil.which("npm") is None:
        pytest.fail("the conformance suite needs node and npm on PATH")
    CACHE.mkdir(parents=True, exist_ok=True)
    wanted = (HERE / "package.json").read_bytes()
    stamp = CACHE / "node_modules" / ".segstore-package.json"
    for name in ("package.json", "vitest.config.mjs"):
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


def run_suite(url: str, report: Path) -> dict:
    """Run vitest against ``url``; returns its JSON report."""
    cache = install_suite()
    env = {**os.environ, "CONFORMANCE_TEST_URL": url, "CI": "true"}
    proc = subprocess.run(
        [
            "npx",
            "vitest",
            "run",
            "--config",
            "vitest.config.mjs",
            "--reporter=json",
            f"--outputFile={report}",
        ],
        cwd=cache,
        env=env,
        timeout=SUITE_TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    if not report.exists():
        pytest.fail(
            f"vitest wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(report.read_text())


def failures(report: dict) -> list[str]:
    return [
        f"{test['fullName']}: {(test.get('failureMessages') or [''])[0][:300]}"
        for suite in report["testResults"]
        for test in suite["assertionResults"]
        if test["status"] == "failed"
    ]


@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
@pytest.mark.process
def test_conformance_suite(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as server:
        report = run_suite(server.url, tmp_path / "vitest.json")
    failed = failures(report)
    assert report["numPassedTests"] >= EXPECTED_PASSES and not failed, "\n".join(failed)
