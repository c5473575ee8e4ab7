"""Partitions for parallel readers: append boundaries remembered sparsely, kept across restarts."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from engine import SegmentNotFound, SegmentStore
from engine.metadata import operations as ops
from engine.metadata.container_metadata import BOUNDARIES_MAX, BOUNDARY_SPACING_MIN_BYTES, SegmentMetadata
from tests.engine.conftest import Node

KiB = 1024


def _filled(sizes: list[int]) -> SegmentMetadata:
    seg = SegmentMetadata(1, "s", 0.0)
    for size in sizes:
        seg.apply(ops.Append(segment_id=1, offset=seg.length, data=b"\0" * size))
    return seg


def _check_cover(ranges: list[tuple[int, int]], seg: SegmentMetadata, starts: set[int]) -> None:
    assert ranges[0][0] == seg.start_offset
    assert ranges[-1][1] == seg.length
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end == start
    assert all(start in starts for start, _ in ranges[1:]), ranges


def test_ranges_cover_the_segment_and_start_on_appends() -> None:
    sizes = [100 * KiB, 30 * KiB, 70 * KiB, 200 * KiB, 1 * KiB, 90 * KiB] * 20
    seg = _filled(sizes)
    starts = {sum(sizes[:i]) for i in range(len(sizes))}
    for target in (1, 64 * KiB, 256 * KiB, 1024 * KiB, 10**9):
        ranges = seg.partitions(target)
        _check_cover(ranges, seg, starts)
    assert len(seg.partitions(10**9)) == 1
    sizes_256 = [b - a for a, b in seg.partitions(256 * KiB)]
    assert all(128 * KiB <= n <= 512 * KiB for n in sizes_256[:-1]), sizes_256


def test_small_appends_are_remembered_at_the_minimum_spacing() -> None:
    seg = _filled([100] * 10_000)  # 1,000,000 bytes
    gaps = [b - a for a, b in zip(seg.boundaries, seg.boundaries[1:], strict=False)]
    assert min(gaps) >= BOUNDARY_SPACING_MIN_BYTES
    assert max(gaps) < BOUNDARY_SPACING_MIN_BYTES + 100
    ranges = seg.partitions(200 * KiB)
    assert len(ranges) == 5
    assert all(start % 100 == 0 for start, _ in ranges)


def test_a_long_segment_keeps_a_bounded_number_of_boundaries() -> None:
    seg = _filled([BOUNDARY_SPACING_MIN_BYTES] * (5 * BOUNDARIES_MAX))
    assert len(seg.boundaries) <= BOUNDARIES_MAX
    assert seg.boundary_spacing == 8 * BOUNDARY_SPACING_MIN_BYTES
    ranges = seg.partitions(seg.length // 10)
    assert len(ranges) == 10
    _check_cover(ranges, seg, set(range(0, seg.length, BOUNDARY_SPACING_MIN_BYTES)))


def test_empty_and_fully_truncated_segments_have_no_ranges() -> None:
    seg = _filled([])
    assert seg.partitions(10) == []
    seg = _filled([100 * KiB] * 3)
    seg.apply(ops.Truncate(segment_id=1, offset=seg.length))
    assert seg.partitions(10) == []


def test_truncation_starts_the_first_range_at_the_start_offset() -> None:
    seg = _filled([100 * KiB] * 10)
    seg.apply(ops.Truncate(segment_id=1, offset=250 * KiB))
    ranges = seg.partitions(100 * KiB)
    assert ranges[0] == (250 * KiB, 300 * KiB)
    assert [a for a, _ in ranges[1:]] == [k * 100 * KiB for k in range(3, 10)]


def test_boundaries_survive_a_restart_and_merges_bring_theirs(make_node: Callable[..., Node]) -> None:
    node = make_node(checkpoint_every_bytes=1)
    store: SegmentStore = node.store
    store.create("p")
    for _ in range(8):
        store.append("p", b"a" * (100 * KiB))
    txid = store.open_transaction("p")
    for _ in range(4):
        store.append_transaction("p", txid, b"t" * (100 * KiB))
    store.commit_transaction("p", txid)
    store.append("p", b"z" * (100 * KiB))
    expected = store.partitions("p", 100 * KiB)
    assert [a for a, _ in expected] == [k * 100 * KiB for k in range(13)]
    assert expected[-1] == (12 * 100 * KiB, 13 * 100 * KiB)
    node.log_a_checkpoint("p")  # boundaries from the checkpoint, then from replayed appends
    store.append("p", b"y" * (100 * KiB))
    before = store.partitions("p", 100 * KiB)
    node.restart()
    assert node.store.partitions("p", 100 * KiB) == before
    with pytest.raises(SegmentNotFound):
        node.store.partitions("nope", 1)
