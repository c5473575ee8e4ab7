"""A PutObject and a CompleteMultipartUpload cut short at every step, then retried (in-process).

``Dying`` lets the store make ``allowed`` changes and then fails that call
and every later one, as a process killed at that instant would: no cleanup
of the interrupted request runs. The store keeps what was done, as the
engine's durable log does across a restart. After each cut a reader must see
the old object or the new one with its own record (never no object, never
an empty one), and a retry of the same request must finish it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.s3 import multipart, objects
from app.s3.metadata import Stored
from engine import SegmentNotFound, SegmentStore, Settings

CHANGES = frozenset(
    {
        "create", "append", "seal", "truncate", "delete", "merge", "open_transaction",
        "append_transaction", "commit_transaction", "abort_transaction", "composite",
    }
)  # fmt: skip
OLD = (b"old bytes", Stored(hashlib.md5(b"old bytes").hexdigest(), {"x-amz-meta-v": "old"}))


class Died(Exception):
    """The process stopped here."""


class Dying:
    """The store, until its ``allowed``-th change: that call and every call after it raise Died."""

    def __init__(self, store: SegmentStore, allowed: int) -> None:
        self._store = store
        self._allowed = allowed
        self._changes = 0
        self.died = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.died and name in CHANGES:
                if self._changes == self._allowed:
                    self.died = True
                self._changes += 1
            if self.died:
                raise Died(name)
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentStore]:
    s = SegmentStore(Settings(data_dir=str(tmp_path / "data"), container_count=2))
    s.start(wait=True)
    yield s
    s.close()


def _put(store: SegmentStore, name: str, data: bytes, stored: Stored, *, staged: bool = False) -> None:
    """A PutObject: its bytes in the publish itself, or (a large body) staged first."""
    if staged:
        staging = objects.stage(store, name, [data[:4], data[4:]])
        objects.publish(store, name, stored, staging=staging)
    else:
        objects.publish(store, name, stored, data=data)


def _view(store: SegmentStore, name: str) -> tuple[bytes, Stored] | None:
    """What a reader gets: the bytes and what they keep, or None for NoSuchKey."""
    try:
        info = store.info(name)
    except SegmentNotFound:
        return None
    data = store.read(name).data if info.length else b""
    return data, objects.stored_of(store, info)


def _assert_consistent(store: SegmentStore, name: str, data: bytes, etag: str, meta: dict[str, str]) -> None:
    """The object is the old one or the new one, whole, each with its own record."""
    view = _view(store, name)
    assert view is not None, "no object"
    if view != OLD:
        assert view[0] == data and view[1].etag == etag and view[1].meta == meta, view


@pytest.mark.parametrize("staged", [False, True], ids=["in hand", "staged"])
def test_a_put_cut_short_anywhere_shows_the_old_object_or_the_new_one(
    store: SegmentStore, staged: bool
) -> None:
    new = (b"new bytes!", Stored(hashlib.md5(b"new bytes!").hexdigest(), {"x-amz-meta-v": "new"}))
    for allowed in itertools.count():
        name = f"b/put-{allowed}"
        _put(store, name, *OLD)
        dying = Dying(store, allowed)
        with contextlib.suppress(Died):
            _put(dying, name, *new, staged=staged)
        _assert_consistent(store, name, new[0], new[1].etag, new[1].meta)
        _put(store, name, *new)  # the client's retry
        assert _view(store, name) == new
        if not dying.died:
            break
    assert allowed == (3 if staged else 1), "every change of a publish was cut once"


def _start_upload(store: SegmentStore, key: str) -> tuple[str, list[multipart.Chosen], bytes, str]:
    """An upload of two parts, the first sent twice (only its second copy counts); and its ETag."""
    upload_id = multipart.create(store, "b", key, {"x-amz-meta-v": "new"}, "crc32")
    chosen, data, md5s = [], b"", b""
    for number, body in [(1, os.urandom(3000)), (1, os.urandom(3000)), (2, os.urandom(1000))]:
        sent = (hashlib.md5(body).hexdigest(), {"x-amz-checksum-crc32": _crc32(body)})
        multipart.upload_part(store, upload_id, "b", key, number, [body], lambda sent=sent: sent)
        chosen = [c for c in chosen if c.number != number]
        chosen.append(multipart.Chosen(number, sent[0], {"crc32": _crc32(body)}))
        data = data[:3000] + body if number == 2 else body
        md5s = md5s[:16] + hashlib.md5(body).digest() if number == 2 else hashlib.md5(body).digest()
    return upload_id, chosen, data, hashlib.md5(md5s).hexdigest() + "-2"


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_a_complete_cut_short_anywhere_is_finished_by_its_retry(
    store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(multipart, "PART_MIN_BYTES", 1000)
    for allowed in itertools.count():
        key = f"mp-{allowed}"
        name = f"b/{key}"
        _put(store, name, *OLD)
        upload_id, chosen, data, etag = _start_upload(store, key)
        dying = Dying(store, allowed)
        with contextlib.suppress(Died):
            multipart.complete(dying, upload_id, "b", key, chosen)
        _assert_consistent(store, name, data, etag, {"x-amz-meta-v": "new"})
        first = multipart.complete(store, upload_id, "b", key, chosen)  # the client's retry
        assert first.etag == etag
        view = _view(store, name)
        assert view is not None and view[0] == data and view[1].etag == first.etag
        assert view[1].meta == {"x-amz-meta-v": "new"} and view[1].parts == (3000, 1000)
        assert store.info(name).sealed
        with pytest.raises(SegmentNotFound):
            store.info(multipart.parts_name(upload_id))
        again = multipart.complete(store, upload_id, "b", key, chosen[:1])  # answered, not redone
        assert again.etag == first.etag and again.checksum == first.checksum
        if not dying.died:
            break
    assert allowed >= 2, "the Complete and the abort of the part sent twice were each cut once"


def test_a_conditional_complete_cut_short_is_finished_by_its_retry(
    store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All or nothing: its retry either answers from the completion or judges the old object again."""
    monkeypatch.setattr(multipart, "PART_MIN_BYTES", 1000)
    for allowed in itertools.count():
        key = f"if-{allowed}"
        name = f"b/{key}"
        _put(store, name, *OLD)
        upload_id, chosen, data, etag = _start_upload(store, key)
        dying = Dying(store, allowed)
        with contextlib.suppress(Died):
            multipart.complete(dying, upload_id, "b", key, chosen, if_match=OLD[1].etag)
        multipart.complete(store, upload_id, "b", key, chosen, if_match=OLD[1].etag)
        view = _view(store, name)
        assert view is not None and view[0] == data and view[1].etag == etag
        if not dying.died:
            break


def test_completion_records_are_all_pruned_in_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SegmentStore(
        Settings(data_dir=str(tmp_path / "data"), container_count=2, transaction_timeout_s=1)
    )
    store.start(wait=True)
    try:
        monkeypatch.setattr(multipart, "_PRUNE_PAGE", 3)
        old = [multipart.completed_name(f"f{i:031x}") for i in range(5)]
        for name in old:
            store.create(name)
        time.sleep(1.1)
        young = [multipart.completed_name(f"0{i:031x}") for i in range(5)]
        for (
            name
        ) in young:  # they sort first: a prune that always starts at the first page never gets past them
            store.create(name)
        for _ in range(4):
            multipart.create(store, "b", "k", {}, None)
        left = {info.name for info in store.scan(multipart.completed_name(""))}
        assert left == set(young)
    finally:
        store.close()


def test_the_completion_record_names_the_object_segment(store: SegmentStore) -> None:
    upload_id, chosen, _, _ = _start_upload(store, "named")
    multipart.complete(store, upload_id, "b", "named", chosen[1:])
    record = json.loads(store.read(multipart.completed_name(upload_id)).data)
    assert record["id"] == store.info("b/named").segment_id
