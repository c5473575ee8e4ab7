"""The stream layer over a bare store: streams, scaling, events across scalings, cuts (app/scopes)."""

from __future__ import annotations

import uuid

import pytest

from app.scopes import cuts, events, records, scaling
from app.scopes.controller import Controller
from app.scopes.errors import ScaleConflict, ScopeNotFound, StreamConflict, StreamNotFound, StreamSealed
from client.events import frame
from client.routing import key_hash
from engine import BadOffset, InvalidArgument, SegmentExists, SegmentNotFound, SegmentStore, SegmentTruncated
from tests.scopes.conftest import frames, key_in, make_stream


def test_a_stream_is_created_once_and_confirmed_with_its_configuration(ctl: Controller) -> None:
    loaded, created = ctl.create_stream("sc", "st", records.StreamConfig(3))
    assert created and loaded.state.epoch == 0
    assert [(s.lo, s.hi) for s in loaded.state.current] == [(0.0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.0)]
    assert ctl.create_stream("sc", "st", records.StreamConfig(3))[1] is False
    with pytest.raises(StreamConflict):
        ctl.create_stream("sc", "st", records.StreamConfig(2))
    with pytest.raises(ScopeNotFound):
        ctl.create_stream("nope", "st", records.StreamConfig(1))
    assert ctl.stream_names("sc") == ["st"] and ctl.scopes() == ["sc"]
    assert ctl.store.info("sc/st/2").length == 0


def test_a_name_taken_through_the_native_api_stops_a_create_and_leaves_nothing(
    ctl: Controller, store: SegmentStore
) -> None:
    store.create("sc/st/1")
    with pytest.raises(SegmentExists):
        ctl.create_stream("sc", "st", records.StreamConfig(2))
    with pytest.raises(StreamNotFound):
        ctl.touch("sc", "st")
    with pytest.raises(SegmentNotFound):
        store.info("sc/st/0")
    assert store.info("sc/st/1").length == 0  # the stranger stays


def test_a_scale_answers_alike_when_sent_again_and_refuses_what_does_not_fit(ctl: Controller) -> None:
    make_stream(ctl, 2)
    done = scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)])
    assert (done.epoch, [s.id for s in done.segments], done.done) == (1, [2, 3], True)
    assert scaling.scale(ctl, "sc", "st", [0], [(0.25, 0.5), (0.0, 0.25)]) == done
    with pytest.raises(ScaleConflict, match="not in the current epoch"):
        scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.5)])
    with pytest.raises(InvalidArgument, match="cover exactly"):
        scaling.scale(ctl, "sc", "st", [1], [(0.5, 0.9)])
    with pytest.raises(InvalidArgument, match="neighbouring"):
        scaling.scale(ctl, "sc", "st", [2, 1], [(0.0, 0.25), (0.5, 1.0)])
    state = ctl.touch("sc", "st").state
    assert ctl.store.info("sc/st/0").sealed and not ctl.store.info("sc/st/1").sealed
    assert [s.id for s in state.current] == [2, 3, 1]
    ctl.seal("sc", "st")
    with pytest.raises(StreamSealed):
        scaling.scale(ctl, "sc", "st", [1], [(0.5, 1.0)])


def test_a_successor_name_taken_cancels_the_scale_before_anything_is_sealed(
    ctl: Controller, store: SegmentStore
) -> None:
    make_stream(ctl, 1)
    store.create("sc/st/2")
    with pytest.raises(SegmentExists, match="cancelled"):
        scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    state = ctl.touch("sc", "st").state
    assert state.pending is None and state.epoch == 0 and not store.info("sc/st/0").sealed
    with pytest.raises(SegmentNotFound):
        store.info("sc/st/1")  # the successor the scale made is deleted; the stranger stays
    assert scaling.scale(ctl, "sc", "st", [0], [(0.0, 1.0)]).segments[0].id == 3  # ids never given twice


