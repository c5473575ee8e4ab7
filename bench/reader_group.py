"""Reader group benchmark: fetch throughput against raw ranged reads, and the takeover after a kill -9.

``python -m bench.reader_group [--pairs N] [--kills K] [--mib M] [--json PATH]`` measures, on one
segstore server (gunicorn + gevent, started as ``make run`` does):

(a) throughput, paired: a stream of 6 segments holding ``--mib`` MiB of
    1 KiB events is read whole by 3 reader processes (i) with raw ranged
    reads (``GET /v1/segments/{name}?offset&length``, 1 MiB each; each
    process reads 2 segments and decodes the events from their frames, as a
    reader of the stream must, with the client's ``frames_to_events``), and
    (ii) through a reader group (each process a ``StreamReader``: fetches of
    1 MiB in the frames form, events decoded, positions committed every
    second), one after the other, ``--pairs`` times (the order alternates;
    processes start before the clock does); the ratio (ii)/(i) of each pair
    (target >= 0.8);
    (b) takeover: 3 reader processes of a group with a 10 s lease read a
    stream of 6 segments that writers keep filling; one is killed with -9;
    the time from the kill to the first event of one of its segments
    fetched by another reader; then a new reader joins and, once the 6
    segments are shared 2/2/2 again, the next kill; ``--kills`` times.

Everything runs in a temporary directory and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Spread, progress, run_in_workdir
from bench.servers import ROOT, ServerProcess
from client.events import HEADER_BYTES
from client.reader_group import ReaderGroup, frames_to_events
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from client.stream_writer import StreamWriter

EVENT_BYTES = 1024
SEGMENTS = 6
READERS = 3
READ_BYTES = 1 << 20
LEASE_S = 10.0
TARGET_RATIO = 0.8
SERVER_ENV = {"SEGSTORE_LOG_LEVEL": "warning"}


# ------------------------------------------------------------------ reader processes
def _ready() -> None:
    """Say the process has started, and wait for the go (so start-up is not timed)."""
    print("ready", flush=True)
    sys.stdin.readline()


def _raw_reader(url: str, segments: list[str]) -> None:
    """Read ``segments`` whole with ranged reads of READ_BYTES, decoding the events (as a reader must)."""
    with SegmentClient(url) as client:
        lengths = {name: client.info(name).length for name in segments}
        _ready()
        for name, length in lengths.items():
            offset = 0
            while offset < length:
                data = client.read(name, offset, READ_BYTES).data
                events = frames_to_events(name, offset, data[: _whole_frames(data)])
                offset = events[-1].offset + HEADER_BYTES + len(events[-1].data)


def _whole_frames(data: bytes) -> int:
    """How many bytes of ``data`` whole frames take."""
    position = 0
    while len(data) - position >= HEADER_BYTES:
        end = position + HEADER_BYTES + int.from_bytes(data[position : position + HEADER_BYTES], "big")
        if end > len(data):
            break
        position = end
    return position


def _group_reader(url: str, group: str, name: str, total: int, counter: Path) -> None:
    """Read through the group until the group's readers together read ``total`` events (a file each)."""
    with SegmentClient(url) as client:
        reader = ReaderGroup(client, "sc", group).reader(name, wait_s=0.05, max_bytes=READ_BYTES)
        reader.join()
        _ready()
        count = 0
        while True:
            count += len(reader.fetch())
            counter.write_text(str(count))
            done = sum(int(p.read_text() or 0) for p in counter.parent.glob(f"{group}-*.count"))
            if done >= total:
                reader.commit()
                return


def _takeover_reader(url: str, name: str, out: str) -> None:
    """Read the ``kills`` group forever, one line per fetch: ``{"t", "segments": [...]}``."""
    with SegmentClient(url) as client, open(out, "a", encoding="utf-8") as sink:
        reader = ReaderGroup(client, "sc", "kills").reader(name, wait_s=0.5)
        while True:
            events = reader.fetch()
            if events:
                line = {"t": time.time(), "segments": sorted({e.segment for e in events})}
                sink.write(json.dumps(line) + "\n")
                sink.flush()


def _spawn(*args: str, timed: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE} if timed else {}
    return subprocess.Popen([sys.executable, "-m", "bench.reader_group", *args], cwd=ROOT, env=env, **pipes)


def _timed(procs: list[subprocess.Popen[bytes]]) -> float:
    """Once every process is ready, let them go together; the seconds until the last one ends."""
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    began = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.wait() == 0
    return time.perf_counter() - began


# ------------------------------------------------------------------ (a) throughput
def _fill(client: SegmentClient, stream: str, mib: int) -> int:
    """``mib`` MiB of 1 KiB events spread over the stream's keys; returns the events' count."""
    count = mib * 1024
    payload = b"x" * EVENT_BYTES
    with StreamWriter(client, "sc", stream) as writer:
        for i in range(count):
            writer.write(payload, routing_key=f"k{i % 600}")
    return count


def _raw_pass(url: str) -> float:
    names = [f"sc/bulk/{i}" for i in range(SEGMENTS)]
    return _timed([_spawn("--raw", url, *names[i::READERS], timed=True) for i in range(READERS)])


def _group_pass(client: SegmentClient, url: str, workdir: Path, run: int, total: int) -> float:
    group = f"bulk{run}"
    ReaderGroup(client, "sc", group).create(["bulk"], lease_s=LEASE_S)
    procs = [
        _spawn("--group", url, group, f"r{i}", str(total), str(workdir / f"{group}-r{i}.count"), timed=True)
        for i in range(READERS)
    ]
    elapsed = _timed(procs)
    ReaderGroup(client, "sc", group).delete()
    return elapsed


