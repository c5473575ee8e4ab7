"""Metadata and its updater: validation, offsets, duplicates, sequence numbers, invariants."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import (
    BadOffset,
    ConditionalCheckFailed,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
)
from engine.durable_log.metadata_updater import MetadataUpdater, Outcome
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata
from engine.tier2.chunked_segment_storage import ChunkRef

W1, W2 = uuid.UUID(int=1), uuid.UUID(int=2)


def create(name: str = "s") -> ops.CreateSegment:
    return ops.CreateSegment(name=name, created=1.0)


def append(data: bytes = b"x", name: str = "s", **kw: object) -> ops.Append:
    return ops.Append(name=name, data=data, **kw)  # type: ignore[arg-type]


def commit(md: ContainerMetadata, *batch: ops.Operation) -> list[Outcome]:
    """Pre-process a batch in one updater and apply what it logged, like a durable write."""
    updater = MetadataUpdater(md)
    outcomes = [updater.pre_process(op) for op in batch]
    for op, outcome in zip(batch, outcomes, strict=True):
        if outcome.logged:
            md.apply(op)
    return outcomes


@pytest.fixture
def md() -> ContainerMetadata:
    md = ContainerMetadata(0)
    commit(md, create())
    return md


def test_create_assigns_ids_and_existing_name_is_refused(md: ContainerMetadata) -> None:
    assert md.by_name("s").segment_id == 1
    with pytest.raises(SegmentExists):
        commit(md, create())
    updater = MetadataUpdater(md)
    updater.pre_process(create("t"))
    with pytest.raises(SegmentExists):
        updater.pre_process(create("t"))  # earlier in the same batch


def test_unknown_segment_is_not_found(md: ContainerMetadata) -> None:
    for op in (
        append(name="nope"),
        ops.Seal(name="nope"),
        ops.Truncate(name="nope"),
        ops.Delete(name="nope"),
    ):
        with pytest.raises(SegmentNotFound):
            MetadataUpdater(md).pre_process(op)


def test_appends_in_one_batch_get_consecutive_offsets(md: ContainerMetadata) -> None:
    batch = [append(b"abc"), append(b"de"), append(b"f")]
    commit(md, *batch)
    assert [op.offset for op in batch] == [0, 3, 5]
    assert md.info("s").length == 6


def test_expected_offset_mismatch_is_refused_with_segment_info(md: ContainerMetadata) -> None:
    commit(md, append(b"abc"))
    with pytest.raises(ConditionalCheckFailed) as info:
        commit(md, append(expected_offset=2))
    assert info.value.segment is not None and info.value.segment.length == 3
    updater = MetadataUpdater(md)
    updater.pre_process(append(b"zz", expected_offset=3))
    updater.pre_process(append(b"y", expected_offset=5))  # counts the batch's earlier append
    with pytest.raises(ConditionalCheckFailed):
        updater.pre_process(append(b"y", expected_offset=5))


def test_duplicate_event_numbers_are_not_logged(md: ContainerMetadata) -> None:
    assert commit(md, append(writer_id=W1, event_number=5)) == [Outcome(True)]
    dup = append(writer_id=W1, event_number=5)
    older = append(writer_id=W1, event_number=0)
    assert commit(md, dup, older) == [Outcome(False, 5), Outcome(False, 5)]
    assert dup.seq == -1 and dup.offset == -1
    assert commit(md, append(writer_id=W2, event_number=0), append(writer_id=W1, event_number=6)) == [
        Outcome(True),
        Outcome(True),
    ]
    seg = md.by_name("s")
    assert seg.attributes == {str(W1): 6, str(W2): 0}
    assert seg.length == 3 and seg.event_count == 3


def test_duplicate_within_one_batch(md: ContainerMetadata) -> None:
    outcomes = commit(md, append(writer_id=W1, event_number=1), append(writer_id=W1, event_number=1))
    assert outcomes == [Outcome(True), Outcome(False, 1)]
    assert md.info("s").length == 1


def test_sealed_segment_refuses_appends(md: ContainerMetadata) -> None:
    assert commit(md, ops.Seal(name="s")) == [Outcome(True)]
    assert commit(md, ops.Seal(name="s")) == [Outcome(False)]  # idempotent, nothing logged
    with pytest.raises(SegmentSealed) as info:
        commit(md, append())
    assert info.value.segment is not None and info.value.segment.sealed
    updater = MetadataUpdater(md)
    updater.pre_process(create("t"))
    updater.pre_process(ops.Seal(name="t"))
    with pytest.raises(SegmentSealed):
        updater.pre_process(append(name="t"))


def test_truncate(md: ContainerMetadata) -> None:
    commit(md, append(b"0123456789"))
    with pytest.raises(BadOffset) as info:
        commit(md, ops.Truncate(name="s", offset=11))
    assert info.value.segment is not None and info.value.segment.length == 10
    assert commit(md, ops.Truncate(name="s", offset=4)) == [Outcome(True)]
    assert commit(md, ops.Truncate(name="s", offset=2)) == [Outcome(False)]  # never decreases
    assert md.info("s").start_offset == 4
    assert commit(md, ops.Truncate(name="s", offset=10)) == [Outcome(True)]
    commit(md, ops.Seal(name="s"))
    with pytest.raises(SegmentSealed):
        commit(md, ops.Truncate(name="s", offset=11))


def test_delete_then_recreate_gets_a_new_id(md: ContainerMetadata) -> None:
    commit(md, ops.Delete(name="s"))
    with pytest.raises(SegmentNotFound):
        md.by_name("s")
    assert md.segments[1].deleted
    commit(md, create())
    assert md.by_name("s").segment_id == 2
    commit(md, ops.Delete(name="s"), create())  # in one batch
    assert md.by_name("s").segment_id == 3


def test_sequence_numbers_strictly_increase_and_failed_ones_are_burnt(md: ContainerMetadata) -> None:
    batch = [append(), ops.Seal(name="s"), ops.Seal(name="s"), create("t")]
    commit(md, *batch)
    assert [op.seq for op in batch] == [2, 3, -1, 4]
    assert md.seq == 4
    failed = MetadataUpdater(md)
    failed.pre_process(append(name="t"))
    failed.pre_process(append(name="t"))
    assert md.seq == 4 and md.info("t").length == 0  # staged only
    failed.burn_sequence_numbers()
    assert md.seq == 6
    later = append(name="t")
    commit(md, later)
    assert later.seq == 7 and later.offset == 0


def test_updater_stages_without_touching_committed_state(md: ContainerMetadata) -> None:
    updater = MetadataUpdater(md)
    updater.pre_process(append(b"abc"))
    updater.pre_process(ops.Seal(name="s"))
    updater.pre_process(ops.Delete(name="s"))
    seg = md.by_name("s")
    assert (seg.length, seg.sealed, seg.deleted) == (0, False, False)


def layout(*chunks: tuple[str, int, int]) -> list[list[object]]:
    """A layout as an UpdateLayout operation carries it: [name, start, length] lists."""
    return [list(c) for c in chunks]


def update_layout(
    md: ContainerMetadata, seg_id: int, storage_length: int, *chunks: tuple[str, int, int]
) -> None:
    """Apply an UpdateLayout as a replayed (already durable) operation."""
    md.apply(
        ops.UpdateLayout(
            seq=md.seq + 1, name="s", segment_id=seg_id, chunks=layout(*chunks), storage_length=storage_length
        )
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda md, seg: update_layout(md, seg, 5, ("a", 0, 3), ("b", 3, 2)),
        lambda md, seg: update_layout(md, seg, 2, ("a", 0, 2)),
        lambda md, seg: update_layout(md, seg, 3, ("a", 0, 2)),
        lambda md, seg: update_layout(md, seg, 4, ("a", 0, 3), ("b", 3, 0), ("c", 3, 1)),
        lambda md, seg: update_layout(md, seg, 4, ("a", 0, 2), ("b", 3, 1)),
        lambda md, seg: update_layout(md, seg, 4, ("a", 0, 3), ("b", 2, 2)),
        lambda md, seg: update_layout(md, seg, 4, ("b", 1, 3)),
        lambda md, seg: update_layout(md, seg, 4),
        lambda md, seg: md.apply(ops.Truncate(seq=md.seq + 1, name="s", segment_id=seg, offset=5)),
        lambda md, seg: md.apply(ops.Seal(seq=md.seq, name="s", segment_id=seg)),  # seq reused
        lambda md, seg: md.apply(ops.Append(seq=md.seq + 1, name="s", segment_id=seg, offset=3, data=b"x")),
    ],
    ids=[
        "storage past length",
        "storage decreasing",
        "layout short of the storage length",
        "empty chunk",
        "layout gap",
        "layout overlap",
        "layout starts past the start offset",
        "no chunks below the storage length",
        "start past length",
        "seq reused",
        "append gap",
    ],
)
def test_invariants_are_asserted(
    md: ContainerMetadata, change: Callable[[ContainerMetadata, int], None]
) -> None:
    commit(md, append(b"abcd"))
    seg_id = md.by_name("s").segment_id
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("a", 0, 3)), storage_length=3))
    assert md.by_name("s").storage_length == 3 and md.unflushed_bytes == 1
    with pytest.raises(AssertionError):
        change(md, seg_id)


def test_layout_changes_that_keep_the_invariants(md: ContainerMetadata) -> None:
    commit(md, append(b"0123456789"))
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("a", 0, 4)), storage_length=4))
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("a", 0, 4), ("b", 4, 3)), storage_length=7))
    seg = md.by_name("s")
    assert seg.chunks == [ChunkRef("a", 0, 4), ChunkRef("b", 4, 3)]
    assert (seg.storage_length, md.unflushed_bytes) == (7, 3)
    commit(md, ops.Truncate(name="s", offset=5))
    # Truncation drops the chunks wholly below the start offset; the storage length stays.
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("b", 4, 3)), storage_length=7))
    assert seg.chunks == [ChunkRef("b", 4, 3)] and seg.storage_length == 7
    # Defrag replaces chunks by one holding the same bytes.
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("ab", 4, 3)), storage_length=7))
    commit(md, ops.Truncate(name="s", offset=8))
    commit(md, ops.UpdateLayout(name="s", chunks=[], storage_length=7))  # nothing left above the start
    assert (seg.chunks, seg.start_offset, seg.storage_length) == ([], 8, 7)
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("c", 7, 3)), storage_length=10))
    assert md.unflushed_bytes == 0 and md.info("s").storage_length == 10


def test_imported_segment_starts_with_its_layout(md: ContainerMetadata) -> None:
    chunks = layout(("x", 4, 6), ("y", 10, 2))
    commit(md, ops.CreateSegment(name="imported", created=1.0, chunks=chunks, length=12))
    seg = md.by_name("imported")
    assert seg.chunks == [ChunkRef("x", 4, 6), ChunkRef("y", 10, 2)]
    assert (seg.start_offset, seg.storage_length, seg.length) == (4, 12, 12)
    assert md.unflushed_bytes == 0
    with pytest.raises(AssertionError):  # a gap in the imported layout
        commit(
            md, ops.CreateSegment(name="bad", created=1.0, chunks=layout(("x", 0, 2), ("y", 3, 1)), length=4)
        )


def test_snapshot_restores_everything(md: ContainerMetadata) -> None:
    commit(md, append(b"abc", writer_id=W1, event_number=9, event_count=3), ops.Truncate(name="s", offset=1))
    commit(md, ops.UpdateLayout(name="s", chunks=layout(("a", 0, 1), ("b", 1, 1)), storage_length=2))
    commit(md, create("gone"), ops.Seal(name="s"))
    commit(md, ops.Delete(name="gone"))
    md.epoch = 4
    copy = ContainerMetadata(0)
    copy.restore(md.snapshot(), md.seq)
    assert copy.snapshot() == md.snapshot()
    assert copy.names == {"s": 1} and copy.seq == md.seq and copy.epoch == 4
    assert copy.by_name("s").attributes == {str(W1): 9}
    assert copy.by_name("s").chunks == [ChunkRef("a", 0, 1), ChunkRef("b", 1, 1)]
    assert copy.by_name("s").storage_length == 2 and copy.unflushed_bytes == md.unflushed_bytes == 1


OPERATION = st.one_of(
    st.builds(lambda n: append(b"x" * n), st.integers(1, 5)),
    st.builds(lambda e: append(writer_id=W1, event_number=e), st.integers(0, 5)),
    st.builds(lambda e: append(expected_offset=e), st.integers(0, 12)),
    st.builds(lambda o: ops.Truncate(name="s", offset=o), st.integers(0, 12)),
    st.builds(lambda: ops.Seal(name="s")),
)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.lists(OPERATION, min_size=1, max_size=4), st.integers(0, 12)), max_size=8))
def test_invariants_hold_under_any_operation_sequence(batches: list[tuple[list[ops.Operation], int]]) -> None:
    md = ContainerMetadata(0)
    commit(md, create())
    seg = md.by_name("s")
    for batch, flushed in batches:
        before = (md.seq, seg.start_offset, seg.length, seg.event_count)
        updater = MetadataUpdater(md)
        logged = []
        for op in batch:
            try:
                if updater.pre_process(op).logged:
                    logged.append(op)
            except (SegmentSealed, BadOffset, ConditionalCheckFailed):
                assert op.seq == -1
        for op in logged:
            md.apply(op)
        assert [op.seq for op in logged] == list(range(before[0] + 1, before[0] + 1 + len(logged)))
        # The storage writer's flush: a new chunk up to the flushed length, chunks below the start dropped.
        storage_length = max(seg.storage_length, min(flushed, seg.length))
        chunks = [list(c) for c in seg.chunks]
        if storage_length > seg.storage_length:
            chunks.append([f"c{len(chunks)}", seg.storage_length, storage_length - seg.storage_length])
        chunks = [c for c in chunks if c[1] + c[2] > seg.start_offset]
        commit(md, ops.UpdateLayout(name="s", chunks=chunks, storage_length=storage_length))
        assert seg.storage_length == storage_length and [list(c) for c in seg.chunks] == chunks
        assert 0 <= seg.start_offset <= seg.length and 0 <= seg.storage_length <= seg.length
        now = (seg.start_offset, seg.length, seg.event_count)
        assert all(a >= b for a, b in zip(now, before[1:], strict=True))  # never decrease
        assert md.unflushed_bytes == seg.length - seg.storage_length


def test_store_reports_conditions_and_duplicates(store: SegmentStore) -> None:
    store.create("s")
    first = store.append("s", b"abc", writer_id=W1, event_number=1, expected_offset=0)
    assert (first.offset, first.duplicate, first.event_number, first.info.length) == (0, False, 1, 3)
    dup = store.append("s", b"abc", writer_id=W1, event_number=1)
    assert (dup.offset, dup.duplicate, dup.event_number, dup.info.length) == (None, True, 1, 3)
    assert store.writer_event_number("s", W1) == 1 and store.writer_event_number("s", W2) is None
    with pytest.raises(ConditionalCheckFailed) as info:
        store.append("s", b"d", expected_offset=0)
    assert info.value.segment is not None and info.value.segment.length == 3
    with pytest.raises(SegmentExists):
        store.create("s")
    with pytest.raises(BadOffset):
        store.truncate("s", 4)
    store.seal("s")
    with pytest.raises(SegmentSealed):
        store.append("s", b"d")
    with pytest.raises(SegmentSealed):
        store.truncate("s", 4)
    assert store.info("s").length == 3
