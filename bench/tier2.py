"""Tier 2 on S3 benchmark: catch-up reads, flush throughput and objects per MiB, against moto.

``python -m bench.tier2 [--quick] [--repeat N] [--json PATH]`` starts one moto
server (S3 over HTTP on loopback, fake credentials, a fresh bucket) and one
segstore server (gunicorn + gevent, as ``make run``) whose Tier 2 is
``s3://<bucket>/seg`` on it, with a small cache, and measures in one run:

(1) catch-up reads: a segment filled with 256 MiB of 1 MiB appends is read
    from offset 0 to its end by one client, with ranged GETs of
    ``max_read_bytes`` on one keep-alive connection, right after a restart
    (cold cache: the bytes come from S3); against boto3 reading the same
    bytes from the same moto: the segment's chunk objects, listed (not timed)
    and fetched in offset order, one streamed GetObject each, also one
    sequential reader. Each run restarts segstore, then reads both ways.
(2) flush throughput, once per run: Tier 2 bytes/s while the 256 MiB are
    appended (``segstore_tier2_flush_bytes_total``), and the time from the
    last append until ``storage_length`` reaches the length.
(3) S3 objects per MiB of 100-byte appends: a fresh segment gets N MiB of
    pipelined 100-byte appends from 16 keep-alive connections; the objects
    under its prefix once flushed and once defrag has settled, the flushes
    (UpdateLayout operations less defrags) and the S3 requests behind them,
    counted in moto's request log.

Every byte read is checked: each 1 MiB of the filled segment starts with a
tag naming the append, and both readers must see the same tags in order.
moto answers each request in milliseconds and keeps objects in memory: the
flush figures describe segstore against moto, not the speed of S3.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    Spread,
    create_segment,
    metric_total,
    process_cpu_s,
    progress,
    run_in_workdir,
    spread_of,
    worker_pid,
)
from bench.load import HOST, Connection, request_bytes
from bench.servers import MotoServer, ServerProcess
from bench.tier2_probes import (
    TAG_BYTES,
    TIER2_PREFIX,
    WAIT_FLUSHED_S,
    MotoLog,
    TagCheck,
    chunk_key_prefix,
    chunk_objects,
    fake_aws_environment,
    restart,
    tag,
    wait_flushed,
)
from engine import naming
from engine.config import load_settings
from engine.tier2.s3 import make_client

KiB = 1024
MiB = 1024 * KiB
SMALL_APPEND_BYTES = 100
TARGET_READ_RATIO = 0.8
FLUSH_METRIC = "segstore_tier2_flush_bytes_total"
LAYOUT_METRIC = 'segstore_operation_latency_seconds_count{type="UpdateLayout"}'
SETTLE_S = 2.0


@dataclass(frozen=True)
class Plan:
    """Sizes and counts of each measurement."""

    repeat: int
    fill_mib: int
    fill_clients: int
    read_bytes: int
    cache_max_bytes: int
    small_mib: int
    small_connections: int
    pipeline_depth: int

    @classmethod
    def build(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        return cls(
            repeat=args.repeat or (1 if quick else 3),
            fill_mib=args.fill_mib or (64 if quick else 256),
            fill_clients=args.fill_clients,
            read_bytes=load_settings({}).max_read_bytes,
            cache_max_bytes=args.cache_mib * MiB,
            small_mib=args.small_mib or (4 if quick else 16),
            small_connections=args.small_connections,
            pipeline_depth=args.pipeline_depth,
        )


# ------------------------------------------------------------------- the fill
async def _fill(port: int, segment: str, mib: int, clients: int) -> None:
    """``mib`` appends of 1 MiB, each starting with its tag, from ``clients`` connections."""
    filler = os.urandom(MiB - TAG_BYTES)
    target = f"/v1/segments/{segment}"

    async def client(first: int) -> None:
        conn = Connection(port)
        for index in range(first, mib, clients):
            status, _, body = await conn.request(request_bytes("POST", target, tag(index) + filler))
            if status != 200:
                raise RuntimeError(f"append {index}: {status} {body[:200]!r}")
        conn.close()

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(clients))), WAIT_FLUSHED_S)


@dataclass
class FillResult:
    """The 256 MiB fill: append rate, Tier 2 rate during it, and the drain after it."""

    mib: int
    append_s: float
    append_mib_per_s: float
    tier2_mib_per_s_during_load: float
    tier2_mib_during_load: float
    drain_s: float
    tier2_mib_per_s_overall: float
    s3_calls: dict[str, int]


def fill(plan: Plan, server: ServerProcess, moto_log: MotoLog, segment: str) -> FillResult:
    create_segment(server, segment)
    mark = moto_log.mark()
    flushed_before = metric_total(server, FLUSH_METRIC)
    started = time.monotonic()
    asyncio.run(_fill(server.port, segment, plan.fill_mib, plan.fill_clients))
    loaded = time.monotonic()
    flushed_at_load_end = metric_total(server, FLUSH_METRIC)
    wait_flushed(server, segment)
    drained = time.monotonic()
    flushed_after = metric_total(server, FLUSH_METRIC)
    return FillResult(
        mib=plan.fill_mib,
        append_s=loaded - started,
        append_mib_per_s=plan.fill_mib / (loaded - started),
        tier2_mib_per_s_during_load=(flushed_at_load_end - flushed_before) / MiB / (loaded - started),
        tier2_mib_during_load=(flushed_at_load_end - flushed_before) / MiB,
        drain_s=drained - loaded,
        tier2_mib_per_s_overall=(flushed_after - flushed_before) / MiB / (drained - started),
        s3_calls=dict(moto_log.calls(mark, chunk_key_prefix(segment))),
    )


# ---------------------------------------------------------------- the reads
@dataclass
class ReadRun:
    """One sequential read of the whole segment."""

    seconds: float
    mib_per_s: float
    requests: int
    s3_gets: int
    server_cpu: float | None
    moto_cpu: float
    reader_cpu: float


def _cpu_shares(pids: Sequence[int], run: Callable[[], object]) -> tuple[float, list[float], float]:
    """Run ``run``; its wall seconds, the CPU share of each process in ``pids`` and of this one."""
    before = [process_cpu_s(pid) for pid in pids]
    own = time.process_time()
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    own = time.process_time() - own
    shares = [(process_cpu_s(pid) - b) / seconds for pid, b in zip(pids, before, strict=True)]
    return seconds, shares, own / seconds


def push_out_of_cache(plan: Plan, server: ServerProcess, segment: str) -> None:
    """Append, after ``segment``'s bytes, more than its container's cache holds to another of its segments.

    A restart replays Tier 1 from a checkpoint into the cache, which keeps the
    newest blocks: these, so no byte of ``segment`` is cached after a restart.
    """
    count = load_settings({}).container_count
    home = naming.container_for(segment, count)
    names = (f"pusher-{i}" for i in itertools.count())
    pusher = next(name for name in names if naming.container_for(name, count) == home)
    create_segment(server, pusher)
    asyncio.run(_fill(server.port, pusher, plan.cache_max_bytes // count // MiB + 1, plan.fill_clients))
    wait_flushed(server, pusher)


def segstore_read(
    server: ServerProcess, moto: MotoServer, moto_log: MotoLog, segment: str, length: int, read_bytes: int
) -> tuple[ReadRun, list[bytes]]:
    """Read the segment from 0 to ``length`` over one keep-alive connection."""
    check = TagCheck()
    count = 0

    def run() -> None:
        nonlocal count
        conn = http.client.HTTPConnection(HOST, server.port, timeout=60)
        offset = 0
        while offset < length:
            conn.request("GET", f"/v1/segments/{segment}?offset={offset}&length={read_bytes}")
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"read at {offset}: {response.status} {body[:200]!r}")
            next_offset = int(response.getheader("Segment-Next-Offset", "0"))
            if next_offset != offset + len(body) or not body:
                raise RuntimeError(f"read at {offset}: {len(body)} bytes, next offset {next_offset}")
            check.feed(body)
            offset = next_offset
            count += 1
        conn.close()

    mark = moto_log.mark()
    assert moto.proc is not None
    seconds, (worker_cpu, moto_cpu), own = _cpu_shares([worker_pid(server), moto.proc.pid], run)
    run_result = ReadRun(
        seconds=seconds,
        mib_per_s=length / MiB / seconds,
        requests=count,
        s3_gets=moto_log.calls(mark, chunk_key_prefix(segment))["GetObject"],
        server_cpu=worker_cpu,
        moto_cpu=moto_cpu,
        reader_cpu=own,
    )
    return run_result, check.tags


def boto3_read(
    s3: Any, moto: MotoServer, moto_log: MotoLog, bucket: str, objects: list[tuple[str, int]]
) -> tuple[ReadRun, list[bytes]]:
    """GetObject each chunk in order, streaming its body in 1 MiB reads."""
    check = TagCheck()

    def run() -> None:
        for key, size in objects:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"]
            got = 0
            while data := body.read(MiB):
                check.feed(data)
                got += len(data)
            body.close()
            if got != size:
                raise RuntimeError(f"{key}: {got} bytes, listed as {size}")

    mark = moto_log.mark()
    assert moto.proc is not None
    seconds, (moto_cpu,), own = _cpu_shares([moto.proc.pid], run)
    length = sum(size for _, size in objects)
    run_result = ReadRun(
        seconds=seconds,
        mib_per_s=length / MiB / seconds,
        requests=len(objects),
        s3_gets=moto_log.calls(mark, f"{TIER2_PREFIX}/")["GetObject"],
        server_cpu=None,
        moto_cpu=moto_cpu,
        reader_cpu=own,
    )
    return run_result, check.tags


# -------------------------------------------------------- small appends
async def _pipelined(port: int, segment: str, count: int, connections: int, depth: int) -> None:
    """``count`` 100-byte appends from ``connections`` connections, ``depth`` in flight on each.

    ``Connection.request`` writes one request and reads one answer; with
    ``depth - 1`` requests sent ahead, every call keeps ``depth`` in flight,
    and ``request(b"")`` reads the answers still owed at the end.
    """
    request = request_bytes("POST", f"/v1/segments/{segment}", b"s" * SMALL_APPEND_BYTES)

    async def one(n: int) -> None:
        conn = Connection(port)
        await conn.open()
        assert conn.writer is not None
        ahead = min(depth, n) - 1
        conn.writer.write(request * ahead)
        for data in [request] * (n - ahead) + [b""] * ahead:
            status, _, body = await conn.request(data)
            if status != 200:
                raise RuntimeError(f"small append: {status} {body[:200]!r}")
        conn.close()

    shares = [count // connections + (i < count % connections) for i in range(connections)]
    await asyncio.wait_for(asyncio.gather(*(one(n) for n in shares if n)), WAIT_FLUSHED_S)


@dataclass
class SmallRun:
    """One fresh segment of 100-byte appends and what it cost in Tier 2."""

    mib: float
    appends_per_s: float
    flush_wait_s: float
    objects_flushed_per_mib: float
    objects_settled_per_mib: float
    flushes_per_mib: float
    objects_per_flush: float
    put_object_per_mib: float
    s3_requests_per_mib: float
    s3_calls: dict[str, int]


def _object_count(s3: Any, bucket: str, segment: str) -> int:
    return sum(
        page.get("KeyCount", 0)
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=chunk_key_prefix(segment)
        )
    )


def _settled_count(s3: Any, bucket: str, segment: str, timeout_s: float = 120.0) -> int:
    """The segment's object count once it has not changed for SETTLE_S."""
    deadline = time.monotonic() + timeout_s
    count, since = _object_count(s3, bucket, segment), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _object_count(s3, bucket, segment)
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= SETTLE_S:
            return count
    raise RuntimeError(f"{segment}: object count still changing after {timeout_s} s")


