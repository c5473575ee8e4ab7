"""Transaction commit benchmark: commit latency by size, and the Tier 2 bytes commits copy.

``python -m bench.transactions [--quick] [--repeat N] [--json PATH]`` starts one
segstore server (gunicorn + gevent, as ``make run``: local Tier 1, local-folder
Tier 2) and, for transactions of 1 KiB to 64 MiB, times
``POST {parent}:transactions/{id}/commit`` from one keep-alive client:

- flushed: the transaction's bytes are all in Tier 2 before the commit (its
  ``storage_length`` equals its length), so the commit's Tier 2 half is a
  metadata-only concat (seed 002 "Concatenation");
- unflushed: the commit follows the last append at once; the bytes are in
  Tier 1 and move into the parent's read index without a copy.

A commit is one Tier 1 write whatever the size, so its latency should be flat;
a plain 1 KiB append (one Tier 1 write as well) is measured beside it. Before
each transaction and after its commit the benchmark waits until the parent
is all in Tier 2 and reads ``segstore_tier2_flush_bytes_total`` and
``segstore_tier2_merge_bytes_total``: the bytes written to Tier 2 beyond the
transaction's own (each written once, as the transaction's chunks or, when
the commit came first, as the parent's) are the bytes the commit copied
(the target is zero). Every commit's bytes are checked in the parent
at the offset the commit answered.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from bench.common import Spread, create_segment, metric_total, progress, run_in_workdir
from bench.servers import ServerProcess

KiB = 1024
MiB = 1024 * KiB
SIZES = (1 * KiB, 64 * KiB, 1 * MiB, 8 * MiB, 64 * MiB)
QUICK_SIZES = (1 * KiB, 1 * MiB, 8 * MiB)
APPEND_BYTES = 8 * MiB  # the server's max_append_bytes
PARENT = "bench/transactions/0"
FLUSHED_WAIT_S = 120.0


class Client:
    """One keep-alive HTTP client of the server."""

    def __init__(self, server: ServerProcess) -> None:
        self.url = f"{server.url}/v1/segments/{PARENT}"
        self.session = requests.Session()
        self.server = server

    def open(self) -> str:
        response = self.session.post(f"{self.url}:transactions", timeout=30)
        response.raise_for_status()
        return str(response.json()["id"])

    def fill(self, txid: str, data: bytes) -> None:
        for start in range(0, len(data), APPEND_BYTES):
            response = self.session.post(
                f"{self.url}:transactions/{txid}", data=data[start : start + APPEND_BYTES], timeout=60
            )
            response.raise_for_status()

    def transaction(self, txid: str) -> dict[str, Any]:
        response = self.session.get(f"{self.url}:transactions/{txid}", timeout=30)
        response.raise_for_status()
        return dict(response.json())

    def commit(self, txid: str) -> tuple[float, int, int]:
        """Commit; returns (seconds, offset, length)."""
        started = time.perf_counter()
        response = self.session.post(f"{self.url}:transactions/{txid}/commit", timeout=60)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        body = response.json()
        return elapsed, int(body["offset"]), int(body["length"])

    def append(self, data: bytes) -> float:
        started = time.perf_counter()
        response = self.session.post(self.url, data=data, timeout=30)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        return elapsed

    def flushed(self) -> bool:
        response = self.session.get(f"{self.url}:info", timeout=30)
        response.raise_for_status()
        info = response.json()
        return bool(info["storage_length"] == info["length"])

    def read(self, offset: int, length: int) -> bytes:
        response = self.session.get(self.url, params={"offset": offset, "length": length}, timeout=30)
        response.raise_for_status()
        return response.content


def wait_until(predicate: Any, what: str, timeout_s: float = FLUSHED_WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def tier2_counters(client: Client) -> tuple[float, float]:
    """(bytes written to Tier 2, bytes merged by naming chunks) once the parent is all in Tier 2."""
    wait_until(lambda: client.flushed(), "the parent's flush")
    return (
        metric_total(client.server, "segstore_tier2_flush_bytes_total"),
        metric_total(client.server, "segstore_tier2_merge_bytes_total"),
    )


def one_commit(client: Client, size: int, flushed: bool) -> dict[str, float]:
    data = uuid.uuid4().bytes * (size // 16) + os.urandom(size % 16)
    before = tier2_counters(client)
    txid = client.open()
    client.fill(txid, data)
    if flushed:
        wait_until(
            lambda: client.transaction(txid)["storage_length"] == size, "the transaction's flush"
        )
    seconds, offset, length = client.commit(txid)
    after = tier2_counters(client)
    assert length == offset + size, (offset, length, size)  # the parent's length after it, as for appends
    for at in (0, size - min(size, 64 * KiB)):
        piece = client.read(offset + at, min(size, 64 * KiB))
        assert piece == data[at : at + len(piece)], f"commit of {size} bytes: wrong bytes at {offset + at}"
    return {
        "seconds": seconds,
        "tier2_copied": after[0] - before[0] - size,
        "tier2_merged": after[1] - before[1],
    }


def measure(sizes: Sequence[int], repeat: int, workdir: Path) -> dict[str, Any]:
    server = ServerProcess(workdir / "data").start()
    try:
        create_segment(server, PARENT)
        client = Client(server)
        for _ in range(5):  # warm up the connection and the worker
            client.append(b"w" * KiB)
        appends = Spread.of([client.append(os.urandom(KiB)) * 1000 for _ in range(50)])
        rows = []
        for flushed in (True, False):
            for size in sizes:
                mode = "flushed" if flushed else "unflushed"
                progress(f"{repeat} commits of {size:,} bytes, {mode}")
                runs = [one_commit(client, size, flushed) for _ in range(repeat)]
                rows.append(
                    {
                        "size": size,
                        "mode": mode,
                        "commit_ms": Spread.of([r["seconds"] * 1000 for r in runs]),
                        "tier2_copied": Spread.of([r["tier2_copied"] for r in runs]),
                        "tier2_merged": Spread.of([r["tier2_merged"] for r in runs]),
                    }
                )
    finally:
        server.stop()
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0],
        },
        "repeat": repeat,
        "append_1k_ms": appends,
        "rows": rows,
    }


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"segstore transaction commit benchmark: {m['cpus']} CPUs, Python {m['python']}, "
        f"1-minute load average {m['load_average_1m']:.2f} after",
        f"one keep-alive client; {doc['repeat']} commits per row; figures are min / median / max",
        f"plain 1 KiB append (one Tier 1 write), ms: {doc['append_1k_ms'].show('{:.2f}')}",
        "",
        f"{'size':>10}  {'mode':<9}  {'commit ms':>22}  {'Tier 2 bytes copied':>28}  "
        f"{'merged by naming chunks':>26}",
    ]
    for row in doc["rows"]:
        lines.append(
            f"{row['size']:>10,}  {row['mode']:<9}  {row['commit_ms'].show('{:.2f}'):>22}  "
            f"{row['tier2_copied'].show():>28}  {row['tier2_merged'].show():>26}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transactions", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 KiB, 1 MiB and 8 MiB only, 2 commits each")
    parser.add_argument("--repeat", type=int, help="commits per size and mode (5, quick: 2)")
    parser.add_argument("--dir", help="where the temporary directory goes")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args(argv)
    repeat = args.repeat or (2 if args.quick else 5)
    sizes = QUICK_SIZES if args.quick else SIZES
    return run_in_workdir(
        "segstore-bench-txn-", args.dir, lambda d: measure(sizes, repeat, d), render, args.json
    )


if __name__ == "__main__":
    sys.exit(main())
