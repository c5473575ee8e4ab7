"""The S3 routes: path-style at the root, one view per level (service, bucket, object).

Each view checks the request (Signature V4, then the grants, through
``app.auth``) and dispatches on method and query to one operation; the
operations compose engine calls through ``objects`` and ``multipart``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from urllib.parse import parse_qs, unquote

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.http import parse_date
from werkzeug.routing import BaseConverter

from app import auth, ops
from app.s3 import (
    answers,
    buckets,
    checksums,
    listing,
    metadata,
    migration,
    multipart,
    objects,
    reading,
    sigv4,
    subresources,
)
from app.s3.aws_chunked import Body
from app.s3.errors import S3Error
from app.s3.xml import document, iso8601, parse
from engine import (
    AppendResult,
    AppendStep,
    ConditionalCheckFailed,
    CreateStep,
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
_DIGITS = re.compile(r"[0-9]{1,19}")


class BucketConverter(BaseConverter):
    """One path part that is not a reserved name: ``/v1/...``, ``/metrics``, ``/console/`` never reach
    S3 views, so werkzeug answers them (404, or 405 beside a native route) as the native API does."""

    regex = r"(?!(?:v1|healthz|readyz|metrics|console)$)[^/]+"
    part_isolating = True


class KeyConverter(BaseConverter):
    """Everything after the bucket: slashes, spaces, anything (the key validator judges it)."""

    regex = r"[\s\S]*"
    part_isolating = False


bp.record_once(
    lambda state: state.app.url_map.converters.update(s3bucket=BucketConverter, s3key=KeyConverter)
)
bp.register_error_handler(S3Error, answers.render)
bp.register_error_handler(SegstoreError, answers.render_engine_error)
bp.register_error_handler(Exception, answers.render_unexpected)


def init_app(app: Flask, store: SegmentStore) -> None:
    """Register the routes (last: they take whatever path the others leave) and migrate old state."""
    app.register_blueprint(bp)
    migration.start(store)


@bp.before_request
def _migrated() -> None:
    """No S3 request runs before the surface's state is under its reserved names."""
    migration.ensure(_store())


def _store() -> SegmentStore:
    return current_app.extensions["segstore"]


def _verify() -> sigv4.Verdict:
    return sigv4.verify(request, auth.config())


def _require(verdict: sigv4.Verdict, access: auth.Access, name: str) -> None:
    try:
        auth.require(verdict.principal, access, name)
    except auth.Forbidden as err:
        raise S3Error("AccessDenied", err.detail) from None


def _xml_body(verdict: sigv4.Verdict, *, checksum_headers: bool = True) -> bytes:
    body = Body(request, verdict.signing, checksum_headers=checksum_headers)
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
        return buckets.create_bucket(store, bucket, _xml_body(verdict))
    if op == "DeleteBucket":
        _require(verdict, auth.Access.ADMIN, bucket + "/")
        return buckets.delete_bucket(store, bucket)
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
        body = _xml_body(verdict)
        return buckets.delete_objects(
            store, bucket, body, lambda name: _require(verdict, auth.Access.WRITE, name)
        )
    _require(verdict, auth.Access.READ, f"{bucket}/{request.args.get('prefix', '')}")
    if op == "ListObjectVersions":
        return listing.list_object_versions(store, bucket)
    assert op == "ListObjects", op
    return listing.list_objects(store, bucket)


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
            return listing.list_parts(store, bucket, key)
        return reading.get_object(store, name, head=op == "HeadObject")
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
        objects.delete_object(store, name, if_match=request.headers.get("If-Match"))
        return Response(status=204)
    if op == "CreateMultipartUpload":
        return _create_upload(store, bucket, key)
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


def _put_object(store: SegmentStore, verdict: sigv4.Verdict, name: str) -> Response:
    offset_header = request.headers.get("X-Amz-Write-Offset-Bytes")
    if offset_header is not None:
        return _append_object(store, verdict, name, offset_header)
    if_none_match = _if_none_match_star()
    if_match = request.headers.get("If-Match")
    meta = metadata.from_request(request.headers)
    if if_none_match or if_match is not None:  # fail before the body is read; publish checks again
        current = objects.info_or_none(store, name)
        objects.check_write_conditions(store, current, if_none_match=if_none_match, if_match=if_match)
    body = Body(request, verdict.signing)
    pieces = body.pieces(store.settings.max_append_bytes)
    data, staging = objects.small_or_staged(store, name, pieces, body.finish)
    checksum = body.checksum_headers()
    if checksum:
        checksum["x-amz-checksum-type"] = "FULL_OBJECT"
    stored = metadata.Stored(body.etag, meta, checksum)
    _publish(store, name, stored, data, staging, if_none_match=if_none_match, if_match=if_match)
    return Response(status=200, headers={"ETag": f'"{body.etag}"', **checksum})


def _publish(
    store: SegmentStore,
    name: str,
    stored: metadata.Stored,
    data: bytes | None,
    staging: str | None,
    *,
    if_none_match: bool,
    if_match: str | None,
) -> SegmentInfo:
    """Publish an upload's bytes (in hand or staged) as the object; a staging segment goes on failure."""
    try:
        return objects.publish(
            store, name, stored, data=data, staging=staging, if_none_match=if_none_match, if_match=if_match
        )
    except BaseException:
        if staging is not None:
            objects.discard(store, staging)
        raise


