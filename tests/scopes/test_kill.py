"""kill -9 of a real server while streams scale and transactions commit, over and over.

Writers (StreamWriter) run through every kill and restart, a scaler splits
and merges the stream, and a transaction thread opens, fills and commits
transactions. After each restart the stream's pending scale completes
(once the transactions it waits for end); at the end every key's events
are there exactly once and in order, every acknowledged commit is whole,
and no transaction is ever partly visible. tests/scopes/test_crash_steps.py
cuts each procedure at every one of its steps; this test kills real
processes at random moments of the same procedures.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from bench.servers import ServerProcess
from client.errors import SegstoreClientError, TransactionNotOpen
from client.segment_client import SegmentClient
from client.stream_client import StreamClient
from tests.conftest import random_seed
from tests.processes import killed_at_exit
from tests.scopes.writers import KeyedWriters, assert_exactly_once_in_order, read_in_successor_order

pytestmark = [pytest.mark.slow, pytest.mark.process]

CYCLES = 2
TXN_TIMEOUT_S = 5
ENV = {
    "SEGSTORE_LOG_LEVEL": "warning",
    "SEGSTORE_FLUSH_THRESHOLD_MS": "50",
    "SEGSTORE_STREAM_SCALE_SAMPLE_S": "0.5",
    "SEGSTORE_STREAM_SCALE_WINDOW_S": "1",
}
_DOWN = (requests.RequestException, SegstoreClientError)


def _loop(stop: threading.Event, step: Callable[[], None]) -> None:
    """Run ``step`` until stopped; a server that is down (killed, restarting) is waited out."""
    while not stop.is_set():
        try:
            step()
        except _DOWN:
            time.sleep(0.2)


class Transactions:
    """Opens, fills and commits transactions; knows which commits were answered and which were cut."""

    def __init__(self, url: str, rng: random.Random) -> None:
        self.rng = rng
        self.client = SegmentClient(url, retries=1, backoff_s=0.05)
        self.streams = StreamClient(self.client)
        self.committed: dict[str, int] = {}
        self.cut: dict[str, int] = {}  # filled, commit sent, no answer

    def step(self) -> None:
        txid = self.streams.open_transaction("sc", "k", timeout_s=TXN_TIMEOUT_S)
        count = self.rng.randrange(1, 6)
        for i in range(1, count + 1):
            event = f"txn-{txid}:{i}".encode()
            self.streams.write_transaction_event("sc", "k", txid, event, routing_key=f"{i}")
        self.cut[txid] = count
        self.streams.commit("sc", "k", txid)
        self.committed[txid] = self.cut.pop(txid)


def _scale(streams: StreamClient) -> None:
    _, segments = streams.segments("sc", "k")
    if len(segments) == 1:
        streams.scale("sc", "k", [segments[0].id], [(0.0, 0.5), (0.5, 1.0)])
    else:
        streams.scale("sc", "k", [s.id for s in segments], [(0.0, 1.0)])
    time.sleep(0.1)


def test_kill_9_during_scales_and_commits(tmp_path: Path) -> None:
    seed = random_seed()
    rng = random.Random(seed)
    keys = [f"key-{i}" for i in range(20)]
    with (
        killed_at_exit(ServerProcess(tmp_path / "data", env=ENV)) as server,
        SegmentClient(server.url) as client,
    ):
        streams = StreamClient(client)
        streams.create_scope("sc")
        streams.create_stream("sc", "k", segments=2)
        writers = KeyedWriters(client, "sc", "k", keys, threads=2).start()
        txns = Transactions(server.url, random.Random(seed))
        scaler = StreamClient(SegmentClient(server.url, retries=1, backoff_s=0.05))
        stop = threading.Event()
        loops = [
            threading.Thread(target=_loop, args=(stop, txns.step), daemon=True),
            threading.Thread(target=_loop, args=(stop, lambda: _scale(scaler)), daemon=True),
        ]
        for thread in loops:
            thread.start()
        epochs = []
        for _ in range(CYCLES):
            time.sleep(rng.uniform(0.8, 2.0))
            server.kill()
            server.start()
            deadline = time.monotonic() + TXN_TIMEOUT_S + 10
            while streams.stream("sc", "k")["pending_scale"] is not None:
                assert time.monotonic() < deadline, f"a scale stays pending after a restart (seed {seed})"
                time.sleep(0.2)
            epochs.append(streams.stream("sc", "k")["epoch"])
        stop.set()
        for thread in loops:
            thread.join(60)
        writers.stop()
        found = read_in_successor_order(client, "sc", "k")
        assert_exactly_once_in_order({k: v for k, v in found.items() if k in keys}, writers.written)
        for txid in list(txns.cut):
            try:
                assert streams.commit("sc", "k", txid)["state"] == "committed"
                txns.committed[txid] = txns.cut.pop(txid)
            except TransactionNotOpen:
                pass  # it expired while the server was down: aborted, nothing of it may show
        txn_events = read_in_successor_order(client, "sc", "k") if txns.cut else found
        for txid, count in txns.committed.items():  # whole, each event once (keys spread them)
            assert sorted(txn_events.get(f"txn-{txid}", [])) == list(range(1, count + 1)), (seed, txid)
        visible = {key for key in txn_events if key.startswith("txn-")}
        assert visible == {f"txn-{txid}" for txid in txns.committed}, seed  # nothing of any other
        assert len(txns.committed) >= CYCLES and epochs[-1] >= CYCLES, (seed, len(txns.committed), epochs)
