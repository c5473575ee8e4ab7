"""The attribute index B+Tree (seed 001): against a dict, through splits, merges, reopening and crashes."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from engine.attributes.index import AttributeIndex, IndexUpdate, NodeCache, RootPointer
from engine.attributes.index import page as pages
from engine.attributes.index.memory import LivePageStore
from engine.attributes.index.page import INT64_MAX, INT64_MIN, NODE_MAX_BYTES
from engine.attributes.index.tree import COMPACTION_RATIO
from engine.errors import DataCorrupted, InvalidArgument

SMALL_NODE_BYTES = 200  # 7 entries a leaf, 5 children an index page: splits and merges with few keys


class Segment:
    """An attribute segment in memory: appends land at the recorded length, as the storage writer's do."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.reads = 0

    def read(self, offset: int, length: int) -> bytes:
        self.reads += 1
        return bytes(self.data[offset : offset + length])

    def write(self, update: IndexUpdate) -> None:
        # Bytes past the offset are garbage of a plan that was never committed.
        assert update.offset <= len(self.data)
        self.data[update.offset :] = update.data


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def apply(
    index: AttributeIndex, segment: Segment | LivePageStore, changes: Mapping[bytes, int | None]
) -> None:
    update = index.plan(changes)
    segment.write(update)
    index.commit(update)
    if isinstance(segment, LivePageStore):
        segment.forget(update.obsolete)


def update_model(model: dict[bytes, int], changes: Mapping[bytes, int | None]) -> None:
    for k, v in changes.items():
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v


