"""Reader groups over a bare store: membership and generations, assignment and its balance, commits,
segments handed over, successors after their predecessors, checkpoints and resets, compaction."""

from __future__ import annotations

import pytest

from app.scopes import events, fetch, record_log, scaling
from app.scopes.controller import Controller
from app.scopes.errors import GroupConflict, GroupNotFound, ReaderFenced
from app.scopes.readers import Readers
from tests.polling import wait_until
from tests.scopes.conftest import key_in, make_stream


@pytest.fixture
def readers(ctl: Controller) -> Readers:
    return Readers(ctl)


def _write(ctl: Controller, numbers: events.WriterNumbers, lo: float, hi: float, *payloads: str) -> None:
    key = key_in(lo, hi)
    for payload in payloads:
        events.write(ctl, numbers, "sc", "st", key, payload.encode())


def _fetch(readers: Readers, reader: str, generation: int, wait_s: float = 0.0) -> fetch.Fetched:
    return fetch.fetch(readers, "sc", "g", reader, generation, wait_s, 1 << 20)


def _read_all(readers: Readers, reader: str, generation: int) -> list[str]:
    """Fetch and commit until a fetch brings nothing; the payloads, in order."""
    got: list[str] = []
    while True:
        answer = _fetch(readers, reader, generation)
        readers.commit("sc", "g", reader, generation, answer.positions)
        if not answer.events:
            return got
        got.extend(e.data.decode() for e in answer.events)


def test_a_group_is_created_confirmed_and_deleted(ctl: Controller, readers: Readers) -> None:
    make_stream(ctl, 2)
    assert readers.create("sc", "g", ["st"], "head", 10)[1] is True
    assert readers.create("sc", "g", ["st"], "head", 10)[1] is False
    with pytest.raises(GroupConflict):
        readers.create("sc", "g", ["st"], "head", 5)
    doc = readers.describe("sc", "g")
    assert doc["unassigned"] == {"sc/st/0": 0, "sc/st/1": 0} and doc["readers"] == []
    readers.delete("sc", "g")
    with pytest.raises(GroupNotFound):
        readers.describe("sc", "g")


def test_readers_share_the_segments_and_a_rejoin_fences_the_older_generation(
    ctl: Controller, readers: Readers
) -> None:
    make_stream(ctl, 5)
    readers.create("sc", "g", ["st"], "head", 10)
    first, _ = readers.join("sc", "g", "a")
    assert len(readers.describe("sc", "g")["readers"][0]["segments"]) == 5
    readers.join("sc", "g", "b")
    readers.join("sc", "g", "c")
    # a holds all five; the surplus is released at once (nothing was served) and given on the next tend
    readers.tend("sc", "g")
    counts = sorted(len(r["segments"]) for r in readers.describe("sc", "g")["readers"])
    assert counts == [1, 2, 2]
    second, _ = readers.join("sc", "g", "a")
    assert second > first
    with pytest.raises(ReaderFenced):
        _fetch(readers, "a", first)
    with pytest.raises(ReaderFenced):
        readers.commit("sc", "g", "a", first, {"sc/st/0": 0})
    readers.leave("sc", "g", "a", None)
    readers.tend("sc", "g")
    doc = readers.describe("sc", "g")
    assert sorted(len(r["segments"]) for r in doc["readers"]) == [2, 3] and doc["unassigned"] == {}


def test_events_are_served_once_committed_and_served_again_only_if_not(
    ctl: Controller, readers: Readers, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 1)
    _write(ctl, numbers, 0, 1, "e1", "e2")
    readers.create("sc", "g", ["st"], "head", 10)
    gen, _ = readers.join("sc", "g", "a")
    answer = _fetch(readers, "a", gen)
    assert [e.data for e in answer.events] == [b"e1", b"e2"] and answer.positions == {"sc/st/0": 12}
    assert _fetch(readers, "a", gen).events == []  # served already, not committed: not served again to a
    readers.leave("sc", "g", "a", gen)
    gen_b, _ = readers.join("sc", "g", "b")
    assert [e.data for e in _fetch(readers, "b", gen_b).events] == [b"e1", b"e2"]  # at least once
    readers.commit("sc", "g", "b", gen_b, {"sc/st/0": 12})
    assert readers.describe("sc", "g")["readers"][0]["segments"] == {"sc/st/0": 12}


@pytest.mark.parametrize("max_bytes", [1, 3, 4, 5])
def test_a_fetch_smaller_than_an_events_length_prefix_still_answers_one_event(
    ctl: Controller, readers: Readers, numbers: events.WriterNumbers, max_bytes: int
) -> None:
    make_stream(ctl, 1)
    _write(ctl, numbers, 0, 1, "e1", "e2")
    readers.create("sc", "g", ["st"], "head", 10)
    gen, _ = readers.join("sc", "g", "a")
    answer = fetch.fetch(readers, "sc", "g", "a", gen, 0.0, max_bytes)
    assert [e.data for e in answer.events] == [b"e1"] and answer.positions == {"sc/st/0": 6}


