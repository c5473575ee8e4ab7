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

import contextlib
import functools
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.s3 import objects
from app.s3.errors import S3Error
from engine import SegmentNotFound, SegmentStore, SegstoreError

PART_NUMBER_MAX = 10000
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


def upload_name(upload_id: str) -> str:
    return f"{objects.META}/uploads/{upload_id}"


def parts_name(upload_id: str) -> str:
    return f"{objects.META}/parts/{upload_id}"


def create(store: SegmentStore, bucket: str, key: str) -> str:
    """Start an upload of ``bucket``/``key``; returns its upload id."""
    target = objects.object_name(bucket, key)
    upload = objects.colocated(store, "uploads", target)
    upload_id = upload.rsplit("/", 1)[1]
    store.create(upload)
    store.create(parts_name(upload_id))
    header = json.dumps({"bucket": bucket, "key": key}, ensure_ascii=False).encode()
    store.append(parts_name(upload_id), header + b"\n")
    return upload_id


def _no_such_upload() -> S3Error:
    return S3Error("NoSuchUpload", "The specified upload does not exist.")


def _check_id(upload_id: str) -> None:
    if len(upload_id) != 32 or not all(c in "0123456789abcdef" for c in upload_id):
        raise _no_such_upload()


def _check_header(store: SegmentStore, upload_id: str, bucket: str, key: str) -> None:
    """NoSuchUpload unless the part log's first line names this object (one short read)."""
    _check_id(upload_id)
    try:
        first = store.read(parts_name(upload_id), 0, _HEADER_MAX_BYTES).data.split(b"\n", 1)[0]
    except SegmentNotFound:
        raise _no_such_upload() from None
    if json.loads(first) != {"bucket": bucket, "key": key}:
        raise _no_such_upload()


def _records(store: SegmentStore, upload_id: str, bucket: str, key: str) -> list[dict]:
    """The part log's records after its header; NoSuchUpload unless it is this object's upload."""
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
    if not lines or lines[0] != {"bucket": bucket, "key": key}:
        raise _no_such_upload()
    return lines[1:]


def parts(store: SegmentStore, upload_id: str, bucket: str, key: str) -> dict[int, Part]:
    """The upload's parts by number (the last upload of each number)."""
    found: dict[int, Part] = {}
    for r in _records(store, upload_id, bucket, key):
        found[r["part"]] = Part(r["part"], uuid.UUID(r["tx"]), r["etag"], r["size"], r["time"])
    return found


def upload_part(
    store: SegmentStore,
    upload_id: str,
    bucket: str,
    key: str,
    number: int,
    pieces: Iterable[bytes],
    finish: Callable[[], str],
) -> str:
    """Write one part into a new transaction and log it; returns its ETag (the MD5 of its bytes).

    ``finish()`` checks the body (checksums, length) and returns its MD5 hex
    once every piece is read; a body that fails it leaves nothing behind.
    """
    if not 1 <= number <= PART_NUMBER_MAX:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {PART_NUMBER_MAX}")
    _check_header(store, upload_id, bucket, key)
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
        etag = finish()
    except BaseException:
        with contextlib.suppress(SegstoreError):
            store.abort_transaction(upload, txid)
        raise
    record = {"part": number, "tx": str(txid), "etag": etag, "size": size, "time": time.time()}
    store.append(parts_name(upload_id), json.dumps(record).encode() + b"\n")
    return etag


def complete(
    store: SegmentStore, upload_id: str, bucket: str, key: str, chosen: list[tuple[int, str]]
) -> str:
    """Merge the chosen parts in order and publish the object; returns its multipart ETag."""
    if not chosen:
        raise S3Error("MalformedXML", "You must specify at least one part")
    numbers = [n for n, _ in chosen]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.")
    known = parts(store, upload_id, bucket, key)
    for number, etag in chosen:
        part = known.get(number)
        if part is None or part.etag != etag.strip('"'):
            raise S3Error(
                "InvalidPart", f"One or more of the specified parts could not be found: part {number}"
            )
    for number, _ in chosen[:-1]:
        if known[number].size < PART_MIN_BYTES:
            raise S3Error(
                "EntityTooSmall",
                f"Your proposed upload is smaller than the minimum allowed size: part {number} "
                f"is {known[number].size} bytes; every part but the last needs {PART_MIN_BYTES}",
            )
    upload = upload_name(upload_id)
    for number, _ in chosen:
        try:
            store.commit_transaction(upload, known[number].txid)
        except SegmentNotFound:
            raise S3Error(
                "InvalidPart", f"part {number} expired (its transaction idled past transaction_timeout_s)"
            ) from None
    chosen_tx = {known[n].txid for n in numbers}
    for record in _records(store, upload_id, bucket, key):
        txid = uuid.UUID(record["tx"])
        if txid not in chosen_tx:
            with contextlib.suppress(SegstoreError):
                store.abort_transaction(upload, txid)
    digest = hashlib.md5(b"".join(bytes.fromhex(known[n].etag) for n in numbers))
    etag = f"{digest.hexdigest()}-{len(numbers)}"
    objects.publish(store, objects.object_name(bucket, key), upload, etag)
    objects.discard(store, parts_name(upload_id))
    return etag


def abort(store: SegmentStore, upload_id: str, bucket: str, key: str) -> None:
    _check_header(store, upload_id, bucket, key)
    objects.discard(store, upload_name(upload_id))
    objects.discard(store, parts_name(upload_id))
