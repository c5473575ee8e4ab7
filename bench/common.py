"""What the benchmarks share: server processes and their metrics, percentiles, spreads, reports."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.servers import ServerProcess

# The engine's histogram of operations per Tier 1 write (engine/metrics.py).
TIER1_OPS_METRIC = "segstore_tier1_write_operations"


def worker_pids(server: ServerProcess) -> list[int]:
    """The gunicorn workers: the arbiter's children (one per process of the node)."""
    assert server.proc is not None
    arbiter = server.proc.pid
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == arbiter:
                pids.append(int(entry.name))
    if not pids:
        raise RuntimeError(f"no worker process under gunicorn {arbiter}")
    return sorted(pids)


def worker_pid(server: ServerProcess) -> int:
    """The gunicorn worker of a one-process server."""
    return worker_pids(server)[0]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_total(server: ServerProcess, name: str, headers: dict[str, str] | None = None) -> float:
    """The sum of a Prometheus sample over all its labels (``headers``: a token, with auth on)."""
    text = requests.get(server.url + "/metrics", headers=headers, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def tier1_metric(server: ServerProcess, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Sum and count of the operations-per-Tier-1-write histogram."""
    return {kind: metric_total(server, f"{TIER1_OPS_METRIC}_{kind}", headers) for kind in ("sum", "count")}


def create_segment(server: ServerProcess, name: str, headers: dict[str, str] | None = None) -> None:
    response = requests.put(f"{server.url}/v1/segments/{name}", headers=headers, timeout=10)
    if response.status_code != 201:
        raise RuntimeError(f"create {name}: {response.status_code} {response.text}")


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * pct / 100)) - 1]


@dataclass
class Spread:
    """Min, median and max of repeated runs."""

    min: float
    median: float
    max: float
    runs: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(min(values), statistics.median(values), max(values), list(values))

    def show(self, fmt: str = "{:,.0f}") -> str:
        return " / ".join(fmt.format(v) for v in (self.min, self.median, self.max))


def run_in_workdir(
    prefix: str,
    parent: str | Path | None,
    measure: Callable[[Path], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    json_path: str | Path | None,
) -> int:
    """A benchmark's main: ``measure`` in a temporary folder (always removed), print, save as JSON."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        doc = measure(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(doc))
    if json_path:
        Path(json_path).write_text(json.dumps(doc, default=lambda o: o.__dict__, indent=2) + "\n")
    return 0


def wait_writer_idle(server: ServerProcess, timeout_s: float = 120.0) -> None:
    """Wait until no acknowledged byte waits for Tier 2, so the next run starts quiet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric_total(server, "segstore_writer_lag_bytes") == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"Tier 2 did not catch up in {timeout_s} s")


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def spread_of(runs: Sequence[Any], attr: str) -> Spread | None:
    values = [getattr(r, attr) for r in runs if getattr(r, attr) is not None]
    return Spread.of(values) if values else None
