"""client.stream_cuts over a lineage held in memory: the ranges between cuts and the micro-batch ends."""

from __future__ import annotations

from client.results import SegmentInfo
from client.segment_client import SegmentClient
from client.stream_client import StreamCut, StreamSegment
from client.stream_cuts import Lineage, SegmentRange, advance, ranges_between


class FakeLineage(Lineage):
    """Segments as ``{id: (length, sealed)}``; successors as ``{id: [(successor, predecessors)]}``."""

    def __init__(
        self, segments: dict[int, tuple[int, bool]], successors: dict[int, list[tuple[int, list[int]]]]
    ):
        super().__init__(SegmentClient("http://127.0.0.1:9"), "sc", "st")
        self.segments, self.links = segments, successors

    def info(self, segment_id: int) -> SegmentInfo:
        length, sealed = self.segments[segment_id]
        return SegmentInfo(self.name(segment_id), length, 0, length, sealed, 0, "", "")

    def successors(self, segment_id: int) -> list[StreamSegment]:
        found = self.links.get(segment_id, [])
        return [StreamSegment(s, self.name(s), 0.0, 1.0, tuple(preds)) for s, preds in found]

    def epoch_of(self, segment_id: int, since: int) -> int:
        return {3: 1, 4: 1, 5: 2}.get(segment_id, 0)


# Three segments; 0 splits into 3 and 4 (epoch 1); 4 and 1 merge into 5 (epoch 2); 2 never scales.
SEGMENTS = {0: (100, True), 1: (50, True), 2: (70, False), 3: (30, False), 4: (20, True), 5: (10, False)}
LINKS = {0: [(3, [0]), (4, [0])], 4: [(5, [4, 1])], 1: [(5, [4, 1])]}


def test_ranges_between_the_head_and_the_tail_are_grouped_by_lineage_in_id_order() -> None:
    lineage = FakeLineage(SEGMENTS, LINKS)
    head = StreamCut(0, {0: 0, 1: 0, 2: 0})
    tail = StreamCut(2, {2: 70, 3: 30, 5: 10})
    groups = ranges_between(lineage, head, tail)
    assert sorted(groups, key=len) == [
        [SegmentRange(2, 0, 70)],
        [SegmentRange(0, 0, 100), SegmentRange(1, 0, 50), SegmentRange(3, 0, 30), SegmentRange(4, 0, 20),
         SegmentRange(5, 0, 10)],
    ]  # fmt: skip


def test_ranges_between_stop_at_the_end_cut() -> None:
    lineage = FakeLineage(SEGMENTS, LINKS)
    middle = StreamCut(1, {1: 40, 2: 10, 3: 5, 4: 20})
    groups = ranges_between(lineage, StreamCut(0, {0: 60, 1: 0, 2: 0}), middle)
    assert sorted((r for group in groups for r in group), key=lambda r: r.segment_id) == [
        SegmentRange(0, 60, 100), SegmentRange(1, 0, 40), SegmentRange(2, 0, 10), SegmentRange(3, 0, 5),
        SegmentRange(4, 0, 20),
    ]  # fmt: skip


def test_a_micro_batch_enters_successors_only_of_segments_read_to_their_ends_before_it() -> None:
    lineage = FakeLineage(SEGMENTS, LINKS)
    first = advance(lineage, StreamCut(0, {0: 0, 1: 0, 2: 0}))
    assert first == StreamCut(0, {0: 100, 1: 50, 2: 70})  # 0 and 1 are read to their ends, not yet left
    second = advance(lineage, first)
    assert second == StreamCut(1, {1: 50, 2: 70, 3: 30, 4: 20})  # the split entered; 1 waits for 4
    third = advance(lineage, second)
    assert third == StreamCut(2, {2: 70, 3: 30, 5: 10})  # the merge entered once both were read
    assert advance(lineage, third) == third
    # Within each micro-batch no segment with events is another's successor.
    for start, end in ((first, second), (second, third)):
        read = {r.segment_id for group in ranges_between(lineage, start, end) for r in group}
        assert not any(s in read for p in read for s, _ in LINKS.get(p, []))


def test_available_now_caps_offsets_and_enters_no_segment_born_after_it() -> None:
    lineage = FakeLineage(SEGMENTS, LINKS)
    cap = StreamCut(0, {0: 100, 1: 30, 2: 40})
    start = advance(lineage, StreamCut(0, {0: 0, 1: 0, 2: 0}), cap)
    assert start == StreamCut(0, {0: 100, 1: 30, 2: 40})
    assert advance(lineage, start, cap) == start
