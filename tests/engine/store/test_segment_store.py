"""SegmentStore: data directory lock, pinned container count, routing, listing, request checks."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from engine import (
    ContainerNotReady,
    InvalidArgument,
    PayloadTooLarge,
    SegmentNotFound,
    SegmentStore,
    Settings,
    StoreLocked,
)
from engine.container.segment_container import SegmentContainer
from engine.metrics import EngineMetrics
from engine.naming import container_chunk_prefix, container_for, parse_chunk_name
from engine.tier1.memory_log import MemoryDataLog
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage
from engine.tier2.local import LocalChunkStorage
from engine.tier2.memory import MemoryChunkStorage
from tests.engine.conftest import Node, small_settings


def test_second_store_on_the_same_directory_is_locked_out(tmp_path: Path) -> None:
    settings = small_settings(tmp_path)
    first = SegmentStore(settings)
    first.start(wait=True)
    with pytest.raises(StoreLocked) as refused:
        SegmentStore(settings).start()
    holder = Path(settings.data_dir).resolve()
    expected = f"another process (pid {os.getpid()}) owns the data directory {holder}: stop it"
    assert expected in str(refused.value)
    first.create("s")
    first.close()
    second = SegmentStore(settings)
    second.start(wait=True)
    assert second.info("s").length == 0
    second.close()


def test_container_count_is_pinned(tmp_path: Path) -> None:
    first = SegmentStore(small_settings(tmp_path, container_count=2))
    first.start(wait=True)
    first.close()
    assert json.loads((tmp_path / "store.json").read_text())["container_count"] == 2
    with pytest.raises(InvalidArgument, match="container_count=2"):
        SegmentStore(small_settings(tmp_path, container_count=3)).start()
    assert json.loads((tmp_path / "store.json").read_text())["container_count"] == 2


def test_refused_container_count_leaves_the_directory_unlocked(tmp_path: Path) -> None:
    first = SegmentStore(small_settings(tmp_path, container_count=2))
    first.start(wait=True)
    first.close()
    with pytest.raises(InvalidArgument):
        SegmentStore(small_settings(tmp_path, container_count=3)).start()
    again = SegmentStore(small_settings(tmp_path, container_count=2))
    again.start(wait=True)
    again.close()


def test_segments_live_in_their_hashed_container(file_store: SegmentStore, tmp_path: Path) -> None:
    names = [f"scope/stream/{i}" for i in range(12)]
    for name in names:
        file_store.create(name)
        file_store.append(name, name.encode())
    file_store.flush()
    tier2 = LocalChunkStorage(tmp_path / "tier2")
    referenced: set[str] = set()
    for name in names:
        cid = container_for(name, 4)
        seg = file_store._containers[cid].metadata.by_name(name)
        assert seg.length == seg.storage_length == len(name) and seg.chunks
        for chunk in seg.chunks:
            parts = parse_chunk_name(chunk.name)
            assert parts is not None and (parts.container_id, parts.segment_id) == (cid, seg.segment_id)
            assert (tmp_path / "tier2" / chunk.name).is_file()
        assert ChunkedSegmentStorage(tier2, cid).read(seg.chunks, 0, len(name)) == name.encode()
        referenced.update(c.name for c in seg.chunks)
    assert {info.name for info in tier2.list()} == referenced
    for cid in range(4):
        for info in tier2.list(container_chunk_prefix(cid)):
            assert parse_chunk_name(info.name).container_id == cid  # type: ignore[union-attr]
    assert {container_for(n, 4) for n in names} == {0, 1, 2, 3}


@pytest.fixture
def four_containers() -> Iterator[SegmentStore]:
    settings = Settings(container_count=4, flush_threshold_ms=20)
    containers = [
        SegmentContainer(
            i, settings, MemoryDataLog(), MemoryChunkStorage(), EngineMetrics(CollectorRegistry())
        )
        for i in range(4)
    ]
    store = SegmentStore(settings, containers=containers)
    store.start(wait=True)
    yield store
    store.close()


def test_list_pages_across_containers(four_containers: SegmentStore) -> None:
    store = four_containers
    names = sorted([f"logs/{i:02d}" for i in range(23)] + ["a", "logs", "logz/1", "m/x"])
    for name in names:
        store.create(name)
    assert {container_for(n, 4) for n in names} == {0, 1, 2, 3}
    page, after = store.list()
    assert [i.name for i in page] == names and after is None
    seen: list[str] = []
    after = None
    while True:
        page, after = store.list("logs/", after=after, limit=5)
        seen.extend(i.name for i in page)
        assert len(page) <= 5
        if after is None:
            break
        assert after == page[-1].name
    assert seen == [n for n in names if n.startswith("logs/")]
    page, after = store.list("logs/", limit=23)
    assert len(page) == 23 and after is None
    page, after = store.list("logs/", after="logs/20")
    assert [i.name for i in page] == ["logs/21", "logs/22"]
    assert store.list("nothing")[0] == []
    store.delete("logs")
    assert "logs" not in [i.name for i in store.list()[0]]
    with pytest.raises(InvalidArgument):
        store.list(limit=0)


def test_request_arguments_are_checked(make_node: Callable[..., Node]) -> None:
    store = make_node(max_append_bytes=100).store
    store.create("s")
    writer = uuid.uuid4()
    bad = [
        lambda: store.append("s", b""),
        lambda: store.append("s", b"x", writer_id=writer),
        lambda: store.append("s", b"x", event_number=1),
        lambda: store.append("s", b"x", writer_id=writer, event_number=-1),
        lambda: store.append("s", b"x", writer_id=writer, event_number=2**63),
        lambda: store.append("s", b"x", event_count=0),
        lambda: store.append("s", b"x", event_count=2**32),
        lambda: store.append("s", b"x", expected_offset=-1),
        lambda: store.truncate("s", -1),
        lambda: store.create("t", rollover_bytes=0),
    ]
    for call in bad:
        with pytest.raises(InvalidArgument):
            call()
    with pytest.raises(PayloadTooLarge):
        store.append("s", b"x" * 101)
    assert store.append("s", b"x" * 100, writer_id=writer, event_number=2**63 - 1).offset == 0
    with pytest.raises(SegmentNotFound):
        store.info("t")
    info = store.info("s")
    assert (info.length, info.event_count) == (100, 1)


def test_store_refuses_requests_before_start_and_after_close(tmp_path: Path) -> None:
    store = SegmentStore(small_settings(tmp_path))
    assert not store.ready
    with pytest.raises(ContainerNotReady):
        store.create("s")
    store.start(wait=True)
    assert store.ready
    store.create("s")
    store.close()
    assert not store.ready
    with pytest.raises(ContainerNotReady):
        store.append("s", b"x")
    store.close()  # idempotent


def test_scan_walks_every_page_of_a_listing(store: SegmentStore) -> None:
    names = [f"scan/{i:04d}" for i in range(1005)]  # more than one page of 1,000
    for name in names:
        store.create(name)
    assert [info.name for info in store.scan("scan/")] == names
    assert [info.name for info in store.scan("scan/", after="scan/1002")] == names[1003:]
