"""Objects and buckets as segments, composed from the engine's public calls (no storage logic).

Layout: objects are ordinary segments; everything else is the surface's
state, in reserved names (``#s3/...``, ``engine/naming.py``) that the native
API refuses and native listings hide:

- object ``key`` of bucket ``b`` is the segment ``b/key``;
- bucket ``b`` exists when the empty sealed segment ``#s3/buckets/b`` does;
- what an object keeps besides its bytes (``metadata.Stored``: its ETag,
  the MD5 of its bytes computed while the upload streamed, its metadata
  headers, checksum and part sizes) is kept in ``#s3/etags/b/key`` as a JSON
  line ``{"id": segment id, "length": n, "etag": hex, ...}``. It only counts
  while the object's segment id and length still match: a segment written or
  replaced through the native API gets a derived ETag ``<md5 of
  id:length>-1`` and no metadata instead, never a wrong MD5. HEAD reads this
  record, never the object;
- a PutObject stages its bytes in ``#s3/staging/<uuid>`` and a multipart
  upload collects its parts in ``#s3/uploads/<upload id>``; both names are
  picked in the target's container, so publishing them is a metadata-only
  merge, whatever the object's size.

Publishing (``publish``) under a per-key lock: judge the write's
conditions, [delete the old object], create it empty, write its record,
merge the sealed staging segment into it, seal it. A reader in between sees
NoSuchKey or an empty object for the few milliseconds of three log
operations; it never sees a mix of old and new bytes, nor a half-written
upload, nor bytes with another object's record (``replace`` says what holds
at each step, a crash included).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable

from app.s3.errors import S3Error
from app.s3.metadata import Stored
from engine import (
    AppendResult,
    InvalidName,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentStore,
    SegstoreError,
    Throttled,
    s3_state_name,
    validate_segment_name,
)

log = logging.getLogger(__name__)

# The one region a bucket reports (GetBucketLocation answers the empty us-east-1 constraint).
REGION = "us-east-1"
# How long one append of an upload waits out back-pressure before the upload fails (SlowDown).
THROTTLED_WAIT_MAX_S = 60.0
RESERVED_BUCKETS = frozenset({"v1", "healthz", "readyz", "metrics"})
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_locks_guard = threading.Lock()


def key_lock(name: str) -> threading.Lock:
    """One lock per object name while anyone holds it: publishes of one key never interleave.

    One worker process owns the data directory, so a process-local lock is enough.
    """
    with _locks_guard:
        lock = _locks.get(name)
        if lock is None:
            lock = threading.Lock()
            _locks[name] = lock
        return lock


def check_bucket_name(bucket: str) -> None:
    """S3's general purpose bucket naming rules (400 InvalidBucketName), plus segstore's own paths.

    3 to 63 characters of lowercase letters, digits, ``.`` and ``-``; a letter
    or digit at each end; no ``..``, ``.-`` or ``-.``; not shaped like an IPv4
    address; none of the prefixes and suffixes S3 keeps for its own features.
    """
    if (
        not _BUCKET.fullmatch(bucket)
        or any(pair in bucket for pair in ("..", ".-", "-."))
        or _IPV4.fullmatch(bucket)
        or bucket.startswith(_RESERVED_PREFIXES)
        or bucket.endswith(_RESERVED_SUFFIXES)
        or bucket in RESERVED_BUCKETS
    ):
        raise S3Error("InvalidBucketName", f"The specified bucket is not valid: {bucket!r}")


def object_name(bucket: str, key: str) -> str:
    """The segment of ``bucket``/``key``; keys a segment name cannot hold are refused (400)."""
    if not key:
        raise S3Error("InvalidArgument", "an object key is at least one character")
    name = f"{bucket}/{key}"
    if len(name.encode("utf-8", "surrogatepass")) > 1024:
        raise S3Error("KeyTooLongError", "Your key is too long.")
    try:
        return validate_segment_name(name)
    except InvalidName as err:
        raise S3Error("InvalidArgument", f"key {key!r} cannot name a segment: {err.detail}") from None


def bucket_marker(bucket: str) -> str:
    return s3_state_name("buckets", bucket)


def record_name(name: str) -> str | None:
    """Where object segment ``name`` keeps its ``Stored`` (None: the name would be too long)."""
    record = s3_state_name("etags", name)
    return record if len(record.encode()) <= 1024 else None


def colocated(store: SegmentStore, kind: str, target: str) -> str:
    """A fresh ``#s3/<kind>/<uuid>`` name in ``target``'s container (a merge then copies nothing)."""
    want = store.container_of(target)
    while True:
        name = s3_state_name(kind, uuid.uuid4().hex)
        if store.container_of(name) == want:
            return name


