"""The segment a path-style S3 request is about, where a cluster sends it.

An object-level request (``/{bucket}/{key}``, any method and subresource:
multipart, copy, tagging...) touches the object's segment, its record and
its uploads' segments, all in the container of ``{bucket}/{key}``. A
bucket-level request (``/{bucket}``) is about the bucket's marker.
ListBuckets (``/``) and anything the surface refuses for its name have no
subject: the node they reach answers them.
"""

from __future__ import annotations

from typing import Any

from app.s3 import objects
from app.s3.errors import S3Error


def request_subject(environ: dict[str, Any]) -> str | None:
    """The object segment or bucket marker the request's path names, or None.

    The path is decoded as the S3 routes decode it (``PATH_INFO`` as UTF-8,
    the bucket up to the first slash, the key everything after it).
    """
    try:
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8")
    except UnicodeError:
        return None
    bucket, slash, key = path.removeprefix("/").partition("/")
    if bucket in objects.RESERVED_BUCKETS or not objects.bucket_shaped(bucket):
        return None
    if not slash or not key:
        return objects.bucket_marker(bucket)
    try:
        return objects.object_name(bucket, key)
    except S3Error:
        return None
