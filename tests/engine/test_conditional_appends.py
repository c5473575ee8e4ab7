"""Seed 001's conditional append: an append that lands only after the writer's previous one."""

from __future__ import annotations

import random
import threading
import uuid

import pytest

from engine import AppendStep, EventNumberMismatch, InvalidArgument, SegmentStore
from tests.conftest import random_seed
from tests.engine.conftest import HeldProcessor, Node

W = uuid.UUID(int=21)


def test_an_append_lands_only_on_the_number_it_names(store: SegmentStore) -> None:
    store.create("s")
    with pytest.raises(EventNumberMismatch) as none_yet:
        store.append("s", b"b", writer_id=W, event_number=2, previous_event_number=1)
    assert none_yet.value.stored is None
    assert store.append("s", b"a", writer_id=W, event_number=1).offset == 0
    assert store.append("s", b"b", writer_id=W, event_number=2, previous_event_number=1).offset == 1
    with pytest.raises(EventNumberMismatch) as behind:
        store.append("s", b"d", writer_id=W, event_number=9, previous_event_number=5)
    assert behind.value.stored == 2 and behind.value.code == "ConditionalCheckFailed"
    again = store.append("s", b"b", writer_id=W, event_number=2, previous_event_number=1)
    assert again.duplicate and again.event_number == 2  # a retried batch answers as a duplicate
    assert store.read("s").data == b"ab"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"previous_event_number": 1},
        {"writer_id": W, "event_number": 3, "previous_event_number": 3},
        {"writer_id": W, "event_number": 3, "previous_event_number": -1},
    ],
    ids=["without a writer", "not below the event number", "negative"],
)
def test_a_malformed_condition_is_refused(store: SegmentStore, kwargs: dict) -> None:
    store.create("s")
    with pytest.raises(InvalidArgument):
        store.append("s", b"x", **kwargs)


def test_batches_reordered_in_one_processor_batch_are_refused_then_land_in_order(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches 3, 2, 1 queued in that order: 1 lands, the others are refused and land when resent."""
    store = node.store
    store.create("busy")
    store.create("s")
    held = HeldProcessor(node, monkeypatch)
    held.hold("busy", lambda: store.append("busy", b"holds the processor"))
    for number in (3, 2, 1):
        previous = number - 1 or None
        held.submit(
            str(number),
            lambda n=number, p=previous: store.append(
                "s", f"<{n}>".encode(), writer_id=W, event_number=n, previous_event_number=p
            ),
        )
        held.wait_queued(4 - number)
    results = held.release()
    assert isinstance(results["3"], EventNumberMismatch) and isinstance(results["2"], EventNumberMismatch)
    assert results["1"].offset == 0
    store.append("s", b"<2>", writer_id=W, event_number=2, previous_event_number=1)
    store.append("s", b"<3>", writer_id=W, event_number=3, previous_event_number=2)
    assert store.read("s").data == b"<1><2><3>"


def test_pipelined_batches_sent_out_of_order_land_once_and_in_order(store: SegmentStore) -> None:
    """Threads send a writer's batches in a random order, each resending until it lands."""
    seed = random_seed()
    rng = random.Random(seed)
    store.create("s")
    numbers = list(range(1, 41))
    rng.shuffle(numbers)

    def send(number: int) -> None:
        previous = number - 1 or None
        while True:
            try:
                store.append(
                    "s", f"<{number}>".encode(), writer_id=W, event_number=number,
                    previous_event_number=previous,
                )  # fmt: skip
                return
            except EventNumberMismatch:
                threading.Event().wait(0.001)

    threads = [threading.Thread(target=send, args=(n,)) for n in numbers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    expected = b"".join(f"<{n}>".encode() for n in range(1, 41))
    assert store.read("s").data == expected, f"seed {seed}"


def test_a_composite_append_takes_the_condition(store: SegmentStore) -> None:
    store.create("s")
    store.append("s", b"a", writer_id=W, event_number=1)
    with pytest.raises(EventNumberMismatch) as refused:
        store.composite([AppendStep("s", b"c", writer_id=W, event_number=3, previous_event_number=2)])
    assert refused.value.step == 0 and refused.value.stored == 1
    store.composite([AppendStep("s", b"b", writer_id=W, event_number=2, previous_event_number=1)])
    assert store.read("s").data == b"ab"
