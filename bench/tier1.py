"""Tier 1 benchmark: the write-ahead log on S3 (moto) against local files, in one run.

``python -m bench.tier1 [--quick] [--repeat N] [--json PATH]`` starts moto and
two servers as ``make run`` does, one with the default Tier 1 (local files)
and one with ``SEGSTORE_TIER1``/``SEGSTORE_TIER2`` on moto, and measures each
repetition on both back to back:

(a) appends/s of 100-byte appends from 1, 16 and 64 keep-alive clients in a
    closed loop (``bench.appends``' load generator), operations per Tier 1
    write (from ``/metrics``) and so Tier 1 writes (PutObjects) per second;
(b) ack latency p50/p99 of one client and of 16 clients appending in a loop;
(c) MiB/s of 1 MiB appends from 4 clients;
(d) moto's own PutObject latency (1 KiB, one at a time), so the figures can be
    scaled to S3 Express One Zone (5-10 ms) or S3 Standard (50-100 ms).

Target: at 64 clients, appends/s with Tier 1 on S3 at least 0.5x local files.
moto costs CPU on this machine that S3 would not: the servers, moto and the
load generator share its cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import requests

from bench.appends import (
    BIG_APPEND_BYTES,
    CONCURRENCY,
    SERVER_ENV,
    SMALL_APPEND_BYTES,
    LoadResult,
    LoadSpec,
    Spread,
    _percentile,
    _progress,
    create_segment,
    run_in_workdir,
    run_load,
    tier1_metric,
)
from tests.conftest import FAKE_AWS_ENV
from tests.motoserver import MotoServer
from tests.serverproc import ServerProcess

TARGET_RATIO = 0.5
LATENCY_CLIENTS = (1, 16)
BUCKET = "bench-tier1"


def _latencies(url: str, segment: str, clients: int, duration_s: float) -> list[float]:
    """Ack latency (ms) of every append ``clients`` threads send in a loop for ``duration_s``."""
    found: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + duration_s

    def loop() -> None:
        mine = []
        body = b"x" * SMALL_APPEND_BYTES
        with requests.Session() as http:
            while time.monotonic() < stop:
                started = time.perf_counter()
                http.post(f"{url}/v1/segments/{segment}", data=body, timeout=30).raise_for_status()
                mine.append((time.perf_counter() - started) * 1000)
        with lock:
            found.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return found


def _moto_put_ms(endpoint: str, count: int) -> list[float]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    body = os.urandom(1024)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        s3.put_object(Bucket=BUCKET, Key=f"probe/{uuid.uuid4().hex}", Body=body, IfNoneMatch="*")
        times.append((time.perf_counter() - started) * 1000)
    return times


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    warmup_s, duration_s = (0.5, 2.0) if args.quick else (1.0, 5.0)
    repeat = args.repeat or (1 if args.quick else 3)
    os.environ.update(FAKE_AWS_ENV)
    with MotoServer(workdir / "moto.log") as moto:
        boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        s3_env = {
            **SERVER_ENV,
            **FAKE_AWS_ENV,
            "SEGSTORE_TIER1": f"s3://{BUCKET}/tier1",
            "SEGSTORE_TIER2": f"s3://{BUCKET}/tier2",
            "SEGSTORE_S3_ENDPOINT": moto.url,
        }
        servers = {
            "local": ServerProcess(workdir / "local", env=SERVER_ENV).start(),
            "s3": ServerProcess(workdir / "s3", env=s3_env).start(),
        }
        runs: dict[str, dict[str, list[Any]]] = {kind: {} for kind in servers}
        try:
            for r in range(repeat):
                for clients in CONCURRENCY:
                    for kind, server in servers.items():
                        _progress(f"run {r + 1}: {kind}, {clients} clients of 100 B")
                        segment = f"bench/{kind}/{r}/{clients}"
                        create_segment(server, segment)
                        spec = LoadSpec(
                            server.port, segment, SMALL_APPEND_BYTES, clients, warmup_s, duration_s
                        )
                        result = run_load(spec, 1, server, partial(tier1_metric, server))
                        runs[kind].setdefault(f"small_{clients}", []).append(result)
                for clients in LATENCY_CLIENTS:
                    for kind, server in servers.items():
                        _progress(f"run {r + 1}: {kind}, ack latency with {clients} clients")
                        segment = f"bench/{kind}/{r}/latency{clients}"
                        create_segment(server, segment)
                        runs[kind].setdefault(f"latency_{clients}", []).append(
                            _latencies(server.url, segment, clients, duration_s)
                        )
                for kind, server in servers.items():
                    _progress(f"run {r + 1}: {kind}, 1 MiB appends")
                    segment = f"bench/{kind}/{r}/big"
                    create_segment(server, segment)
                    spec = LoadSpec(server.port, segment, BIG_APPEND_BYTES, 4, warmup_s, duration_s)
                    runs[kind].setdefault("big", []).append(
                        run_load(spec, 1, server, partial(tier1_metric, server))
                    )
            moto_ms = _moto_put_ms(moto.url, 300)
        finally:
            for server in servers.values():
                server.stop()
    return _summary(runs, moto_ms, repeat)


def _summary(runs: dict[str, dict[str, list[Any]]], moto_ms: list[float], repeat: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"repeat": repeat, "moto_put_ms": {"p50": _percentile(moto_ms, 50),
                                                              "p99": _percentile(moto_ms, 99)}}  # fmt: skip
    for kind, measured in runs.items():
        section: dict[str, Any] = {}
        for name, results in measured.items():
            if name.startswith("latency"):
                section[name] = {
                    "p50_ms": asdict(Spread.of([_percentile(r, 50) for r in results])),
                    "p99_ms": asdict(Spread.of([_percentile(r, 99) for r in results])),
                }
                continue
            loads: list[LoadResult] = results
            section[name] = {
                "appends_per_s": asdict(Spread.of([x.requests_per_s for x in loads])),
                "mib_per_s": asdict(Spread.of([x.mib_per_s for x in loads])),
                "ops_per_write": asdict(Spread.of([x.ops_per_tier1_write or 0.0 for x in loads])),
                "writes_per_s": asdict(
                    Spread.of([x.requests_per_s / (x.ops_per_tier1_write or 1.0) for x in loads])
                ),
                "server_cpu": asdict(Spread.of([x.server_cpu for x in loads])),
            }
        doc[kind] = section
    pairs = zip(runs["s3"]["small_64"], runs["local"]["small_64"], strict=True)
    doc["ratio_64"] = asdict(Spread.of([s.requests_per_s / max(x.requests_per_s, 1e-9) for s, x in pairs]))
    return doc


def render(doc: dict[str, Any]) -> str:
    def show(spread: dict[str, float], fmt: str = "{:,.0f}") -> str:
        return " / ".join(fmt.format(spread[k]) for k in ("min", "median", "max"))

    lines = [f"Tier 1 on S3 (moto) against local files, {doc['repeat']} paired runs, min / median / max"]
    for name in [f"small_{c}" for c in CONCURRENCY] + ["big"]:
        for kind in ("local", "s3"):
            row = doc[kind][name]
            if name == "big":
                rate = show(row["mib_per_s"], "{:,.1f}") + " MiB/s"
            else:
                rate = show(row["appends_per_s"]) + " appends/s"
            lines.append(
                f"  {name:9} {kind:5}: {rate}, {show(row['ops_per_write'], '{:.1f}')} ops/write, "
                f"{show(row['writes_per_s'])} writes/s, server CPU {show(row['server_cpu'], '{:.2f}')}"
            )
    for clients in LATENCY_CLIENTS:
        for kind in ("local", "s3"):
            row = doc[kind][f"latency_{clients}"]
            lines.append(
                f"  ack latency, {clients:2} clients, {kind:5}: p50 {show(row['p50_ms'], '{:.2f}')} ms, "
                f"p99 {show(row['p99_ms'], '{:.2f}')} ms"
            )
    lines.append(
        f"  moto PutObject: p50 {doc['moto_put_ms']['p50']:.2f} ms, p99 {doc['moto_put_ms']['p99']:.2f} ms"
    )
    ratio = doc["ratio_64"]
    verdict = "met" if ratio["median"] >= TARGET_RATIO else "NOT met"
    lines.append(f"  64 clients, S3 / local: {show(ratio, '{:.2f}')} (target {TARGET_RATIO}: {verdict})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tier1", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--repeat", type=int, default=0, help="paired runs (3, quick: 1)")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folders go")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    return run_in_workdir("segstore-tier1-", args.dir, lambda d: measure(args, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
