"""Whole-cluster operations on two stores on moto, their peer calls made in process (no HTTP).

The calls still go through the peer service's JSON answers and the
client's decoding, errors included, so only the HTTP hop is left out.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from engine import (
    AppendResult,
    AppendStep,
    AttributeUpdate,
    AttributeUpdateType,
    ContainerNotReady,
    CreateStep,
    DeleteStep,
    EventNumberMismatch,
    InvalidArgument,
    PeerService,
    SealStep,
    SegmentInfo,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentStore,
    UpdateAttributesStep,
    load_settings,
)
from engine.naming import container_for
from tests.polling import wait_until

LEASE_S = 3.0
CONTAINERS = 4

pytestmark = pytest.mark.slow


class LocalTransport:
    """Peer calls handed straight to the receiving store's service; an unknown URL is unreachable."""

    def __init__(self) -> None:
        self.services: dict[str, PeerService] = {}
        self.calls: list[tuple[str, str]] = []

    def post(self, url: str, op: str, doc: dict[str, Any], secret: str) -> tuple[int, dict[str, Any]]:
        service = self.services.get(url)
        if service is None:
            raise OSError(f"{url} does not answer")
        self.calls.append((url, op))
        assert service.admits(secret), "every node of the cluster knows the secret"
        status, body = service.answer(op, json.dumps(doc).encode())
        return status, json.loads(body)



@pytest.fixture(scope="module")
def pair(
    moto_endpoint: str, s3_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SegmentStore, SegmentStore, LocalTransport]]:
    """Stores a and b splitting four containers, each knowing the other's view.

    One pair serves every test of the module (starting one takes seconds): each
    test names its own segments, and one that takes a node away puts it back.
    """
    s3_bucket = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=s3_bucket)
    tmp_path = tmp_path_factory.mktemp("pair")
    transport = LocalTransport()
    stores: list[SegmentStore] = []
    for node_id in ("a", "b"):
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
        store = SegmentStore(settings, peer_transport=transport)
        store.start()
        transport.services[settings.node_url] = PeerService(store)
        stores.append(store)
    a, b = stores

    def settled() -> bool:
        served = [sorted(s.served_containers()) for s in (a, b)]
        views = [s.node.view().owners for s in (a, b) if s.node is not None]
        return all(len(c) == 2 for c in served) and all(len(v) == CONTAINERS for v in views)

    try:
        wait_until(settled, "two containers each, seen by both", 30)
        yield a, b, transport
    finally:
        for store in stores:
            store.close()


def _owner(a: SegmentStore, b: SegmentStore, name: str) -> SegmentStore:
    return a if container_for(name, CONTAINERS) in a.served_containers() else b


def _names_everywhere(prefix: str, per_container: int) -> list[str]:
    names: list[str] = []
    for i in range(10_000):
        name = f"{prefix}{i:04d}"
        if (
            sum(container_for(n, CONTAINERS) == container_for(name, CONTAINERS) for n in names)
            < per_container
        ):
            names.append(name)
        if len(names) == per_container * CONTAINERS:
            return names
    raise AssertionError("too few names")


def test_both_nodes_know_one_secret_and_refuse_another(
    pair: tuple[SegmentStore, SegmentStore, LocalTransport],
) -> None:
    a, b, transport = pair
    assert a.node is not None and b.node is not None
    assert a.node.secret and a.node.secret == b.node.secret and len(a.node.secret) == 64
    service = transport.services["http://a.invalid"]
    assert (
        not service.admits(None) and not service.admits("") and not service.admits(a.node.secret[:-1] + "x")
    )


def test_a_listing_spans_every_container_from_either_node(
    pair: tuple[SegmentStore, SegmentStore, LocalTransport],
) -> None:
    a, b, transport = pair
    names = _names_everywhere("wide/s-", 3)
    for name in names:
        _owner(a, b, name).create(name)
    _owner(a, b, names[0]).open_transaction(names[0])  # an internal segment: never listed
    reserved = "#test/buckets/wide"
    _owner(a, b, reserved).create(reserved)
    for store in (a, b):
        page, after = store.list("wide/")
        assert [i.name for i in page] == sorted(names) and after is None
        seen: list[str] = []
        after = None
        while True:
            transport.calls.clear()
            page, after = store.list("wide/", after=after, limit=5)
            assert len(page) <= 5 and {op for _, op in transport.calls} == {"list"}
            assert len(transport.calls) == 1, "one call to the other node per page"
            seen.extend(i.name for i in page)
            if after is None:
                break
            assert after == page[-1].name
        assert seen == sorted(names)
        assert [i.name for i in store.scan("#test/buckets/")] == [reserved], "reserved prefixes list theirs"
        assert all(not i.name.startswith("#") for i in store.scan("")), "reserved names hidden as before"
        here = [i.name for i in store.scan("wide/", here=True)]
        assert here == sorted(n for n in names if container_for(n, CONTAINERS) in store.served_containers())