def require_bucket(store: SegmentStore, bucket: str) -> SegmentInfo:
    """The marker of an existing bucket; 404 NoSuchBucket for any other name.

    Only CreateBucket applies every rule of ``check_bucket_name``. Here a name
    is looked up if it has the shape buckets always had (``_BUCKET``, no
    ``..``), so a bucket made before the other rules (``a.-b``,
    ``192.168.5.4``) can still be listed, emptied and deleted.
    """
    if not bucket_shaped(bucket):
        raise S3Error("NoSuchBucket", "The specified bucket does not exist")
    try:  # in a cluster the marker may live on another node: one call to it
        return store.info(bucket_marker(bucket), anywhere=True)
    except SegmentNotFound:
        raise S3Error("NoSuchBucket", "The specified bucket does not exist") from None


def bucket_shaped(bucket: str) -> bool:
    """Whether ``bucket`` has the shape every bucket name has had (a lookup of any other is 404)."""
    return _BUCKET.fullmatch(bucket) is not None and ".." not in bucket


def derived_etag(info: SegmentInfo) -> str:
    """The ETag of an object without a valid MD5 record: stable while its bytes are, never an MD5."""
    start = f":{info.start_offset}" if info.start_offset else ""  # truncated through the native API
    return hashlib.md5(f"{info.segment_id}:{info.length}{start}".encode()).hexdigest() + "-1"


def _record(store: SegmentStore, info: SegmentInfo) -> dict | None:
    """The last line of the record of object segment ``info`` if it names that segment id."""
    name = record_name(info.name)
    if name is not None:
        with contextlib.suppress(SegstoreError):  # beside its object, on another node for a copy's source
            return _parsed(store.read(name, anywhere=True).data, info)
    return None


def _parsed(data: bytes | None, info: SegmentInfo) -> dict | None:
    """The record line ``data`` ends with, if it names ``info``'s segment id."""
    if data is None:
        return None
    with contextlib.suppress(ValueError, KeyError, TypeError):
        record = json.loads(data.rstrip(b"\n").rsplit(b"\n", 1)[-1])
        if record["id"] == info.segment_id:
            return record
    return None


def _stored(record: dict | None, info: SegmentInfo) -> Stored:
    if record is not None and record["length"] == info.length and info.start_offset == 0:
        return Stored.from_json(record)
    return Stored(derived_etag(info))


def stored_of(store: SegmentStore, info: SegmentInfo) -> Stored:
    """What the object keeps besides its bytes, if its record is about these bytes.

    Otherwise (written through the native API, or the record was not written)
    a derived ETag and no metadata.
    """
    return _stored(_record(store, info), info)


def etags_of(store: SegmentStore, infos: list[SegmentInfo]) -> dict[str, str]:
    """The ETag of each object segment of a listing page, by name, its records read all at once.

    On a cluster node the records of another node's containers come in one
    call to that node for the whole page (``SegmentStore.heads``).
    """
    names = {info.name: record_name(info.name) for info in infos}
    heads = store.heads(sorted({n for n in names.values() if n is not None}))
    return {
        info.name: _stored(_parsed(heads.get(names[info.name] or ""), info), info).etag for info in infos
    }


def recorded_etag(store: SegmentStore, info: SegmentInfo) -> str | None:
    """The ETag the record of segment ``info`` names, whether or not its bytes are all in yet.

    A publish writes the record before the bytes merge in: this tells whose
    segment an empty or unsealed object is after a crash between the two.
    """
    record = _record(store, info)
    return str(record["etag"]) if record is not None else None


def etag_of(store: SegmentStore, info: SegmentInfo) -> str:
    return stored_of(store, info).etag


def write_record(store: SegmentStore, name: str, segment_id: int, length: int, stored: Stored) -> None:
    """Record ``stored`` for the object segment ``name`` once it is ``segment_id`` of ``length`` bytes.

    The record segment keeps only its last line. Back-pressure is waited out
    as an upload's is; past that, the object goes without its record (a
    derived ETag and no metadata, never another object's) and a warning says so.
    """
    record = record_name(name)
    if record is None:
        return
    appended: list[AppendResult] = []
    try:
        with contextlib.suppress(SegmentExists):
            store.create(record)
        line = stored.to_json(segment_id, length)
        patiently(lambda data: appended.append(store.append(record, data)), line)
        offset = appended[0].offset
        assert offset is not None
        store.truncate(record, offset)
    except Throttled as err:
        log.warning("record of %r not written: %s", name, err.detail)


