"""Fixtures for engine tests: restartable containers on the in-memory twins, small settings."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from engine import SegmentExists, SegmentStore, Settings
from engine.container.segment_container import SegmentContainer
from engine.durable_log import frames
from engine.durable_log.data_log import PendingWrite
from engine.metadata import operations as ops
from engine.metrics import EngineMetrics
from engine.tier1.memory_log import MemoryDataLog
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage, ChunkRef
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage
from tests.polling import wait_until

# Small limits: frames of 4 KiB, tiny log files, a writer that flushes within 20 ms.
SMALL: dict[str, Any] = {
    "container_count": 1,
    "max_frame_bytes": 4096,
    "tier1_file_bytes": 8192,
    "flush_threshold_ms": 20,
    "flush_threshold_bytes": 64 * 1024,
    "cache_block_bytes": 1024,
}


def small_settings(data_dir: Path | str = "unused", **overrides: Any) -> Settings:
    return Settings(data_dir=str(data_dir), **{**SMALL, **overrides})



def logged_operations(data_log: MemoryDataLog) -> list[ops.Operation]:
    """Every operation in a memory Tier 1 log, in log order."""
    out: list[ops.Operation] = []
    for buf in data_log.writes:
        for batch in frames.iter_batches(buf):
            out.extend(ops.decode_all(batch.payload))
    return out


def leads_with_checkpoint(buf: bytes) -> bool:
    """Whether a Tier 1 write starts with a metadata checkpoint."""
    first = next(frames.iter_batches(buf))
    return isinstance(ops.decode_all(first.payload)[0], ops.MetadataCheckpoint)


def starts_at_newest_checkpoint(data_log: MemoryDataLog) -> bool:
    """Whether Tier 1 holds nothing before its newest checkpoint (the first write leads with it).

    Writes after it may remain: the storage writer logs ``UpdateLayout``
    operations after every flush, and those follow the checkpoint.
    """
    writes = list(data_log.writes)
    return (
        bool(writes) and leads_with_checkpoint(writes[0]) and not any(map(leads_with_checkpoint, writes[1:]))
    )


class Node:
    """One container on the in-memory twins behind a SegmentStore; restartable like a process.

    Tier 2 is ``storage`` (a MemoryChunkStorage, inspected directly by tests)
    seen by the container through ``faults``, a FaultyChunkStorage that
    injects nothing until a test asks it to.
    """

    def __init__(
        self, settings: Settings, container_id: int = 0, storage: MemoryChunkStorage | None = None
    ) -> None:
        self.settings = settings
        self.container_id = container_id
        self.data_log = MemoryDataLog(max_frame_bytes=settings.max_frame_bytes)
        self.storage = MemoryChunkStorage() if storage is None else storage
        self.faults = FaultyChunkStorage(self.storage)
        self.container = self._build()
        self.store = SegmentStore(settings, containers=[self.container])

    def _build(self) -> SegmentContainer:
        self.registry = CollectorRegistry()
        return SegmentContainer(
            self.container_id, self.settings, self.data_log, self.faults, EngineMetrics(self.registry)
        )

    def layout(self, name: str) -> list[ChunkRef]:
        """The live segment's committed Tier 2 layout."""
        with self.container.metadata.lock:
            return list(self.container.metadata.by_name(name).chunks)

    def tier2_bytes(self, name: str) -> bytes:
        """The live segment's bytes in Tier 2, read through its layout (from its first chunk)."""
        with self.container.metadata.lock:
            seg = self.container.metadata.by_name(name)
            chunks, storage_length = list(seg.chunks), seg.storage_length
        if not chunks:
            return b""
        reader = ChunkedSegmentStorage(self.storage, self.container_id)
        return reader.read(chunks, chunks[0].start, storage_length - chunks[0].start)

    def evict_all(self) -> None:
        """Drop every flushed block from the cache, so reads of it go to Tier 2."""
        cache = self.container.read_index.cache
        budget, cache.max_bytes = cache.max_bytes, 0
        try:
            self.container.read_index.evict(self.container.metadata.storage_lengths())
        finally:
            cache.max_bytes = budget

    def start(self, *, wait: bool = True) -> Node:
        self.store.start(wait=wait)
        return self

    def restart(self, *, wait: bool = True, hold_tier1: bool = False) -> Node:
        """Close the store, then start a new container on the same Tier 1 bytes and Tier 2.

        ``hold_tier1``: Tier 1 writes (the first is recovery's checkpoint) block until the gate opens.
        """
        self.store.close()
        self.data_log = self.data_log.reopen()
        if hold_tier1:
            self.data_log.gate.clear()
        self.container = self._build()
        self.store = SegmentStore(self.settings, containers=[self.container])
        return self.start(wait=wait)

    def log_a_checkpoint(self, name: str) -> None:
        """Append to ``name`` until a Tier 1 write leads with a checkpoint (taken after all before it)."""
        for _ in range(10):
            self.store.append(name, b".")
            if leads_with_checkpoint(self.data_log.writes[-1]):
                return
        pytest.fail("no Tier 1 write led with a checkpoint")

    def truncate_tier1(self, tick: str = "tick") -> None:
        """Flush, log a checkpoint (appending to ``tick``), wait until Tier 1 holds nothing older."""
        self.store.flush()
        with contextlib.suppress(SegmentExists):
            self.store.create(tick)
        self.log_a_checkpoint(tick)
        self.store.flush()
        wait_until(
            lambda: starts_at_newest_checkpoint(self.data_log),
            what="Tier 1 truncation at the newest checkpoint",
        )

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    def close(self) -> None:
        self.data_log.gate.set()
        self.store.close()


