"""The S3 routes: path-style at the root, one view per level (service, bucket, object).

Each view checks the request (Signature V4, then the grants, through
``app.auth``) and dispatches on method and query to one operation; the
operations compose engine calls through ``objects`` and ``multipart``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from urllib.parse import unquote

from flask import Blueprint, Response, current_app, request
from werkzeug.http import http_date, parse_date
from werkzeug.routing import BaseConverter

from app import auth, ops
from app.s3 import errors, listing, multipart, objects, sigv4, subresources
from app.s3.chunked import Body
from app.s3.errors import S3Error
from app.s3.xml import document, iso8601, parse
from engine import (
    ConditionalCheckFailed,
    SegmentExists,
    SegmentInfo,
    SegmentNotFound,
    SegmentSealed,
    SegmentStore,
    SegstoreError,
)

bp = Blueprint("s3", __name__)
METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE"]
XML_BODY_MAX_BYTES = 2 * 1024 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_DIGITS = re.compile(r"[0-9]{1,19}")


class BucketConverter(BaseConverter):
    """One path part that is not a reserved name: ``/v1/...``, ``/metrics`` never reach S3 views,
    so werkzeug answers them (404, or 405 beside a native route) as the native API does."""

    regex = r"(?!(?:v1|healthz|readyz|metrics)$)[^/]+"
    part_isolating = True


class KeyConverter(BaseConverter):
    """Everything after the bucket: slashes, spaces, anything (the key validator judges it)."""

    regex = r"[\s\S]*"
    part_isolating = False


bp.record_once(
    lambda state: state.app.url_map.converters.update(s3bucket=BucketConverter, s3key=KeyConverter)
)
bp.register_error_handler(S3Error, errors.render)
bp.register_error_handler(SegstoreError, errors.render_engine_error)
bp.register_error_handler(Exception, errors.render_unexpected)


def _store() -> SegmentStore:
    return current_app.extensions["segstore"]


def _verify() -> sigv4.Verdict:
    return sigv4.verify(request, auth.config())


def _require(verdict: sigv4.Verdict, access: auth.Access, name: str) -> None:
    try:
        auth.require(verdict.principal, access, name)
    except auth.Forbidden as err:
        raise S3Error("AccessDenied", err.detail) from None


def _xml_body(verdict: sigv4.Verdict) -> bytes:
    body = Body(request, verdict.signing)
    data = body.read_all(XML_BODY_MAX_BYTES)
    body.finish()
    return data


# ------------------------------------------------------------------ service
@bp.route("/", methods=METHODS)
def service() -> Response:
    """ListBuckets: the buckets whose names the caller has any grant under."""
    ops.set_route("/")
    verdict = _verify()
    subresources.operation("service", request.method, request.args, request.headers)
    return listing.list_buckets(_store(), lambda bucket: verdict.principal.touches(bucket + "/"))


# ------------------------------------------------------------------- bucket
@bp.route("/<s3bucket:bucket>", methods=METHODS)
@bp.route("/<s3bucket:bucket>/", methods=METHODS)
def bucket_view(bucket: str) -> Response:
    ops.set_route("/{bucket}")
    verdict = _verify()
    op = subresources.operation("bucket", request.method, request.args, request.headers)
    store = _store()
    if op == "CreateBucket":
        _require(verdict, auth.Access.ADMIN, bucket + "/")
        return _create_bucket(store, bucket)
    if op == "DeleteBucket":
        _require(verdict, auth.Access.ADMIN, bucket + "/")
        return _delete_bucket(store, bucket)
    if not verdict.principal.touches(bucket + "/"):
        raise S3Error("AccessDenied", "Access Denied")
    objects.require_bucket(store, bucket)
    if op == "HeadBucket":
        return Response(status=200, headers={"x-amz-bucket-region": objects.REGION})
    if op == "GetBucketLocation":
        return document("LocationConstraint", [])
    if op == "GetBucketVersioning":
        return document("VersioningConfiguration", [])
    if op == "DeleteObjects":
        return _delete_objects(store, verdict, bucket)
    _require(verdict, auth.Access.READ, f"{bucket}/{request.args.get('prefix', '')}")
    if op == "ListObjectVersions":
        return listing.list_object_versions(store, bucket)
    assert op == "ListObjects", op
    return listing.list_objects(store, bucket)


def _create_bucket(store: SegmentStore, bucket: str) -> Response:
    objects.check_bucket_name(bucket)
    marker = objects.bucket_marker(bucket)
    try:
        store.create(marker)
    except SegmentExists:
        raise S3Error(
            "BucketAlreadyOwnedByYou",
            "Your previous request to create the named bucket succeeded and you already own it.",
        ) from None
    store.seal(marker)
    return Response(status=200, headers={"Location": f"/{bucket}"})


def _delete_bucket(store: SegmentStore, bucket: str) -> Response:
    objects.require_bucket(store, bucket)
    page, _ = store.list(bucket + "/", limit=1)
    if page:
        raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty")
    try:
        store.delete(objects.bucket_marker(bucket))
    except SegmentNotFound:
        raise S3Error("NoSuchBucket", "The specified bucket does not exist") from None
    return Response(status=204)


def _delete_objects(store: SegmentStore, verdict: sigv4.Verdict, bucket: str) -> Response:
    root = parse(_xml_body(verdict))
    quiet = (root.findtext("Quiet") or "").strip().lower() == "true"
    keys = [obj.findtext("Key") or "" for obj in root.findall("Object")]
    if len(keys) > 1000:
        raise S3Error("MalformedXML", "a DeleteObjects request names at most 1000 keys")
    results = []
    for key in keys:
        try:
            name = objects.object_name(bucket, key)
            _require(verdict, auth.Access.WRITE, name)
            objects.delete_object(store, name)
            if not quiet:
                results.append(("Deleted", [("Key", key)]))
        except S3Error as err:
            results.append(("Error", [("Key", key), ("Code", err.code), ("Message", err.message)]))
        except SegstoreError as err:
            s3err = errors.from_engine(err)
            results.append(("Error", [("Key", key), ("Code", s3err.code), ("Message", s3err.message)]))
    return document("DeleteResult", results)


# ------------------------------------------------------------------- object
@bp.route("/<s3bucket:bucket>/<s3key:key>", methods=METHODS)
def object_view(bucket: str, key: str) -> Response:
    ops.set_route("/{bucket}/{key}")
    verdict = _verify()
    op = subresources.operation("object", request.method, request.args, request.headers)
    store = _store()
    objects.require_bucket(store, bucket)
    name = objects.object_name(bucket, key)
    args = request.args
    _check_version_id(op)
    if op in ("GetObject", "HeadObject", "ListParts"):
        _require(verdict, auth.Access.READ, name)
        if op == "ListParts":
            return _list_parts(store, bucket, key)
        return _get_object(store, name, head=op == "HeadObject")
    _require(verdict, auth.Access.WRITE, name)
    if "X-Amz-Copy-Source" in request.headers:
        if op != "PutObject":
            raise subresources.not_implemented("UploadPartCopy")
        return _copy_object(store, verdict, name)
    if op == "UploadPart":
        return _upload_part(store, verdict, bucket, key)
    if op == "PutObject":
        return _put_object(store, verdict, name)
    if op == "AbortMultipartUpload":
        multipart.abort(store, args["uploadId"], bucket, key)
        return Response(status=204)
    if op == "DeleteObject":
        objects.delete_object(store, name)
        return Response(status=204)
    if op == "CreateMultipartUpload":
        upload_id = multipart.create(store, bucket, key)
        return document(
            "InitiateMultipartUploadResult", [("Bucket", bucket), ("Key", key), ("UploadId", upload_id)]
        )
    assert op == "CompleteMultipartUpload", op
    return _complete(store, verdict, bucket, key)


def _check_version_id(op: str) -> None:
    """``versionId``: objects have one version, ``null`` (versioning is never enabled)."""
    version = request.args.get("versionId")
    if version is None:
        return
    if op not in ("GetObject", "HeadObject", "DeleteObject", "PutObject"):
        raise S3Error("InvalidArgument", "This operation does not accept a version id")
    if version != "null" or op == "PutObject":
        raise S3Error("InvalidArgument", "Invalid version id specified")


def _object_headers(info: SegmentInfo, etag: str) -> dict[str, str]:
    return {
        "ETag": f'"{etag}"',
        "Last-Modified": http_date(int(info.last_modified)),
        "Accept-Ranges": "bytes",
        "Content-Type": "binary/octet-stream",
    }


def _preconditions(info: SegmentInfo, etag: str) -> Response | None:
    """If-Match / If-Unmodified-Since (412) and If-None-Match / If-Modified-Since (304)."""
    modified = int(info.last_modified)
    if_match = request.headers.get("If-Match")
    if if_match is not None and not request.if_match.contains(etag) and if_match.strip() != "*":
        raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
    since = parse_date(request.headers.get("If-Unmodified-Since"))
    if if_match is None and since is not None and modified > since.timestamp():
        raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None and (request.if_none_match.contains(etag) or if_none_match.strip() == "*"):
        return Response(status=304, headers=_object_headers(info, etag))
    since = parse_date(request.headers.get("If-Modified-Since"))
    if if_none_match is None and since is not None and modified <= since.timestamp():
        return Response(status=304, headers=_object_headers(info, etag))
    return None


def _byte_range(length: int) -> tuple[int, int] | None:
    """The inclusive range a ``Range`` header asks for, or None for the whole object."""
    raw = request.headers.get("Range")
    if raw is None:
        return None
    match = _RANGE.fullmatch(raw.strip())
    if match is None or (not match.group(1) and not match.group(2)):
        return None  # several ranges or another unit: S3 answers with the whole object
    first, last = match.group(1), match.group(2)
    if not first:
        suffix = int(last)
        if suffix == 0 or length == 0:
            raise _invalid_range(length)
        return max(0, length - suffix), length - 1
    start = int(first)
    end = min(int(last), length - 1) if last else length - 1
    if start >= length or (last and int(last) < start):
        raise _invalid_range(length)
    return start, end


def _invalid_range(length: int) -> S3Error:
    return S3Error(
        "InvalidRange",
        "The requested range is not satisfiable",
        headers={"Content-Range": f"bytes */{length}"},
    )


def _stream(store: SegmentStore, info: SegmentInfo, start: int, end: int) -> Iterator[bytes]:
    """The bytes [start, end) of the object ``info`` names, read by read; stops if it is replaced."""
    offset = start
    while offset < end:
        result = store.read(info.name, offset, end - offset)
        if result.info.segment_id != info.segment_id:
            raise SegmentNotFound(f"{info.name!r} was replaced while it was read")
        if result.next_offset == offset:
            raise SegmentNotFound(f"{info.name!r} ended at {offset} while it was read")
        yield from result.pieces
        offset = result.next_offset


def _get_object(store: SegmentStore, name: str, *, head: bool) -> Response:
    info = store.info(name)
    etag = objects.etag_of(store, info)
    not_modified = _preconditions(info, etag)
    if not_modified is not None:
        return not_modified
    headers = _object_headers(info, etag)
    byte_range = _byte_range(info.length) if "partNumber" not in request.args else None
    start, end, status = 0, info.length, 200
    if byte_range is not None:
        start, end, status = byte_range[0], byte_range[1] + 1, 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{info.length}"
    headers["Content-Length"] = str(end - start)
    if head:
        return Response(status=status, headers=headers)
    body = _stream(store, info, start, end)
    # The first read happens now, so a failure still gets a proper error answer.
    first = next(body, b"")
    return Response(_chain(first, body), status=status, headers=headers)


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _put_object(store: SegmentStore, verdict: sigv4.Verdict, name: str) -> Response:
    offset_header = request.headers.get("X-Amz-Write-Offset-Bytes")
    if offset_header is not None:
        return _append_object(store, verdict, name, offset_header)
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None and if_none_match.strip() != "*":
        raise S3Error("NotImplemented", "PutObject takes If-None-Match only as *")
    if if_none_match is not None:
        try:
            store.info(name)
            raise S3Error(
                "PreconditionFailed", "At least one of the pre-conditions you specified did not hold"
            )
        except SegmentNotFound:
            pass
    body = Body(request, verdict.signing)
    staging = objects.stage(store, name, body.pieces(store.settings.max_append_bytes))
    try:
        body.finish()
    except BaseException:
        objects.discard(store, staging)
        raise
    objects.publish(
        store,
        name,
        staging,
        body.etag,
        if_none_match=if_none_match is not None,
        if_match=request.headers.get("If-Match"),
    )
    return Response(status=200, headers={"ETag": f'"{body.etag}"', **body.checksum_headers()})


def _copy_object(store: SegmentStore, verdict: sigv4.Verdict, name: str) -> Response:
    """CopyObject: the source's bytes staged beside the target, then published like a PutObject.

    The copy's ETag is the MD5 of the bytes (computed as they are copied);
    metadata directives do not apply, as no metadata is stored.
    """
    source = unquote(request.headers["X-Amz-Copy-Source"]).partition("?")[0].lstrip("/")
    source_bucket, _, source_key = source.partition("/")
    objects.require_bucket(store, source_bucket)
    source_name = objects.object_name(source_bucket, source_key)
    _require(verdict, auth.Access.READ, source_name)
    info = store.info(source_name)
    copy_if_match = request.headers.get("X-Amz-Copy-Source-If-Match")
    if copy_if_match is not None and copy_if_match.strip('"') != objects.etag_of(store, info):
        raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
    md5 = hashlib.md5()

    def pieces() -> Iterator[bytes]:
        for piece in _stream(store, info, 0, info.length):
            md5.update(piece)
            yield piece

    staging = objects.stage(store, name, pieces())
    published = objects.publish(store, name, staging, md5.hexdigest())
    return document(
        "CopyObjectResult",
        [("LastModified", iso8601(published.last_modified)), ("ETag", f'"{md5.hexdigest()}"')],
    )


def _append_object(store: SegmentStore, verdict: sigv4.Verdict, name: str, offset_header: str) -> Response:
    """PutObject with ``x-amz-write-offset-bytes``: one atomic append at exactly that offset.

    The body is at most ``max_append_bytes``. A missing object is created
    (unsealed) by an append at offset 0; objects written by a plain PutObject
    are sealed and take no appends.
    """
    if not _DIGITS.fullmatch(offset_header.strip()):
        raise S3Error("InvalidArgument", "x-amz-write-offset-bytes must be a non-negative integer")
    offset = int(offset_header)
    body = Body(request, verdict.signing)
    data = body.read_all(store.settings.max_append_bytes)
    body.finish()
    with objects.key_lock(name):
        try:
            info = store.info(name)
        except SegmentNotFound:
            if offset != 0:
                raise S3Error("NoSuchKey", "The specified key does not exist.") from None
            info = store.create(name)
        if not data:
            if info.length != offset:
                raise S3Error("InvalidWriteOffset", f"the object is {info.length} bytes long, not {offset}")
        else:
            try:
                info = store.append(name, data, expected_offset=offset).info
            except ConditionalCheckFailed as err:
                length = err.segment.length if err.segment is not None else "another number of"
                raise S3Error(
                    "InvalidWriteOffset", f"the object is {length} bytes long, not {offset}"
                ) from None
            except SegmentSealed:
                raise S3Error(
                    "InvalidRequest", "the object is sealed (written by PutObject) and takes no appends"
                ) from None
    return Response(
        status=200, headers={"ETag": f'"{objects.derived_etag(info)}"', **body.checksum_headers()}
    )


def _part_number() -> int:
    raw = request.args.get("partNumber", "")
    if not _DIGITS.fullmatch(raw):
        raise S3Error("InvalidArgument", "Part number must be an integer between 1 and 10000")
    return int(raw)


def _upload_part(store: SegmentStore, verdict: sigv4.Verdict, bucket: str, key: str) -> Response:
    body = Body(request, verdict.signing)

    def finish() -> str:
        body.finish()
        return body.etag

    etag = multipart.upload_part(
        store,
        request.args["uploadId"],
        bucket,
        key,
        _part_number(),
        body.pieces(store.settings.max_append_bytes),
        finish,
    )
    return Response(status=200, headers={"ETag": f'"{etag}"', **body.checksum_headers()})


def _complete(store: SegmentStore, verdict: sigv4.Verdict, bucket: str, key: str) -> Response:
    root = parse(_xml_body(verdict))
    chosen = []
    for part in root.findall("Part"):
        number = (part.findtext("PartNumber") or "").strip()
        if not _DIGITS.fullmatch(number):
            raise S3Error("MalformedXML", "each Part needs a PartNumber")
        chosen.append((int(number), (part.findtext("ETag") or "").strip()))
    etag = multipart.complete(store, request.args["uploadId"], bucket, key, chosen)
    return document(
        "CompleteMultipartUploadResult",
        [("Location", f"/{bucket}/{key}"), ("Bucket", bucket), ("Key", key), ("ETag", f'"{etag}"')],
    )


def _list_parts(store: SegmentStore, bucket: str, key: str) -> Response:
    upload_id = request.args["uploadId"]
    marker = listing.int_arg("part-number-marker", 0, multipart.PART_NUMBER_MAX)
    max_parts = listing.int_arg("max-parts", 1000, 1000)
    found = sorted(multipart.parts(store, upload_id, bucket, key).values(), key=lambda p: p.number)
    after = [p for p in found if p.number > marker]
    page = after[:max_parts]
    truncated = len(after) > len(page)
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
            *(
                (
                    "Part",
                    [
                        ("PartNumber", p.number),
                        ("LastModified", iso8601(p.time)),
                        ("ETag", f'"{p.etag}"'),
                        ("Size", p.size),
                    ],
                )
                for p in page
            ),
        ],
    )