def small_run(
    plan: Plan, server: ServerProcess, s3: Any, bucket: str, moto_log: MotoLog, segment: str
) -> SmallRun:
    appends = plan.small_mib * MiB // SMALL_APPEND_BYTES
    create_segment(server, segment)
    mark = moto_log.mark()
    layouts_before = metric_total(server, LAYOUT_METRIC)
    started = time.monotonic()
    asyncio.run(_pipelined(server.port, segment, appends, plan.small_connections, plan.pipeline_depth))
    loaded = time.monotonic()
    length = wait_flushed(server, segment)
    flushed = time.monotonic()
    if length != appends * SMALL_APPEND_BYTES:
        raise RuntimeError(f"{segment}: length {length}, expected {appends * SMALL_APPEND_BYTES}")
    objects_flushed = _object_count(s3, bucket, segment)
    objects_settled = _settled_count(s3, bucket, segment)
    calls = moto_log.calls(mark, chunk_key_prefix(segment))
    defrags = calls["CreateMultipartUpload"]
    flushes = metric_total(server, LAYOUT_METRIC) - layouts_before - defrags
    mib = length / MiB
    return SmallRun(
        mib=mib,
        appends_per_s=appends / (loaded - started),
        flush_wait_s=flushed - loaded,
        objects_flushed_per_mib=objects_flushed / mib,
        objects_settled_per_mib=objects_settled / mib,
        flushes_per_mib=flushes / mib,
        objects_per_flush=(calls["PutObject"] - defrags) / flushes,
        put_object_per_mib=calls["PutObject"] / mib,
        s3_requests_per_mib=sum(calls.values()) / mib,
        s3_calls=dict(calls),
    )