def test_an_expired_reader_loses_its_segments_and_gets_409(ctl: Controller, readers: Readers) -> None:
    make_stream(ctl, 2)
    readers.create("sc", "g", ["st"], "head", 0.2)
    gen_a, _ = readers.join("sc", "g", "a")
    gen_b, _ = readers.join("sc", "g", "b")

    def b_holds_both() -> bool:
        _fetch(readers, "b", gen_b)
        return len(readers.describe("sc", "g")["readers"][0]["segments"]) == 2

    wait_until(b_holds_both, "b holds a's segment too")
    with pytest.raises(ReaderFenced):
        _fetch(readers, "a", gen_a)
    with pytest.raises(ReaderFenced):
        readers.commit("sc", "g", "a", gen_a, {"sc/st/0": 0})


def test_a_merge_successor_waits_for_both_predecessors(
    ctl: Controller, readers: Readers, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 1)
    _write(ctl, numbers, 0, 1, "before")
    scaling.scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    _write(ctl, numbers, 0, 0.5, "low")
    _write(ctl, numbers, 0.5, 1, "high")
    scaling.scale(ctl, "sc", "st", [1, 2], [(0.0, 1.0)])
    _write(ctl, numbers, 0, 1, "after")
    readers.create("sc", "g", ["st"], "head", 10)
    gen, _ = readers.join("sc", "g", "a")
    first = _fetch(readers, "a", gen)
    assert [e.data for e in first.events] == [b"before"]
    readers.commit("sc", "g", "a", gen, first.positions)
    # segment 0 ends within the next fetch: 1 and 2 open, a holds them; it commits 1 only, 3 waits for 2
    one = _fetch(readers, "a", gen)
    got = {e.segment: e.data for e in one.events}
    assert got == {"sc/st/1": b"low", "sc/st/2": b"high"}
    readers.commit("sc", "g", "a", gen, {"sc/st/1": one.positions["sc/st/1"]})
    _fetch(readers, "a", gen)  # ends 1
    doc = readers.describe("sc", "g")
    assert doc["waiting"] == [{"segment": "sc/st/3", "predecessors": ["sc/st/2"]}]
    readers.commit("sc", "g", "a", gen, {"sc/st/2": one.positions["sc/st/2"]})
    assert _read_all(readers, "a", gen) == ["after"]


def test_a_checkpoint_gives_cuts_and_a_reset_starts_there(
    ctl: Controller, readers: Readers, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 2)
    _write(ctl, numbers, 0, 0.5, "a1", "a2")
    _write(ctl, numbers, 0.5, 1, "b1")
    readers.create("sc", "g", ["st"], "head", 10)
    gen, _ = readers.join("sc", "g", "r")
    assert sorted(_read_all(readers, "r", gen)) == ["a1", "a2", "b1"]
    checkpoint, started = readers.start_checkpoint("sc", "g")
    assert started and readers.checkpoint("sc", "g", checkpoint) == (False, {})
    answer = _fetch(readers, "r", gen)
    assert answer.checkpoint == checkpoint and answer.events == []
    complete, found = readers.checkpoint("sc", "g", checkpoint)
    assert complete and found["st"].positions == ((0, 12), (1, 6))
    _write(ctl, numbers, 0, 0.5, "a3")
    assert _read_all(readers, "r", gen) == ["a3"]
    readers.reset("sc", "g", {"st": found["st"].to_json()})
    with pytest.raises(ReaderFenced):
        _fetch(readers, "r", gen)
    gen, _ = readers.join("sc", "g", "r")
    assert _read_all(readers, "r", gen) == ["a3"]
    with pytest.raises(GroupNotFound):
        readers.checkpoint("sc", "g", "nope")


def test_the_record_is_compacted_and_loads_again(
    ctl: Controller, readers: Readers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_log, "COMPACT_BYTES", 2000)
    make_stream(ctl, 2)
    readers.create("sc", "g", ["st"], "head", 10)
    for _ in range(40):
        readers.join("sc", "g", "a")
    info = ctl.store.info("#scopes/groups/sc/g")
    assert info.start_offset > 0
    fresh = Readers(ctl)
    assert fresh.describe("sc", "g") == readers.describe("sc", "g")


def test_a_segment_is_taken_from_its_reader_before_another_gets_it(
    ctl: Controller, readers: Readers, numbers: events.WriterNumbers
) -> None:
    make_stream(ctl, 2)
    _write(ctl, numbers, 0, 0.5, "low")
    _write(ctl, numbers, 0.5, 1, "high")
    readers.create("sc", "g", ["st"], "head", 10)
    gen_a, _ = readers.join("sc", "g", "a")
    served = _fetch(readers, "a", gen_a)
    assert len(served.events) == 2
    gen_b, _ = readers.join("sc", "g", "b")
    doc = readers.describe("sc", "g")
    releasing = doc["readers"][0]["releasing"]
    assert len(releasing) == 1 and doc["readers"][1]["segments"] == {}
    assert _fetch(readers, "b", gen_b).events == []  # not b's until a commits what it was served
    checkpoint, _ = readers.start_checkpoint("sc", "g")
    assert _fetch(readers, "a", gen_a).positions == served.positions  # the released one at its served offset
    _fetch(readers, "b", gen_b)
    assert readers.checkpoint("sc", "g", checkpoint)[0]
    readers.commit("sc", "g", "a", gen_a, served.positions)
    readers.tend("sc", "g")
    doc = readers.describe("sc", "g")
    assert doc["readers"][1]["segments"] == {releasing[0]: served.positions[releasing[0]]}
    assert _fetch(readers, "b", gen_b).events == []  # nothing served twice
