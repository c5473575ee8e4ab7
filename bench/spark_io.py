"""Spark I/O benchmark: the segstore format against Spark's own local files, same bytes, same run.

``python -m bench.spark_io [--quick] [--repeat N] [--json PATH]`` measures on a
``local[2]`` Spark session:

(a) read: ``spark.read.format("segstore")`` of one segment holding 1 GiB of
    length-prefixed events (1,000-byte payloads, appended 8 MiB at a time;
    64 MiB partitions from ``:partitions``), counted and summed, against
    ``spark.read.format("binaryFile")`` of the same bytes as 64 MiB local
    files; also the segstore read with ``framing=raw`` (bytes, no events);
(b) write: the same number of 1,000-byte values written with
    ``df.write.format("segstore")`` (task transactions, committed by the
    driver) against ``df.write.parquet`` (uncompressed) to local files.

Throughput is payload MiB/s over the wall time of the Spark action. The
segstore server is gunicorn + gevent as ``make run`` starts it, on loopback;
its Tier 2 is left to catch up before the reads. A warm-up round on 16 MiB
(Python workers started, modules imported) is not counted. Files and segments live in
one temporary directory on the same filesystem, which is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import Spread, run_in_workdir, wait_writer_idle
from bench.servers import ServerProcess
from client.segment_client import SegmentClient

MiB = 1024 * 1024
PAYLOAD_BYTES = 1000
APPEND_BYTES = 8 * MiB
FILE_BYTES = 64 * MiB
TARGET_READ_RATIO = 0.5
SERVER_ENV = {"SEGSTORE_LOG_LEVEL": "warning"}


@dataclass(frozen=True)
class Plan:
    total_bytes: int
    repeat: int
    spark_master: str


def _chunk(events: int, salt: int) -> bytes:
    """``events`` framed events of ``PAYLOAD_BYTES`` each."""
    payload = (b"%012d" % salt) + os.urandom(PAYLOAD_BYTES - 12)
    return ((PAYLOAD_BYTES).to_bytes(4, "big") + payload) * events


def load_data(client: SegmentClient, segment: str, files: Path, total_bytes: int) -> int:
    """The same framed events into ``segment`` and into 64 MiB files; returns the number of events."""
    per_append = APPEND_BYTES // (PAYLOAD_BYTES + 4)
    appends = max(1, total_bytes // (per_append * (PAYLOAD_BYTES + 4)))
    per_file = max(1, FILE_BYTES // APPEND_BYTES)
    client.create(segment)
    files.mkdir(parents=True)
    handle = None
    for i in range(appends):
        data = _chunk(per_append, i)
        client.append(segment, data)
        if i % per_file == 0:
            if handle is not None:
                handle.close()
            handle = open(files / f"part-{i // per_file:05d}.bin", "wb")  # noqa: SIM115 - closed below
        handle.write(data)
    if handle is not None:
        handle.close()
    return appends * per_append


def _timed(action: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def spark_session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from client.spark import SegstoreDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName("segstore-bench-spark-io")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SegstoreDataSource)
    return spark


@dataclass
class Round:
    """One repetition: MiB/s of payload (read: bytes as stored for binaryFile and raw)."""

    segstore_read: float
    segstore_raw_read: float
    files_read: float
    segstore_write: float
    files_write: float


def one_round(spark: Any, server: ServerProcess, segment: str, files: Path, events: int, r: int) -> Round:
    stored = events * (PAYLOAD_BYTES + 4)
    payload_mib = events * PAYLOAD_BYTES / MiB

    def segstore_df(framing: str) -> Any:
        return (
            spark.read.format("segstore")
            .option("endpoint", server.url)
            .option("segments", segment)
            .option("framing", framing)
            .load()
        )

    progress(f"run {r + 1}: segstore read")
    seconds, rows = _timed(
        lambda: segstore_df("length_prefixed").selectExpr("count(*)", "sum(length(value))").first()
    )
    if tuple(rows) != (events, events * PAYLOAD_BYTES):
        raise RuntimeError(f"segstore read {tuple(rows)}, expected {(events, events * PAYLOAD_BYTES)}")
    segstore_read = payload_mib / seconds
    progress(f"run {r + 1}: segstore raw read")
    seconds, rows = _timed(lambda: segstore_df("raw").selectExpr("sum(length(value))").first())
    if rows[0] != stored:
        raise RuntimeError(f"segstore raw read {rows[0]} bytes, expected {stored}")
    raw_read = stored / MiB / seconds
    progress(f"run {r + 1}: binaryFile read")
    binary = spark.read.format("binaryFile").load(str(files))
    seconds, rows = _timed(lambda: binary.selectExpr("sum(length(content))").first())
    if rows[0] != stored:
        raise RuntimeError(f"binaryFile read {rows[0]} bytes, expected {stored}")
    files_read = stored / MiB / seconds

    values = spark.range(0, events, numPartitions=16).selectExpr(
        f"cast(concat(lpad(cast(id as string), 12, '0'), repeat('v', {PAYLOAD_BYTES - 12})) as binary)"
        " as value"
    )
    target = f"{segment}-out-{r}"
    SegmentClient(server.url).create(target)
    progress(f"run {r + 1}: segstore write")
    seconds, _ = _timed(
        lambda: (
            values.write.format("segstore")
            .option("endpoint", server.url)
            .option("segment", target)
            .mode("append")
            .save()
        )
    )
    written = SegmentClient(server.url).info(target).length
    if written != stored:
        raise RuntimeError(f"segstore write stored {written} bytes, expected {stored}")
    segstore_write = payload_mib / seconds
    SegmentClient(server.url).delete(target)
    progress(f"run {r + 1}: parquet write")
    out = files.parent / f"parquet-{r}"
    seconds, _ = _timed(lambda: values.write.option("compression", "none").parquet(str(out)))
    files_write = payload_mib / seconds
    shutil.rmtree(out, ignore_errors=True)
    wait_writer_idle(server)
    return Round(segstore_read, raw_read, files_read, segstore_write, files_write)


def measure(plan: Plan, workdir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_before": os.getloadavg()[0]},
        "plan": asdict(plan),
    }
    rounds: list[Round] = []
    with ServerProcess(workdir / "data", env=SERVER_ENV) as server:
        segment = "bench/spark/0"
        progress(f"loading {plan.total_bytes / MiB:,.0f} MiB into segstore and into files")
        with SegmentClient(server.url) as client:
            events = load_data(client, segment, workdir / "files", plan.total_bytes)
            warm_events = load_data(client, "bench/warm/0", workdir / "warm", 16 * MiB)
        wait_writer_idle(server, timeout_s=600)
        doc["events"] = events
        spark = spark_session(plan.spark_master)
        try:
            progress("warm-up: every action once on 16 MiB")
            one_round(spark, server, "bench/warm/0", workdir / "warm", warm_events, -1)
            for r in range(plan.repeat):
                rounds.append(one_round(spark, server, segment, workdir / "files", events, r))
        finally:
            spark.stop()
    doc["machine"]["loadavg_1m_after"] = os.getloadavg()[0]
    for name in Round.__dataclass_fields__:
        doc[name] = asdict(Spread.of([getattr(run, name) for run in rounds]))
    doc["read_ratio"] = asdict(Spread.of([run.segstore_read / run.files_read for run in rounds]))
    doc["raw_read_ratio"] = asdict(Spread.of([run.segstore_raw_read / run.files_read for run in rounds]))
    doc["write_ratio"] = asdict(Spread.of([run.segstore_write / run.files_write for run in rounds]))
    return doc


def render(doc: dict[str, Any]) -> str:
    machine, plan = doc["machine"], doc["plan"]

    def show(d: dict[str, float], fmt: str = "{:,.1f}") -> str:
        return Spread(d["min"], d["median"], d["max"]).show(fmt)

    met = "met" if doc["read_ratio"]["median"] >= TARGET_READ_RATIO else "NOT met"
    return "\n".join(
        [
            f"Spark I/O benchmark: {machine['cpus']} CPUs, Spark {plan['spark_master']}, "
            f"1-minute load average {machine['loadavg_1m_before']:.2f} before, "
            f"{machine['loadavg_1m_after']:.2f} after",
            f"{plan['total_bytes'] / MiB:,.0f} MiB: {doc['events']:,} events of {PAYLOAD_BYTES} bytes; "
            f"{plan['repeat']} run(s), MiB/s min / median / max",
            "",
            "(a) read",
            f"  segstore, length_prefixed events:  {show(doc['segstore_read']):>24}",
            f"  segstore, framing=raw:             {show(doc['segstore_raw_read']):>24}",
            f"  binaryFile, 64 MiB local files:    {show(doc['files_read']):>24}",
            f"  events / binaryFile:               {show(doc['read_ratio'], '{:.2f}'):>24}  "
            f"[target >= {TARGET_READ_RATIO}: {met}]",
            f"  raw / binaryFile:                  {show(doc['raw_read_ratio'], '{:.2f}'):>24}",
            "",
            "(b) write",
            f"  segstore sink (task transactions): {show(doc['segstore_write']):>24}",
            f"  parquet, uncompressed local files: {show(doc['files_write']):>24}",
            f"  segstore / parquet:                {show(doc['write_ratio'], '{:.2f}'):>24}",
        ]
    )


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_io", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB, one repetition")
    parser.add_argument("--repeat", type=int, default=0, help="repetitions (3, quick: 1)")
    parser.add_argument("--mib", type=int, default=0, help="MiB of events (1024, quick: 64)")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary directory goes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    plan = Plan(
        total_bytes=(args.mib or (64 if args.quick else 1024)) * MiB,
        repeat=args.repeat or (1 if args.quick else 3),
        spark_master=args.master,
    )
    return run_in_workdir("segstore-bench-spark-", args.dir, lambda d: measure(plan, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
