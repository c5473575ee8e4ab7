"""Attributes in the attribute index (seed 001): flushes, eviction, fetch before the pipeline, crashes."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from engine import AttributeUpdate, AttributeUpdateType, ConditionalCheckFailed
from engine.metadata import operations as ops
from engine.metadata.container_metadata import SegmentMetadata
from engine.storage_writer import ATTRIBUTE_MEMORY_BYTES
from tests.engine.conftest import Node, logged_operations
from tests.polling import wait_until

T = AttributeUpdateType
KEYS = [uuid.UUID(int=i + 1) for i in range(40)]
# At most 8 values stay in memory once they are in the index.
TIGHT = {"attribute_cache_max_bytes": 8 * ATTRIBUTE_MEMORY_BYTES}


def _held(node: Node, name: str = "s") -> dict[str, int]:
    with node.container.metadata.lock:
        return dict(node.container.metadata.by_name(name).attributes)


def _segment(node: Node, name: str = "s") -> SegmentMetadata:
    with node.container.metadata.lock:
        return node.container.metadata.by_name(name)


def _attribute_chunks(node: Node) -> list[str]:
    return [n for n in node.storage.chunks if "%23attributes" in n]


def _fill(node: Node, count: int = 40) -> None:
    node.store.create("s")
    for i in range(0, count, 10):
        updates = [AttributeUpdate(k, T.REPLACE, k.int * 10) for k in KEYS[i : i + 10]]
        node.store.update_attributes("s", updates)


def test_the_writer_puts_attributes_in_the_index_and_logs_its_root(make_node: Callable[..., Node]) -> None:
    node = make_node()
    _fill(node)
    node.store.flush()
    seg = _segment(node)
    assert seg.attribute_root is not None and seg.attribute_length > 0
    assert seg.dirty == {}
    assert _attribute_chunks(node)
    index_ops = [op for op in logged_operations(node.data_log) if isinstance(op, ops.UpdateAttributeIndex)]
    assert index_ops and index_ops[-1].root == seg.attribute_root
    found = node.container.attributes.lookup(seg.segment_id, [str(k) for k in KEYS])
    assert found == {str(k): k.int * 10 for k in KEYS}


def test_clean_values_are_evicted_and_read_back_from_the_index(make_node: Callable[..., Node]) -> None:
    node = make_node(**TIGHT)
    _fill(node)
    node.store.flush()
    wait_until(lambda: len(_held(node)) <= 8, what="eviction")
    assert _segment(node).evictions > 0
    values = node.store.get_attributes("s", KEYS)
    assert values == {k: k.int * 10 for k in KEYS}
    assert node.store.get_attributes("s", [uuid.UUID(int=999)]) == {uuid.UUID(int=999): None}


def test_attribute_items_lists_values_in_memory_and_those_only_in_the_index(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(**TIGHT)
    assert node.store.create("empty") and node.store.attribute_items("empty") == {}
    _fill(node)
    node.store.flush()
    wait_until(lambda: len(_held(node)) <= 8, what="eviction")
    node.store.update_attributes("s", [AttributeUpdate(KEYS[0], T.REPLACE, -1)])  # newer in memory
    expected = {k: k.int * 10 for k in KEYS} | {KEYS[0]: -1}
    assert node.store.attribute_items("s") == expected


def test_conditions_on_evicted_values_use_fetched_values(make_node: Callable[..., Node]) -> None:
    node = make_node(**TIGHT)
    _fill(node)
    node.store.flush()
    wait_until(lambda: len(_held(node)) <= 8, what="eviction")
    evicted = next(k for k in KEYS if str(k) not in _held(node))
    with pytest.raises(ConditionalCheckFailed):
        node.store.update_attributes("s", [AttributeUpdate(evicted, T.REPLACE_IF_EQUALS, 1, expected=None)])
    with pytest.raises(ConditionalCheckFailed):
        node.store.update_attributes("s", [AttributeUpdate(evicted, T.NONE, 1)])
    done = node.store.update_attributes(
        "s", [AttributeUpdate(evicted, T.REPLACE_IF_EQUALS, 7, expected=evicted.int * 10)]
    )
    assert done == {evicted: 7}
    other = next(k for k in KEYS if str(k) not in _held(node))
    assert node.store.update_attributes("s", [AttributeUpdate(other, T.ACCUMULATE, 1)]) == {
        other: other.int * 10 + 1
    }


def test_an_evicted_writer_id_still_deduplicates(make_node: Callable[..., Node]) -> None:
    node = make_node(**TIGHT)
    node.store.create("s")
    writers = [uuid.uuid4() for _ in range(30)]
    for writer in writers:
        node.store.append("s", b"e", writer_id=writer, event_number=5)
    node.store.flush()
    wait_until(lambda: len(_held(node)) <= 8, what="eviction")
    for writer in writers:
        assert node.store.append("s", b"e", writer_id=writer, event_number=5).duplicate
        assert node.store.writer_event_number("s", writer) == 5
    assert not node.store.append("s", b"e", writer_id=writers[0], event_number=6).duplicate
    assert node.store.info("s").length == 31


def test_the_index_survives_restarts_and_keeps_growing(make_node: Callable[..., Node]) -> None:
    node = make_node(checkpoint_every_bytes=1, **TIGHT)
    _fill(node, 20)
    node.truncate_tier1()
    node.restart()
    assert node.store.get_attributes("s", KEYS[:20]) == {k: k.int * 10 for k in KEYS[:20]}
    node.store.update_attributes("s", [AttributeUpdate(k, T.ACCUMULATE, 1) for k in KEYS[:20]])
    node.store.flush()
    node.restart()
    assert node.store.get_attributes("s", KEYS[:20]) == {k: k.int * 10 + 1 for k in KEYS[:20]}


def test_a_crash_in_the_middle_of_an_index_write_keeps_the_old_root(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(**TIGHT)
    _fill(node, 20)
    node.store.flush()
    before = _segment(node).attribute_root
    attempts: list[ops.UpdateAttributeIndex] = []

    def never_durable(op: ops.UpdateAttributeIndex, written: int) -> bool:
        attempts.append(op)  # the pages are in Tier 2; the process dies before the root is logged
        raise OSError("crash before the index root reached Tier 1")

    monkeypatch.setattr(node.container.storage_writer, "_commit_index", never_durable)
    node.store.update_attributes("s", [AttributeUpdate(k, T.REPLACE, -k.int) for k in KEYS[:20]])
    wait_until(lambda: attempts, what="an index write")
    written = set(_attribute_chunks(node))
    assert _segment(node).attribute_root == before
    node.restart()
    assert node.store.get_attributes("s", KEYS[:20]) == {k: -k.int for k in KEYS[:20]}
    node.store.flush()
    after = _segment(node)
    assert after.attribute_root != before and after.dirty == {}
    garbage = {c for c in written if c not in {x.name for x in after.attribute_chunks}}
    assert garbage and not garbage & set(node.storage.chunks)  # unreferenced pages were collected
    node.restart()
    assert node.store.get_attributes("s", KEYS[:20]) == {k: -k.int for k in KEYS[:20]}


def test_deleting_a_segment_deletes_its_index(make_node: Callable[..., Node]) -> None:
    node = make_node()
    _fill(node)
    node.store.flush()
    assert _attribute_chunks(node)
    node.store.delete("s")
    node.store.flush()
    assert _attribute_chunks(node) == []


def test_a_merged_transaction_leaves_no_index_behind(make_node: Callable[..., Node]) -> None:
    node = make_node()
    node.store.create("p")
    txid = node.store.open_transaction("p")
    node.store.append_transaction("p", txid, b"x", writer_id=uuid.uuid4(), event_number=1)
    node.store.flush()
    assert _attribute_chunks(node)
    node.store.commit_transaction("p", txid)
    node.store.flush()
    wait_until(lambda: not _attribute_chunks(node), what="the transaction's index to go")


def test_a_value_fetched_before_an_eviction_is_fetched_again(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer value evicted between the fetch and the check must win over the fetched one."""
    node = make_node(**TIGHT)
    _fill(node)
    node.store.flush()
    wait_until(lambda: len(_held(node)) <= 8, what="eviction")
    key = next(k for k in KEYS if str(k) not in _held(node))
    container = node.container
    original = container._preload
    fetched: list[object] = []

    def preload_then_race(name: str, keys: list[str]) -> object:
        preloaded = original(name, keys)
        fetched.append(preloaded)
        if len(fetched) == 1:  # meanwhile: the key changes, reaches the index and is evicted again
            monkeypatch.setattr(container, "_preload", original)
            node.store.update_attributes("s", [AttributeUpdate(key, T.REPLACE, 20)])
            node.store.flush()
            container.metadata.evict_attributes(0)
            monkeypatch.setattr(container, "_preload", preload_then_race)
        return preloaded

    monkeypatch.setattr(container, "_preload", preload_then_race)
    with pytest.raises(ConditionalCheckFailed, match="is 20"):
        update = AttributeUpdate(key, T.REPLACE_IF_EQUALS, 11, expected=key.int * 10)
        node.store.update_attributes("s", [update])
    assert len(fetched) == 2  # the stale fetch was refused and done again
    assert node.store.get_attributes("s", [key]) == {key: 20}
