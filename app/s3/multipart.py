"""Multipart uploads as transactions (seed 004: commit = merge, abort = delete).

An upload is the segment ``#s3/uploads/<upload id>`` (in the target's
container) and a part log ``#s3/parts/<upload id>``: its first line names
the bucket and key (with the object's metadata and checksum algorithm),
every later line records one UploadPart ``{"part": n, "tx": txid, "etag":
md5, "size": bytes, "time": unix s[, "checksum": base64]}`` (a part sent
again is a new line; the last one wins). Each part's bytes go into a
transaction of the upload segment, invisible until committed.

CompleteMultipartUpload, holding a lock of the upload, then of the key:

1. judges the write's conditions against the object now (a 412 leaves the
   upload as it was, and it can be completed again);
2. appends its decision ``{"complete": [transaction ids]}`` to the part log:
   from here on the upload is completing, and a retry finishes that decision
   whatever parts it lists;
3. commits the chosen transactions in part-number order (each commit merges
   one part at the end of the upload segment; a commit repeated answers as
   the first did), aborts the others and seals the upload segment;
4. publishes it as the object (``objects.replace``) with S3's ETag
   ``md5(md5(part 1) ... md5(part N))-N``;
5. records the completion in ``#s3/completed/<upload id>`` (ETag, checksum,
   object segment id) and drops the part log.

A crash anywhere leaves what a retry of the Complete finishes: before 2,
nothing happened; between 2 and 4, the retry resumes the decision (an object
left empty by a crash inside 4 is known as this upload's by the ETag its
record names); after 4, the upload segment is gone and the object's record
names this upload, so the retry seals the object, records and answers. After
5, a retry answers from the completion record, for ``transaction_timeout_s``.
AbortMultipartUpload deletes the upload segment, which drops its
transactions, and the part log.

Transactions idle longer than ``transaction_timeout_s`` (600 s by default)
are aborted by the engine: an upload must complete within that time of its
last UploadPart, or raise the setting.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.s3 import checksums, objects
from app.s3.errors import S3Error
from app.s3.metadata import Stored
from engine import (
    InvalidName,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
    SegstoreError,
    s3_state_name,
)

PART_NUMBER_MAX = 10000
# The checksums S3 combines into a COMPOSITE checksum of a multipart object (CRC64NVME is FULL_OBJECT only).
COMPOSITE_ALGORITHMS = ("crc32", "crc32c", "sha1", "sha256")
# As on S3: every part but the last is at least 5 MiB.
PART_MIN_BYTES = 5 * 1024 * 1024
# The part log's first line: bucket and key, JSON without ASCII escapes (a key is at most 1 KiB).
_HEADER_MAX_BYTES = 8 * 1024
# Completion records looked at per CreateMultipartUpload, and where the next look starts, per store.
_PRUNE_PAGE = 100
_prune_cursor: weakref.WeakKeyDictionary[SegmentStore, str] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Part:
    number: int
    txid: uuid.UUID
    etag: str
    size: int
    time: float
    checksum: str | None = None


def upload_name(upload_id: str) -> str:
    return s3_state_name("uploads", upload_id)


def parts_name(upload_id: str) -> str:
    return s3_state_name("parts", upload_id)


def completed_name(upload_id: str) -> str:
    return s3_state_name("completed", upload_id)


def create(store: SegmentStore, bucket: str, key: str, meta: dict[str, str], algorithm: str | None) -> str:
    """Start an upload of ``bucket``/``key`` with the object's metadata; returns its upload id.

    ``algorithm`` (``crc32``, ...): every part carries that checksum, and the
    object gets S3's composite checksum of them.
    """
    if algorithm is not None and algorithm not in COMPOSITE_ALGORITHMS:
        raise S3Error("NotImplemented", f"multipart checksums of type FULL_OBJECT or {algorithm!r}")
    _prune_completed(store)
    target = objects.object_name(bucket, key)
    upload = objects.colocated(store, "uploads", target)
    upload_id = upload.rsplit("/", 1)[1]
    store.create(upload)
    store.create(parts_name(upload_id))
    header = {"bucket": bucket, "key": key, "meta": meta, "checksum": algorithm}
    store.append(parts_name(upload_id), json.dumps(header, ensure_ascii=False).encode() + b"\n")
    return upload_id


def _prune_completed(store: SegmentStore) -> None:
    """Forget completed uploads older than ``transaction_timeout_s``.

    A page of records per call, each call going on where the last one
    stopped (and starting over past the end), so every record is seen in turn
    however many there are. A cluster node prunes the records of the
    containers it serves (each node its own).
    """
    horizon = time.time() - store.settings.transaction_timeout_s
    cursor = _prune_cursor.get(store)
    page, after = store.list(completed_name(""), after=cursor, limit=_PRUNE_PAGE, here=True)
    if after is None:
        _prune_cursor.pop(store, None)
    else:
        _prune_cursor[store] = after
    for info in page:
        if info.created < horizon:
            objects.discard(store, info.name)


def _no_such_upload() -> S3Error:
    return S3Error("NoSuchUpload", "The specified upload does not exist.")


def _check_id(upload_id: str) -> None:
    if len(upload_id) != 32 or not all(c in "0123456789abcdef" for c in upload_id):
        raise _no_such_upload()


def _check_header(store: SegmentStore, upload_id: str, bucket: str, key: str) -> dict:
    """The part log's first line if it names this object (one short read); NoSuchUpload otherwise."""
    _check_id(upload_id)
    try:
        first = store.read(parts_name(upload_id), 0, _HEADER_MAX_BYTES).data.split(b"\n", 1)[0]
    except SegmentNotFound:
        raise _no_such_upload() from None
    return _check_names(json.loads(first), bucket, key)


