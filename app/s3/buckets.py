"""Bucket operations: CreateBucket, DeleteBucket (empty only) and DeleteObjects.

A bucket is the sealed empty marker segment ``objects.bucket_marker``. Its
name follows S3's rules when it is created (``objects.check_bucket_name``);
CreateBucket's optional ``CreateBucketConfiguration`` may name the one
region segstore reports and nothing else segstore would have to keep.
"""

from __future__ import annotations

from collections.abc import Callable
from xml.etree import ElementTree

from flask import Response

from app.s3 import answers, objects, subresources
from app.s3.errors import S3Error
from app.s3.xml import Node, document, parse
from engine import CreateStep, SealStep, SegmentExists, SegmentNotFound, SegmentStore, SegstoreError

DELETE_KEYS_MAX = 1000


def create_bucket(store: SegmentStore, bucket: str, body: bytes) -> Response:
    objects.check_bucket_name(bucket)
    if body.strip():
        _check_configuration(parse(body))
    marker = objects.bucket_marker(bucket)
    try:
        store.composite([CreateStep(marker), SealStep(marker)])
    except SegmentExists:
        raise S3Error(
            "BucketAlreadyOwnedByYou",
            "Your previous request to create the named bucket succeeded and you already own it.",
        ) from None
    return Response(status=200, headers={"Location": f"/{bucket}"})


def _check_configuration(root: ElementTree.Element) -> None:
    """``LocationConstraint`` empty or the one region; a Location, Bucket type or Tags: 501."""
    if root.tag != "CreateBucketConfiguration":
        raise S3Error("MalformedXML", "The XML you provided was not well-formed.")
    for child in root:
        if child.tag != "LocationConstraint":
            raise subresources.not_implemented(f"CreateBucketConfiguration {child.tag}")
        region = (child.text or "").strip()
        if region not in ("", objects.REGION):
            raise S3Error(
                "IllegalLocationConstraintException",
                f"The {region} location constraint is incompatible for the region specific "
                f"endpoint this request was sent to ({objects.REGION}).",
            )


def delete_bucket(store: SegmentStore, bucket: str) -> Response:
    objects.require_bucket(store, bucket)
    page, _ = store.list(bucket + "/", limit=1)
    if page:
        raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty")
    try:
        store.delete(objects.bucket_marker(bucket))
    except SegmentNotFound:
        raise S3Error("NoSuchBucket", "The specified bucket does not exist") from None
    return Response(status=204)


def delete_objects(
    store: SegmentStore, bucket: str, body: bytes, authorize: Callable[[str], None]
) -> Response:
    """DeleteObjects: each key deleted as DeleteObject would, its failure reported in its place.

    ``authorize`` raises for a segment name the caller may not write. An
    ``ETag`` makes that key's delete conditional (412 PreconditionFailed in
    its place); a ``VersionId`` other than ``null`` deletes nothing, and so
    do ``LastModifiedTime`` and ``Size`` (conditions S3 evaluates in
    directory buckets only).
    """
    root = parse(body)
    quiet = (root.findtext("Quiet") or "").strip().lower() == "true"
    entries = root.findall("Object")
    if len(entries) > DELETE_KEYS_MAX:
        raise S3Error("MalformedXML", f"a DeleteObjects request names at most {DELETE_KEYS_MAX} keys")
    results: list[Node] = []
    for entry in entries:
        key = entry.findtext("Key") or ""
        try:
            _delete_one(store, bucket, entry, key, authorize)
            if not quiet:
                results.append(("Deleted", [("Key", key)]))
        except (S3Error, SegstoreError) as err:
            s3err = err if isinstance(err, S3Error) else answers.from_engine(err)
            results.append(("Error", [("Key", key), ("Code", s3err.code), ("Message", s3err.message)]))
    return document("DeleteResult", results)


def _delete_one(
    store: SegmentStore, bucket: str, entry: ElementTree.Element, key: str, authorize: Callable[[str], None]
) -> None:
    for unserved in ("LastModifiedTime", "Size"):
        if entry.find(unserved) is not None:
            raise subresources.not_implemented(f"DeleteObjects {unserved}")
    version = entry.findtext("VersionId")
    if version is not None and version.strip() != "null":
        raise S3Error("InvalidArgument", "Invalid version id specified")
    name = objects.object_name(bucket, key)
    authorize(name)
    etag = entry.findtext("ETag")
    objects.delete_object(store, name, if_match=etag.strip() if etag is not None else None)
