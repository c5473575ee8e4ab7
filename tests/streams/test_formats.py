"""The stream layer's formats: offsets, escaped names, frames, JSON-mode payloads."""

from __future__ import annotations

import pytest

from app.streams.format import format_offset, frame, json_payload, json_values, parse_offset, unframe
from app.streams.names import (
    STREAM_META_PREFIX,
    stream_data_segment,
    stream_meta_segment,
    stream_of_meta_segment,
)
from app.streams.store import StreamStore
from engine import InvalidArgument
from engine.naming import is_internal, is_reserved, validate_name


def test_offsets_sort_as_strings_and_parse_back() -> None:
    positions = [0, 9, 10, 12345, 2**40]
    offsets = [format_offset(p) for p in positions]
    assert offsets == sorted(offsets)
    assert [parse_offset(o) for o in offsets] == positions
    for bad in ["", "12", "1_", "_1", "a_1", "-1_0", "1_2_3", "1, 2"]:
        with pytest.raises(InvalidArgument):
            parse_offset(bad)


@pytest.mark.parametrize("name", ["a", "a/b", "a:b#c?d%e\\f", "..", "/lead//double/", "ünï cödé", "~7E"])
def test_any_stream_name_is_one_part_of_a_reserved_name(name: str) -> None:
    meta = stream_meta_segment(name)
    escaped = meta.removeprefix(STREAM_META_PREFIX)
    assert "/" not in escaped and escaped not in (".", "..") and "#" not in escaped
    data = stream_data_segment(name, "0123abcd")
    for segment in (meta, data):
        assert validate_name(segment) and is_reserved(segment) and not is_internal(segment)
    assert stream_of_meta_segment(meta) == name


def test_frames_keep_message_boundaries() -> None:
    data = frame(b"one") + frame(b"") + frame(b"three")
    assert unframe(data) == ([b"one", b"", b"three"], len(data))
    assert unframe(data[:-1]) == ([b"one", b""], len(frame(b"one") + frame(b"")))


def test_json_payloads_are_values_joined_by_commas() -> None:
    assert json_payload(b'[{"a": 1}, 2, "x"]', allow_empty=False) == b'{"a":1},2,"x"'
    assert json_payload(b'{"a": [1, 2]}', allow_empty=False) == b'{"a":[1,2]}'
    assert json_payload(b"[[1], [2]]", allow_empty=False) == b"[1],[2]"
    assert json_payload(b"[]", allow_empty=True) is None
    assert json_values(b'{"a":1},2') == [{"a": 1}, 2]
    for bad in [b"[]", b"{", b"NaN", b"1e400", b"\xff"]:
        with pytest.raises(InvalidArgument):
            json_payload(bad, allow_empty=False)


def test_a_stream_data_lives_beside_its_meta_and_a_fork_beside_its_source(streams: StreamStore) -> None:
    """One stream request touches one container; a fork shares its source's chunks, so it sits there."""
    store = streams.store
    names = [f"events/{i}" for i in range(12)]
    for name in names:
        streams.create(name, content_type="text/plain", body=b"m")
        data = streams.live(name).config.data_segment
        assert store.container_of(data) == store.container_of(stream_meta_segment(name))
    source = streams.live(names[0]).config.data_segment
    for i in range(6):
        streams.create(f"fork/{i}", content_type="text/plain", forked_from=names[0])
        fork = streams.live(f"fork/{i}").config.data_segment
        assert store.container_of(fork) == store.container_of(source)
        assert streams.read(f"fork/{i}", None).messages == (b"m",)
