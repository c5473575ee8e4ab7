"""Reader groups with a real server and readers in processes of their own: a reader killed with -9,
a reader stopped past its lease, a merge read in order, and a checkpoint restarted from exactly once.

Leases are seconds-scale (``LEASE_S``) so the handovers are quick.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.servers import ROOT, ServerProcess
from client.errors import ReaderFenced
from client.events import HEADER_BYTES
from client.reader_group import ReaderGroup, StreamReader
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from tests.polling import wait_until
from tests.processes import killed_at_exit

pytestmark = [pytest.mark.process]

LEASE_S = 2.0
ENV = {"SEGSTORE_LOG_LEVEL": "warning", "SEGSTORE_FLUSH_THRESHOLD_MS": "20"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with killed_at_exit(ServerProcess(tmp_path / "data", env=ENV)) as started:
        yield started


@pytest.fixture
def client(server: ServerProcess) -> Iterator[SegmentClient]:
    with SegmentClient(server.url) as made:
        yield made


class Writer:
    """A thread writing numbered events ``w<n>`` with keys spread over the stream, until stopped."""

    def __init__(self, client: SegmentClient, stream: str) -> None:
        self.streams = StreamClient(client)
        self.stream = stream
        self.written: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def write(self, count: int) -> None:
        for _ in range(count):
            payload = f"w{len(self.written)}"
            self.streams.write_event("sc", self.stream, payload.encode(), routing_key=payload)
            self.written.append(payload)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.write(1)
            time.sleep(0.002)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _stream(client: SegmentClient, segments: int) -> StreamClient:
    """Stream ``sc/st`` of ``segments`` segments; the stream API that made it."""
    streams = StreamClient(client)
    streams.create_scope("sc")
    streams.create_stream("sc", "st", segments=segments)
    return streams


def _group(client: SegmentClient, lease_s: float = LEASE_S) -> ReaderGroup:
    """Group ``sc/g`` over stream ``sc/st``, from its head."""
    group = ReaderGroup(client, "sc", "g")
    group.create(["st"], lease_s=lease_s)
    return group


def _reader(server: ServerProcess, name: str, out: Path, *flags: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.scopes.group_reader", server.url, "sc", "g", name, str(out), *flags]
    return subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _lines(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(raw) for raw in out.read_text().splitlines() if raw.endswith("}")]


def _held(group: ReaderGroup) -> dict[str, list[str]]:
    return {r["reader"]: sorted(r["segments"]) for r in group.state()["readers"]}


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_killed_readers_segments_go_to_the_others_and_every_event_is_read(
    server: ServerProcess, client: SegmentClient, tmp_path: Path
) -> None:
    _stream(client, 6)
    group = _group(client)
    writer = Writer(client, "st").start()
    outs = {name: tmp_path / f"{name}.jsonl" for name in ("r0", "r1", "r2")}
    procs = {name: _reader(server, name, out) for name, out in outs.items()}
    try:
        wait_until(
            lambda: sorted(map(len, _held(group).values())) == [2, 2, 2], "three readers hold two each", 30
        )
        wait_until(lambda: all(_lines(out) for out in outs.values()), "every reader read", 30)
        victim = _held(group)["r0"]
        procs["r0"].kill()
        killed_at = time.time()
        procs["r0"].wait(10)

        def taken_over() -> bool:
            found = {
                line["s"] for name in ("r1", "r2") for line in _lines(outs[name]) if line["t"] > killed_at
            }
            return set(victim) <= found

        wait_until(taken_over, "the killed reader's segments are read by the others", LEASE_S + 15)
        takeover_s = time.time() - killed_at
        assert takeover_s < LEASE_S + 3, takeover_s  # the lease, one fetch, the polling
        writer.stop()

        def all_read() -> bool:
            read = {line["d"] for out in outs.values() for line in _lines(out) if "d" in line}
            return set(writer.written) <= read

        wait_until(all_read, "every event written is read", 30)
    finally:
        writer.stop()
        _stop_all(list(procs.values()))
    deliveries: dict[str, list[str]] = {}
    for name, out in outs.items():
        for line in _lines(out):
            if "d" in line:
                deliveries.setdefault(line["d"], []).append(name)
    for payload, readers in deliveries.items():
        assert readers.count("r1") + readers.count("r2") <= 1, (payload, readers)  # again only after the kill


def test_a_reader_stopped_past_its_lease_is_fenced_and_changes_nothing(
    server: ServerProcess, client: SegmentClient, tmp_path: Path
) -> None:
    _stream(client, 2)
    group = _group(client, lease_s=1.0)
    Writer(client, "st").write(50)
    out = tmp_path / "a.jsonl"
    stopped = _reader(server, "a", out, "--exit-when-fenced")
    other = _reader(server, "b", tmp_path / "b.jsonl")
    try:
        wait_until(lambda: sorted(map(len, _held(group).values())) == [1, 1], "each reader holds one", 30)
        generation = next(r["generation"] for r in group.state()["readers"] if r["reader"] == "a")
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_until(lambda: _held(group).get("b", []) == ["sc/st/0", "sc/st/1"], "b holds both segments", 20)
        os.kill(stopped.pid, signal.SIGCONT)
        assert stopped.wait(20) == 3
        assert any(line.get("fenced") == generation for line in _lines(out))
        other.kill()
        other.wait(10)
        before = group.state()
        held = {s: p for r in before["readers"] for s, p in r["segments"].items()} | before["unassigned"]
        stale = StreamReader(group, "a")
        stale.generation = generation
        stale._served = {"sc/st/0": 10**6, "sc/st/1": 10**6}
        with pytest.raises(ReaderFenced):
            stale.commit()
        with pytest.raises(ReaderFenced):
            stale._fetch()
        after = group.state()
        assert {s: p for r in after["readers"] for s, p in r["segments"].items()} | after[
            "unassigned"
        ] == held
        assert "a" not in {r["reader"] for r in after["readers"]}
    finally:
        if stopped.poll() is None:
            os.kill(stopped.pid, signal.SIGCONT)
        _stop_all([stopped, other])


def test_a_merged_successor_waits_until_both_predecessors_are_read(client: SegmentClient) -> None:
    streams = _stream(client, 2)
    writer = Writer(client, "st")
    writer.write(40)
    streams.scale("sc", "st", [0, 1], [(0.0, 1.0)])
    writer.write(20)
    group = _group(client)
    delivered: list[tuple[str, float]] = []
    lock = threading.Lock()
    done = threading.Event()

    def read(name: str) -> None:
        with group.reader(name, wait_s=0.2) as reader:
            while not done.is_set():
                for event in reader.fetch():
                    if event.segment == "sc/st/1":
                        time.sleep(0.05)  # slow on one predecessor
                    with lock:
                        delivered.append((event.segment, time.monotonic()))

    threads = [threading.Thread(target=read, args=(n,), daemon=True) for n in ("fast", "slow")]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(delivered) >= 60, "every event is read", 30)
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
    assert Counter(s for s, _ in delivered) == Counter({"sc/st/2": 20, **Counter(_segments_of(client, 40))})
    last_predecessor = max(t for s, t in delivered if s != "sc/st/2")
    first_successor = min(t for s, t in delivered if s == "sc/st/2")
    assert first_successor > last_predecessor


def _segments_of(client: SegmentClient, count: int) -> list[str]:
    """The segment of each of the first ``count`` events (those written before the merge)."""
    found = []
    for segment in ("sc/st/0", "sc/st/1"):
        found.extend([segment] * len(_frames(client, segment, 0)))
    assert len(found) == count
    return found


def _frames(client: SegmentClient, segment: str, offset: int) -> list[str]:
    data = client.read(segment, offset).data
    out = []
    while data:
        size = int.from_bytes(data[:HEADER_BYTES], "big")
        out.append(data[HEADER_BYTES : HEADER_BYTES + size].decode())
        data = data[HEADER_BYTES + size :]
    return out


def test_a_checkpoint_a_crash_and_a_reset_read_every_later_event_exactly_once(
    server: ServerProcess, client: SegmentClient, tmp_path: Path
) -> None:
    _stream(client, 3)
    group = _group(client)
    writer = Writer(client, "st")
    writer.write(150)
    outs = [tmp_path / f"r{i}.jsonl" for i in range(3)]
    procs = [_reader(server, f"r{i}", out) for i, out in enumerate(outs)]
    try:
        wait_until(lambda: sum(len(_lines(o)) for o in outs) >= 30, "the readers read", 30)
        checkpoint = group.checkpoint()
        found: dict = {}
        wait_until(
            lambda: found.update(cuts=group.checkpoint_cuts(checkpoint)) or found["cuts"], "complete", 30
        )
        writer.write(150)
        wait_until(lambda: any(line.get("d") == "w200" for o in outs for line in _lines(o)), "read on", 30)
    finally:
        _stop_all(procs)
    writer.write(50)
    cut = found["cuts"]["st"]
    after = [e for sid, offset in cut.positions.items() for e in _frames(client, f"sc/st/{sid}", offset)]
    group.reset(found["cuts"])
    read: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def run(name: str) -> None:
        with group.reader(name, wait_s=0.2) as reader:
            while not done.is_set():
                events = reader.fetch()
                with lock:
                    read.extend(e.data.decode() for e in events)

    threads = [threading.Thread(target=run, args=(f"n{i}",), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(read) >= len(after), "the new readers read what follows the cut", 30)
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
    assert Counter(read) == Counter(after)
