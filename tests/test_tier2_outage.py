"""A Tier 2 outage of 30 s under load: back-pressure, bounded memory, no loss, catch-up.

An in-process store (two containers on real Tier 1 files, Tier 2 on the
S3-like in-memory twin behind FaultyChunkStorage) takes appends from several
writer threads while every Tier 2 call fails. Appends succeed until the
Tier 1 backlog limit, then answer Throttled (with a retry delay) and nothing
else; the cache stays within the backlog plus its own budget. When Tier 2
comes back the storage writers catch up, every acknowledged byte reads back
exactly, and a restart on the same Tier 1 folders and Tier 2 recovers it all.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from engine import SegmentStore, Settings, Throttled
from engine.container.segment_container import SegmentContainer
from engine.metrics import EngineMetrics
from engine.naming import container_for, tier1_dir
from engine.tier1.file_log import FileDataLog
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.memory import MemoryChunkStorage

pytestmark = pytest.mark.slow

KiB = 1024
MiB = 1024 * KiB
OUTAGE_S = 30.0
CONTAINERS = 2
THREADS = 4
APPEND_BYTES = 32 * KiB
PACE_S = 0.1  # 4 threads x 32 KiB every 0.1 s: the 16 MiB backlog fills in about 13 s
BACKLOG_BYTES = 16 * MiB
CACHE_BYTES = 2 * MiB
# The storage writer retries with a backoff of at most 10 s: catching up may take that long.
CATCH_UP_S = 15.0


def settings_for(data_dir: Path) -> Settings:
    return Settings(
        data_dir=str(data_dir),
        container_count=CONTAINERS,
        tier1_backlog_max_bytes=BACKLOG_BYTES,
        cache_max_bytes=CACHE_BYTES,
        cache_block_bytes=64 * KiB,
        storage_read_block_bytes=256 * KiB,
        flush_threshold_ms=100,
        flush_threshold_bytes=1 * MiB,
        tier1_file_bytes=1 * MiB,
        checkpoint_every_bytes=512 * KiB,
        rollover_bytes=4 * MiB,
    )


def segment_names() -> list[str]:
    """Two segments per container, so that every container's backlog fills."""
    names: list[str] = []
    for container in range(CONTAINERS):
        mine = (n for n in (f"outage/{i}" for i in range(1000)) if container_for(n, CONTAINERS) == container)
        names += [next(mine), next(mine)]
    return names


SEGMENTS = segment_names()


class Node:
    """A SegmentStore whose containers run on Tier 1 files in ``data_dir`` and the given Tier 2."""

    def __init__(self, data_dir: Path, storage: FaultyChunkStorage) -> None:
        self.settings = settings_for(data_dir)
        metrics = EngineMetrics(CollectorRegistry())
        self.containers = [
            SegmentContainer(
                i,
                self.settings,
                FileDataLog(
                    tier1_dir(data_dir, i),
                    file_bytes=self.settings.tier1_file_bytes,
                    max_frame_bytes=self.settings.max_frame_bytes,
                ),
                storage,
                metrics,
            )
            for i in range(CONTAINERS)
        ]
        self.store = SegmentStore(self.settings, containers=self.containers)
        self.store.start(wait=True)

    def container(self, name: str) -> SegmentContainer:
        return self.containers[container_for(name, CONTAINERS)]


@dataclass
class Ledger:
    """What the writers sent and what was acknowledged; shared by the writer threads."""

    acked: dict[str, list[tuple[int, bytes]]] = field(default_factory=lambda: {n: [] for n in SEGMENTS})
    last_event: dict[tuple[str, uuid.UUID], int] = field(default_factory=dict)
    throttled: int = 0
    throttled_at: dict[str, float] = field(default_factory=dict)
    retry_after: set[float] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expected(self, name: str) -> bytes:
        out = bytearray()
        for offset, payload in sorted(self.acked[name]):
            assert offset == len(out), f"{name}: acknowledged appends leave a gap or overlap at {offset}"
            out += payload
        return bytes(out)


def payload_for(writer: int, event: int, segment: str, rng: random.Random) -> bytes:
    head = f"<{writer}:{event}:{segment}|".encode()
    return head + rng.randbytes(APPEND_BYTES - len(head) - 1) + b">"


def write_until(store: SegmentStore, ledger: Ledger, writer: int, stop_at: float) -> None:
    """One writer: paced appends round the segments, the same event retried while Throttled."""
    rng = random.Random(writer)
    writer_id = uuid.UUID(int=writer + 1)
    event = 0
    while time.monotonic() < stop_at:
        event += 1
        segment = SEGMENTS[(writer + event) % len(SEGMENTS)]
        payload = payload_for(writer, event, segment, rng)
        while time.monotonic() < stop_at:
            try:
                result = store.append(segment, payload, writer_id=writer_id, event_number=event)
            except Throttled as exc:
                if type(exc) is not Throttled:  # e.g. ContainerNotReady: a container failed
                    with ledger.lock:
                        ledger.errors.append(f"writer {writer} event {event} on {segment}: {exc!r}")
                    return
                with ledger.lock:
                    ledger.throttled += 1
                    ledger.throttled_at.setdefault(segment, time.monotonic())
                    ledger.retry_after.add(exc.retry_after_s)
                time.sleep(min(exc.retry_after_s or 0.1, 0.1))
                continue
            except Exception as exc:  # anything but Throttled fails the test
                with ledger.lock:
                    ledger.errors.append(f"writer {writer} event {event} on {segment}: {exc!r}")
                return
            with ledger.lock:
                if result.duplicate or result.offset is None:
                    ledger.errors.append(f"writer {writer} event {event}: unexpected duplicate {result}")
                    return
                ledger.acked[segment].append((result.offset, payload))
                ledger.last_event[segment, writer_id] = event
            time.sleep(PACE_S)
            break


