"""Acknowledged appends survive SIGKILL of the server, exactly once.

Writer threads, each with its own Writer-Id, append numbered self-describing
records to a few segments of a real server; the server is SIGKILLed at a
random moment and restarted on the same data directory, cycle after cycle, so
recovery stacks up. After every restart:

- each segment parses completely into well-formed records (no torn bytes);
- every acknowledged append is present at its acknowledged offset with its
  exact bytes; no record appears twice anywhere; a record that was never
  acknowledged is one that was in flight at the kill;
- retrying an in-flight append (same writer id and event number) is answered
  duplicate if it was stored, and is stored once if it was not;
- each writer's stored event number on each segment is its last stored one.

Every other cycle runs with small limits so that Tier 1 files roll,
checkpoints are written, Tier 2 flushes and Tier 1 truncates between kills;
the test checks on disk that Tier 1 rolled and was truncated (which needs a
checkpoint) and that Tier 2 holds data.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from bench.servers import ServerProcess
from engine import load_settings
from engine.naming import parse_log_file_name, tier1_dir
from tests.conftest import random_seed

pytestmark = [pytest.mark.slow, pytest.mark.process]

SEGMENTS = ("crash/a", "crash/b/0", "crash/c")
WRITERS = 6
CYCLES = 8
KILL_AFTER_S = (0.4, 1.6)
TIMEOUT_S = 10
QUIET_ENV = {"SEGSTORE_LOG_LEVEL": "warning"}
SMALL_ENV = {
    **QUIET_ENV,
    "SEGSTORE_FLUSH_THRESHOLD_MS": "50",
    "SEGSTORE_FLUSH_THRESHOLD_BYTES": "16384",
    "SEGSTORE_TIER1_FILE_BYTES": "65536",
    "SEGSTORE_CHECKPOINT_EVERY_BYTES": "32768",
}

_HEAD = re.compile(rb"<(\d{2}):(\d):(\d{8}):(\d{6})\|")


def record(writer: int, segment: int, event: int, size: int) -> bytes:
    """The one record of (writer, segment, event): a header, a fill byte, a closing mark."""
    head = b"<%02d:%d:%08d:%06d|" % (writer, segment, event, size)
    fill = bytes([97 + (writer * 7 + event) % 26])
    return head + fill * (size - len(head) - 1) + b">"


@dataclass(frozen=True)
class Append:
    """One append a writer sent (and may resend after a crash)."""

    writer: int
    segment: int
    event: int
    payload: bytes = field(repr=False)


@dataclass
class Writer:
    """A writer's identity and progress, kept across server restarts."""

    index: int
    writer_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    next_event: int = 0
    in_flight: Append | None = None
    failure: str | None = None


