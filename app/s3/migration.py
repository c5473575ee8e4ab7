"""The S3 surface's state moves out of ordinary names (``.s3/...``) into reserved ones (``#s3/...``).

Data folders written before the surface had reserved names keep bucket
markers, object records, staging segments and multipart uploads under
``.s3/``, where the native API could reach them. Once per data folder, at
start (``ensure``):

- a bucket marker becomes ``#s3/buckets/<bucket>`` (empty and sealed; its
  creation time becomes the migration's);
- an object record (``etags``) and a completion record (``completed``) are
  copied into their reserved names; objects themselves do not move, so a
  record still names its object's segment id and length;
- a staging segment is dropped: the PutObject that wrote it died with the
  process that ran it;
- a multipart upload in progress (``uploads``, ``parts``) is aborted: its
  parts are transactions of the upload segment, which cannot move; its
  client gets NoSuchUpload and uploads again.

Each old segment goes only once its new one is whole, so a crash in the
middle leaves old names that the next start moves again (a half-written new
one is replaced). The marker ``#s3/migrated`` is written last: from then on
``.s3/...`` are ordinary names a user may take, never looked at again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable

from app.s3.names import LEGACY_S3_PREFIX, S3, s3_state_name
from engine import (
    SegmentExists,
    SegmentNotFound,
    SegmentStore,
    SegstoreError,
)

log = logging.getLogger(__name__)

_done: weakref.WeakSet[SegmentStore] = weakref.WeakSet()
_lock = threading.Lock()


def ensure(store: SegmentStore) -> None:
    """Migrate ``store``'s data folder unless done already (cheap after the first call)."""
    if store in _done:
        return
    with _lock:
        if store not in _done:
            migrate(store)
            _done.add(store)


def start(store: SegmentStore) -> None:
    """Migrate in the background as soon as the store is ready, before any S3 request needs it."""

    def run() -> None:
        try:
            store.wait_ready()
            ensure(store)
        except SegstoreError as err:  # the first S3 request tries again
            log.warning("S3 state not migrated at start: %s %s", err.code, err.detail)
        except Exception:  # e.g. the store closed meanwhile; the first S3 request tries again
            log.exception("S3 state not migrated at start")

    threading.Thread(target=run, name="s3-migration", daemon=True).start()


def migrate(store: SegmentStore) -> int:
    """Move every ``.s3/...`` segment to its reserved name (or drop it); returns how many were looked at.

    A cluster node moves nothing: a cluster's state was written with
    reserved names (a data folder from before them runs once as a single
    node first), and the marker lives in one container of one node.
    """
    if store.node is not None:
        return 0
    marker = S3.migrated
    with contextlib.suppress(SegmentNotFound):
        store.info(marker)
        return 0
    seen = 0
    for info in store.scan(LEGACY_S3_PREFIX):
        kind, _, rest = info.name.removeprefix(LEGACY_S3_PREFIX).partition("/")
        if not rest:
            continue
        if kind == "buckets":
            _move(store, info.name, s3_state_name(kind, rest), _empty_sealed)
        elif kind in ("etags", "completed"):
            _move(store, info.name, s3_state_name(kind, rest), _copy)
        elif kind in ("staging", "uploads", "parts"):
            if kind == "uploads":
                log.warning("multipart upload %s aborted: uploads in progress do not move", rest)
            _drop(store, info.name)
        else:
            continue  # not the surface's: a user's segment that happens to start with .s3/
        seen += 1
    with contextlib.suppress(SegmentExists):
        store.create(marker)
    if seen:
        log.info("S3: %d segments moved from %s to reserved names", seen, LEGACY_S3_PREFIX)
    return seen


def _move(store: SegmentStore, old: str, new: str, write: Callable[[SegmentStore, str, str], None]) -> None:
    """Write ``new`` afresh from ``old``, then drop ``old``."""
    _drop(store, new)  # half-written by a migration that crashed
    write(store, old, new)
    _drop(store, old)


def _empty_sealed(store: SegmentStore, old: str, new: str) -> None:
    store.create(new)
    store.seal(new)


def _copy(store: SegmentStore, old: str, new: str) -> None:
    """``old``'s readable bytes into ``new`` (records are small: a line or a few)."""
    info = store.info(old)
    store.create(new)
    offset = info.start_offset
    while offset < info.length:
        result = store.read(old, offset)
        store.append(new, result.data)
        offset = result.next_offset
    if info.sealed:
        store.seal(new)


def _drop(store: SegmentStore, name: str) -> None:
    with contextlib.suppress(SegmentNotFound):
        store.delete(name)