class HeldProcessor:
    """Keeps the operation processor inside one Tier 1 write so later requests queue behind it."""

    def __init__(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        self.node = node
        self.entered = threading.Event()
        self.outcomes: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        original = node.data_log.write

        def write(pending: PendingWrite) -> None:
            self.entered.set()
            original(pending)

        monkeypatch.setattr(node.data_log, "write", write)
        node.data_log.gate.clear()

    def submit(self, key: str, call: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.outcomes[key] = call()
            except Exception as exc:
                self.outcomes[key] = exc

        thread = threading.Thread(target=run)
        thread.start()
        self._threads.append(thread)

    def hold(self, key: str, call: Callable[[], Any]) -> None:
        """Submit ``call`` and wait until its Tier 1 write is in flight (and blocked)."""
        self.submit(key, call)
        assert self.entered.wait(30)

    def wait_queued(self, count: int) -> None:
        queue = self.node.container.durable_log.processor._queue
        # Generous: threads starting on a machine the rest of the suite keeps busy (a CI run).
        wait_until(lambda: len(queue) == count, what=f"{count} queued operations", timeout_s=30)

    def release(self) -> dict[str, Any]:
        self.node.data_log.gate.set()
        for thread in self._threads:
            thread.join(10)
        return self.outcomes


@pytest.fixture
def make_node() -> Iterator[Callable[..., Node]]:
    """Build started nodes from SMALL settings plus overrides (and a Tier 2); all closed after the test."""
    nodes: list[Node] = []

    def make(*, storage: MemoryChunkStorage | None = None, **overrides: Any) -> Node:
        node = Node(small_settings(**overrides), storage=storage)
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        node.close()


@pytest.fixture
def node(make_node: Callable[..., Node]) -> Node:
    return make_node()


@pytest.fixture
def store(node: Node) -> SegmentStore:
    return node.store


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[SegmentStore]:
    """A store of four containers on files (Tier 1) and a folder (Tier 2) in ``tmp_path``."""
    store = SegmentStore(small_settings(tmp_path, container_count=4))
    store.start(wait=True)
    yield store
    store.close()