def _check_names(header: dict, bucket: str, key: str) -> dict:
    """The part log's header if it is about ``bucket``/``key``; NoSuchUpload otherwise."""
    if header.get("bucket") != bucket or header.get("key") != key:
        raise _no_such_upload()
    return header


def _records(store: SegmentStore, upload_id: str, bucket: str, key: str) -> list[dict]:
    """The part log's header, then its records; NoSuchUpload unless it is this object's upload."""
    _check_id(upload_id)
    data = bytearray()
    offset = None
    try:
        while True:
            result = store.read(parts_name(upload_id), offset)
            data += result.data
            offset = result.next_offset
            if offset >= result.info.length:
                break
    except SegmentNotFound:
        raise _no_such_upload() from None
    lines = [json.loads(line) for line in bytes(data).splitlines() if line]
    if not lines:
        raise _no_such_upload()
    _check_names(lines[0], bucket, key)
    return lines


def parts(store: SegmentStore, upload_id: str, bucket: str, key: str) -> tuple[str | None, dict[int, Part]]:
    """The upload's checksum algorithm (None without one) and parts by number (the last of each)."""
    records = _records(store, upload_id, bucket, key)
    return records[0].get("checksum"), _parts(records)


def _parts(records: list[dict]) -> dict[int, Part]:
    return {part.number: part for part in _every_part(records)}


def _every_part(records: list[dict]) -> list[Part]:
    """Every UploadPart the log records, in order (a number sent again appears again)."""
    return [
        Part(r["part"], uuid.UUID(r["tx"]), r["etag"], r["size"], r["time"], r.get("checksum"))
        for r in records[1:]
        if "part" in r
    ]


def _decision(records: list[dict]) -> list[Part] | None:
    """The parts a Complete decided on (step 2), in order; None if none did."""
    decided = [r["complete"] for r in records[1:] if "complete" in r]
    assert len(decided) <= 1, decided
    if not decided:
        return None
    by_tx = {str(part.txid): part for part in _every_part(records)}
    return [by_tx[txid] for txid in decided[0]]


