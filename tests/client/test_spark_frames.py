"""Cutting length-prefixed frames out of a GET's bytes (client.spark_ranges.split_frames), no server."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from client.spark_ranges import split_frames


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _walk(data: bytes, base: int, start: int = 0) -> tuple[list[int], list[bytes], int]:
    """The frames the plain way, one header after another."""
    offsets, values, position = [], [], start
    while len(data) - position >= 4:
        end = position + 4 + int.from_bytes(data[position : position + 4], "big")
        if end > len(data):
            break
        offsets.append(base + position)
        values.append(data[position + 4 : end])
        position = end
    return offsets, values, position


def _split(data: bytes | bytearray, base: int, start: int = 0) -> tuple[list[int], list[bytes], int]:
    offsets, values, end = split_frames(data, base, start)
    assert (offsets.type, values.type) == (pa.int64(), pa.binary())
    return offsets.to_pylist(), values.to_pylist(), end


def test_a_long_run_of_one_size_with_others_between_and_a_partial_frame_at_the_end() -> None:
    payloads = [b"%04d" % i + b"x" * 96 for i in range(500)]
    payloads[70] = b"longer" * 40
    payloads[71] = b""
    payloads[300:303] = [b"a", b"bc", b"def"]
    data = b"".join(_frame(p) for p in payloads) + _frame(b"cut short")[:7]
    offsets, values, end = _split(data, 1000)
    assert values == payloads
    assert (offsets, end) == _walk(data, 1000)[::2]
    assert end == len(data) - 7


def test_runs_of_empty_payloads() -> None:
    data = _frame(b"") * 300 + _frame(b"z") + _frame(b"") * 40
    assert _split(data, 0) == _walk(data, 0)
    assert _split(data, 0)[1] == [b""] * 300 + [b"z"] + [b""] * 40


def test_splitting_from_a_start_position_and_from_a_bytearray() -> None:
    data = bytearray(_frame(b"skipped") + _frame(b"q" * 10) * 100)
    offsets, values, end = _split(data, 50, start=11)
    assert (offsets[:2], values, end) == ([61, 75], [b"q" * 10] * 100, len(data))
    assert _split(data, 0, start=len(data)) == ([], [], len(data))


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_of_runs_match_a_plain_walk(seed: int) -> None:
    rng = random.Random(seed)
    payloads: list[bytes] = []
    while len(payloads) < 3000:
        size = rng.choice([0, 1, 3, 4, 17, 100, rng.randrange(300)])
        # Runs just shorter, as long as and just longer than the lengths that are checked by Arrow.
        payloads += [rng.randbytes(size)] * rng.choice([1, 2, 15, 16, 17, 33, 64, 65, 400])
    data = b"".join(_frame(p) for p in payloads)
    data = data[: rng.randrange(len(data) - 2000, len(data) + 1)]
    start = _walk(data, 0)[0][rng.randrange(50)]
    assert _split(data, 7, start) == _walk(data, 7, start)


def test_too_few_bytes_for_a_header_or_a_payload() -> None:
    assert _split(b"\x00\x00\x00", 0) == ([], [], 0)
    assert _split(_frame(b"abc")[:-1], 0) == ([], [], 0)
    assert _split(b"", 0) == ([], [], 0)
