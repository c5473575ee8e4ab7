"""The routing key hash (the client's routing module), key-range checks (app/scopes/ranges.py), lookups."""

from __future__ import annotations

import random

import pytest

from app.scopes import ranges
from client.routing import KeyRange, KeyRanges, header_key, header_value, key_hash
from engine import InvalidArgument
from tests.conftest import random_seed


def test_the_hash_is_the_documented_one_and_never_changes() -> None:
    # Top 53 bits of BLAKE2b-64 of the UTF-8, big-endian, over 2^53: fixed forever (data is routed by it).
    assert key_hash("") == 0.8931675160897388
    assert key_hash("a") == 0.2537936105758485
    assert key_hash("sensor-17") == 0.5543839392901578
    assert key_hash("é") == 0.7933768955844694
    assert key_hash("🌡") == 0.8401571827343155


def test_hashes_fall_in_the_key_space_and_spread() -> None:
    seed = random_seed()
    rng = random.Random(seed)
    points = [key_hash(str(rng.random())) for _ in range(4000)]
    assert all(0.0 <= p < 1.0 for p in points), seed
    quarters = [sum(1 for p in points if q / 4 <= p < (q + 1) / 4) for q in range(4)]
    assert min(quarters) > 800, (seed, quarters)


@pytest.mark.parametrize("key", ["plain", "with space", "100%", "é/🌡:#?", ""])
def test_a_routing_key_header_carries_any_key(key: str) -> None:
    value = header_value(key)
    assert all(33 <= ord(c) <= 126 for c in value)
    assert header_key(value) == key


def test_a_bad_percent_sequence_decodes_to_a_replacement_character() -> None:
    assert header_key("a%FFb") == "a\ufffdb"
    assert header_key("%zz") == "%zz"


def test_a_lookup_finds_the_range_covering_each_point() -> None:
    table = KeyRanges([KeyRange(0.5, 1.0, 7), KeyRange(0.0, 0.25, 3), KeyRange(0.25, 0.5, 4)])
    assert [table.find(p).segment for p in (0.0, 0.2499, 0.25, 0.49, 0.5, 0.999)] == [3, 3, 4, 4, 7, 7]
    assert table.route("sensor-17") == 7
    with pytest.raises(AssertionError):
        KeyRanges([KeyRange(0.0, 0.5, 1), KeyRange(0.6, 1.0, 2)])  # a gap


def test_a_partition_covers_the_key_space_exactly() -> None:
    ranges.check_partition([(0.0, 0.5), (0.5, 1.0)], "cut")
    for bad in ([(0.0, 0.5)], [(0.0, 0.6), (0.5, 1.0)], [(0.0, 0.4), (0.5, 1.0)], [(0.0, 0.0), (0.0, 1.0)]):
        with pytest.raises(InvalidArgument):
            ranges.check_partition(bad, "cut")


def test_a_replacement_covers_exactly_what_it_seals() -> None:
    ranges.check_replacement([(0.25, 0.5), (0.5, 0.75)], [(0.25, 0.3), (0.3, 0.75)])
    with pytest.raises(InvalidArgument, match="neighbouring"):
        ranges.check_replacement([(0.0, 0.25), (0.5, 0.75)], [(0.0, 0.75)])
    with pytest.raises(InvalidArgument, match="cover exactly"):
        ranges.check_replacement([(0.0, 0.5)], [(0.0, 0.25), (0.25, 0.6)])
    with pytest.raises(InvalidArgument, match="lo < hi"):
        ranges.check_replacement([(0.0, 0.5)], [(0.0, 0.5), (0.5, 0.5)])


def test_splits_meet_exactly_whatever_the_bounds() -> None:
    seed = random_seed()
    rng = random.Random(seed)
    for _ in range(500):
        lo = rng.random()
        hi = lo + (1.0 - lo) * rng.random() or 1.0
        if lo >= hi:
            continue
        parts = ranges.split(lo, hi, rng.randrange(1, 9))
        assert ranges.contiguous(parts) == (lo, hi), (seed, lo, hi, parts)
