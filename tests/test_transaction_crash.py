"""A SIGKILL in the middle of commits leaves every transaction wholly merged or not at all.

Threads open transactions of a real server, fill each with numbered records
and commit it, over and over; the server is SIGKILLed at a random moment and
restarted on the same data directory, cycle after cycle. After every restart:

- the parent parses into whole transactions, each contiguous, none twice;
- every acknowledged commit is there at its acknowledged offset;
- a commit that was in flight at the kill, retried, answers 200 and the
  transaction is then there exactly once (at the offset the retry answers).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from bench.servers import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.process]

PARENT = "crash/txn"
THREADS = 4
CYCLES = 4
KILL_AFTER_S = (0.5, 1.5)
TIMEOUT_S = 10
ENV = {
    "SEGSTORE_LOG_LEVEL": "warning",
    "SEGSTORE_FLUSH_THRESHOLD_MS": "50",
    "SEGSTORE_FLUSH_THRESHOLD_BYTES": "16384",
    "SEGSTORE_TIER1_FILE_BYTES": "65536",
    "SEGSTORE_CHECKPOINT_EVERY_BYTES": "32768",
}
_RECORD = re.compile(rb"<([0-9a-f-]{36}):(\d{3})/(\d{3})\|x*>")


def records(txid: str, count: int, rng: random.Random) -> list[bytes]:
    fill = [b"x" * rng.randrange(10, 3000) for _ in range(count)]
    return [b"<%s:%03d/%03d|%s>" % (txid.encode(), i, count, fill[i]) for i in range(count)]


@dataclass
class Ledger:
    """What the server acknowledged, and what was in flight at a kill."""

    committed: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # txid -> (offset, bytes)
    in_flight: dict[str, bytes] = field(default_factory=dict)  # filled, commit sent, no answer
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _work(url: str, ledger: Ledger, rng: random.Random) -> None:
    http = requests.Session()
    try:
        while True:
            response = http.post(f"{url}:transactions", timeout=TIMEOUT_S)
            assert response.status_code == 201, response.text
            txid = response.json()["id"]
            body = records(txid, rng.randrange(1, 6), rng)
            for piece in body:
                answer = http.post(f"{url}:transactions/{txid}", data=piece, timeout=TIMEOUT_S)
                assert answer.status_code == 200, answer.text
            with ledger.lock:
                ledger.in_flight[txid] = b"".join(body)
            answer = http.post(f"{url}:transactions/{txid}/commit", timeout=TIMEOUT_S)
            assert answer.status_code == 200, answer.text
            with ledger.lock:
                data = ledger.in_flight.pop(txid)
                ledger.committed[txid] = (answer.json()["offset"], data)
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
        return  # the kill (before an answer, or in the middle of one)
    except BaseException as exc:
        ledger.errors.append(exc)


def _read_all(url: str) -> bytes:
    parts, offset = [], 0
    while True:
        response = requests.get(url, params={"offset": offset}, timeout=TIMEOUT_S)
        if response.status_code == 204:
            return b"".join(parts)
        assert response.status_code == 200, response.text
        parts.append(response.content)
        offset = int(response.headers["Segment-Next-Offset"])


def _transactions(data: bytes) -> dict[str, int]:
    """txid -> offset of each whole transaction in the parent; fails on a torn or repeated one."""
    found: dict[str, int] = {}
    pos = 0
    while pos < len(data):
        match = _RECORD.match(data, pos)
        assert match is not None, f"unparsable bytes at {pos}: {data[pos : pos + 60]!r}"
        txid, index, count = match.group(1).decode(), int(match.group(2)), int(match.group(3))
        assert index == 0, f"transaction {txid} starts at record {index}, offset {pos}"
        assert txid not in found, f"transaction {txid} merged twice"
        found[txid] = pos
        for i in range(count):
            match = _RECORD.match(data, pos)
            assert match is not None and match.group(1).decode() == txid and int(match.group(2)) == i, (
                f"transaction {txid} is torn at offset {pos}"
            )
            pos = match.end()
    return found


def verify(url: str, ledger: Ledger) -> None:
    data = _read_all(url)
    found = _transactions(data)
    for txid, (offset, body) in ledger.committed.items():
        assert found.get(txid) == offset, f"acknowledged commit of {txid} is not at {offset}"
        assert data[offset : offset + len(body)] == body
    for txid, body in list(ledger.in_flight.items()):
        response = requests.post(f"{url}:transactions/{txid}/commit", timeout=TIMEOUT_S)
        assert response.status_code == 200, (txid, response.text)
        offset = response.json()["offset"]
        if txid in found:
            assert found[txid] == offset, f"retried commit of {txid} answers another offset"
        ledger.committed[txid] = (offset, body)
        del ledger.in_flight[txid]
    data = _read_all(url)
    found = _transactions(data)
    assert set(found) == set(ledger.committed)
    for txid, (offset, body) in ledger.committed.items():
        assert found[txid] == offset and data[offset : offset + len(body)] == body


@contextmanager
def _running(data_dir: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(data_dir, env=ENV).start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def test_commits_survive_repeated_sigkill_whole_or_not_at_all(tmp_path: Path) -> None:
    rng = random.Random(20261123)
    data_dir = tmp_path / "data"
    ledger = Ledger()
    with _running(data_dir) as server:
        assert requests.put(f"{server.url}/v1/segments/{PARENT}", timeout=TIMEOUT_S).status_code == 201
        server.kill()
    for cycle in range(CYCLES):
        with _running(data_dir) as server:
            url = f"{server.url}/v1/segments/{PARENT}"
            verify(url, ledger)
            threads = [
                threading.Thread(target=_work, args=(url, ledger, random.Random(rng.random())))
                for _ in range(THREADS)
            ]
            for thread in threads:
                thread.start()
            time.sleep(rng.uniform(*KILL_AFTER_S))
            server.kill()
            for thread in threads:
                thread.join(TIMEOUT_S * 2)
            assert not any(t.is_alive() for t in threads), f"cycle {cycle}: a worker hung"
            assert not ledger.errors, ledger.errors
    with _running(data_dir) as server:
        verify(f"{server.url}/v1/segments/{PARENT}", ledger)
    assert len(ledger.committed) >= CYCLES, "too few commits to mean anything"