def drop_record(store: SegmentStore, name: str) -> None:
    record = record_name(name)
    if record is not None:
        with contextlib.suppress(SegmentNotFound):
            store.delete(record)


def precondition_failed() -> S3Error:
    return S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold")


def check_write_conditions(
    store: SegmentStore, current: SegmentInfo | None, *, if_none_match: bool, if_match: str | None
) -> None:
    """A conditional write's checks against the object now: ``If-None-Match: *`` and ``If-Match``.

    ``If-Match`` on a missing object is NoSuchKey; ``If-Match: *`` holds for any existing object.
    """
    if if_none_match and current is not None:
        raise precondition_failed()
    if if_match is not None:
        if current is None:
            raise S3Error("NoSuchKey", "The specified key does not exist.")
        wanted = if_match.strip()
        if wanted != "*" and etag_of(store, current) != wanted.strip('"'):
            raise precondition_failed()


def patiently(append: Callable[[bytes], object], data: bytes) -> None:
    """``append(data)``, waiting out back-pressure (Throttled) for up to ``THROTTLED_WAIT_MAX_S``.

    An upload is many appends; failing it at its 200th MiB because Tier 2 is
    briefly behind would make the client send everything again.
    """
    deadline = time.monotonic() + THROTTLED_WAIT_MAX_S
    while True:
        try:
            append(data)
            return
        except Throttled as err:
            if time.monotonic() + err.retry_after_s > deadline:
                raise
            time.sleep(err.retry_after_s)


def stage(store: SegmentStore, target: str, pieces: Iterable[bytes]) -> str:
    """Write ``pieces`` into a new staging segment beside ``target``; returns its name (unsealed)."""
    staging = colocated(store, "staging", target)
    store.create(staging)
    try:
        for piece in pieces:
            patiently(functools.partial(store.append, staging), piece)
    except BaseException:
        discard(store, staging)
        raise
    return staging


def discard(store: SegmentStore, name: str) -> None:
    with contextlib.suppress(SegstoreError):
        store.delete(name)


def info_or_none(store: SegmentStore, name: str) -> SegmentInfo | None:
    try:
        return store.info(name)
    except SegmentNotFound:
        return None


def publish(
    store: SegmentStore,
    target: str,
    staging: str,
    stored: Stored,
    *,
    if_none_match: bool = False,
    if_match: str | None = None,
) -> SegmentInfo:
    """Make the ``staging`` segment the object ``target`` (replacing it), with ``stored`` as its record.

    ``if_none_match``: only if there is no such object; ``if_match``: only if
    the current object has that ETag (or exists, for ``*``). Either failing:
    PreconditionFailed. On any failure the staging segment is dropped and
    the object is left as ``replace`` left it.
    """
    try:
        store.seal(staging)
        with key_lock(target):
            current = info_or_none(store, target)
            check_write_conditions(store, current, if_none_match=if_none_match, if_match=if_match)
            return replace(store, target, staging, stored, current)
    except BaseException:
        discard(store, staging)
        raise


def replace(
    store: SegmentStore, target: str, staging: str, stored: Stored, current: SegmentInfo | None
) -> SegmentInfo:
    """The swap of ``publish`` (the caller holds ``key_lock(target)``; ``staging`` is sealed).

    [Delete the ``current`` object], create the target empty, write its record
    for the segment id and length it will have, merge the staging segment
    into it (one log operation), seal it. What holds at every step, a crash
    included: a reader sees the old object (its bytes and record), no object,
    an empty one (a derived ETag, no metadata), or the new bytes with their
    own record; never new bytes with the old record or the reverse, as a
    record only counts for the segment id and length it names.
    """
    staged = store.info(staging)
    if current is not None:
        store.delete(target)
    created = store.create(target)
    write_record(store, target, created.segment_id, staged.length, stored)
    merged = store.merge(target, staging)
    assert merged.offset == 0, "a fresh object segment must be empty when its bytes merge in"
    return store.seal(target)


def delete_object(store: SegmentStore, name: str, *, if_match: str | None = None) -> None:
    """Delete the object and its record; a missing object is fine (S3 answers 204 alike).

    With ``if_match``, only the object of that ETag (412 otherwise, 404 if there is none).
    """
    with key_lock(name):
        if if_match is not None:
            current = info_or_none(store, name)
            check_write_conditions(store, current, if_none_match=False, if_match=if_match)
        with contextlib.suppress(SegmentNotFound):
            store.delete(name)
        drop_record(store, name)