def upload_part(
    store: SegmentStore,
    upload_id: str,
    bucket: str,
    key: str,
    number: int,
    pieces: Iterable[bytes],
    finish: Callable[[], tuple[str, dict[str, str]]],
) -> str:
    """Write one part into a new transaction and log it; returns its ETag (the MD5 of its bytes).

    ``finish()`` checks the body (checksums, length) once every piece is read
    and returns its MD5 hex and checked checksum headers; a body that fails
    it leaves nothing behind. An upload created with a checksum algorithm
    takes only parts that carry that checksum.
    """
    if not 1 <= number <= PART_NUMBER_MAX:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {PART_NUMBER_MAX}")
    algorithm = _check_header(store, upload_id, bucket, key).get("checksum")
    upload = upload_name(upload_id)
    try:
        txid = store.open_transaction(upload)
    except (SegmentNotFound, SegmentSealed):  # gone, or sealed by a Complete
        raise _no_such_upload() from None
    size = 0
    try:
        for piece in pieces:
            objects.patiently(functools.partial(store.append_transaction, upload, txid), piece)
            size += len(piece)
        etag, sent = finish()
        checksum = sent.get(checksums.HEADER_PREFIX + algorithm) if algorithm else None
        if algorithm and checksum is None:
            raise S3Error(
                "InvalidRequest",
                f"The upload was created using a {algorithm} checksum. The part upload request "
                "must include a checksum of that algorithm.",
            )
    except BaseException:
        with contextlib.suppress(SegstoreError):
            store.abort_transaction(upload, txid)
        raise
    record = {"part": number, "tx": str(txid), "etag": etag, "size": size, "time": time.time()}
    if checksum is not None:
        record["checksum"] = checksum
    store.append(parts_name(upload_id), json.dumps(record).encode() + b"\n")
    return etag


@dataclass(frozen=True)
class Chosen:
    """One part of a CompleteMultipartUpload request: its number, ETag and checksums sent."""

    number: int
    etag: str
    checksums: dict[str, str]


def complete(
    store: SegmentStore,
    upload_id: str,
    bucket: str,
    key: str,
    chosen: list[Chosen],
    *,
    if_none_match: bool = False,
    if_match: str | None = None,
) -> Stored:
    """Merge the chosen parts in order and publish the object; returns what the object keeps.

    The steps, and what a retry finds after a crash at any of them, are in
    the module docstring. A Complete repeated after one succeeded answers as
    that one did, for ``transaction_timeout_s``, without looking at its parts
    or conditions again (as S3 answers the retry of a lost answer).
    """
    if not chosen:
        raise S3Error("MalformedXML", "You must specify at least one part")
    numbers = [c.number for c in chosen]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.")
    _check_id(upload_id)
    with objects.key_lock(upload_name(upload_id)):
        done = _completed(store, upload_id, bucket, key)
        if done is not None:
            objects.discard(store, parts_name(upload_id))  # left by a crash after step 5's record
            return done
        records = _records(store, upload_id, bucket, key)
        decided = _decision(records)
        if decided is None:
            known = _parts(records)
            _check_chosen(records[0], known, chosen)
            parts = [known[n] for n in numbers]
        else:
            parts = decided
        stored = _stored(records[0], parts)
        target = objects.object_name(bucket, key)
        with objects.key_lock(target):
            info = _publish(
                store, upload_id, target, stored, records, parts, decided is not None,
                if_none_match=if_none_match, if_match=if_match,
            )  # fmt: skip
        record = {"bucket": bucket, "key": key, "etag": stored.etag, "checksum": stored.checksum}
        record["id"] = info.segment_id  # the object this upload made
        with contextlib.suppress(SegmentExists):
            store.create(completed_name(upload_id))
        store.append(completed_name(upload_id), json.dumps(record, ensure_ascii=False).encode())
        objects.discard(store, parts_name(upload_id))
        return stored


def _check_chosen(header: dict, known: dict[int, Part], chosen: list[Chosen]) -> None:
    """The parts a Complete lists exist with these ETags (and checksums); all but the last >= 5 MiB."""
    algorithm = header.get("checksum")
    for c in chosen:
        part = known.get(c.number)
        if part is None or part.etag != c.etag.strip('"'):
            raise S3Error(
                "InvalidPart", f"One or more of the specified parts could not be found: part {c.number}"
            )
        if algorithm is None:
            continue
        sent = c.checksums.get(algorithm)
        if sent is None:
            raise S3Error(
                "InvalidRequest",
                f"The upload was created using a {algorithm} checksum. The complete request must "
                f"include the checksum for each part. It was missing for part {c.number} in the request.",
            )
        if sent != part.checksum:
            raise S3Error(
                "InvalidPart", f"One or more of the specified parts could not be found: part {c.number}"
            )
    for c in chosen[:-1]:
        if known[c.number].size < PART_MIN_BYTES:
            raise S3Error(
                "EntityTooSmall",
                f"Your proposed upload is smaller than the minimum allowed size: part {c.number} "
                f"is {known[c.number].size} bytes; every part but the last needs {PART_MIN_BYTES}",
            )