@dataclass
class Ledger:
    """What the clients know: acknowledged appends by (writer, event)."""

    writers: list[Writer]
    acked: dict[tuple[int, int], tuple[int, int, bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, append: Append, offset: int) -> None:
        with self.lock:
            key = (append.writer, append.event)
            assert key not in self.acked, f"event acknowledged twice: {key}"
            self.acked[key] = (append.segment, offset, append.payload)


def _post(http: requests.Session, url: str, writer: Writer, append: Append) -> requests.Response:
    return http.post(
        f"{url}/v1/segments/{SEGMENTS[append.segment]}",
        data=append.payload,
        headers={"Writer-Id": writer.writer_id, "Event-Number": str(append.event)},
        timeout=TIMEOUT_S,
    )


def _write_until_killed(url: str, writer: Writer, ledger: Ledger, rng: random.Random) -> None:
    """Append new records until the server goes away; the last one stays in flight."""
    with requests.Session() as http:
        while True:
            size = rng.choice((24, 100, 300, 1000, 3000)) + rng.randrange(50)
            if rng.random() < 0.05:
                size = 8000 + rng.randrange(8000)
            segment = rng.randrange(len(SEGMENTS))
            append = Append(
                writer.index,
                segment,
                writer.next_event,
                record(writer.index, segment, writer.next_event, size),
            )
            writer.in_flight = append
            while True:
                try:
                    response = _post(http, url, writer, append)
                except requests.RequestException:
                    return
                if response.status_code != 503:
                    break
                time.sleep(0.05)
            body = response.json() if response.status_code == 200 else {}
            if response.status_code != 200 or body.get("duplicate"):
                writer.failure = f"append {append.event}: {response.status_code} {response.text}"
                return
            ledger.ack(append, body["offset"])
            writer.in_flight = None
            writer.next_event += 1


def _read_all(url: str, name: str) -> bytes:
    info = requests.get(f"{url}/v1/segments/{name}:info", timeout=TIMEOUT_S).json()
    assert info["start_offset"] == 0, info
    data = bytearray()
    while len(data) < info["length"]:
        response = requests.get(f"{url}/v1/segments/{name}", params={"offset": len(data)}, timeout=TIMEOUT_S)
        assert response.status_code == 200, response.text
        assert response.content, f"{name}: empty read at {len(data)} of {info['length']}"
        data += response.content
    assert len(data) == info["length"]
    return bytes(data)


def _parse(name: str, segment: int, data: bytes) -> list[tuple[int, int, int]]:
    """(offset, writer, event) of every record; fails on any byte that is not a whole record."""
    found = []
    position = 0
    while position < len(data):
        head = _HEAD.match(data, position)
        assert head, f"{name}: no record at {position}: {data[position : position + 40]!r}"
        writer, seg, event, size = (int(g) for g in head.groups())
        assert seg == segment, f"{name}: record of segment {seg} at {position}"
        assert data[position : position + size] == record(writer, seg, event, size), (
            f"{name}: damaged record at {position}"
        )
        found.append((position, writer, event))
        position += size
    return found


def verify(url: str, ledger: Ledger) -> None:
    """Check the store against the ledger, then resolve every in-flight append."""
    stored: dict[tuple[int, int], tuple[int, int]] = {}
    lengths: list[int] = []
    in_flight = {(w.index, w.in_flight.event): w.in_flight for w in ledger.writers if w.in_flight}
    for segment, name in enumerate(SEGMENTS):
        data = _read_all(url, name)
        lengths.append(len(data))
        last_event: dict[int, int] = {}
        for offset, writer, event in _parse(name, segment, data):
            key = (writer, event)
            assert key not in stored, f"record {key} stored twice: {stored[key]} and {name}@{offset}"
            stored[key] = (segment, offset)
            assert key in ledger.acked or key in in_flight, f"{name}@{offset}: {key} never sent"
            assert event > last_event.get(writer, -1), f"{name}@{offset}: {key} out of order"
            last_event[writer] = event
        for (writer, event), (seg, offset, payload) in ledger.acked.items():
            if seg == segment:
                assert stored.get((writer, event)) == (seg, offset), (
                    f"acknowledged {(writer, event)} at {name}@{offset} is missing or moved"
                )
                assert data[offset : offset + len(payload)] == payload

    with requests.Session() as http:
        for writer in ledger.writers:
            append = writer.in_flight
            if append is None:
                continue
            response = _post(http, url, writer, append)
            assert response.status_code == 200, response.text
            body = response.json()
            if (writer.index, append.event) in stored:
                assert body.get("duplicate") is True, f"stored in-flight {append} appended again"
                assert body["event_number"] == append.event, body
                ledger.ack(append, stored[(writer.index, append.event)][1])
            else:
                assert not body.get("duplicate"), f"lost in-flight {append} called duplicate"
                assert body["offset"] == lengths[append.segment], (append, body)
                lengths[append.segment] += len(append.payload)
                ledger.ack(append, body["offset"])
            writer.in_flight = None
            writer.next_event = append.event + 1

        for writer in ledger.writers:
            for segment, name in enumerate(SEGMENTS):
                events = [e for (w, e), a in ledger.acked.items() if w == writer.index and a[0] == segment]
                response = http.get(f"{url}/v1/segments/{name}:writers/{writer.writer_id}", timeout=TIMEOUT_S)
                assert response.status_code == 200, response.text
                assert response.json()["event_number"] == (max(events) if events else None), (
                    f"writer {writer.index} on {name}"
                )


def run_and_kill(server: ServerProcess, ledger: Ledger, delay_s: float, rng: random.Random) -> None:
    threads = [
        threading.Thread(
            target=_write_until_killed,
            args=(server.url, w, ledger, random.Random(rng.random())),
            daemon=True,
        )
        for w in ledger.writers
    ]
    for t in threads:
        t.start()
    time.sleep(delay_s)
    server.kill()
    for t in threads:
        t.join(TIMEOUT_S + 5)
        assert not t.is_alive(), "a writer did not notice the server died"
    failures = [w.failure for w in ledger.writers if w.failure]
    assert not failures, failures


def _observe(data_dir: Path, seen: set[str]) -> None:
    """Note which background work the last cycle left on disk (the server is down)."""
    settings = load_settings(environ={}, data_dir=str(data_dir))
    for container in range(settings.container_count):
        folder = tier1_dir(data_dir, container)
        if not folder.exists():
            continue
        seqs = sorted(s for e in folder.iterdir() if (s := parse_log_file_name(e.name)) is not None)
        if len(seqs) > 1 or (seqs and seqs[0] > 0):
            seen.add("tier1 rolled")
        if seqs and seqs[0] > 0:
            seen.add("tier1 truncated")
    if any(p.is_file() and p.stat().st_size for p in settings.tier2_path.rglob("*")):
        seen.add("tier2 written")


@contextmanager
def _running(data_dir: Path, env: dict[str, str]) -> Iterator[ServerProcess]:
    """A started server that is killed on the way out, whatever happened."""
    server = ServerProcess(data_dir, env=env).start()
    try:
        yield server
    finally:
        server.kill()


def test_acknowledged_appends_survive_repeated_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    ledger = Ledger([Writer(i) for i in range(WRITERS)])
    rng = random.Random(random_seed())
    started = time.monotonic()
    seen: set[str] = set()
    for cycle in range(CYCLES):
        with _running(data_dir, SMALL_ENV if cycle % 2 == 0 else QUIET_ENV) as server:
            if cycle == 0:
                for name in SEGMENTS:
                    response = requests.put(f"{server.url}/v1/segments/{name}", timeout=TIMEOUT_S)
                    assert response.status_code == 201, response.text
            else:
                verify(server.url, ledger)
            delay = rng.uniform(*KILL_AFTER_S)
            print(f"cycle {cycle}: kill after {delay:.3f} s, {len(ledger.acked)} acked so far")
            run_and_kill(server, ledger, delay, rng)
        _observe(data_dir, seen)

    with _running(data_dir, SMALL_ENV) as server:
        verify(server.url, ledger)
        assert server.stop() == 0, server.log_tail()
    with _running(data_dir, QUIET_ENV) as server:
        verify(server.url, ledger)
        assert server.stop() == 0, server.log_tail()
    assert len(ledger.acked) > CYCLES * 50, f"only {len(ledger.acked)} appends acknowledged"
    assert seen == {"tier1 rolled", "tier1 truncated", "tier2 written"}
    print(f"{len(ledger.acked)} appends acknowledged in {time.monotonic() - started:.1f} s")