def tier1_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "tier1").rglob("*.log") if p.exists())


def verify(node: Node, ledger: Ledger) -> None:
    """Every segment holds exactly its acknowledged bytes; every writer's last event is stored."""
    for name in SEGMENTS:
        expected = ledger.expected(name)
        info = node.store.info(name)
        assert info.length == len(expected), (name, info)
        data = bytearray()
        while len(data) < len(expected):
            data += node.store.read(name, len(data)).data
        assert bytes(data) == expected, f"{name}: the bytes read differ from the acknowledged ones"
    for (name, writer_id), event in ledger.last_event.items():
        assert node.store.writer_event_number(name, writer_id) == event, (name, writer_id)


def test_a_30_s_tier2_outage_under_load_loses_nothing_and_bounds_memory(tmp_path: Path) -> None:
    started = time.monotonic()
    storage = FaultyChunkStorage(MemoryChunkStorage(supports_append=False, supports_truncation=False))
    node = Node(tmp_path, storage)
    ledger = Ledger()
    try:
        for name in SEGMENTS:
            node.store.create(name)
        # Some bytes reach Tier 2 before the outage.
        for name in SEGMENTS:
            result = node.store.append(name, b"before the outage " + name.encode())
            ledger.acked[name].append((result.offset, b"before the outage " + name.encode()))
        node.store.flush(10)
        chunks_before = len(storage.inner.chunks)
        assert chunks_before >= len(SEGMENTS)

        storage.outage()
        outage_started = time.monotonic()
        stop_at = outage_started + OUTAGE_S
        threads = [
            threading.Thread(target=write_until, args=(node.store, ledger, w, stop_at), daemon=True)
            for w in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        peak_cache = [0] * CONTAINERS
        peak_unflushed = [0] * CONTAINERS
        peak_tier1 = 0
        reads_checked = 0
        while time.monotonic() < stop_at:
            for i, container in enumerate(node.containers):
                peak_cache[i] = max(peak_cache[i], container.read_index.cache.size)
                peak_unflushed[i] = max(peak_unflushed[i], container.metadata.unflushed_bytes)
            peak_tier1 = max(peak_tier1, tier1_bytes(tmp_path))
            # Acknowledged bytes stay readable (from the cache) while Tier 2 is down.
            with ledger.lock:
                name = SEGMENTS[reads_checked % len(SEGMENTS)]
                offset, payload = ledger.acked[name][-1]
            assert node.store.read(name, offset, len(payload)).data == payload
            reads_checked += 1
            time.sleep(0.05)
        for thread in threads:
            thread.join(5)
            assert not thread.is_alive()
        assert not ledger.errors, ledger.errors[:5]
        assert len(storage.inner.chunks) == chunks_before, "a Tier 2 call got through the outage"

        # The backlog filled (every container was throttled), and only then were appends refused.
        throttled_containers = {container_for(n, CONTAINERS) for n in ledger.throttled_at}
        assert throttled_containers == set(range(CONTAINERS)), ledger.throttled_at
        assert ledger.retry_after and all(r > 0 for r in ledger.retry_after), ledger.retry_after
        first_throttled = min(ledger.throttled_at.values()) - outage_started
        assert 5 < first_throttled < OUTAGE_S - 5, f"first Throttled {first_throttled:.1f} s into the outage"
        backlog = BACKLOG_BYTES // CONTAINERS
        for i, container in enumerate(node.containers):
            unflushed = container.metadata.unflushed_bytes
            assert backlog - APPEND_BYTES < unflushed <= backlog + THREADS * APPEND_BYTES, (i, unflushed)
            assert peak_unflushed[i] <= backlog + THREADS * APPEND_BYTES, (i, peak_unflushed[i])
            cache_bound = backlog + CACHE_BYTES // CONTAINERS + THREADS * APPEND_BYTES + 64 * KiB
            assert peak_cache[i] <= cache_bound, (i, peak_cache[i], cache_bound)
        assert peak_tier1 <= BACKLOG_BYTES + 4 * MiB, peak_tier1
        print(
            f"outage: {sum(len(a) for a in ledger.acked.values())} appends acknowledged, "
            f"{ledger.throttled} throttled (first after {first_throttled:.1f} s), "
            f"peak cache {peak_cache}, peak Tier 1 {peak_tier1}"
        )

        storage.end_outage()
        ended = time.monotonic()
        deadline = ended + CATCH_UP_S
        for name in SEGMENTS:
            while (info := node.store.info(name)).storage_length != info.length:
                assert time.monotonic() < deadline, f"{name} did not catch up: {info}"
                time.sleep(0.05)
        print(f"caught up {time.monotonic() - ended:.1f} s after the outage")
        assert all(c.metadata.unflushed_bytes == 0 for c in node.containers)
        verify(node, ledger)
    finally:
        node.store.close()

    storage.clear()
    node = Node(tmp_path, storage)
    try:
        verify(node, ledger)
    finally:
        node.store.close()
    print(f"total {time.monotonic() - started:.1f} s")
