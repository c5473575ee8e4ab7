"""Tier 1 benchmark: the write-ahead log on S3 (moto) against local files, in one run.

``python -m bench.tier1 [--quick] [--repeat N] [--in-flight 4[,1...]] [--json PATH]``
starts moto and servers as ``make run`` does, one with the default Tier 1
(local files) and one with ``SEGSTORE_TIER1``/``SEGSTORE_TIER2`` on moto per
``--in-flight`` value (``SEGSTORE_TIER1_WRITES_IN_FLIGHT``; default: the
setting's default), and measures each repetition on all of them back to back:

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

from bench.appends import BIG_APPEND_BYTES, CONCURRENCY, SERVER_ENV, SMALL_APPEND_BYTES
from bench.common import Spread, create_segment, percentile, progress, run_in_workdir, tier1_metric
from bench.load import LoadResult, LoadSpec, run_load
from bench.servers import FAKE_AWS_ENV, MotoServer, ServerProcess
from engine import Settings

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
        servers = {"local": ServerProcess(workdir / "local", env=SERVER_ENV).start()}
        for count in args.in_flight:
            kind = s3_kind(count)
            s3_env = {
                **SERVER_ENV,
                **FAKE_AWS_ENV,
                "SEGSTORE_TIER1": f"s3://{BUCKET}/{kind}/tier1",
                "SEGSTORE_TIER2": f"s3://{BUCKET}/{kind}/tier2",
                "SEGSTORE_S3_ENDPOINT": moto.url,
                "SEGSTORE_TIER1_WRITES_IN_FLIGHT": str(count),
            }
            servers[kind] = ServerProcess(workdir / kind, env=s3_env).start()
        runs: dict[str, dict[str, list[Any]]] = {kind: {} for kind in servers}
        try:
            for r in range(repeat):
                for clients in CONCURRENCY:
                    for kind, server in servers.items():
                        progress(f"run {r + 1}: {kind}, {clients} clients of 100 B")
                        segment = f"bench/{kind}/{r}/{clients}"
                        create_segment(server, segment)
                        spec = LoadSpec(
                            server.port, segment, SMALL_APPEND_BYTES, clients, warmup_s, duration_s
                        )
                        result = run_load(spec, 1, server, partial(tier1_metric, server))
                        runs[kind].setdefault(f"small_{clients}", []).append(result)
                for clients in LATENCY_CLIENTS:
                    for kind, server in servers.items():
                        progress(f"run {r + 1}: {kind}, ack latency with {clients} clients")
                        segment = f"bench/{kind}/{r}/latency{clients}"
                        create_segment(server, segment)
                        runs[kind].setdefault(f"latency_{clients}", []).append(
                            _latencies(server.url, segment, clients, duration_s)
                        )
                for kind, server in servers.items():
                    progress(f"run {r + 1}: {kind}, 1 MiB appends")
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
    doc: dict[str, Any] = {"repeat": repeat, "moto_put_ms": {"p50": percentile(moto_ms, 50),
                                                              "p99": percentile(moto_ms, 99)}}  # fmt: skip
    for kind, measured in runs.items():
        section: dict[str, Any] = {}
        for name, results in measured.items():
            if name.startswith("latency"):
                section[name] = {
                    "p50_ms": asdict(Spread.of([percentile(r, 50) for r in results])),
                    "p99_ms": asdict(Spread.of([percentile(r, 99) for r in results])),
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
    doc["ratio_64"] = {}
    for kind in runs:
        if kind != "local":
            pairs = zip(runs[kind]["small_64"], runs["local"]["small_64"], strict=True)
            ratios = [s.requests_per_s / max(x.requests_per_s, 1e-9) for s, x in pairs]
            doc["ratio_64"][kind] = asdict(Spread.of(ratios))
    return doc


def render(doc: dict[str, Any]) -> str:
    def show(spread: dict[str, float], fmt: str = "{:,.0f}") -> str:
        return " / ".join(fmt.format(spread[k]) for k in ("min", "median", "max"))

    kinds = [k for k in doc if k == "local" or k.startswith("s3-")]
    lines = [
        f"Tier 1 on S3 (moto; s3-N: N PutObjects in flight per container) against local files, "
        f"{doc['repeat']} paired runs, min / median / max; writes: fdatasyncs or PutObjects"
    ]
    for name in [f"small_{c}" for c in CONCURRENCY] + ["big"]:
        for kind in kinds:
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
        for kind in kinds:
            row = doc[kind][f"latency_{clients}"]
            lines.append(
                f"  ack latency, {clients:2} clients, {kind:5}: p50 {show(row['p50_ms'], '{:.2f}')} ms, "
                f"p99 {show(row['p99_ms'], '{:.2f}')} ms"
            )
    lines.append(
        f"  moto PutObject: p50 {doc['moto_put_ms']['p50']:.2f} ms, p99 {doc['moto_put_ms']['p99']:.2f} ms"
    )
    for kind, ratio in doc["ratio_64"].items():
        verdict = "met" if ratio["median"] >= TARGET_RATIO else "NOT met"
        shown = show(ratio, "{:.2f}")
        lines.append(f"  64 clients, {kind} / local: {shown} (target {TARGET_RATIO}: {verdict})")
    return "\n".join(lines)


def s3_kind(in_flight: int) -> str:
    return f"s3-{in_flight}"


def _counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if not counts or len(set(counts)) != len(counts) or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"distinct counts of at least 1, not {text!r}")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tier1", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--repeat", type=int, default=0, help="paired runs (3, quick: 1)")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folders go")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument(
        "--in-flight",
        type=_counts,
        default=[Settings().tier1_writes_in_flight],
        help="S3 servers to run, by PutObjects in flight per container, e.g. 4,1 (default: the setting's)",
    )
    args = parser.parse_args(argv)
    return run_in_workdir("segstore-tier1-", args.dir, lambda d: measure(args, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
