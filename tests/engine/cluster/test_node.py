"""Stores as cluster nodes on moto: containers split by lease, moved on a node's loss, zombies fenced."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import ContainerNotReady, InvalidArgument, SegmentStore, Settings, load_settings
from engine.naming import container_for
from tests.polling import wait_until

LEASE_S = 3.0
CONTAINERS = 4



@pytest.fixture
def make_node(moto_endpoint: str, s3_bucket: str, tmp_path: Path) -> Iterator[Callable[[str], SegmentStore]]:
    stores: list[SegmentStore] = []

    def make(node_id: str) -> SegmentStore:
        settings = load_settings(
            {},
            data_dir=str(tmp_path / node_id),
            tier1=f"s3://{s3_bucket}/t1",
            tier2=f"s3://{s3_bucket}/t2",
            s3_endpoint=moto_endpoint,
            node_id=node_id,
            advertise_url=f"http://{node_id}.invalid",
            lease_s=LEASE_S,
            container_count=CONTAINERS,
            flush_threshold_ms=100,
        )
        store = SegmentStore(settings)
        store.start()
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def _serving(store: SegmentStore) -> list[int]:
    assert store.node is not None
    return [c for c in store.node.coordinator.held() if store.container_ready(c)]


def _owner(stores: list[SegmentStore], name: str) -> SegmentStore:
    container = container_for(name, CONTAINERS)
    for store in stores:
        if container in _serving(store):
            return store
    raise AssertionError(f"nobody serves container {container}")


def test_a_node_needs_tier1_on_s3_and_a_good_id() -> None:
    with pytest.raises(InvalidArgument, match="tier1 on S3"):
        Settings(node_id="a")
    with pytest.raises(InvalidArgument, match="node_id"):
        Settings(node_id="a/b", tier1="s3://b/t1", tier2="s3://b/t2")


@pytest.mark.slow
def test_two_nodes_split_the_containers_and_one_survives_the_others_loss(
    make_node: Callable[[str], SegmentStore],
) -> None:
    a, b = make_node("a"), make_node("b")
    wait_until(lambda: len(_serving(a)) == 2 and len(_serving(b)) == 2, "two containers each", 20)
    names = [f"seg-{i}" for i in range(16)]
    acked: dict[str, list[tuple[int, bytes]]] = {name: [] for name in names}
    for name in names:
        _owner([a, b], name).create(name)
    for round_ in range(5):
        for name in names:
            data = f"{name}:{round_};".encode()
            result = _owner([a, b], name).append(name, data)
            acked[name].append((result.offset, data))
    on_a = [name for name in names if container_for(name, CONTAINERS) in _serving(a)]
    assert on_a
    name = on_a[0]
    with pytest.raises(ContainerNotReady, match="served by node a"):
        b.append(name, b"not here")

    assert a.node is not None
    a.node.stop(hand_over=False)  # a stops renewing, as if it died; its containers are still up
    wait_until(lambda: len(_serving(b)) == CONTAINERS, "b serving every container", 20)
    assert not _serving(a)  # its leases ran out: it serves nothing, though nobody stopped it
    with pytest.raises(ContainerNotReady):
        a.append(name, b"zombie")
    for name in names:
        info = b.info(name)
        got = b.read(name, 0, info.length).data
        assert got == b"".join(data for _, data in acked[name])
        for offset, data in acked[name]:
            assert got[offset : offset + len(data)] == data
    assert b.append(on_a[0], b"after").offset == b.info(on_a[0]).length - len(b"after")


@pytest.mark.slow
def test_a_joining_node_takes_its_share_from_a_running_one(make_node: Callable[[str], SegmentStore]) -> None:
    a = make_node("a")
    wait_until(lambda: len(_serving(a)) == CONTAINERS, "a serving every container", 20)
    name = f"s-{uuid.uuid4().hex[:6]}"
    a.create(name)
    a.append(name, b"before")
    b = make_node("b")
    wait_until(lambda: len(_serving(a)) == 2 and len(_serving(b)) == 2, "two containers each", 30)
    owner = _owner([a, b], name)
    owner.append(name, b"after")
    assert owner.read(name, 0, 11).data == b"beforeafter"

