"""Streams benchmark: StreamWriter against EventWriter, a writer's stall during splits, auto-scale reaction.

``python -m bench.stream_writer [--rounds N] [--duration S] [--scales N] [--reactions N] [--json PATH]``
starts one segstore server as ``make run`` does (auto-scaling windows of
seconds: ``stream_scale_sample_s`` 0.5, ``stream_scale_window_s`` 2,
``stream_scale_cooldown_s`` 2) and measures:

(a) events/s of 100-byte events, acknowledged: ``StreamWriter`` with 16 routing
    keys over a stream of 4 segments, against ``EventWriter`` on one
    segment; each round runs both, in alternating order, the same number of
    writers (one thread each, in client processes) in a closed loop for the
    same time; the ratio per round (target: at least 0.8);
(b) the longest stall a writer sees while its segment splits under load:
    writers write 64 keys in cycles of 50 events then ``flush()``; while
    they run, the stream's segment covering the most keys splits in two
    (``--scales`` times); a scale's stall is the longest cycle that overlaps
    it (the time from the cycle's first write to its flush returning), next
    to the median cycle without a scale;
(c) auto-scale reaction time: a stream with ``events_per_s`` target 50 gets
    about 500 events/s; seconds from the load's start until its epoch 1.
    The expected value is about the window plus a sample interval.

Figures: min / median / max over rounds, scales and reactions; the machine's
load (``uptime``) is printed with them.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Spread, progress, run_in_workdir, wait_writer_idle
from bench.servers import ServerProcess
from client.events import EventWriter
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from client.stream_writer import StreamWriter

EVENT_BYTES = 100
KEYS = 16
SEGMENTS = 4
TARGET_RATIO = 0.8
CYCLE_EVENTS = 50
SERVER_ENV = {
    "SEGSTORE_LOG_LEVEL": "warning",
    "SEGSTORE_STREAM_SCALE_SAMPLE_S": "0.5",
    "SEGSTORE_STREAM_SCALE_WINDOW_S": "2",
    "SEGSTORE_STREAM_SCALE_COOLDOWN_S": "2",
}


# ----------------------------------------------------------------- (a) throughput
def _writer_process(url: str, kind: str, target: str, threads: int, duration_s: float, barrier: Any,
                    results: Any) -> None:
    """``threads`` writers of ``kind`` writing 100-byte events for ``duration_s``; reports how many."""
    try:
        client = SegmentClient(url)
        payload = b"e" * EVENT_BYTES
        counts = [0] * threads

        def run(index: int) -> None:
            if kind == "stream":
                scope, stream = target.split("/")
                writer: StreamWriter | EventWriter = StreamWriter(client, scope, stream)
            else:
                writer = EventWriter(client, target)
            with writer:
                stop = time.monotonic() + duration_s
                sent = 0
                while time.monotonic() < stop:
                    for i in range(100):
                        if isinstance(writer, StreamWriter):
                            writer.write(payload, f"key-{(sent + i) % KEYS}")
                        else:
                            writer.write(payload)
                    sent += 100
                writer.flush()
            counts[index] = sent

        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        barrier.wait(60)
        started = time.monotonic()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        results.put((sum(counts), time.monotonic() - started))
    except BaseException as exc:
        barrier.abort()
        results.put(f"writer process failed: {exc!r}")


def _throughput(url: str, kind: str, target: str, writers: int, processes: int, duration_s: float) -> float:
    ctx = mp.get_context("fork")
    processes = max(1, min(processes, writers))
    shares = [writers // processes + (i < writers % processes) for i in range(processes)]
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_writer_process, args=(url, kind, target, n, duration_s, barrier, results))
        for n in shares
    ]
    for proc in procs:
        proc.start()
    barrier.wait(60)
    outcomes = [results.get(timeout=duration_s + 120) for _ in procs]
    for proc in procs:
        proc.join(30)
    failures = [o for o in outcomes if isinstance(o, str)]
    if failures:
        raise RuntimeError("; ".join(failures))
    return sum(o[0] for o in outcomes) / max(o[1] for o in outcomes)


def throughput_rounds(server: ServerProcess, rounds: int, duration_s: float, writers: int,
                      processes: int) -> list[dict[str, float]]:
    client = SegmentClient(server.url)
    streams = StreamClient(client)
    streams.create_scope("bench")
    rows = []
    for number in range(rounds):
        stream = f"t{number}"
        streams.create_stream("bench", stream, segments=SEGMENTS)
        segment = f"bench/one/{number}"
        client.create(segment)
        order = ["stream", "event"] if number % 2 == 0 else ["event", "stream"]
        rates: dict[str, float] = {}
        for kind in order:
            wait_writer_idle(server)
            target = f"bench/{stream}" if kind == "stream" else segment
            rates[kind] = _throughput(server.url, kind, target, writers, processes, duration_s)
        rows.append({"stream_events_per_s": rates["stream"], "event_events_per_s": rates["event"],
                     "ratio": rates["stream"] / rates["event"]})
        progress(f"round {number + 1}: StreamWriter {rates['stream']:,.0f}/s, EventWriter "
                 f"{rates['event']:,.0f}/s, ratio {rows[-1]['ratio']:.2f}")
    return rows


# -------------------------------------------------------------------- (b) stalls
def stalls(server: ServerProcess, scales: int, writers: int) -> dict[str, Any]:
    """Writers in flush cycles while the busiest segment splits ``scales`` times."""
    client = SegmentClient(server.url)
    streams = StreamClient(client)
    streams.create_scope("bench")
    streams.create_stream("bench", "split", segments=1)
    cycles: list[tuple[float, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with StreamWriter(client, "bench", "split") as writer:
                sent = 0
                while not stop.is_set():
                    began = time.monotonic()
                    for i in range(CYCLE_EVENTS):
                        writer.write(b"s" * EVENT_BYTES, f"key-{(sent + i) % 64}")
                    writer.flush()
                    sent += CYCLE_EVENTS
                    with lock:
                        cycles.append((began, time.monotonic()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    windows = []
    for _ in range(scales):
        _, segments = streams.segments("bench", "split")
        widest = max(segments, key=lambda s: s.key_hi - s.key_lo)
        middle = (widest.key_lo + widest.key_hi) / 2
        started = time.monotonic()
        streams.scale("bench", "split", [widest.id], [(widest.key_lo, middle), (middle, widest.key_hi)])
        windows.append((started, time.monotonic()))
        time.sleep(1.5)
    stop.set()
    for thread in threads:
        thread.join(60)
    if errors:
        raise RuntimeError(f"a writer failed: {errors[0]!r}")
    per_scale = []
    for started, ended in windows:
        overlapping = [b - a for a, b in cycles if a <= ended and b >= started]
        per_scale.append(max(overlapping) if overlapping else 0.0)
    quiet = [b - a for a, b in cycles if not any(a <= e and b >= s for s, e in windows)]
    return {
        "stall_s": Spread.of(per_scale),
        "scale_s": Spread.of([e - s for s, e in windows]),
        "quiet_cycle_median_s": statistics.median(quiet),
        "cycles": len(cycles),
    }


# ---------------------------------------------------------------- (c) reactions
def reactions(server: ServerProcess, count: int) -> Spread:
    """Seconds from a load of ten times the target until the stream's first split."""
    client = SegmentClient(server.url)
    streams = StreamClient(client)
    streams.create_scope("bench")
    found = []
    for number in range(count):
        stream = f"auto{number}-{uuid.uuid4().hex[:6]}"
        streams.create_stream("bench", stream, segments=1, scaling={"type": "events_per_s", "target": 50})
        with StreamWriter(client, "bench", stream, linger_s=0.01) as writer:
            started = time.monotonic()
            while streams.stream("bench", stream)["epoch"] < 1:
                if time.monotonic() - started > 60:
                    raise RuntimeError(f"{stream} did not split within 60 s")
                for i in range(25):
                    writer.write(b"a" * EVENT_BYTES, f"key-{i}")
                writer.flush()
                time.sleep(0.05)  # about 500 events/s
            found.append(time.monotonic() - started)
        progress(f"reaction {number + 1}: {found[-1]:.2f} s")
    return Spread.of(found)