def throughput(server: ServerProcess, workdir: Path, pairs: int, mib: int) -> dict[str, Any]:
    with SegmentClient(server.url) as client:
        StreamClient(client).create_stream("sc", "bulk", segments=SEGMENTS)
        progress(f"filling {mib} MiB of 1 KiB events")
        total = _fill(client, "bulk", mib)
        size = sum(client.info(f"sc/bulk/{i}").length for i in range(SEGMENTS))
        raw, grouped, ratios = [], [], []
        for run in range(pairs):
            if run % 2 == 0:
                raw_s, group_s = _raw_pass(server.url), _group_pass(client, server.url, workdir, run, total)
            else:
                group_s, raw_s = _group_pass(client, server.url, workdir, run, total), _raw_pass(server.url)
            raw.append(size / raw_s / 2**20)
            grouped.append(size / group_s / 2**20)
            ratios.append(raw_s / group_s)
            progress(f"pair {run + 1}: raw {raw[-1]:.0f} MiB/s, group {grouped[-1]:.0f} MiB/s")
    return {
        "bytes": size,
        "events": total,
        "raw_mib_s": Spread.of(raw),
        "group_mib_s": Spread.of(grouped),
        "ratio": Spread.of(ratios),
    }


# ------------------------------------------------------------------ (b) takeover
def _held(group: ReaderGroup) -> dict[str, list[str]]:
    return {r["reader"]: sorted(r["segments"]) for r in group.state()["readers"]}


def _wait_for(predicate: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting until {what}")
        time.sleep(0.1)


def takeover(server: ServerProcess, workdir: Path, kills: int) -> dict[str, Any]:
    with SegmentClient(server.url) as client:
        StreamClient(client).create_stream("sc", "live", segments=SEGMENTS)
        group = ReaderGroup(client, "sc", "kills")
        group.create(["live"], lease_s=LEASE_S)
        stop = threading.Event()
        writer = threading.Thread(target=_keep_writing, args=(server.url, stop), daemon=True)
        writer.start()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        outs: dict[str, Path] = {}
        times: list[float] = []
        try:
            for n in range(kills + READERS):
                if len(procs) == READERS:
                    times.append(_kill_one(group, procs, outs))
                    progress(f"kill {len(times)}: taken over in {times[-1]:.2f} s")
                name = f"r{n}"
                outs[name] = workdir / f"{name}.jsonl"
                procs[name] = _spawn("--takeover", server.url, name, str(outs[name]))
                if len(procs) == READERS:
                    _wait_for(lambda: sorted(map(len, _held(group).values())) == [2, 2, 2], "2/2/2", 120)
        finally:
            stop.set()
            for proc in procs.values():
                proc.kill()
                proc.wait()
            writer.join(10)
    return {"lease_s": LEASE_S, "takeover_s": Spread.of(times)}


def _kill_one(group: ReaderGroup, procs: dict[str, subprocess.Popen[bytes]], outs: dict[str, Path]) -> float:
    victim = min(procs)
    segments = set(_held(group)[victim])
    proc = procs.pop(victim)
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.time()
    proc.wait()
    found: list[float] = []

    def taken() -> bool:
        for name in procs:
            for raw in outs[name].read_text().splitlines() if outs[name].exists() else []:
                line = json.loads(raw)
                if line["t"] > killed and segments & set(line["segments"]):
                    found.append(line["t"])
        return bool(found)

    _wait_for(taken, "the victim's segments are read", LEASE_S * 4)
    return min(found) - killed


def _keep_writing(url: str, stop: threading.Event) -> None:
    with SegmentClient(url) as client, StreamWriter(client, "sc", "live") as writer:
        n = 0
        while not stop.is_set():
            writer.write(b"y" * EVENT_BYTES, routing_key=f"k{n % 600}")
            n += 1
            time.sleep(0.001)


# ------------------------------------------------------------------ main
def measure(workdir: Path, pairs: int, kills: int, mib: int) -> dict[str, Any]:
    with ServerProcess(workdir / "data", env=SERVER_ENV) as server:
        StreamClient(SegmentClient(server.url)).create_scope("sc")
        doc = {"throughput": throughput(server, workdir, pairs, mib) if pairs else None}
        doc["takeover"] = takeover(server, workdir, kills) if kills else None
    doc["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return doc


def render(doc: dict[str, Any]) -> str:
    lines = ["reader groups (min / median / max)"]
    found = doc["throughput"]
    if found:
        ratio = found["ratio"]
        lines += [
            f"  {found['bytes'] / 2**20:.0f} MiB, {found['events']} events of {EVENT_BYTES} B, "
            f"{SEGMENTS} segments, {READERS} reader processes",
            f"  raw ranged reads  MiB/s  {found['raw_mib_s'].show('{:,.1f}')}",
            f"  reader group      MiB/s  {found['group_mib_s'].show('{:,.1f}')}",
            f"  ratio (target >= {TARGET_RATIO})  {ratio.show('{:.2f}')}",
        ]
    taken = doc["takeover"]
    if taken:
        spread = taken["takeover_s"]
        lines.append(f"  takeover after kill -9, lease {taken['lease_s']:g} s, {len(spread.runs)} kills: "
                     f"{spread.show('{:.2f}')} s")
    lines.append(f"  load: {doc['uptime']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--raw":
        _raw_reader(argv[1], argv[2:])
        return 0
    if argv and argv[0] == "--group":
        _group_reader(argv[1], argv[2], argv[3], int(argv[4]), Path(argv[5]))
        return 0
    if argv and argv[0] == "--takeover":
        _takeover_reader(argv[1], argv[2], argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    return run_in_workdir(
        "reader-group-", None, lambda w: measure(w, args.pairs, args.kills, args.mib), render, args.json
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
