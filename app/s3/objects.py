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
- a PutObject whose body fits one append carries its bytes in the publish
  itself; a larger one stages them in ``#s3/staging/<uuid>``, and a
  multipart upload collects its parts in ``#s3/uploads/<upload id>``; both
  names are picked in the target's container, so publishing them is a
  metadata-only merge, whatever the object's size.

Publishing (``publish``) is one composite operation (engine/container/composite.py):
the old object deleted, the new one created with its bytes (or the staging
segment merged into it), its record written, the object sealed, all in one
log entry. A reader sees the old object or the new one, each with its own
record; NoSuchKey only if there was none; never an empty or half-written
object, and a crash leaves one or the other. The write's conditions
(``If-None-Match``, ``If-Match``) are judged against the object, and the
composite holds only while that object is still the one judged (its
segment id, the record's length): when another writer of the key came
first, the publish judges again and retries, so concurrent writers of one
key need no lock and the last one to commit wins, as on S3.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from app.s3.errors import S3Error
from app.s3.metadata import Stored
from app.s3.names import s3_state_name
from engine import (
    AppendStep,
    ConditionalCheckFailed,
    CreateStep,
    DeleteStep,
    InvalidName,
    MergeStep,
    SealStep,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentStore,
    SegstoreError,
    Step,
    Throttled,
    TruncateStep,
    validate_segment_name,
)

# The one region a bucket reports (GetBucketLocation answers the empty us-east-1 constraint).
REGION = "us-east-1"
# How long one append of an upload waits out back-pressure before the upload fails (SlowDown).
THROTTLED_WAIT_MAX_S = 60.0
# Paths of segstore itself: the native API, the probes, the metrics and the console.
RESERVED_BUCKETS = frozenset({"v1", "healthz", "readyz", "metrics", "console"})
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# How often a write of a key is judged again when other writers of it keep coming first.
RACED_TRIES_MAX = 8
T = TypeVar("T")


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


def etag_of(store: SegmentStore, info: SegmentInfo) -> str:
    return stored_of(store, info).etag


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


def patiently(call: Callable[[], T]) -> T:
    """``call()``, waiting out back-pressure (Throttled) for up to ``THROTTLED_WAIT_MAX_S``.

    An upload is many appends; failing it at its 200th MiB because Tier 2 is
    briefly behind would make the client send everything again.
    """
    deadline = time.monotonic() + THROTTLED_WAIT_MAX_S
    while True:
        try:
            return call()
        except Throttled as err:
            if time.monotonic() + err.retry_after_s > deadline:
                raise
            time.sleep(err.retry_after_s)


def stage(store: SegmentStore, target: str, pieces: Iterable[bytes]) -> str:
    """Write ``pieces`` into a new staging segment beside ``target``; returns its name (unsealed).

    The segment is created with the first piece (one log entry).
    """
    staging = colocated(store, "staging", target)
    pieces = iter(pieces)
    first = next(pieces, b"")
    created: list[Step] = [CreateStep(staging), *([AppendStep(staging, first)] if first else [])]
    patiently(lambda: store.composite(created))
    try:
        for piece in pieces:
            patiently(functools.partial(store.append, staging, piece))
    except BaseException:
        discard(store, staging)
        raise
    return staging


def small_or_staged(
    store: SegmentStore, target: str, pieces: Iterator[bytes], finish: Callable[[], object]
) -> tuple[bytes | None, str | None]:
    """An upload's bytes: in hand if they fit one append (one piece), else staged beside ``target``.

    ``finish()`` checks the body once it is all read; a body that fails it
    leaves nothing behind.
    """
    first = next(pieces, b"")
    second = next(pieces, None)
    if second is None:
        finish()
        return first, None
    staging = stage(store, target, itertools.chain([first, second], pieces))
    try:
        finish()
    except BaseException:
        discard(store, staging)
        raise
    return None, staging


def discard(store: SegmentStore, name: str) -> None:
    with contextlib.suppress(SegstoreError):
        store.delete(name)


def info_or_none(store: SegmentStore, name: str, *, anywhere: bool = False) -> SegmentInfo | None:
    """The segment's state, None if there is none; ``anywhere`` as for ``SegmentStore.info``."""
    try:
        return store.info(name, anywhere=anywhere)
    except SegmentNotFound:
        return None


def publish(
    store: SegmentStore,
    target: str,
    stored: Stored,
    *,
    data: bytes | None = None,
    staging: str | None = None,
    if_none_match: bool = False,
    if_match: str | None = None,
    length: int | None = None,
    before: Sequence[Step] = (),
    after: Sequence[Step] = (),
) -> SegmentInfo:
    """Make ``data`` (or the ``staging`` segment) the object ``target`` with ``stored`` as its record.

    One composite operation (the module says what holds). ``if_none_match``:
    only if there is no such object; ``if_match``: only if the current object
    has that ETag (or exists, for ``*``). Either failing: PreconditionFailed.
    ``before`` and ``after`` are the caller's steps in the same composite (a
    multipart upload's parts merged into its staging segment; its completion
    record). A refused step of theirs raises its error (``step`` counts from
    the first of ``before``); the staging segment is the caller's to drop.
    ``length``: the object's, if ``before`` changes the staging segment's.
    Returns the new object's state.
    """
    assert (data is None) != (staging is None), "an object's bytes come in hand or staged"
    if data is not None:
        length = len(data)
    for _ in range(RACED_TRIES_MAX):
        current = info_or_none(store, target)
        check_write_conditions(store, current, if_none_match=if_none_match, if_match=if_match)
        replacing = replace_steps(store, target, current, stored, data=data, staging=staging, length=length)
        steps = [*before, *replacing, *after]
        try:
            results = store.composite(steps)
        except (SegmentExists, SegmentNotFound, ConditionalCheckFailed) as err:
            if not raced(err, steps, target):
                raise
            continue
        published = results[len(before) + len(replacing) - 1]
        assert isinstance(published, SegmentInfo) and published.sealed, published
        return published
    raise S3Error("SlowDown", f"other writers of {target!r} kept coming first; please retry")


def replace_steps(
    store: SegmentStore,
    target: str,
    current: SegmentInfo | None,
    stored: Stored,
    *,
    data: bytes | None = None,
    staging: str | None = None,
    length: int | None = None,
) -> list[Step]:
    """The steps that put the new object in ``current``'s place, ending with its seal.

    [Delete ``current`` (only that segment)], create the target, append its
    bytes or merge the staging segment in, write its record (created, or
    appended at the length it has now and truncated there: it keeps only its
    last line), seal the target. ``length``: the object's (default: the
    staging segment's now).
    """
    if length is None:
        assert staging is not None
        length = store.info(staging).length
    steps: list[Step] = []
    if current is not None:
        steps.append(DeleteStep(target, segment_id=current.segment_id))
    steps.append(CreateStep(target))
    if data:
        steps.append(AppendStep(target, data))
    elif staging is not None:
        steps += [SealStep(staging), MergeStep(target, staging)]
    record = record_name(target)
    if record is not None:
        line = functools.partial(_record_line, stored, target, length)
        kept = info_or_none(store, record)
        if kept is None:
            steps += [CreateStep(record), AppendStep(record, line)]
        else:
            line_step = AppendStep(record, line, expected_offset=kept.length)
            steps += [line_step, TruncateStep(record, kept.length)]
    steps.append(SealStep(target))
    return steps


def _record_line(stored: Stored, target: str, length: int, info_of: Callable[[str], SegmentInfo]) -> bytes:
    """The record line of the object the composite creates: it names that segment's id."""
    return stored.to_json(info_of(target).segment_id, length)


def raced(err: SegstoreError, steps: list[Step], target: str) -> bool:
    """Whether a refused composite met another writer of ``target`` (or its record): judge again."""
    if err.step is None:
        return False
    step = steps[err.step]
    name = step.target if isinstance(step, MergeStep) else step.name
    return name in (target, record_name(target)) and not isinstance(step, MergeStep)


def delete_object(store: SegmentStore, name: str, *, if_match: str | None = None) -> None:
    """Delete the object and its record in one composite; a missing object is fine (S3 answers 204).

    With ``if_match``, only the object of that ETag (412 otherwise, 404 if there is none).
    The object's container may be served by another cluster member (a
    DeleteObjects request names keys of many containers): then the lookups
    and the composite go to that member (``anywhere``), one call each.
    """
    record = record_name(name)
    for _ in range(RACED_TRIES_MAX):
        current = info_or_none(store, name, anywhere=True)
        if if_match is not None:
            check_write_conditions(store, current, if_none_match=False, if_match=if_match)
        steps: list[Step] = [] if current is None else [DeleteStep(name, segment_id=current.segment_id)]
        if record is not None and info_or_none(store, record, anywhere=True) is not None:
            steps.append(DeleteStep(record))
        if not steps:
            return
        try:
            store.composite(steps, anywhere=True)
            return
        except SegmentNotFound as err:
            if not raced(err, steps, name):
                raise
    raise S3Error("SlowDown", f"other writers of {name!r} kept coming first; please retry")
