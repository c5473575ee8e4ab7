"""Multipart uploads as transactions (seed 004: commit = merge, abort = delete).

An upload is the segment ``.s3/uploads/<upload id>`` (in the target's
container) and a part log ``.s3/parts/<upload id>``: its first line names
the bucket and key, every later line records one UploadPart
``{"part": n, "tx": txid, "etag": md5, "size": bytes, "time": unix s}`` (a
part sent again is a new line; the last one wins). Each part's bytes go
into a transaction of the upload segment, invisible until committed.
CompleteMultipartUpload commits the chosen transactions in part-number
order (each commit merges one part at the end of the upload segment), aborts
the parts not chosen, and publishes the upload segment as the object (see
``objects.publish``) with S3's ETag ``md5(md5(part 1) ... md5(part N))-N``.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.s3 import checksums, objects
from app.s3.errors import S3Error
from app.s3.metadata import Stored
from engine import InvalidName, SegmentExists, SegmentNotFound, SegmentStore, SegstoreError

PART_NUMBER_MAX = 10000
# The checksums S3 combines into a COMPOSITE checksum of a multipart object (CRC64NVME is FULL_OBJECT only).
COMPOSITE_ALGORITHMS = ("crc32", "crc32c", "sha1", "sha256")
# As on S3: every part but the last is at least 5 MiB.
PART_MIN_BYTES = 5 * 1024 * 1024
# The part log's first line: bucket and key, JSON without ASCII escapes (a key is at most 1 KiB).
_HEADER_MAX_BYTES = 8 * 1024


@dataclass(frozen=True)
class Part:
    number: int
    txid: uuid.UUID
    etag: str
    size: int
    time: float
    checksum: str | None = None


def upload_name(upload_id: str) -> str:
    return f"{objects.META}/uploads/{upload_id}"


def parts_name(upload_id: str) -> str:
    return f"{objects.META}/parts/{upload_id}"


def completed_name(upload_id: str) -> str:
    return f"{objects.META}/completed/{upload_id}"


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
    """Forget completed uploads older than ``transaction_timeout_s`` (a page of them per call)."""
    horizon = time.time() - store.settings.transaction_timeout_s
    page, _ = store.list(completed_name(""), limit=100)
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


def parts(store: SegmentStore, upload_id: str, bucket: str, key: str) -> dict[int, Part]:
    """The upload's parts by number (the last upload of each number)."""
    return _parts(_records(store, upload_id, bucket, key))


def _parts(records: list[dict]) -> dict[int, Part]:
    found: dict[int, Part] = {}
    for r in records[1:]:
        txid = uuid.UUID(r["tx"])
        found[r["part"]] = Part(r["part"], txid, r["etag"], r["size"], r["time"], r.get("checksum"))
    return found


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
    except SegmentNotFound:
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

    A repeat of a Complete that succeeded (its answer was lost) answers the
    same as the first time, for ``transaction_timeout_s``. The conditions
    (``If-None-Match: *``, ``If-Match``) are checked before any part is
    committed, and again when the object is published.
    """
    if not chosen:
        raise S3Error("MalformedXML", "You must specify at least one part")
    numbers = [c.number for c in chosen]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.")
    try:
        records = _records(store, upload_id, bucket, key)
    except S3Error:
        done = _completed(store, upload_id, bucket, key)
        if done is None:
            raise
        return done
    header, known = records[0], _parts(records)
    algorithm = header.get("checksum")
    for c in chosen:
        part = known.get(c.number)
        sent = c.checksums.get(algorithm) if algorithm else None
        if part is None or part.etag != c.etag.strip('"') or (sent is not None and sent != part.checksum):
            raise S3Error(
                "InvalidPart", f"One or more of the specified parts could not be found: part {c.number}"
            )
    for number in numbers[:-1]:
        if known[number].size < PART_MIN_BYTES:
            raise S3Error(
                "EntityTooSmall",
                f"Your proposed upload is smaller than the minimum allowed size: part {number} "
                f"is {known[number].size} bytes; every part but the last needs {PART_MIN_BYTES}",
            )
    target = objects.object_name(bucket, key)
    if if_none_match or if_match is not None:
        try:
            current = store.info(target)
        except SegmentNotFound:
            current = None
        objects.check_write_conditions(store, current, if_none_match=if_none_match, if_match=if_match)
    upload = upload_name(upload_id)
    for number in numbers:
        try:
            store.commit_transaction(upload, known[number].txid)
        except SegmentNotFound:
            raise S3Error(
                "InvalidPart", f"part {number} expired (its transaction idled past transaction_timeout_s)"
            ) from None
    chosen_tx = {known[n].txid for n in numbers}
    for record in records[1:]:
        txid = uuid.UUID(record["tx"])
        if txid not in chosen_tx:
            with contextlib.suppress(SegstoreError):
                store.abort_transaction(upload, txid)
    digest = hashlib.md5(b"".join(bytes.fromhex(known[n].etag) for n in numbers))
    stored = Stored(
        f"{digest.hexdigest()}-{len(numbers)}",
        header.get("meta", {}),
        _composite(algorithm, [known[n] for n in numbers]),
        tuple(known[n].size for n in numbers),
    )
    objects.publish(store, target, upload, stored, if_none_match=if_none_match, if_match=if_match)
    done = {"bucket": bucket, "key": key, "etag": stored.etag, "checksum": stored.checksum}
    with contextlib.suppress(SegmentExists):
        store.create(completed_name(upload_id))
    store.append(completed_name(upload_id), json.dumps(done, ensure_ascii=False).encode())
    objects.discard(store, parts_name(upload_id))
    return stored


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
    if result.info.created < time.time() - store.settings.transaction_timeout_s:
        return None
    done = json.loads(result.data)
    if done["bucket"] != bucket or done["key"] != key:
        return None
    return Stored(done["etag"], checksum=done["checksum"])


def abort(store: SegmentStore, upload_id: str, bucket: str, key: str) -> None:
    _check_header(store, upload_id, bucket, key)
    objects.discard(store, upload_name(upload_id))
    objects.discard(store, parts_name(upload_id))
