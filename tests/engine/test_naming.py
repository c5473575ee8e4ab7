"""Names: segment name rules, stable container routing, Tier 1 file names and Tier 2 keys."""

from __future__ import annotations

import pytest

from engine import InvalidName, SegmentStore, validate_segment_name
from engine.naming import (
    container_for,
    log_file_name,
    parse_log_file_name,
    segment_object_key,
)

FORBIDDEN = [chr(c) for c in range(0x20)] + ["\x7f", ":", "#", "?", "\\", "%"]


@pytest.mark.parametrize("char", FORBIDDEN, ids=[f"U+{ord(c):04X}" for c in FORBIDDEN])
def test_forbidden_characters(char: str, store: SegmentStore) -> None:
    with pytest.raises(InvalidName, match="forbidden character"):
        validate_segment_name(f"scope/a{char}b")
    with pytest.raises(InvalidName):
        store.create(f"a{char}b")


@pytest.mark.parametrize("name", ["", ".", "..", "/a", "a/", "a//b", "./a", "a/./b", "a/../b", "a/.."])
def test_empty_dot_and_dotdot_parts(name: str, store: SegmentStore) -> None:
    with pytest.raises(InvalidName):
        validate_segment_name(name)
    with pytest.raises(InvalidName):
        store.append(name, b"x")


def test_length_is_counted_in_utf8_bytes() -> None:
    assert validate_segment_name("a" * 1024)
    assert validate_segment_name("é" * 512)  # 1024 bytes
    for name in ("a" * 1025, "é" * 512 + "a", "€" * 342):
        with pytest.raises(InvalidName, match="1 to 1024 bytes"):
            validate_segment_name(name)


def test_lone_surrogate_is_not_utf8() -> None:
    with pytest.raises(InvalidName, match="UTF-8"):
        validate_segment_name("a\udc80b")


@pytest.mark.parametrize("name", ["a", "scope/stream/0", "a.b/..c/.d.", "x y/é/日本", "~!@$&'()*+,;=[]"])
def test_valid_names(name: str, store: SegmentStore) -> None:
    assert validate_segment_name(name) == name
    store.create(name)
    store.append(name, b"x")
    assert store.read(name).data == b"x"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a", [0, 1, 3, 2, 15]),
        ("scope/stream/0", [0, 1, 3, 1, 11]),
        ("segment-1", [0, 1, 3, 0, 3]),
        ("é/ü", [0, 0, 0, 0, 4]),
    ],
)
def test_container_for_is_stable(name: str, expected: list[int]) -> None:
    assert [container_for(name, count) for count in (1, 2, 4, 7, 16)] == expected


def test_log_file_names_sort_by_first_frame() -> None:
    names = [log_file_name(seq) for seq in (0, 9, 10, 2**63)]
    assert names == sorted(names)
    assert [parse_log_file_name(n) for n in names] == [0, 9, 10, 2**63]
    for other in ("LOCK", "1.log", "00000000000000000001.log.tmp", "0000000000000000000a.log"):
        assert parse_log_file_name(other) is None


def test_tier2_keys_escape_names_and_hash_long_ones() -> None:
    assert segment_object_key(3, "a/b c", 7) == "c3/a%2Fb%20c.7"
    assert segment_object_key(3, "..", 7) == "c3/...7"
    long_key = segment_object_key(0, "é" * 100, 1)
    assert long_key.startswith("c0/~") and long_key.endswith(".1") and len(long_key) < 80
    assert segment_object_key(0, "é" * 100, 2) != long_key
    assert segment_object_key(0, "é" * 99 + "e", 1) != long_key