def _if_none_match_star() -> bool:
    """A write's ``If-None-Match``: only ``*`` (create, never replace) means anything on S3."""
    value = request.headers.get("If-None-Match")
    if value is not None and value.strip() != "*":
        raise subresources.not_implemented("If-None-Match other than *")
    return value is not None


def _copy_conditions(info: SegmentInfo, etag: str) -> None:
    """CopyObject's ``x-amz-copy-source-if-*`` headers, judged on the source: 412 when one fails.

    As on S3, a matching ETag wins over If-Unmodified-Since, and a
    non-matching If-None-Match over If-Modified-Since.
    """
    headers = request.headers
    modified = int(info.last_modified)
    if_match = headers.get("x-amz-copy-source-if-match")
    if_none_match = headers.get("x-amz-copy-source-if-none-match")
    unmodified_since = parse_date(headers.get("x-amz-copy-source-if-unmodified-since"))
    modified_since = parse_date(headers.get("x-amz-copy-source-if-modified-since"))
    tags = {t.strip().strip('"') for t in (if_match or "").split(",")}
    if if_match is not None and etag not in tags and "*" not in tags:
        raise objects.precondition_failed()
    if if_match is None and unmodified_since is not None and modified > unmodified_since.timestamp():
        raise objects.precondition_failed()
    tags = {t.strip().strip('"') for t in (if_none_match or "").split(",")}
    if if_none_match is not None and (etag in tags or "*" in tags):
        raise objects.precondition_failed()
    if if_none_match is None and modified_since is not None and modified <= modified_since.timestamp():
        raise objects.precondition_failed()


