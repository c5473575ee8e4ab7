"""Data folders from before reserved names: streams under ``streams/meta|data/`` move to ``#stream/``.

The old layout is written here through the engine, as the stream layer
wrote it: framed messages, producer and ``Stream-Seq`` attributes, meta
records, a closed stream, a fork, a soft-deleted source and leftovers.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from app import create_app
from app.streams import migration
from app.streams.errors import StreamClosed, StreamConflict, StreamGone
from app.streams.format import format_offset, frame
from app.streams.names import stream_part
from app.streams.producers import SEQ_GENERATION_KEY, Producer, producer_keys
from app.streams.records import StreamConfig, encode_record
from app.streams.store import StreamStore
from engine import AttributeUpdate, AttributeUpdateType, SegmentStore, Settings
from tests.crashing import crash_everywhere, open_store
from tests.streams.conftest import HTTP

REPLACE = AttributeUpdateType.REPLACE
FIRST = frame(b"m1")


def _settings(data: Path) -> Settings:
    return Settings(data_dir=str(data), container_count=4, flush_threshold_ms=50)


def _old_meta(name: str) -> str:
    return f"streams/meta/{stream_part(name)}"


def _old_data(store: SegmentStore, name: str, beside: str | None = None) -> str:
    """An old data segment name; with ``beside``, one in that segment's container (for a fork)."""
    while True:
        segment = f"streams/data/{stream_part(name)}/{uuid.uuid4().hex[:16]}"
        if beside is None or store.container_of(segment) == store.container_of(beside):
            return segment


def _old_stream(store: SegmentStore, name: str, data: str, records: list[dict], **config: Any) -> None:
    store.create(_old_meta(name))
    content = StreamConfig(content_type="text/plain", data_segment=data, **config).to_json()
    store.append(_old_meta(name), b"".join(encode_record(r) for r in [content, *records]))


def build_old_layout(store: SegmentStore) -> None:
    """Streams s (producer p, Stream-Seq), c (closed by p2), f (fork of s), d (soft-deleted, forked by e)."""
    s = _old_data(store, "s/ü")
    store.create(s)
    epoch, seq = producer_keys("p")
    store.append(s, FIRST, attributes=[AttributeUpdate(epoch, REPLACE, 0), AttributeUpdate(seq, REPLACE, 0)])
    store.append(
        s,
        frame(b"m2"),
        attributes=[AttributeUpdate(seq, REPLACE, 1), AttributeUpdate(SEQ_GENERATION_KEY, REPLACE, 1)],
    )
    _old_stream(store, "s/ü", s, [{"t": "seq", "seq": "0001", "generation": 1}])

    c = _old_data(store, "c")
    store.create(c)
    epoch, seq = producer_keys("p2")
    producer_state = [AttributeUpdate(epoch, REPLACE, 0), AttributeUpdate(seq, REPLACE, 0)]
    store.append(c, frame(b"last"), attributes=producer_state)
    store.seal(c)
    _old_stream(store, "c", c, [{"t": "closed_by", "producer": "p2", "epoch": 0, "seq": 0}])

    f = _old_data(store, "f", beside=s)
    store.fork(s, f, len(FIRST))
    store.append(f, frame(b"f1"))
    fork_offset = format_offset(len(FIRST))
    _old_stream(store, "f", f, [], forked_from="s/ü", fork_offset=fork_offset, fork_position=len(FIRST))

    d = _old_data(store, "d")
    store.create(d)
    store.append(d, frame(b"d1"))
    e = _old_data(store, "e", beside=d)
    store.fork(d, e)
    store.delete(d)
    _old_stream(store, "d", d, [{"t": "soft_deleted"}])
    _old_stream(store, "e", e, [], forked_from="d", fork_position=len(frame(b"d1")))

    store.create(_old_meta("half-created"))  # a create that crashed before its record
    store.create(_old_data(store, "orphan"))  # a delete that crashed before its data segment went
    store.create("streams/mine")  # a user's segment


