"""S3 PutObject latency against a native append of the same size, paired, from one client.

``python -m bench.s3_put [--size N] [--count N] [--rounds N] [--json PATH]``
starts one segstore server as ``make run`` does (local Tier 1, local-folder
Tier 2; no S3 keys, so requests go unsigned and both kinds cost the client
the same) and, in each round, times ``--count`` PutObjects of ``--size``
bytes overwriting one key, then as many native appends of that size to one
segment, one keep-alive ``requests`` session each, one request at a time.
A PutObject publishes the object, its record and the replacement of the
old one in one composite operation (one Tier 1 write); an append is one
Tier 1 write. Reported per round: p50 of each and their ratio; over the
rounds: min / median / max (target: the ratio's median at most 2.5).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from bench.common import Spread, create_segment, percentile, progress, run_in_workdir
from bench.servers import ServerProcess

SEGMENT = "bench/appends/0"
BUCKET = "bench"
KEY = "object"


def timed(session: requests.Session, method: str, url: str, body: bytes, count: int, ok: int) -> list[float]:
    """Latencies in ms of ``count`` requests, one at a time."""
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        response = session.request(method, url, data=body, timeout=30)
        latencies.append((time.perf_counter() - start) * 1000)
        if response.status_code != ok:
            raise RuntimeError(f"{method} {url}: {response.status_code} {response.text[:200]}")
    return latencies


def measure(workdir: Path, size: int, count: int, rounds: int) -> dict[str, Any]:
    rows = []
    body = os.urandom(size)
    with ServerProcess(workdir / "data") as server:
        create_segment(server, SEGMENT)
        session = requests.Session()
        if session.put(f"{server.url}/{BUCKET}", timeout=10).status_code != 200:
            raise RuntimeError("CreateBucket failed")
        put_url, append_url = f"{server.url}/{BUCKET}/{KEY}", f"{server.url}/v1/segments/{SEGMENT}"
        timed(session, "PUT", put_url, body, 50, 200)  # warm-up
        timed(session, "POST", append_url, body, 50, 200)
        for i in range(rounds):
            puts = percentile(timed(session, "PUT", put_url, body, count, 200), 50)
            appends = percentile(timed(session, "POST", append_url, body, count, 200), 50)
            rows.append({"put_p50_ms": puts, "append_p50_ms": appends, "ratio": puts / appends})
            progress(f"round {i + 1}: PutObject p50 {puts:.2f} ms, append p50 {appends:.2f} ms")
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "load_after": os.getloadavg()[0],
        "size": size,
        "count": count,
        "rounds": rows,
        "put_p50_ms": Spread.of([r["put_p50_ms"] for r in rows]),
        "append_p50_ms": Spread.of([r["append_p50_ms"] for r in rows]),
        "ratio": Spread.of([r["ratio"] for r in rows]),
    }


def render(doc: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"S3 PutObject of {doc['size']} B against a native append of {doc['size']} B "
            f"({len(doc['rounds'])} rounds of {doc['count']} each; {doc['machine']}; "
            f"load after {doc['load_after']:.2f}), min / median / max:",
            f"  PutObject p50 ms: {doc['put_p50_ms'].show('{:.2f}')}",
            f"  append p50 ms:    {doc['append_p50_ms'].show('{:.2f}')}",
            f"  ratio:            {doc['ratio'].show('{:.2f}')}   (target: median <= 2.5)",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=1024, help="bytes per request (default 1 KiB)")
    parser.add_argument("--count", type=int, default=500, help="requests of each kind per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--workdir", help="parent of the temporary data folder")
    args = parser.parse_args(argv)
    return run_in_workdir(
        "segstore-s3-put-",
        args.workdir,
        lambda workdir: measure(workdir, args.size, args.count, args.rounds),
        render,
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
