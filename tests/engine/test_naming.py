"""Names: segment name rules, stable container routing, Tier 1 file names and Tier 2 keys."""

from __future__ import annotations

import uuid

import pytest

from engine import InvalidName, SegmentStore, validate_segment_name
from engine.naming import (
    ChunkNameParts,
    chunk_name,
    container_chunk_prefix,
    container_for,
    layout_key,
    lease_register_name,
    log_file_name,
    node_register_name,
    parse_chunk_name,
    parse_lease_register_name,
    parse_log_file_name,
    parse_node_register_name,
    subject_of,
    transaction_name,
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


@pytest.mark.parametrize(
    ("name", "subject"),
    [
        ("b/k", "b/k"),
        ("p#transaction.00000000-0000-0000-0000-000000000000", "p"),
        ("#s3/etags/b/dir/k", "b/dir/k"),
        ("#s3/buckets/b", "b"),
        ("#s3/uploads/0a1b", "0a1b"),
        ("#s3/parts/0a1b#transaction.1", "0a1b"),
        ("#stream/meta/x~2Fy~20z", "x~2Fy~20z"),
        ("#stream/data/x~2Fy~20z/" + "0" * 16, "x~2Fy~20z/" + "0" * 16),
        ("#s3/migrated", "#s3/migrated"),
    ],
)
def test_subject_of(name: str, subject: str) -> None:
    assert subject_of(name) == subject


def test_what_one_surface_request_touches_shares_a_container() -> None:
    """A segment and a record about it, an upload's segments: one container."""
    for count in (4, 7, 16):
        for i in range(50):
            obj = f"bucket/key-{i}"
            assert container_for(f"#s3/etags/{obj}", count) == container_for(obj, count)
            upload = uuid.uuid4().hex
            assert container_for(f"#s3/uploads/{upload}", count) == container_for(
                transaction_name(f"#s3/parts/{upload}", uuid.uuid4()), count
            )


def test_log_file_names_sort_by_first_frame() -> None:
    names = [log_file_name(seq) for seq in (0, 9, 10, 2**63)]
    assert names == sorted(names)
    assert [parse_log_file_name(n) for n in names] == [0, 9, 10, 2**63]
    for other in ("LOCK", "1.log", "00000000000000000001.log.tmp", "0000000000000000000a.log"):
        assert parse_log_file_name(other) is None


def test_chunk_names_are_unique_even_for_the_same_segment_epoch_and_offset() -> None:
    names = {chunk_name(0, "s", 1, 1, 0) for _ in range(200)}
    assert len(names) == 200
    assert len({chunk_name(0, "s", 1, epoch, 0) for epoch in range(5)}) == 5


@pytest.mark.parametrize(
    ("container", "name", "segment_id", "epoch", "offset"),
    [
        (0, "s", 1, 1, 0),
        (3, "a/b c", 7, 12, 4096),
        (15, "x.5", 2**63 - 1, 9_999_999_999, 2**63 - 1),
        (2, "..", 9, 3, 1),
        (1, "é" * 100, 4, 2, 10),
    ],
)
def test_chunk_names_round_trip(container: int, name: str, segment_id: int, epoch: int, offset: int) -> None:
    chunk = chunk_name(container, name, segment_id, epoch, offset)
    assert parse_chunk_name(chunk) == ChunkNameParts(container, segment_id, epoch, offset)
    assert chunk.startswith(container_chunk_prefix(container))


def test_chunk_names_escape_segment_names_and_hash_long_ones() -> None:
    assert chunk_name(3, "a/b c", 7, 5, 1234).startswith("c3/a%2Fb%20c.7/e0000000005-o00000000000000001234-")
    assert chunk_name(3, "..", 7, 1, 0).startswith("c3/...7/")  # never a path part of its own
    for name in ("a/../../b", "/abs", "a\\b"):
        chunk = chunk_name(0, name, 1, 1, 0)
        assert chunk.count("/") == 2 and ".." not in chunk.split("/")
    long_chunk = chunk_name(0, "é" * 100, 1, 1, 0)
    folder = long_chunk.rsplit("/", 1)[0]
    assert folder.startswith("c0/~") and folder.endswith(".1") and len(long_chunk) < 150
    assert chunk_name(0, "é" * 99 + "e", 1, 1, 0).rsplit("/", 1)[0] != folder
    assert chunk_name(0, "é" * 100, 2, 1, 0).rsplit("/", 1)[0] != folder


def test_chunks_of_one_segment_share_a_folder_and_sort_by_epoch_then_offset() -> None:
    names = [
        chunk_name(0, "s", 1, epoch, offset)
        for epoch, offset in [(1, 0), (1, 10), (1, 2**40), (2, 5), (10, 0)]
    ]
    assert len({n.rsplit("/", 1)[0] for n in names}) == 1
    assert names == sorted(names)


def test_container_prefix_separates_containers() -> None:
    assert container_chunk_prefix(1) == "c1/"
    ten = chunk_name(10, "s", 1, 1, 0)
    assert not ten.startswith(container_chunk_prefix(1))
    assert parse_chunk_name(ten).container_id == 10  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "other",
    [
        "",
        "c0/s.1",
        "c0/s.1/e0000000001-o00000000000000000000",
        "c0/s.1/e0000000001-o00000000000000000000-0a1b2c3d/x",
        "c0/s/e0000000001-o00000000000000000000-0a1b2c3d",
        "cx/s.1/e0000000001-o00000000000000000000-0a1b2c3d",
        "c0/s.1/e1-o0-0a1b2c3d",
        "c0/s.1/e0000000001-o00000000000000000000-0A1B2C3D",
        "x/c0/s.1/e0000000001-o00000000000000000000-0a1b2c3d",
        layout_key("s"),
        log_file_name(0),
    ],
)
def test_what_is_not_a_chunk_name(other: str) -> None:
    assert parse_chunk_name(other) is None


def test_layout_keys_escape_names_and_stay_out_of_container_prefixes() -> None:
    assert layout_key("a/b c") == "layouts/a%2Fb%20c.json"
    assert layout_key("..") == "layouts/...json"
    long_key = layout_key("é" * 100)
    assert long_key.startswith("layouts/~") and long_key.endswith(".json") and len(long_key) < 100
    assert layout_key("é" * 99 + "e") != long_key
    assert layout_key("a") != layout_key("b")
    for key in (layout_key("c0"), layout_key("c0/s")):
        assert not any(key.startswith(container_chunk_prefix(c)) for c in range(16))


def test_cluster_register_names_round_trip_and_node_ids_are_checked() -> None:
    assert lease_register_name(7) == "leases/00007"
    assert parse_lease_register_name("leases/00007") == 7
    assert parse_lease_register_name("leases/7") is None
    assert node_register_name("node-1.a") == "nodes/node-1.a"
    assert parse_node_register_name("nodes/node-1.a") == "node-1.a"
    for bad in ("", "-x", "a/b", "a b", "x" * 64):
        with pytest.raises(ValueError):
            node_register_name(bad)