def check_tree(
    segment: Segment | LivePageStore, root: RootPointer | None, node_max_bytes: int
) -> tuple[int, int]:
    """Walk the pages from ``root`` and assert the B+Tree's invariants; returns (height, pages).

    Every leaf at one depth; keys within their separators; each stored
    child_min_offset the true lowest offset of its subtree; pages within the
    size bound; every node but the root and those on the right edge at least
    a quarter full; an index root has two children at least.
    """
    if root is None:
        return 0, 0
    leaf_min = max(1, pages.leaf_capacity(node_max_bytes) // 4)
    index_min = max(2, pages.index_capacity(node_max_bytes) // 4)
    depths: set[int] = set()
    count = 0

    def walk(offset: int, length: int, lo: bytes | None, hi: bytes | None, depth: int, edge: bool) -> int:
        nonlocal count
        count += 1
        assert length <= node_max_bytes
        node = pages.decode(segment.read(offset, length), offset)
        keys = node.keys
        assert lo is None or keys[0] >= lo
        assert hi is None or keys[-1] < hi
        if isinstance(node, pages.Leaf):
            depths.add(depth)
            assert depth == 0 or edge or len(keys) >= leaf_min
            return offset
        assert len(keys) >= 2 if depth == 0 else (edge or len(keys) >= index_min)
        low = offset
        for i in range(len(keys)):
            upper = keys[i + 1] if i + 1 < len(keys) else hi
            last = i == len(keys) - 1
            child = walk(node.offsets[i], node.lengths[i], keys[i], upper, depth + 1, edge and last)
            assert node.mins[i] == child
            low = min(low, child)
        return low

    assert walk(root.offset, root.length, None, None, 0, True) == root.min_offset
    assert len(depths) == 1
    return depths.pop() + 1, count


def assert_same(index: AttributeIndex, model: dict[bytes, int], probe: Iterable[bytes]) -> None:
    assert list(index.items()) == sorted(model.items())
    probe = list(probe)
    start = probe[len(probe) // 2]
    assert list(index.items(start)) == sorted((k, v) for k, v in model.items() if k >= start)
    assert index.get(probe) == {k: model[k] for k in probe if k in model}


KEYS = st.integers(0, 299).map(key) | st.sampled_from([bytes(16), b"\xff" * 16])
VALUES = st.none() | st.integers(INT64_MIN, INT64_MAX)
RANGE = st.tuples(st.sampled_from(["put", "remove"]), st.integers(0, 299), st.integers(0, 299))
BATCH = st.dictionaries(KEYS, VALUES, max_size=40) | RANGE


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(BATCH, min_size=1, max_size=25),
    compaction=st.booleans(),
    reopen_every=st.integers(1, 6),
)
def test_matches_a_dict_through_splits_merges_and_reopening(
    batches: list[dict[bytes, int | None] | tuple[str, int, int]], compaction: bool, reopen_every: int
) -> None:
    segment = Segment()
    index = AttributeIndex(segment.read, None, 0, compaction=compaction, node_max_bytes=SMALL_NODE_BYTES)
    model: dict[bytes, int] = {}
    probe = [key(i) for i in range(0, 300, 7)] + [bytes(16), b"\xff" * 16]
    tallest = removed = 0
    for n, batch in enumerate(batches, 1):
        if isinstance(batch, tuple):  # a whole range at once: many splits, or many merges
            verb, lo, hi = batch[0], *sorted(batch[1:])
            batch = {key(i): None if verb == "remove" else n * i for i in range(lo, hi + 1)}
        removed += sum(1 for k, v in batch.items() if v is None and k in model)
        apply(index, segment, batch)
        update_model(model, batch)
        assert_same(index, model, [*probe, *batch])
        height, _ = check_tree(segment, index.root, SMALL_NODE_BYTES)
        tallest = max(tallest, height)
        if n % reopen_every == 0:
            index = AttributeIndex(
                segment.read, index.root, index.length, compaction=compaction,
                cache=NodeCache(), node_max_bytes=SMALL_NODE_BYTES,
            )
            assert_same(index, model, probe)
    # Steer the search towards tall trees that then shrink.
    target(float(tallest), label="height")
    target(float(min(removed, 40 * tallest)), label="removals")


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.sampled_from([300, 1_000, 2_000]))
def test_real_node_size_splits_and_merges(seed: int, size: int) -> None:
    """32 KiB pages: 8,000 keys split the first leaf more than twice; removing most merges them back."""
    rng = random.Random(seed)
    segment = Segment()
    index = AttributeIndex(segment.read, None, 0)
    model: dict[bytes, int] = {}
    keys = list({rng.randbytes(16) for _ in range(8_000)})
    assert len(keys) == 8_000
    for at in range(0, len(keys), size):
        batch = {k: rng.randint(INT64_MIN, INT64_MAX) for k in keys[at : at + size]}
        apply(index, segment, batch)
        update_model(model, batch)
    height, count = check_tree(segment, index.root, NODE_MAX_BYTES)
    assert height == 2 and count >= 1 + 6  # 8,000 / 1,364 a leaf, some half full after splits
    assert_same(index, model, keys[::50])
    leaves_before = count - 1
    rng.shuffle(keys)
    for at in range(0, 7_500, 500):
        batch = {k: None for k in keys[at : at + 500]}
        apply(index, segment, batch)
        update_model(model, batch)
        check_tree(segment, index.root, NODE_MAX_BYTES)
    height, count = check_tree(segment, index.root, NODE_MAX_BYTES)
    assert len(model) == 500 and count - (height > 1) < leaves_before
    reopened = AttributeIndex(segment.read, index.root, index.length)
    assert_same(reopened, model, keys[::50])
    for k in list(model):
        apply(index, segment, {k: None})
    assert index.root is None and list(index.items()) == []


def test_crash_between_plan_and_commit_keeps_the_old_tree() -> None:
    segment = Segment()
    index = AttributeIndex(segment.read, None, 0, node_max_bytes=SMALL_NODE_BYTES)
    model = {key(i): i for i in range(100)}
    apply(index, segment, model)
    root, length = index.root, index.length

    update = index.plan({key(i): None for i in range(0, 100, 2)} | {key(500): 5})
    assert index.root == root and index.length == length  # a plan changes nothing
    segment.write(update)  # written (perhaps only in part) but never recorded: the crash
    del segment.data[update.offset + len(update.data) // 2 :]

    reopened = AttributeIndex(segment.read, root, length, node_max_bytes=SMALL_NODE_BYTES)
    assert_same(reopened, model, [key(i) for i in range(0, 600, 3)])
    changes = {key(i): -i for i in range(50, 150)}
    apply(reopened, segment, changes)
    update_model(model, changes)
    assert_same(reopened, model, [key(i) for i in range(0, 600, 3)])
    check_tree(segment, reopened.root, SMALL_NODE_BYTES)
    fresh = AttributeIndex(segment.read, reopened.root, reopened.length, node_max_bytes=SMALL_NODE_BYTES)
    assert_same(fresh, model, [key(i) for i in range(0, 600, 3)])


def test_a_stale_plan_is_refused() -> None:
    segment = Segment()
    index = AttributeIndex(segment.read, None, 0)
    first, second = index.plan({key(1): 1}), index.plan({key(2): 2})
    segment.write(first)
    index.commit(first)
    with pytest.raises(ValueError):
        index.commit(second)
    assert dict(index.items()) == {key(1): 1}


@pytest.mark.parametrize(
    "damage",
    ["flip a key byte", "flip the checksum", "torn read", "wrong offset", "bad magic", "keys out of order"],
)
def test_corrupted_pages_raise_data_corrupted(damage: str) -> None:
    segment = Segment()
    index = AttributeIndex(segment.read, None, 0, node_max_bytes=SMALL_NODE_BYTES)
    apply(index, segment, {key(i): i for i in range(40)})
    root = index.root
    assert root is not None and root.min_offset == 0  # the first page is a leaf
    leaf_length = pages.OVERHEAD_BYTES + pages.leaf_capacity(SMALL_NODE_BYTES) * pages.LEAF_ENTRY_BYTES
    read = segment.read
    if damage == "flip a key byte":
        segment.data[pages.HEADER.size + 3] ^= 0x40
    elif damage == "flip the checksum":
        segment.data[leaf_length - 1] ^= 1
    elif damage == "torn read":
        def read(offset: int, length: int) -> bytes:
            return segment.read(offset, length)[: length - 5]
    elif damage == "wrong offset":
        def read(offset: int, length: int) -> bytes:
            return segment.read(0, length) if offset else segment.read(offset, length)
    elif damage == "bad magic":
        segment.data[0:4] = b"XXXX"
    else:  # a page whose checksum holds but whose keys do not: a writer's bug, caught on read
        node = pages.decode(segment.read(0, leaf_length), 0)
        node.keys[0], node.keys[1] = node.keys[1], node.keys[0]
        segment.data[0:leaf_length] = pages.encode_leaf(pages.Leaf(node.keys, node.values), 0)
    reopened = AttributeIndex(read, root, index.length, node_max_bytes=SMALL_NODE_BYTES)
    with pytest.raises(DataCorrupted):
        dict(reopened.items())


def test_invalid_changes_are_refused() -> None:
    index = AttributeIndex(Segment().read, None, 0)
    for changes in ({b"short": 1}, {key(1): 2**63}, {key(1): "1"}, {"x" * 16: 1}, {key(1): 1, "x" * 16: 1}):
        with pytest.raises(InvalidArgument):
            index.plan(changes)  # type: ignore[arg-type]


def _window_run(
    compaction: bool, batches: int, ratio: float = COMPACTION_RATIO
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Load 3,000 keys, then update random keys of the upper half only, 20 a batch.

    Returns per batch: the segment length less the root's min_offset (the
    size after head truncation), the bytes appended, and the live pages.
    """
    store = LivePageStore()
    index = AttributeIndex(
        store.read, None, 0, compaction=compaction, compaction_ratio=ratio, node_max_bytes=1024
    )
    apply(index, store, {key(i): i for i in range(3_000)})
    rng = random.Random(7)
    windows, appended, live, live_bytes = [], [], [], []
    for n in range(batches):
        before = store.length
        apply(index, store, {key(rng.randrange(1_500, 3_000)): n for _ in range(20)})
        root = index.root
        assert root is not None
        windows.append(store.length - root.min_offset)
        appended.append(store.length - before)
        live.append(len(store.pages))
        live_bytes.append(sum(map(len, store.pages.values())))
    assert dict(index.items()) == dict(
        AttributeIndex(store.read, index.root, index.length, node_max_bytes=1024).items()
    )
    return windows, appended, live, live_bytes


@pytest.mark.parametrize("ratio", [0.0, COMPACTION_RATIO], ids=["one page a batch", "default"])
def test_progressive_compaction_bounds_the_live_size(ratio: float) -> None:
    """With compaction, length - min_offset stays under a bound; without it, it grows without bound.

    The bound: each batch re-appends the lowest page it does not rewrite (at
    least), and pages written later all lie above it, so every page older
    than batch t is rewritten or moved by batch t + P (P: pages in the tree).
    The oldest live page is then at most P batches old, and the window is at
    most the bytes appended by the last P batches.
    """
    batches = 1_500
    windows, appended, live, _ = _window_run(True, batches, ratio)
    pages_max = max(live)
    for n in range(pages_max, batches):
        assert windows[n] <= sum(appended[n - pages_max + 1 : n + 1])
    # And it does not creep up: the last third of the run is no worse than the middle third.
    third = batches // 3
    assert max(windows[2 * third :]) <= 1.1 * max(windows[third : 2 * third])

    plain, _, _, plain_live = _window_run(False, batches)
    # The lower half is never rewritten: its oldest page stays, so the window is everything appended.
    assert plain[-1] > 2 * plain[batches // 2 - 1] * 0.9
    assert plain[-1] > 30 * max(plain_live)
    assert plain[-1] > 10 * max(windows)


def test_warm_lookups_read_at_most_one_page() -> None:
    """100,000 keys, a 1 MiB cache: the index pages stay cached, a lookup reads its leaf at most."""
    segment = Segment()
    rng = random.Random(9)
    keys = sorted({rng.randbytes(16) for _ in range(100_000)})
    index = AttributeIndex(segment.read, None, 0)
    apply(index, segment, {k: i for i, k in enumerate(keys)})
    warm = AttributeIndex(segment.read, index.root, index.length, cache=NodeCache(1024 * 1024))
    for k in rng.choices(keys, k=2_000):
        warm.get([k])
    reads = 0
    for k in rng.choices(keys, k=2_000):
        before = warm.page_reads
        assert k in warm.get([k])
        assert warm.page_reads - before <= 1
        reads += warm.page_reads - before
    assert reads > 1_000  # the leaves do not all fit: the test measures the upper levels' caching


def test_lookups_during_updates_see_one_whole_batch() -> None:
    """Readers in threads while the writer commits and drops replaced pages: each get sees one root."""
    store = LivePageStore()
    index = AttributeIndex(store.read, None, 0, cache=NodeCache(64 * 1024), node_max_bytes=1024)
    keys = [key(i) for i in range(0, 600, 3)]
    apply(index, store, dict.fromkeys(keys, 0))
    done = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not done.is_set():
                values = set(index.get(keys).values())
                assert len(values) == 1, values
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for n in range(1, 150):
        apply(index, store, dict.fromkeys(keys, n))
    done.set()
    for t in threads:
        t.join()
    assert not errors
    assert set(index.get(keys).values()) == {149}


def test_each_batch_moves_the_lowest_page_with_its_ancestors() -> None:
    """Seed 001's progressive compaction: an empty batch still re-appends the lowest page, and its path."""
    segment = Segment()
    index = AttributeIndex(segment.read, None, 0, node_max_bytes=SMALL_NODE_BYTES)
    apply(index, segment, {key(i): i for i in range(60)})  # three levels of 7-entry leaves
    for _ in range(20):
        root = index.root
        assert root is not None
        update = index.plan({})
        assert root.min_offset in update.obsolete and root.offset in update.obsolete
        assert update.root is not None and update.root.min_offset > root.min_offset
        height, _ = check_tree(segment, root, SMALL_NODE_BYTES)
        assert len(update.obsolete) == height  # the page and each ancestor, once
        segment.write(update)
        index.commit(update)
    assert dict(index.items()) == {key(i): i for i in range(60)}

    plain = AttributeIndex(
        segment.read, index.root, index.length, compaction=False, node_max_bytes=SMALL_NODE_BYTES
    )
    update = plain.plan({})
    assert update.data == b"" and update.root == index.root
