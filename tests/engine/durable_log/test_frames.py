"""Data frames: whole writes round trip; torn tails, bit flips and sequence gaps are caught."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.durable_log import frames
from engine.durable_log.frames import HEADER, TornTail, encode_batch, iter_batches

FRAME = 64  # max_frame_bytes: 17 header bytes + 47 payload bytes
ROOM = FRAME - HEADER.size


def torn(buf: bytes, expected_seq: int | None = None) -> TornTail:
    with pytest.raises(TornTail) as info:
        list(iter_batches(buf, expected_seq))
    return info.value


def test_single_frame_write_round_trips() -> None:
    buf, count = encode_batch(b"hello", 7, FRAME)
    assert count == 1
    assert len(buf) == HEADER.size + 5
    [batch] = iter_batches(buf, 7)
    assert (batch.first_frame_seq, batch.frame_count, batch.payload, batch.end) == (7, 1, b"hello", len(buf))


def test_multi_frame_write_round_trips() -> None:
    payload = bytes(range(256)) * 2
    buf, count = encode_batch(payload, 0, FRAME)
    assert count == -(-len(payload) // ROOM) == len(frames.frame_payload_sizes(len(payload), FRAME))
    [batch] = iter_batches(buf)
    assert batch.payload == payload and batch.frame_count == count and batch.end == len(buf)


@given(st.lists(st.binary(min_size=1, max_size=4 * ROOM + 3), min_size=1, max_size=6), st.integers(0, 2**40))
def test_consecutive_writes_round_trip(payloads: list[bytes], first: int) -> None:
    parts, seq = [], first
    for payload in payloads:
        buf, count = encode_batch(payload, seq, FRAME)
        parts.append(buf)
        seq += count
    batches = list(iter_batches(b"".join(parts), first))
    assert [b.payload for b in batches] == payloads
    assert batches[0].first_frame_seq == first
    for before, after in itertools.pairwise(batches):
        assert after.first_frame_seq == before.first_frame_seq + before.frame_count
    assert batches[-1].end == sum(map(len, parts))


def test_frame_payload_sizes_fill_frames() -> None:
    assert frames.frame_payload_sizes(ROOM, FRAME) == [ROOM]
    assert frames.frame_payload_sizes(ROOM + 1, FRAME) == [ROOM, 1]
    assert frames.frame_payload_sizes(3 * ROOM, FRAME) == [ROOM] * 3


@pytest.fixture
def two_writes() -> tuple[bytes, bytes]:
    """A one-frame write (frame 0) followed by a three-frame write (frames 1-3)."""
    first, _ = encode_batch(b"a" * 10, 0, FRAME)
    second, count = encode_batch(b"b" * (2 * ROOM + 5), 1, FRAME)
    assert count == 3
    return first, second


@pytest.mark.parametrize("cut", [1, HEADER.size - 1])
def test_partial_header_is_a_torn_tail(two_writes: tuple[bytes, bytes], cut: int) -> None:
    first, second = two_writes
    error = torn(first + second[:cut])
    assert error.position == len(first) and error.reason == "partial frame header"


@pytest.mark.parametrize("cut", [HEADER.size, HEADER.size + 1, FRAME - 1])
def test_partial_frame_is_a_torn_tail(two_writes: tuple[bytes, bytes], cut: int) -> None:
    first, second = two_writes
    error = torn(first + second[:cut])
    assert error.position == len(first) and error.reason == "partial frame"


@pytest.mark.parametrize("frames_kept", [1, 2])
def test_write_without_its_last_frame_is_a_torn_tail(
    two_writes: tuple[bytes, bytes], frames_kept: int
) -> None:
    first, second = two_writes
    error = torn(first + second[: FRAME * frames_kept])
    assert error.position == len(first) and error.reason == "write without its last frame"
    assert [b.payload for b in iter_batches(first)] == [b"a" * 10]


def test_batches_before_the_tear_are_yielded(two_writes: tuple[bytes, bytes]) -> None:
    first, second = two_writes
    seen = []
    with pytest.raises(TornTail):
        for batch in iter_batches(first + second[:-1]):
            seen.append(batch.payload)
    assert seen == [b"a" * 10]


# Byte of the second write's middle frame (frame 2) to damage, and the frame number then read.
@pytest.mark.parametrize(
    ("index", "seq_read"),
    [(FRAME + 20, 2), (FRAME + 5, 2), (FRAME + 16, 2), (FRAME + 15, 2 ^ 0x10)],
    ids=["payload", "crc", "flags", "sequence"],
)
def test_flipped_bit_is_a_crc_mismatch(two_writes: tuple[bytes, bytes], index: int, seq_read: int) -> None:
    first, second = two_writes
    damaged = bytearray(second)
    damaged[index] ^= 0x10
    error = torn(first + bytes(damaged))
    assert error.position == len(first)
    assert error.reason == f"CRC mismatch in frame {seq_read}"


def test_flipped_bit_in_the_first_write_tears_at_zero(two_writes: tuple[bytes, bytes]) -> None:
    first, second = two_writes
    damaged = bytearray(first)
    damaged[-1] ^= 1
    assert torn(bytes(damaged) + second).position == 0


def test_frame_sequence_gap_is_detected() -> None:
    first, _ = encode_batch(b"x", 0, FRAME)
    skipped, _ = encode_batch(b"y", 2, FRAME)
    error = torn(first + skipped)
    assert error.position == len(first)
    assert error.reason == "frame 2 where 1 was expected"


def test_expected_first_sequence_is_checked() -> None:
    buf, _ = encode_batch(b"x", 5, FRAME)
    assert torn(buf, 4).position == 0
    assert [b.first_frame_seq for b in iter_batches(buf, 5)] == [5]


def test_empty_buffer_has_no_batches() -> None:
    assert list(iter_batches(b"")) == []
