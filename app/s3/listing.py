"""S3 listings: ListBuckets, ListObjects (v1 and v2), ListObjectVersions and ListParts.

Keys are listed in segment name order (UTF-8 code point order, as S3's
binary order of UTF-8 bytes). With a delimiter, the keys that share a prefix
up to it are rolled up into one common prefix; a marker (v1 ``marker``,
``key-marker``, or the key a v2 continuation token carries) equal to such a
prefix continues after every key under it, so the last key or common prefix
of a page is also where the next page starts.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from urllib.parse import quote_plus

from flask import Response, request

from app.s3 import multipart, objects, reading
from app.s3.errors import S3Error
from app.s3.subresources import OWNER_ID
from app.s3.xml import Node, document, iso8601
from engine import SegmentInfo, SegmentStore

LIST_KEYS_MAX = 1000
LIST_BUCKETS_MAX = 10000
OWNER: Node = ("Owner", [("ID", OWNER_ID), ("DisplayName", OWNER_ID)])
STANDARD: Node = ("StorageClass", "STANDARD")
_DIGITS = re.compile(r"[0-9]{1,19}")
_AFTER_ALL = "\U0010ffff"


def int_arg(name: str, default: int, maximum: int) -> int:
    """A non-negative integer query argument, capped at ``maximum``."""
    raw = request.args.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw):
        raise S3Error("InvalidArgument", f"{name} must be a non-negative integer")
    return min(int(raw), maximum)


def token(marker: str) -> str:
    return base64.urlsafe_b64encode(marker.encode("utf-8")).decode("ascii")


def untoken(value: str) -> str:
    try:
        return base64.urlsafe_b64decode(value.encode("ascii")).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect") from None


def _resume_after(prefix: str, delimiter: str, start: str) -> str:
    """The last key a page starting at marker ``start`` must skip: past a whole common prefix."""
    if delimiter and start.startswith(prefix):
        cut = start.find(delimiter, len(prefix))
        if cut >= 0 and cut + len(delimiter) == len(start):
            return start + _AFTER_ALL
    return start


def listing(
    store: SegmentStore, bucket: str, prefix: str, delimiter: str, start: str, max_keys: int
) -> tuple[list[SegmentInfo], list[str], str | None]:
    """Objects and common prefixes after the marker ``start``, at most ``max_keys`` in all.

    Returns them and the marker of the next page (None: nothing more): the
    last key or common prefix returned.
    """
    base = bucket + "/"
    contents: list[SegmentInfo] = []
    prefixes: list[str] = []
    resume = _resume_after(prefix, delimiter, start) if start else ""
    after = base + resume if resume else None
    last = ""
    while True:
        page, more = store.list(base + prefix, after=after, limit=max(1, min(max_keys + 1, LIST_KEYS_MAX)))
        restart = False
        for info in page:
            key = info.name[len(base) :]
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if len(contents) + len(prefixes) == max_keys:
                return contents, prefixes, last or None
            if cut >= 0:
                common = key[: cut + len(delimiter)]
                prefixes.append(common)
                last = common
                after = base + common + _AFTER_ALL
                restart = True
                break
            contents.append(info)
            last = key
            after = info.name
        if not restart and more is None:
            return contents, prefixes, None


def _encoder() -> tuple[bool, Callable[[str], str]]:
    kind = request.args.get("encoding-type")
    if kind not in (None, "url"):
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request")
    url = kind == "url"
    return url, (lambda text: quote_plus(text, safe="/")) if url else (lambda text: text)


def _object_fields(bucket: str, info: SegmentInfo, etag: str, enc: Callable[[str], str]) -> list:
    return [
        ("Key", enc(info.name[len(bucket) + 1 :])),
        ("LastModified", iso8601(info.last_modified)),
        ("ETag", f'"{etag}"'),
        ("Size", reading.object_size(info)),
    ]


def list_objects(store: SegmentStore, bucket: str) -> Response:
    """ListObjectsV2 (``list-type=2``), or the original ListObjects with ``marker``."""
    args = request.args
    v2 = args.get("list-type") == "2"
    prefix = args.get("prefix", "")
    delimiter = args.get("delimiter", "")
    max_keys = int_arg("max-keys", LIST_KEYS_MAX, LIST_KEYS_MAX)
    url, enc = _encoder()
    if v2:
        continuation = args.get("continuation-token")
        start = untoken(continuation) if continuation is not None else args.get("start-after", "")
    else:
        start = args.get("marker", "")
    contents, prefixes, next_marker = listing(store, bucket, prefix, delimiter, start, max_keys)
    with_owner = args.get("fetch-owner") == "true" if v2 else True
    owner = [OWNER] if with_owner else []
    etags = objects.etags_of(store, contents)
    items = [
        ("Contents", [*_object_fields(bucket, info, etags[info.name], enc), *owner, STANDARD])
        for info in contents
    ]
    common = [("CommonPrefixes", [("Prefix", enc(p))]) for p in prefixes]
    head = [
        ("Name", bucket),
        ("Prefix", enc(prefix)),
        ("Delimiter", enc(delimiter) if delimiter else None),
        ("MaxKeys", max_keys),
        ("EncodingType", "url" if url else None),
        ("IsTruncated", next_marker is not None),
    ]
    if v2:
        head += [
            ("KeyCount", len(contents) + len(prefixes)),
            ("ContinuationToken", args.get("continuation-token")),
            ("NextContinuationToken", token(next_marker) if next_marker else None),
            ("StartAfter", enc(args["start-after"]) if "start-after" in args else None),
        ]
    else:
        head += [
            ("Marker", enc(start)),
            ("NextMarker", enc(next_marker) if next_marker and delimiter else None),
        ]
    return document("ListBucketResult", [*head, *items, *common])


def list_object_versions(store: SegmentStore, bucket: str) -> Response:
    """ListObjectVersions of a bucket that never had versioning: each object once, version ``null``."""
    args = request.args
    prefix = args.get("prefix", "")
    delimiter = args.get("delimiter", "")
    max_keys = int_arg("max-keys", LIST_KEYS_MAX, LIST_KEYS_MAX)
    url, enc = _encoder()
    key_marker = args.get("key-marker", "")
    version_marker = args.get("version-id-marker")
    if version_marker is not None and not key_marker:
        raise S3Error("InvalidArgument", "A version-id marker cannot be specified without a key marker.")
    if version_marker not in (None, "", "null"):
        raise S3Error("InvalidArgument", "Invalid version id specified")
    contents, prefixes, next_marker = listing(store, bucket, prefix, delimiter, key_marker, max_keys)
    etags = objects.etags_of(store, contents)
    versions = [
        (
            "Version",
            [
                *_object_fields(bucket, info, etags[info.name], enc)[:1],
                ("VersionId", "null"),
                ("IsLatest", True),
                *_object_fields(bucket, info, etags[info.name], enc)[1:],
                ("StorageClass", "STANDARD"),
                OWNER,
            ],
        )
        for info in contents
    ]
    next_is_key = next_marker is not None and not next_marker.endswith(delimiter or "\0")
    head = [
        ("Name", bucket),
        ("Prefix", enc(prefix)),
        ("KeyMarker", enc(key_marker)),
        ("VersionIdMarker", version_marker or ""),
        ("NextKeyMarker", enc(next_marker) if next_marker else None),
        ("NextVersionIdMarker", "null" if next_is_key else None),
        ("MaxKeys", max_keys),
        ("Delimiter", enc(delimiter) if delimiter else None),
        ("EncodingType", "url" if url else None),
        ("IsTruncated", next_marker is not None),
    ]
    common = [("CommonPrefixes", [("Prefix", enc(p))]) for p in prefixes]
    return document("ListVersionsResult", [*head, *versions, *common])


def list_buckets(store: SegmentStore, visible: Callable[[str], bool]) -> Response:
    """ListBuckets: the buckets ``visible`` admits, with ``prefix``, ``max-buckets`` and paging.

    Every bucket is in ``objects.REGION``: a ``bucket-region`` naming another lists none.
    """
    args = request.args
    region = args.get("bucket-region", objects.REGION) or objects.REGION
    prefix = args.get("prefix", "")
    max_buckets = int_arg("max-buckets", LIST_BUCKETS_MAX, LIST_BUCKETS_MAX)
    if "max-buckets" in args and max_buckets < 1:
        raise S3Error("InvalidArgument", "max-buckets must be between 1 and 10000")
    continuation = args.get("continuation-token")
    marker_base = objects.bucket_marker("")
    after = marker_base + untoken(continuation) if continuation else None
    buckets: list[Node] = []
    names: list[str] = []
    next_token = None
    found = store.scan(marker_base + prefix, after=after) if region == objects.REGION else iter(())
    for info in found:
        name = info.name[len(marker_base) :]
        if not visible(name):
            continue
        if len(names) == max_buckets:
            next_token = token(names[-1])
            break
        names.append(name)
        created = iso8601(info.created)
        buckets.append(("Bucket", [("Name", name), ("CreationDate", created), ("BucketRegion", region)]))
    return document(
        "ListAllMyBucketsResult",
        [
            OWNER,
            ("Buckets", buckets),
            ("ContinuationToken", next_token),
            ("Prefix", prefix if "prefix" in args else None),
        ],
    )


def list_parts(store: SegmentStore, bucket: str, key: str) -> Response:
    """ListParts: the parts of an upload in part number order, ``part-number-marker`` paging.

    An upload with a checksum algorithm lists each part's checksum, as S3 does.
    """
    upload_id = request.args["uploadId"]
    marker = int_arg("part-number-marker", 0, multipart.PART_NUMBER_MAX)
    max_parts = int_arg("max-parts", 1000, 1000)
    algorithm, by_number = multipart.parts(store, upload_id, bucket, key)
    found = sorted(by_number.values(), key=lambda p: p.number)
    after = [p for p in found if p.number > marker]
    page = after[:max_parts]
    truncated = len(after) > len(page)

    def part(p: multipart.Part) -> Node:
        checksum = [("Checksum" + algorithm.upper(), p.checksum)] if algorithm else []
        return "Part", [
            ("PartNumber", p.number),
            ("LastModified", iso8601(p.time)),
            ("ETag", f'"{p.etag}"'),
            ("Size", p.size),
            *checksum,
        ]

    return document(
        "ListPartsResult",
        [
            ("Bucket", bucket),
            ("Key", key),
            ("UploadId", upload_id),
            ("PartNumberMarker", marker),
            ("NextPartNumberMarker", page[-1].number if page else marker),
            ("MaxParts", max_parts),
            ("IsTruncated", truncated),
            *(part(p) for p in page),
            ("ChecksumAlgorithm", algorithm.upper() if algorithm else None),
            ("ChecksumType", "COMPOSITE" if algorithm else None),
        ],
    )