def _stored(header: dict, chosen: list[Part]) -> Stored:
    """What the object made of ``chosen`` keeps: S3's multipart ETag, metadata, composite checksum."""
    digest = hashlib.md5(b"".join(bytes.fromhex(p.etag) for p in chosen))
    algorithm = header.get("checksum")
    return Stored(
        f"{digest.hexdigest()}-{len(chosen)}",
        header.get("meta", {}),
        _composite(algorithm, chosen),
        tuple(p.size for p in chosen),
        tuple(p.checksum for p in chosen if p.checksum is not None) if algorithm else (),
    )


def _publish(
    store: SegmentStore,
    upload_id: str,
    target: str,
    stored: Stored,
    records: list[dict],
    parts: list[Part],
    decided: bool,
    *,
    if_none_match: bool,
    if_match: str | None,
) -> SegmentInfo:
    """Steps 1 to 4 under the key's lock, resuming the decision a crash interrupted (``decided``)."""
    upload = upload_name(upload_id)
    current = objects.info_or_none(store, target)
    # An object whose record names this upload's ETag is this completion's own, left by a crash.
    ours = decided and current is not None and objects.recorded_etag(store, current) == stored.etag
    staged = objects.info_or_none(store, upload)
    if staged is None:  # merged into the object already (step 4 done), or aborted
        if current is None or not ours:
            raise _no_such_upload()
        return store.seal(target)
    assert decided or not staged.sealed, "an upload segment is sealed only after its decision"
    if not ours:
        objects.check_write_conditions(store, current, if_none_match=if_none_match, if_match=if_match)
    if not decided:
        for part in parts:
            _require_open(store, upload, part)
        decision = {"complete": [str(part.txid) for part in parts]}
        store.append(parts_name(upload_id), json.dumps(decision).encode() + b"\n")
    if not staged.sealed:
        for part in parts:
            try:
                store.commit_transaction(upload, part.txid)
            except SegmentNotFound:
                raise _expired(part.number) from None
        chosen = {part.txid for part in parts}
        for part in _every_part(records):
            if part.txid not in chosen:
                with contextlib.suppress(SegstoreError):
                    store.abort_transaction(upload, part.txid)
        store.seal(upload)
    return objects.replace(store, target, upload, stored, current)


def _require_open(store: SegmentStore, upload: str, part: Part) -> None:
    """InvalidPart if the part's transaction is gone (idle past ``transaction_timeout_s``)."""
    try:
        store.transaction_info(upload, part.txid)
    except SegmentNotFound:
        raise _expired(part.number) from None


def _expired(number: int) -> S3Error:
    return S3Error("InvalidPart", f"part {number} expired (its transaction idled past transaction_timeout_s)")


def _composite(algorithm: str | None, chosen: list[Part]) -> dict[str, str]:
    """S3's COMPOSITE checksum: the checksum of the parts' binary checksums, then ``-N``."""
    if algorithm is None:
        return {}
    combined = checksums.new(algorithm)
    assert combined is not None, algorithm
    for part in chosen:
        assert part.checksum is not None, part
        combined.update(base64.b64decode(part.checksum))
    value = f"{checksums.encode(combined)}-{len(chosen)}"
    return {checksums.HEADER_PREFIX + algorithm: value, "x-amz-checksum-type": "COMPOSITE"}


def _completed(store: SegmentStore, upload_id: str, bucket: str, key: str) -> Stored | None:
    """What a Complete of ``upload_id`` answered, if it succeeded within ``transaction_timeout_s``."""
    try:
        result = store.read(completed_name(upload_id), 0, _HEADER_MAX_BYTES)
    except (SegmentNotFound, InvalidName):
        return None
    if not result.data or result.info.created < time.time() - store.settings.transaction_timeout_s:
        return None  # not written yet (a crash between its create and its append), or too old
    done = json.loads(result.data)
    if done["bucket"] != bucket or done["key"] != key:
        return None
    return Stored(done["etag"], checksum=done["checksum"])


def abort(store: SegmentStore, upload_id: str, bucket: str, key: str) -> None:
    """Drop the upload and its parts (never while a Complete of it runs: they share a lock)."""
    _check_header(store, upload_id, bucket, key)
    with objects.key_lock(upload_name(upload_id)):
        objects.discard(store, upload_name(upload_id))
        objects.discard(store, parts_name(upload_id))
