"""Multipart uploads as transactions (seed 004: commit = merge, abort = delete).

An upload is the segment ``#s3/uploads/<upload id>`` (in the target's
container) and a part log ``#s3/parts/<upload id>``: its first line names
the bucket and key (with the object's metadata and checksum algorithm),
every later line records one UploadPart ``{"part": n, "tx": txid, "etag":
md5, "size": bytes, "time": unix s[, "checksum": base64]}`` (a part sent
again is a new line; the last one wins). Each part's bytes go into a
transaction of the upload segment, invisible until committed.

CompleteMultipartUpload judges the write's conditions and the chosen parts,
then does everything in one composite operation (engine/container/composite.py):
each chosen part's transaction sealed and merged into the upload segment
in part-number order, the upload published as the object (``objects.publish``:
the old object replaced, the record written) with S3's ETag
``md5(md5(part 1) ... md5(part N))-N``, the completion recorded in
``#s3/completed/<upload id>`` (ETag, checksum, object segment id) and the
part log dropped. A crash leaves all of it or none of it: a retry either
finds the completion record and answers from it (for
``transaction_timeout_s``), or does the whole Complete. Two Completes of one
upload, or a Complete and an Abort, cannot both apply: the second finds the
upload's segments gone. The parts not chosen are aborted after, and the
engine's reaper takes any a crash leaves. AbortMultipartUpload deletes the
upload segment, which drops its transactions, and the part log.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from app.s3 import checksums, objects
from app.s3.errors import S3Error
from app.s3.metadata import Stored
from app.s3.names import s3_state_name
from engine import (
    AppendStep,
    CreateStep,
    DeleteStep,
    InvalidName,
    MergeStep,
    SealStep,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
    SegstoreError,
    Step,
    transaction_name,
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
    header = {"bucket": bucket, "key": key, "meta": meta, "checksum": algorithm}
    line = json.dumps(header, ensure_ascii=False).encode() + b"\n"
    parts = parts_name(upload_id)
    store.composite([CreateStep(upload), CreateStep(parts), AppendStep(parts, line)])
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


def _check_id(store: SegmentStore, upload_id: str, bucket: str, key: str) -> None:
    """NoSuchUpload for an id that is not an upload id, or not one of ``bucket``/``key``'s.

    Every upload's state lives in its object's container (``objects.colocated``),
    so an id whose state lives elsewhere belongs to another object: it is
    refused here, without a read that would reach a container another member
    serves (and answer 503 there).
    """
    if len(upload_id) != 32 or not all(c in "0123456789abcdef" for c in upload_id):
        raise _no_such_upload()
    if store.container_of(parts_name(upload_id)) != store.container_of(objects.object_name(bucket, key)):
        raise _no_such_upload()


def _check_header(store: SegmentStore, upload_id: str, bucket: str, key: str) -> dict:
    """The part log's first line if it names this object (one short read); NoSuchUpload otherwise."""
    _check_id(store, upload_id, bucket, key)
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
    _check_id(store, upload_id, bucket, key)
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
            objects.patiently(functools.partial(store.append_transaction, upload, txid, piece))
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
    checksum: Mapping[str, str] | None = None,
) -> Stored:
    """Merge the chosen parts in order and publish the object, all at once; returns what it keeps.

    ``checksum``: the object's checksum headers the client expects (S3's
    composite ``<base64>-N``); BadDigest when the parts give another.
    A Complete repeated after one succeeded answers as that one did, for
    ``transaction_timeout_s``, without looking at its parts or conditions
    again (as S3 answers the retry of a lost answer).
    """
    if not chosen:
        raise S3Error("MalformedXML", "You must specify at least one part")
    numbers = [c.number for c in chosen]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.")
    _check_id(store, upload_id, bucket, key)
    done = _completed(store, upload_id, bucket, key)
    if done is not None:
        return done
    records = _records(store, upload_id, bucket, key)
    known = _parts(records)
    _check_chosen(records[0], known, chosen)
    parts = [known[n] for n in numbers]
    stored = _stored(records[0], parts)
    _check_checksum(stored, checksum or {})
    target = objects.object_name(bucket, key)
    upload = upload_name(upload_id)
    before: list[Step] = []
    for part in parts:
        tx = transaction_name(upload, part.txid)
        before += [SealStep(tx), MergeStep(upload, tx)]
    record = functools.partial(_completion_line, bucket, key, stored, target)
    after: list[Step] = [CreateStep(completed_name(upload_id)), AppendStep(completed_name(upload_id), record),
             DeleteStep(parts_name(upload_id))]  # fmt: skip
    try:
        objects.publish(
            store, target, stored, staging=upload, length=sum(p.size for p in parts),
            if_none_match=if_none_match, if_match=if_match, before=before, after=after,
        )  # fmt: skip
    except (SegmentNotFound, SegmentExists, SegmentSealed) as err:
        done = _completed(store, upload_id, bucket, key)
        if done is not None:  # another Complete of it came first
            return done
        if err.step is not None and err.step < len(before) and objects.info_or_none(store, upload):
            raise _expired(parts[err.step // 2].number) from None
        raise _no_such_upload() from None
    chosen_txids = {part.txid for part in parts}
    for part in _every_part(records):
        if part.txid not in chosen_txids:
            with contextlib.suppress(SegstoreError):
                store.abort_transaction(upload, part.txid)
    return stored


def _completion_line(
    bucket: str, key: str, stored: Stored, target: str, info_of: Callable[[str], SegmentInfo]
) -> bytes:
    """The completion record: what the Complete answered, and the object it made (its segment id)."""
    record: dict[str, object] = {
        "bucket": bucket, "key": key, "etag": stored.etag, "checksum": stored.checksum,
    }  # fmt: skip
    record["id"] = info_of(target).segment_id
    return json.dumps(record, ensure_ascii=False).encode()


def _check_checksum(stored: Stored, sent: Mapping[str, str]) -> None:
    """The object's checksum a Complete names must be the one its parts give (S3's composite)."""
    for header, value in sent.items():
        computed = stored.checksum.get(header)
        if computed is None:
            algorithm = header.removeprefix(checksums.HEADER_PREFIX)
            raise S3Error(
                "InvalidRequest",
                f"the upload has no {algorithm} checksum: create it with x-amz-checksum-algorithm "
                f"{algorithm.upper()} and send that checksum with every part",
            )
        digest, _, count = computed.rpartition("-")
        if value.strip() not in (computed, digest):
            algorithm = header.removeprefix(checksums.HEADER_PREFIX).upper()
            raise S3Error(
                "BadDigest",
                f"The {algorithm} you specified did not match the calculated checksum "
                f"({computed}, the checksum of the {count} parts' checksums).",
            )


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
    """Drop the upload and its parts (a Complete running meanwhile either came first or finds them gone)."""
    _check_header(store, upload_id, bucket, key)
    objects.discard(store, upload_name(upload_id))
    objects.discard(store, parts_name(upload_id))
