"""EventWriter and EventReader against a real server."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from client import errors
from client.events import Event, EventReader, EventWriter, frame
from client.segment_client import SegmentClient


def _payloads(count: int) -> list[bytes]:
    return [f"event-{i}-".encode() * (i % 7) for i in range(count)]


class _CountingWriter(EventWriter):
    """Records each batch's (last event number, event count) as it is sent."""

    def __init__(self, client: SegmentClient, segment: str, **kwargs: Any) -> None:
        self.batches: list[tuple[int, int]] = []
        super().__init__(client, segment, **kwargs)

    def _send(self, data: bytes, last_event_number: int, event_count: int) -> None:
        self.batches.append((last_event_number, event_count))
        super()._send(data, last_event_number, event_count)


def test_many_events_round_trip_in_order(client: SegmentClient, name: str) -> None:
    client.create(name)
    payloads = _payloads(5000)
    with _CountingWriter(client, name, max_batch_bytes=8 * 1024, linger_s=0.002) as writer:
        for payload in payloads:
            writer.write(payload)
    events = list(EventReader(client, name, read_bytes=1000))
    assert [event.payload for event in events] == payloads
    offsets = [0]
    for payload in payloads[:-1]:
        offsets.append(offsets[-1] + len(frame(payload)))
    assert [event.offset for event in events] == offsets
    info = client.info(name)
    assert info.event_count == len(payloads)
    assert info.length == sum(len(frame(p)) for p in payloads)
    assert client.writer_event_number(name, writer.writer_id) == len(payloads)
    # Many events went in few appends, each numbered by its last event.
    assert len(writer.batches) < len(payloads) / 10
    numbers = [last for last, _ in writer.batches]
    assert numbers == sorted(numbers) and numbers[-1] == len(payloads)
    assert sum(count for _, count in writer.batches) == len(payloads)


class _SlowWriter(EventWriter):
    """Holds every batch in flight for a while."""

    def __init__(self, client: SegmentClient, segment: str, **kwargs: Any) -> None:
        self.in_flight = threading.Event()
        super().__init__(client, segment, **kwargs)

    def _send(self, data: bytes, last_event_number: int, event_count: int) -> None:
        self.in_flight.set()
        time.sleep(0.5)
        super()._send(data, last_event_number, event_count)


def test_next_batch_fills_while_one_is_in_flight(client: SegmentClient, name: str) -> None:
    client.create(name)
    with _SlowWriter(client, name, linger_s=0.0) as writer:
        writer.write(b"first")
        assert writer.in_flight.wait(5)
        started = time.monotonic()
        for i in range(100):
            writer.write(b"next-%d" % i)
        assert time.monotonic() - started < 0.25
    assert [event.payload for event in EventReader(client, name)] == [b"first"] + [
        b"next-%d" % i for i in range(100)
    ]


def test_reader_starts_at_a_given_event_offset(client: SegmentClient, name: str) -> None:
    client.create(name)
    client.append(name, frame(b"one") + frame(b"two") + frame(b"three"))
    events = list(EventReader(client, name, offset=len(frame(b"one"))))
    assert events == [Event(7, b"two"), Event(14, b"three")]


def test_flush_waits_for_acknowledgement(client: SegmentClient, name: str) -> None:
    client.create(name)
    writer = EventWriter(client, name, linger_s=10.0)
    try:
        writer.write(b"a")
        writer.write(b"b")
        writer.flush()
        assert client.read(name).data == frame(b"a") + frame(b"b")
    finally:
        writer.close()


class _ResendingWriter(EventWriter):
    """Sends every batch twice, as a client would after losing the first answer."""

    def _send(self, data: bytes, last_event_number: int, event_count: int) -> None:
        super()._send(data, last_event_number, event_count)
        super()._send(data, last_event_number, event_count)


def test_resent_batch_is_stored_once(client: SegmentClient, name: str) -> None:
    client.create(name)
    payloads = _payloads(300)
    with _ResendingWriter(client, name, max_batch_bytes=1024) as writer:
        for payload in payloads:
            writer.write(payload)
    assert [event.payload for event in EventReader(client, name)] == payloads
    assert client.info(name).event_count == len(payloads)


def test_restarted_writer_continues_numbering(client: SegmentClient, name: str) -> None:
    client.create(name)
    writer_id = uuid.uuid4()
    with EventWriter(client, name, writer_id=writer_id) as first:
        assert [first.write(b"a"), first.write(b"b"), first.write(b"c")] == [1, 2, 3]
    with EventWriter(client, name, writer_id=writer_id) as restarted:
        assert restarted.write(b"d") == 4
    assert client.writer_event_number(name, writer_id) == 4
    assert [event.payload for event in EventReader(client, name)] == [b"a", b"b", b"c", b"d"]


def test_write_error_surfaces_on_flush(client: SegmentClient, name: str) -> None:
    client.create(name)
    client.seal(name)
    writer = EventWriter(client, name)
    writer.write(b"lost")
    with pytest.raises(errors.SegmentSealed):
        writer.flush()
    with pytest.raises(errors.SegmentSealed):
        writer.write(b"more")
    with pytest.raises(errors.SegmentSealed):
        writer.close()


def test_follow_sees_later_events_and_stops_at_seal(client: SegmentClient, name: str) -> None:
    client.create(name)
    client.append(name, frame(b"before"))
    seen: list[bytes] = []

    def follow() -> None:
        seen.extend(event.payload for event in EventReader(client, name, follow=True))

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(0.2)
    # An event split across two appends is reassembled.
    whole = frame(b"split-across-appends")
    client.append(name, whole[:6])
    time.sleep(0.1)
    client.append(name, whole[6:])
    with EventWriter(client, name) as writer:
        writer.write(b"after")
    client.seal(name)
    reader.join(10)
    assert not reader.is_alive()
    assert seen == [b"before", b"split-across-appends", b"after"]