def test_a_listing_is_refused_while_a_container_has_no_serving_node(
    pair: tuple[SegmentStore, SegmentStore, LocalTransport],
) -> None:
    a, _b, transport = pair
    gone = transport.services.pop("http://b.invalid")
    with pytest.raises(ContainerNotReady, match="node b cannot be reached"):
        a.list("")
    transport.services["http://b.invalid"] = gone
    assert a.list("refused/")[0] == []


def test_heads_read_many_records_in_one_call_per_node(
    pair: tuple[SegmentStore, SegmentStore, LocalTransport],
) -> None:
    a, b, transport = pair
    names = _names_everywhere("h-", 2)
    for name in names:
        owner = _owner(a, b, name)
        owner.create(name)
        owner.append(name, f"old {name}\n".encode())
        owner.truncate(name, owner.info(name).length)
        owner.append(name, name.encode())
    transport.calls.clear()
    heads = a.heads([*names, "h-missing"])
    assert heads == {**{n: n.encode() for n in names}, "h-missing": None}
    assert len(transport.calls) == 1 and transport.calls[0][1] == "heads"


def test_a_merge_and_a_copy_across_nodes(pair: tuple[SegmentStore, SegmentStore, LocalTransport]) -> None:
    a, b, _transport = pair
    target = next(n for n in (f"t-{i}" for i in range(100)) if _owner(a, b, n) is a)
    source = next(n for n in (f"s-{i}" for i in range(100)) if _owner(a, b, n) is b)
    a.create(target)
    a.append(target, b"head;")
    b.create(source)
    payload = bytes(range(256)) * 20
    b.append(source, payload)
    with pytest.raises(SegmentNotSealed):
        a.merge(target, source)
    b.seal(source)
    with pytest.raises(ContainerNotReady):
        b.merge(target, source)  # the target's node merges
    merged = a.merge(target, source)
    assert (merged.offset, merged.length) == (5, len(payload))
    assert a.read(target, 0, 10_000).data == b"head;" + payload
    with pytest.raises(SegmentNotFound):
        b.info(source)
    again = a.merge(target, source)
    assert (again.offset, again.length) == (5, len(payload)), "a retry answers the first merge"

    copy = next(n for n in (f"c-{i}" for i in range(100)) if _owner(a, b, n) is b)
    info = b.copy(target, copy, 105)
    assert (info.start_offset, info.length) == (0, 105)
    assert b.read(copy, 0, 200).data == (b"head;" + payload)[:105]
    assert a.info(target, anywhere=True) == a.info(target)
    assert b.read(target, 5, 3, anywhere=True).data == payload[:3]


def test_a_composite_and_a_writer_lookup_reach_the_node_serving_their_container(
    pair: tuple[SegmentStore, SegmentStore, LocalTransport],
) -> None:
    a, b, transport = pair
    name = next(n for n in (f"far-{i}" for i in range(100)) if _owner(a, b, n) is b)
    writer = uuid.UUID(int=5)
    key = uuid.UUID(int=6)
    set_key = AttributeUpdate(key, AttributeUpdateType.REPLACE, -7)
    with pytest.raises(ContainerNotReady):
        a.composite([CreateStep(name)])  # only where it is served, unless asked anywhere
    created, appended, attributes = a.composite(
        [CreateStep(name), AppendStep(name, b"far", writer_id=writer, event_number=3),
         UpdateAttributesStep(name, [set_key])],
        anywhere=True,
    )  # fmt: skip
    assert isinstance(created, SegmentInfo) and created.length == 0
    assert isinstance(appended, AppendResult) and (appended.offset, appended.info.length) == (0, 3)
    assert attributes == {key: -7}
    assert ("http://b.invalid", "composite") in transport.calls
    assert a.writer_event_number(name, writer, anywhere=True) == 3
    with pytest.raises(EventNumberMismatch) as mismatch:  # errors come back whole, step and all
        a.composite([UpdateAttributesStep(name, [set_key]), AppendStep(name, b"x", writer_id=writer,
                     event_number=9, previous_event_number=4)], anywhere=True)  # fmt: skip
    assert (mismatch.value.step, mismatch.value.stored) == (1, 3)
    [sealed] = a.composite([SealStep(name)], anywhere=True)
    assert isinstance(sealed, SegmentInfo) and sealed.sealed
    assert b.read(name).data == b"far"
    with pytest.raises(SegmentNotFound) as refused:
        a.composite([DeleteStep(name, segment_id=created.segment_id + 1000)], anywhere=True)
    assert refused.value.step == 0
    with pytest.raises(InvalidArgument):
        a.composite([AppendStep(name, lambda state: b"rendered")], anywhere=True)