def check_migrated(store: SegmentStore) -> None:
    assert [i.name for i in store.list("streams/")[0]] == ["streams/mine"]
    assert store.info("#stream/migrated").length == 0
    streams = StreamStore(store)
    assert streams.read("s/ü", None).messages == (b"m1", b"m2")
    duplicate = streams.append("s/ü", b"m2", content_type="text/plain", producer=Producer("p", 0, 1))
    assert duplicate.status == "duplicate" and duplicate.last_seq == 1
    with pytest.raises(StreamConflict):
        streams.append("s/ü", b"old", content_type="text/plain", seq="0001")
    closed = streams.read("c", None)
    assert closed.messages == (b"last",) and closed.closed
    retry = streams.append("c", b"", content_type=None, producer=Producer("p2", 0, 0), close=True)
    assert retry.status == "duplicate" and retry.closed
    with pytest.raises(StreamClosed):
        streams.append("c", b"more", content_type="text/plain")
    assert streams.read("f", None).messages == (b"m1", b"f1")
    assert streams.read("e", None).messages == (b"d1",)
    with pytest.raises(StreamGone):
        streams.read("d", None)
    assert set(streams.streams) == {"s/ü", "c", "f", "d", "e"}
    data = {i.name for i in store.list("#stream/data/")[0]}
    assert data == {streams.live(n).config.data_segment for n in ("s/ü", "c", "f", "e")}
    assert store.container_of(streams.live("f").config.data_segment) == store.container_of(
        streams.live("s/ü").config.data_segment
    )


@pytest.mark.slow
def test_a_crash_anywhere_in_the_migration_and_a_restart_finish_it(tmp_path: Path) -> None:
    steps = crash_everywhere(tmp_path, _settings, build_old_layout, migration.migrate, check_migrated)
    assert steps > 20


def test_a_second_migration_changes_nothing(tmp_path: Path) -> None:
    store = open_store(_settings(tmp_path / "data"))
    try:
        build_old_layout(store)
        assert migration.migrate(store) == 6
        before = [(i.name, i.length, i.sealed) for i in store.list("#stream/")[0]]
        store.create("streams/meta/new")  # after the migration: an ordinary name
        assert migration.migrate(store) == 0
        assert [(i.name, i.length, i.sealed) for i in store.list("#stream/")[0]] == before
        assert store.info("streams/meta/new").length == 0
    finally:
        store.close()


def test_an_old_data_folder_serves_its_streams_over_http(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "data")
    store = open_store(settings)
    build_old_layout(store)
    store.close()
    app = create_app(settings, HTTP)
    try:
        app.extensions["segstore"].wait_ready(30)
        client = app.test_client()
        got = client.get("/v1/stream/s%2F%C3%BC", query_string={"offset": "-1"})
        assert got.status_code == 200 and got.data == b"m1m2"
        assert client.head("/v1/stream/c").headers["Stream-Closed"] == "true"
        assert client.get("/v1/stream/f", query_string={"offset": "-1"}).data == b"m1f1"
        assert client.get("/v1/stream/d", query_string={"offset": "-1"}).status_code == 410
        listed = json.loads(client.get("/v1/segments").data)["segments"]
        assert [s["name"] for s in listed] == ["streams/mine"]
    finally:
        app.extensions["streams"].close()
        app.extensions["segstore"].close()


def test_a_migrated_data_segment_is_no_longer_and_stays_in_its_container(tmp_path: Path) -> None:
    store = open_store(_settings(tmp_path / "data"))
    try:
        longest = "~F0~9F~8C~A1" * 82 + "abcdefghij"  # 994 bytes: the longest escaped name there is
        for incarnation in ("0123456789abcdef", "fedcba9876543210", "00000000000000ff"):
            old = f"streams/data/{longest}/{incarnation}"
            new = migration.data_segment_beside(store, old)
            assert len(new) == len(old) == 1024 and new.startswith("#stream/data/")
            assert store.container_of(new) == store.container_of(old)
            assert migration.data_segment_beside(store, old) == new
    finally:
        store.close()