# ---------------------------------------------------------------------- main
def measure(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with ServerProcess(workdir / "data", env=SERVER_ENV) as server:
        rows = throughput_rounds(server, args.rounds, args.duration, args.writers, args.processes)
        progress("stalls during splits")
        split = stalls(server, args.scales, args.writers)
        progress("auto-scale reaction")
        reaction = reactions(server, args.reactions)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {
        "rounds": rows,
        "ratio": Spread.of([r["ratio"] for r in rows]),
        "stream_events_per_s": Spread.of([r["stream_events_per_s"] for r in rows]),
        "event_events_per_s": Spread.of([r["event_events_per_s"] for r in rows]),
        "split": split,
        "reaction_s": reaction,
        "writers": args.writers,
        "duration_s": args.duration,
        "uptime": load,
    }


def render(doc: dict[str, Any]) -> str:
    split = doc["split"]
    ratio = doc["ratio"]
    verdict = "met" if ratio.median >= TARGET_RATIO else "NOT met"
    return "\n".join([
        f"StreamWriter ({KEYS} keys, {SEGMENTS} segments) against EventWriter (one segment), "
        f"{EVENT_BYTES}-byte events, {doc['writers']} writers, {doc['duration_s']:g} s per run, "
        f"{len(doc['rounds'])} paired rounds (min / median / max):",
        f"  StreamWriter events/s   {doc['stream_events_per_s'].show()}",
        f"  EventWriter events/s    {doc['event_events_per_s'].show()}",
        f"  ratio                   {ratio.show('{:.2f}')}  (target >= {TARGET_RATIO}: {verdict})",
        f"Longest writer stall while its segment splits ({len(split['stall_s'].runs)} scales, "
        f"cycles of {CYCLE_EVENTS} events then flush):",
        f"  stall s                 {split['stall_s'].show('{:.3f}')}",
        f"  scale request s         {split['scale_s'].show('{:.3f}')}",
        f"  quiet cycle median s    {split['quiet_cycle_median_s']:.3f}",
        "Auto-scale reaction (events_per_s target 50, about 500 events/s; window 2 s, sample 0.5 s):",
        f"  seconds to the split    {doc['reaction_s'].show('{:.2f}')}",
        f"machine: {doc['uptime']}",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rounds", type=int, default=5, help="paired throughput rounds")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per throughput run")
    parser.add_argument("--writers", type=int, default=4, help="writers (one thread each)")
    parser.add_argument("--processes", type=int, default=2, help="client processes the writers share")
    parser.add_argument("--scales", type=int, default=10, help="splits under load")
    parser.add_argument("--reactions", type=int, default=5, help="auto-scale reactions timed")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--workdir", default=None, help="parent of the temporary folder")
    args = parser.parse_args(argv)
    prefix = "segstore-bench-stream-writer-"
    return run_in_workdir(prefix, args.workdir, lambda w: measure(w, args), render, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