# -------------------------------------------------------------------- run
def measure(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Run every measurement of the plan; returns the JSON document."""
    fake_aws_environment()
    doc: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1m_before": os.getloadavg()[0],
        },
        "plan": asdict(plan),
    }
    bucket = f"segstore-bench-{uuid.uuid4().hex[:12]}"
    segment = "catchup"
    reads: dict[str, list[ReadRun]] = {"segstore": [], "boto3": []}
    smalls: list[SmallRun] = []
    with MotoServer(workdir / "moto.log") as moto:
        s3 = make_client(moto.url)
        s3.create_bucket(Bucket=bucket)
        moto_log = MotoLog(moto.log_path, bucket)
        env = {
            "SEGSTORE_LOG_LEVEL": "warning",
            "SEGSTORE_TIER2": f"s3://{bucket}/{TIER2_PREFIX}",
            "SEGSTORE_S3_ENDPOINT": moto.url,
            "SEGSTORE_CACHE_MAX_BYTES": str(plan.cache_max_bytes),
        }
        with ServerProcess(workdir / "data", env=env) as server:
            progress(f"filling {segment} with {plan.fill_mib} MiB of 1 MiB appends")
            filled = fill(plan, server, moto_log, segment)
            push_out_of_cache(plan, server, segment)
            length = plan.fill_mib * MiB
            expected_tags = [tag(i) for i in range(plan.fill_mib)]
            for r in range(plan.repeat):
                progress(f"run {r + 1}/{plan.repeat}: restart, then catch-up reads")
                restart(server)
                objects = chunk_objects(s3, bucket, segment)
                run, seg_tags = segstore_read(server, moto, moto_log, segment, length, plan.read_bytes)
                reads["segstore"].append(run)
                run, boto_tags = boto3_read(s3, moto, moto_log, bucket, objects)
                reads["boto3"].append(run)
                if seg_tags != boto_tags or sorted(seg_tags) != expected_tags:
                    raise RuntimeError("segstore and boto3 read different bytes")
            doc["chunk_objects"] = [size for _, size in objects]
            for r in range(plan.repeat):
                progress(f"run {r + 1}/{plan.repeat}: {plan.small_mib} MiB of 100-byte appends")
                smalls.append(small_run(plan, server, s3, bucket, moto_log, f"small-r{r}"))
    doc["machine"]["loadavg_1m_after"] = os.getloadavg()[0]
    doc["catch_up_read"] = {
        kind: {
            name: asdict(s)
            for name in ReadRun.__dataclass_fields__
            if (s := spread_of(runs, name)) is not None
        }
        for kind, runs in reads.items()
    }
    doc["catch_up_read"]["segstore_over_boto3"] = asdict(
        Spread.of(
            [s.mib_per_s / b.mib_per_s for s, b in zip(reads["segstore"], reads["boto3"], strict=True)]
        )
    )
    doc["fill"] = asdict(filled)
    doc["small_appends"] = {
        name: asdict(s)
        for name in SmallRun.__dataclass_fields__
        if name != "s3_calls" and (s := spread_of(smalls, name)) is not None
    }
    doc["small_appends"]["s3_calls_per_run"] = [run.s3_calls for run in smalls]
    return doc


def render(doc: dict[str, Any]) -> str:
    """The human-readable report of a ``measure`` document."""
    plan = doc["plan"]
    machine = doc["machine"]
    reads = doc["catch_up_read"]
    filled = doc["fill"]
    small = doc["small_appends"]

    def spread(d: dict[str, float], fmt: str = "{:,.1f}") -> str:
        return Spread(d["min"], d["median"], d["max"]).show(fmt)

    def median(d: dict[str, Any], name: str, fmt: str = "{:.0%}") -> str:
        return fmt.format(d[name]["median"]) if name in d else "-"

    ratio = reads["segstore_over_boto3"]
    verdict = "met" if ratio["median"] >= TARGET_READ_RATIO else "NOT met"
    sizes = doc["chunk_objects"]
    seg, boto = reads["segstore"], reads["boto3"]
    calls = ", ".join(f"{n} {c}" for c, n in sorted(filled["s3_calls"].items()))
    lines = [
        f"segstore Tier 2 on S3 benchmark: {machine['cpus']} CPUs, Python {machine['python']}, "
        f"1-minute load average {machine['loadavg_1m_before']:.2f} before, "
        f"{machine['loadavg_1m_after']:.2f} after",
        f"S3 is moto in server mode on loopback; {plan['repeat']} run(s); figures are "
        "min / median / max over runs, CPU is the median share of one core",
        "moto answers each request in milliseconds and keeps objects in memory: flush figures show "
        "segstore against moto, they are not the speed of S3",
        "",
        f"(1) catch-up read of a {plan['fill_mib']} MiB segment from offset 0, one sequential reader, "
        f"cold cache (cache_max_bytes {plan['cache_max_bytes'] // MiB} MiB); "
        f"{len(sizes)} chunk objects of {min(sizes) / MiB:.1f} to {max(sizes) / MiB:.1f} MiB",
        f"  segstore, GETs of {plan['read_bytes'] // MiB} MiB:  {spread(seg['mib_per_s'])} MiB/s  "
        f"({median(seg, 's3_gets', '{:.0f}')} S3 GETs; CPU worker {median(seg, 'server_cpu')}, "
        f"moto {median(seg, 'moto_cpu')}, "
        f"reader {median(seg, 'reader_cpu')})",
        f"  boto3 from moto directly:   {spread(boto['mib_per_s'])} MiB/s  "
        f"({median(boto, 's3_gets', '{:.0f}')} S3 GETs; CPU moto {median(boto, 'moto_cpu')}, "
        f"reader {median(boto, 'reader_cpu')})",
        f"  segstore / boto3, paired:   {spread(ratio, '{:.2f}')}  "
        f"[target >= {TARGET_READ_RATIO}: {verdict}]",
        "",
        f"(2) flush to S3 while appending {filled['mib']} MiB in 1 MiB appends from "
        f"{plan['fill_clients']} clients (once per run)",
        f"  appends:                    {filled['append_mib_per_s']:.1f} MiB/s "
        f"for {filled['append_s']:.1f} s",
        f"  Tier 2 during the load:     {filled['tier2_mib_per_s_during_load']:.1f} MiB/s "
        f"({filled['tier2_mib_during_load']:.0f} MiB of {filled['mib']})",
        f"  last append -> all flushed: {filled['drain_s']:.2f} s; first append -> all flushed: "
        f"{filled['tier2_mib_per_s_overall']:.1f} MiB/s",
        f"  S3 calls on the segment:    {calls}",
        "",
        f"(3) {plan['small_mib']} MiB of 100-byte appends per run to a fresh segment, "
        f"{plan['small_connections']} connections, {plan['pipeline_depth']} in flight on each",
        f"  appends/s:                  {spread(small['appends_per_s'], '{:,.0f}')}",
        f"  last append -> flushed, s:  {spread(small['flush_wait_s'], '{:.2f}')}",
        f"  flushes per MiB:            {spread(small['flushes_per_mib'], '{:.2f}')}  "
        f"(appends per MiB: {MiB / SMALL_APPEND_BYTES:,.0f})",
        f"  objects per flush:          {spread(small['objects_per_flush'], '{:.2f}')}",
        f"  objects per MiB, flushed:   {spread(small['objects_flushed_per_mib'], '{:.2f}')}",
        f"  objects per MiB, settled:   {spread(small['objects_settled_per_mib'], '{:.2f}')}",
        f"  PutObject per MiB:          {spread(small['put_object_per_mib'], '{:.2f}')}",
        f"  S3 requests per MiB:        {spread(small['s3_requests_per_mib'], '{:.2f}')}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the report, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.tier2", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB fill, 4 MiB of small appends, one run")
    parser.add_argument("--repeat", type=int, default=0, help="runs of (1) and (3) (3, quick: 1)")
    parser.add_argument("--fill-mib", type=int, default=0, help="MiB of the read segment (256, quick: 64)")
    parser.add_argument("--fill-clients", type=int, default=4, help="clients filling the read segment")
    parser.add_argument("--cache-mib", type=int, default=64, help="segstore's cache_max_bytes, MiB")
    parser.add_argument("--small-mib", type=int, default=0, help="MiB of 100-byte appends (16, quick: 4)")
    parser.add_argument("--small-connections", type=int, default=16, help="connections for (3)")
    parser.add_argument("--pipeline-depth", type=int, default=8, help="requests in flight per connection")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary directory goes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    plan = Plan.build(args)
    return run_in_workdir("segstore-bench-tier2-", args.dir, lambda d: measure(plan, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
