"""Data folders from before reserved names: the S3 state under ``.s3/`` moves to ``#s3/`` at start.

The old layout is written here through the engine, as the S3 surface wrote
it: bucket markers, object records, a completion record, a staging leftover
and an upload in progress under ``.s3/``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app import create_app
from app.s3 import migration, objects
from app.s3.metadata import Stored
from engine import SegmentNotFound, SegmentStore, Settings
from tests.crashing import crash_everywhere, open_store

OBJECT = b"old bytes"
COMPLETED = b'{"etag": "abc-2", "segment": 7}\n'
UPLOAD = "1f" * 16


def _settings(data: Path) -> Settings:
    return Settings(data_dir=str(data), container_count=4, flush_threshold_ms=50)


def build_old_layout(store: SegmentStore) -> None:
    """What a data folder written before reserved names holds for one bucket with one object."""
    store.create(".s3/buckets/bk1")
    store.seal(".s3/buckets/bk1")
    info = store.create("bk1/k")
    store.append("bk1/k", OBJECT)
    store.seal("bk1/k")
    stored = Stored(hashlib.md5(OBJECT).hexdigest(), meta={"x-amz-meta-color": "blue"})
    store.create(".s3/etags/bk1/k")
    store.append(".s3/etags/bk1/k", stored.to_json(info.segment_id, len(OBJECT)))
    store.create(".s3/completed/u0")
    store.append(".s3/completed/u0", COMPLETED)
    store.create(".s3/staging/0123abcd")
    store.append(".s3/staging/0123abcd", b"half a PutObject")
    store.create(f".s3/uploads/{UPLOAD}")
    store.create(f".s3/parts/{UPLOAD}")
    store.append(f".s3/parts/{UPLOAD}", b'{"bucket": "bk1", "key": "big"}\n')
    txid = store.open_transaction(f".s3/uploads/{UPLOAD}")
    store.append_transaction(f".s3/uploads/{UPLOAD}", txid, b"part one")
    store.create(".s3/notes/mine")  # not a kind the surface wrote: a user's segment


def check_migrated(store: SegmentStore) -> None:
    assert [i.name for i in store.list(".s3/")[0]] == [".s3/notes/mine"]
    assert store.info("#s3/buckets/bk1").sealed
    stored = objects.stored_of(store, store.info("bk1/k"))
    assert stored.etag == hashlib.md5(OBJECT).hexdigest() and stored.meta == {"x-amz-meta-color": "blue"}
    assert store.read("#s3/completed/u0").data == COMPLETED
    for gone in ("#s3/staging/0123abcd", f"#s3/uploads/{UPLOAD}", f"#s3/parts/{UPLOAD}"):
        with pytest.raises(SegmentNotFound):
            store.info(gone)
    assert store.info("#s3/migrated").length == 0


@pytest.mark.slow
def test_a_crash_anywhere_in_the_migration_and_a_restart_finish_it(tmp_path: Path) -> None:
    steps = crash_everywhere(tmp_path, _settings, build_old_layout, migration.migrate, check_migrated)
    assert steps > 10


def test_a_second_migration_changes_nothing(tmp_path: Path) -> None:
    store = open_store(_settings(tmp_path / "data"))
    try:
        build_old_layout(store)
        assert migration.migrate(store) == 6
        before = [(i.name, i.length, i.sealed) for i in store.list("#s3/")[0]]
        store.create(".s3/buckets/bk3")  # after the migration: an ordinary name
        assert migration.migrate(store) == 0
        assert [(i.name, i.length, i.sealed) for i in store.list("#s3/")[0]] == before
        assert store.info(".s3/buckets/bk3").length == 0
    finally:
        store.close()


def test_an_old_data_folder_serves_its_buckets_and_objects_through_s3(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "data")
    store = open_store(settings)
    build_old_layout(store)
    store.close()
    app = create_app(settings)
    try:
        app.extensions["segstore"].wait_ready(30)
        client = app.test_client()
        assert b"<Name>bk1</Name>" in client.get("/").data
        got = client.get("/bk1/k")
        assert got.status_code == 200 and got.data == OBJECT
        assert got.headers["ETag"] == f'"{hashlib.md5(OBJECT).hexdigest()}"'
        assert got.headers["x-amz-meta-color"] == "blue"
        assert client.get("/bk1/big", query_string={"uploadId": UPLOAD}).status_code == 404
        listed = json.loads(client.get("/v1/segments").data)["segments"]
        assert [s["name"] for s in listed] == [".s3/notes/mine", "bk1/k"]
    finally:
        app.extensions["segstore"].close()