def test_an_event_stored_before_two_scales_is_never_stored_again(
    ctl: Controller, store: SegmentStore, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 1)
    writer = uuid.uuid4()
    key = key_in(0.5, 1.0)
    first = events.write(ctl, numbers, "sc", "st", key, b"e5", writer, 5)
    assert (first.segment, first.offset, first.duplicate) == ("sc/st/0", 0, False)
    scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])  # 1, 2
    scaling.scale(ctl, "sc", "st", [1, 2], [(0.0, 1.0)])  # 3
    retry = events.write(ctl, numbers, "sc", "st", key, b"e5", writer, 5)
    assert (retry.segment, retry.duplicate, retry.event_number) == ("sc/st/0", True, 5)
    older = events.write(ctl, numbers, "sc", "st", key_in(0.0, 0.5), b"e4", writer, 4)
    assert older.duplicate  # a lower number of the writer: stored before, or given up
    later = events.write(ctl, numbers, "sc", "st", key, b"e6", writer, 6)
    assert (later.segment, later.duplicate) == ("sc/st/3", False)
    assert events.write(ctl, numbers, "sc", "st", key, b"e6", writer, 6).duplicate
    assert frames(store, "sc/st/0") == [b"e5"] and frames(store, "sc/st/3") == [b"e6"]
    other = events.write(ctl, numbers, "sc", "st", key, b"x", uuid.uuid4(), 1)
    assert not other.duplicate


def test_events_without_a_writer_route_by_key(
    ctl: Controller, store: SegmentStore, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 4)
    for i in range(40):
        key = f"key-{i}"
        answer = events.write(ctl, numbers, "sc", "st", key, key.encode())
        assert answer.segment == f"sc/st/{min(3, int(key_hash(key) * 4))}"
    assert sum(len(frames(store, f"sc/st/{i}")) for i in range(4)) == 40
    assert store.read("sc/st/0", 0, None).data.startswith(frame(frames(store, "sc/st/0")[0]))


def test_cuts_and_truncation(ctl: Controller, store: SegmentStore, numbers: events.WriterNumbers) -> None:
    make_stream(ctl, 1)
    for i in range(5):
        events.write(ctl, numbers, "sc", "st", f"k{i}", b"before")
    scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    for i in range(6):
        events.write(ctl, numbers, "sc", "st", f"k{i}", b"after")
    state = ctl.touch("sc", "st").state
    assert cuts.head(state).positions == ((0, 0),)
    tail = cuts.tail(ctl, state)
    assert [sid for sid, _ in tail.positions] == [1, 2] and cuts.epoch_of(state, tail) == 1
    lengths = dict(tail.positions)
    one_event = len(frame(b"after"))
    busy = 1 if lengths[1] else 2
    cut = {str(sid): length - (one_event if sid == busy else 0) for sid, length in lengths.items()}
    head = cuts.truncate(ctl, "sc", "st", cut)
    assert dict(head.positions) == {1: cut["1"], 2: cut["2"]}
    with pytest.raises(SegmentNotFound):
        store.info("sc/st/0")  # wholly before the cut
    assert store.info("sc/st/1").start_offset == cut["1"]
    assert cuts.head(ctl.touch("sc", "st").state) == head
    with pytest.raises(SegmentTruncated):
        cuts.truncate(ctl, "sc", "st", {"0": 0})
    with pytest.raises(InvalidArgument, match="cover"):
        cuts.truncate(ctl, "sc", "st", {"1": 0})
    with pytest.raises(BadOffset):
        cuts.truncate(ctl, "sc", "st", {"1": 0, "2": lengths[2] + 1})
    with pytest.raises(StreamNotFound):
        cuts.truncate(ctl, "sc", "st", {"1": 0, "9": 0})


def test_a_sealed_stream_takes_no_event_and_is_deleted_whole(
    ctl: Controller, store: SegmentStore, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 2)
    scaling.scale(ctl, "sc", "st", [1], [(0.5, 0.75), (0.75, 1.0)])
    with pytest.raises(Exception, match="not sealed"):
        ctl.delete("sc", "st")
    assert ctl.seal("sc", "st").state.sealed
    assert all(store.info(f"sc/st/{i}").sealed for i in range(4))
    with pytest.raises(StreamSealed):
        events.write(ctl, numbers, "sc", "st", "k", b"late")
    ctl.delete("sc", "st")
    assert [i.name for i in store.scan("sc/")] == [] and ctl.stream_names("sc") == []
    with pytest.raises(StreamNotFound):
        ctl.delete("sc", "st")