def _copy_object(store: SegmentStore, verdict: sigv4.Verdict, name: str) -> Response:
    """CopyObject: the source's bytes staged beside the target, then published like a PutObject.

    The copy's ETag is the MD5 of the bytes and its checksum (the source's
    algorithm, or ``x-amz-checksum-algorithm``) is computed as they are
    copied. ``x-amz-metadata-directive``: ``COPY`` (default) keeps the
    source's metadata, ``REPLACE`` takes the request's.
    """
    path, _, query = request.headers["X-Amz-Copy-Source"].partition("?")  # a key's own ? is %3F
    if parse_qs(query).get("versionId", ["null"]) != ["null"]:
        raise S3Error("InvalidArgument", "Invalid version id specified")
    source_bucket, _, source_key = unquote(path).lstrip("/").partition("/")
    objects.require_bucket(store, source_bucket)
    source_name = objects.object_name(source_bucket, source_key)
    _require(verdict, auth.Access.READ, source_name)
    directive = request.headers.get("x-amz-metadata-directive", "COPY").strip().upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", f"Unknown metadata directive {directive!r}")
    if source_name == name and directive != "REPLACE":
        raise S3Error(
            "InvalidRequest",
            "This copy request is illegal because it is trying to copy an object to itself without "
            "changing the object's metadata, storage class, website redirect location or encryption "
            "attributes.",
        )
    info = store.info(source_name, anywhere=True)  # in a cluster, the source's node may be another
    source_stored = objects.stored_of(store, info)
    _copy_conditions(info, source_stored.etag)
    if_none_match, if_match = _if_none_match_star(), request.headers.get("If-Match")
    if if_none_match or if_match is not None:  # before any byte is copied; publish judges again
        current = objects.info_or_none(store, name)
        objects.check_write_conditions(store, current, if_none_match=if_none_match, if_match=if_match)
    meta = metadata.from_request(request.headers) if directive == "REPLACE" else source_stored.meta
    algorithm = request.headers.get("x-amz-checksum-algorithm") or source_stored.checksum_algorithm()
    checksum = checksums.new(algorithm) if algorithm else None
    if algorithm and checksum is None:
        raise S3Error("InvalidRequest", f"checksum algorithm {algorithm!r} is not supported here")
    md5 = hashlib.md5()

    def pieces() -> Iterator[bytes]:
        """The source's bytes (from its start offset) in pieces of one append at most, hashed as they go."""
        size = store.settings.max_append_bytes
        buffer = bytearray()
        for piece in reading.stream(store, info, info.start_offset, info.length):
            md5.update(piece)
            if checksum is not None:
                checksum.update(piece)
            buffer += piece
            while len(buffer) >= size:
                yield bytes(buffer[:size])
                del buffer[:size]
        if buffer:
            yield bytes(buffer)

    data, staging = objects.small_or_staged(store, name, pieces(), lambda: None)
    stored_checksum = {}
    if checksum is not None and algorithm:
        header = checksums.HEADER_PREFIX + algorithm.lower()
        stored_checksum = {header: checksums.encode(checksum), "x-amz-checksum-type": "FULL_OBJECT"}
    stored = metadata.Stored(md5.hexdigest(), dict(meta), stored_checksum)
    published = _publish(store, name, stored, data, staging, if_none_match=if_none_match, if_match=if_match)
    return document(
        "CopyObjectResult",
        [
            ("LastModified", iso8601(published.last_modified)),
            ("ETag", f'"{md5.hexdigest()}"'),
            *((_checksum_field(h), v) for h, v in stored_checksum.items()),
        ],
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
    info = _append_at(store, name, data, offset)
    return Response(
        status=200, headers={"ETag": f'"{objects.derived_etag(info)}"', **body.checksum_headers()}
    )


def _append_at(store: SegmentStore, name: str, data: bytes, offset: int) -> SegmentInfo:
    """Append ``data`` at exactly ``offset`` (a missing object is created by the append at 0).

    The create and the append are one composite, so no other writer fits
    between them; an object created meanwhile by another is judged again.
    """
    for _ in range(objects.RACED_TRIES_MAX):
        try:
            info = store.info(name)
        except SegmentNotFound:
            if offset != 0:
                raise S3Error("NoSuchKey", "The specified key does not exist.") from None
            try:
                *_, last = store.composite([CreateStep(name), *([AppendStep(name, data)] if data else [])])
            except SegmentExists:
                continue
            created = last.info if isinstance(last, AppendResult) else last
            assert isinstance(created, SegmentInfo)
            return created
        if not data:
            size = reading.object_size(info)
            if size != offset:
                raise S3Error("InvalidWriteOffset", f"the object is {size} bytes long, not {offset}")
            return info
        try:  # the object starts at the segment's start offset (truncated through the native API)
            return store.append(name, data, expected_offset=info.start_offset + offset).info
        except ConditionalCheckFailed as err:
            length = reading.object_size(err.segment) if err.segment is not None else "another number of"
            raise S3Error("InvalidWriteOffset", f"the object is {length} bytes long, not {offset}") from None
        except SegmentSealed:
            raise S3Error(
                "InvalidRequest", "the object is sealed (written by PutObject) and takes no appends"
            ) from None
        except SegmentNotFound:
            continue
    raise S3Error("SlowDown", f"other writers of {name!r} kept coming first; please retry")


def _part_number() -> int:
    raw = request.args.get("partNumber", "")
    if not _DIGITS.fullmatch(raw):
        raise S3Error("InvalidArgument", "Part number must be an integer between 1 and 10000")
    return int(raw)


def _create_upload(store: SegmentStore, bucket: str, key: str) -> Response:
    algorithm = request.headers.get("x-amz-checksum-algorithm")
    kind = request.headers.get("x-amz-checksum-type", "COMPOSITE").strip().upper()
    if kind != "COMPOSITE":
        raise subresources.not_implemented(f"x-amz-checksum-type: {kind}")
    algorithm = algorithm.strip().lower() if algorithm else None
    upload_id = multipart.create(store, bucket, key, metadata.from_request(request.headers), algorithm)
    headers = (
        {"x-amz-checksum-algorithm": algorithm.upper(), "x-amz-checksum-type": kind} if algorithm else {}
    )
    return document(
        "InitiateMultipartUploadResult",
        [("Bucket", bucket), ("Key", key), ("UploadId", upload_id)],
        headers=headers,
    )


def _upload_part(store: SegmentStore, verdict: sigv4.Verdict, bucket: str, key: str) -> Response:
    body = Body(request, verdict.signing)

    def finish() -> tuple[str, dict[str, str]]:
        body.finish()
        return body.etag, body.checksum_headers()

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
    if_none_match = _if_none_match_star()
    root = parse(_xml_body(verdict, checksum_headers=False))  # they are the object's checksum
    chosen = []
    for part in root.findall("Part"):
        number = (part.findtext("PartNumber") or "").strip()
        if not _DIGITS.fullmatch(number):
            raise S3Error("MalformedXML", "each Part needs a PartNumber")
        sent = {
            child.tag.removeprefix("Checksum").lower(): (child.text or "").strip()
            for child in part
            if child.tag.startswith("Checksum") and child.tag != "ChecksumType"
        }
        chosen.append(multipart.Chosen(int(number), (part.findtext("ETag") or "").strip(), sent))
    stored = multipart.complete(
        store,
        request.args["uploadId"],
        bucket,
        key,
        chosen,
        if_none_match=if_none_match,
        if_match=request.headers.get("If-Match"),
        checksum={
            name.lower(): value
            for name, value in request.headers.items()
            if name.lower().startswith(checksums.HEADER_PREFIX) and name.lower() != "x-amz-checksum-type"
        },
    )
    fields = [(_checksum_field(h), v) for h, v in stored.checksum.items()]
    return document(
        "CompleteMultipartUploadResult",
        [
            ("Location", f"/{bucket}/{key}"),
            ("Bucket", bucket),
            ("Key", key),
            ("ETag", f'"{stored.etag}"'),
            *fields,
        ],
        headers=stored.checksum,
    )


def _checksum_field(header: str) -> str:
    """The XML element of a checksum header: ``x-amz-checksum-crc32`` is ``ChecksumCRC32``."""
    name = header.removeprefix(checksums.HEADER_PREFIX)
    return "ChecksumType" if name == "type" else "Checksum" + name.upper()
