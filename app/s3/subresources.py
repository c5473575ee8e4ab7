"""Which S3 operations the surface serves: one table on method + subresource, the rest refused.

S3 selects an operation on a path by the method and a *subresource*: a query
parameter such as ``?acl`` or ``?tagging`` (see the S3 API reference). A
server that ignores a subresource runs the plain operation of the same path
instead: ``PUT ?acl`` would replace the object, ``DELETE ?tagging`` or
``DELETE ?annotation`` delete it. So every request is first matched against
``SERVED``, before anything is read or written:

- a subresource S3 defines and segstore does not serve answers ``501
  NotImplemented``, and so does a parameter S3 does not define that comes
  without a value (``?something`` or ``?something=``): that is the shape of
  a subresource, most likely one S3 added after this table was written;
- a header that would change what a served operation means (tags, object
  lock, server-side encryption, ACL grants, other storage classes,
  conditions segstore does not evaluate) answers 501 too;
- ``x-amz-expected-bucket-owner`` is honoured: every bucket is owned by
  ``OWNER_ID``, any other expected owner is 403, as on S3;
- ``x-amz-request-payer`` and ``x-amz-bypass-governance-retention`` are
  accepted and change nothing, as on an S3 bucket without Requester Pays or
  object lock.

Parameters S3 does not define that carry a value are ignored, as S3 ignores
them.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.s3.errors import S3Error
from app.s3.metadata import RequestHeaders

# The ID of the one owner of every bucket and object (listings' Owner element).
OWNER_ID = "segstore"

# Subresources that select an operation (bucket and object level).
SUBRESOURCES = frozenset(
    {
        "abac", "accelerate", "acl", "analytics", "annotation", "attributes", "cors", "delete",
        "encryption", "intelligent-tiering", "inventory", "legal-hold", "lifecycle", "location",
        "logging", "metadataAnnotationTable", "metadataConfiguration", "metadataInventoryTable",
        "metadataJournalTable", "metadataTable", "metrics", "notification", "object-lock",
        "ownershipControls", "policy", "policyStatus", "publicAccessBlock", "renameObject",
        "replication", "requestPayment", "restore", "retention", "select", "session", "tagging",
        "torrent", "uploadId", "uploads", "versioning", "versions", "website",
    }
)  # fmt: skip

# Query parameters S3 defines that qualify an operation rather than select one: they may come
# empty (``?prefix=``). ``partNumber`` and ``versionId`` are judged by the views.
PARAMETERS = frozenset(
    {
        "annotation-prefix", "annotationName", "bucket-region", "continuation-token", "delimiter",
        "encoding-type", "fetch-owner", "id", "key-marker", "list-type", "marker",
        "max-annotation-results", "max-buckets", "max-directory-buckets", "max-keys", "max-parts",
        "max-uploads", "part-number-marker", "partNumber", "prefix", "response-cache-control",
        "response-content-disposition", "response-content-encoding", "response-content-language",
        "response-content-type", "response-expires", "select-type", "start-after",
        "upload-id-marker", "version-id-marker", "versionId", "x-id",
    }
)  # fmt: skip

# (level, method, subresource or "") -> operation. Everything else is refused.
SERVED: Mapping[tuple[str, str, str], str] = {
    ("service", "GET", ""): "ListBuckets",
    ("service", "HEAD", ""): "ListBuckets",
    ("bucket", "PUT", ""): "CreateBucket",
    ("bucket", "DELETE", ""): "DeleteBucket",
    ("bucket", "HEAD", ""): "HeadBucket",
    ("bucket", "GET", ""): "ListObjects",
    ("bucket", "GET", "location"): "GetBucketLocation",
    ("bucket", "GET", "versioning"): "GetBucketVersioning",
    ("bucket", "GET", "versions"): "ListObjectVersions",
    ("bucket", "POST", "delete"): "DeleteObjects",
    ("object", "GET", ""): "GetObject",
    ("object", "HEAD", ""): "HeadObject",
    ("object", "PUT", ""): "PutObject",
    ("object", "DELETE", ""): "DeleteObject",
    ("object", "POST", "uploads"): "CreateMultipartUpload",
    ("object", "PUT", "uploadId"): "UploadPart",
    ("object", "GET", "uploadId"): "ListParts",
    ("object", "POST", "uploadId"): "CompleteMultipartUpload",
    ("object", "DELETE", "uploadId"): "AbortMultipartUpload",
}
_KNOWN = SUBRESOURCES | PARAMETERS
_SERVED_METHODS = frozenset((level, method) for level, method, _ in SERVED)

# Headers (or header families, ending in ``-``) whose meaning segstore does not keep: honouring
# them silently would store an object other than the one asked for (no tags, no retention, no
# encryption, no grants), or skip a check the client asked for (the conditions).
REFUSED_HEADERS = (
    "x-amz-tagging",
    "x-amz-object-lock-",
    "x-amz-bucket-object-lock-enabled",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-",
    "x-amz-copy-source-server-side-encryption-",
    "x-amz-website-redirect-location",
    "x-amz-grant-",
    "x-amz-mfa",
    "x-amz-copy-source-range",
    "x-amz-if-match-last-modified-time",
    "x-amz-if-match-size",
    "x-amz-if-match-initiated-time",
    "x-amz-mp-object-size",
)
# Header values that ask for nothing beyond what segstore does anyway.
HARMLESS_VALUES: Mapping[str, frozenset[str]] = {
    "x-amz-acl": frozenset({"private", "bucket-owner-full-control"}),
    "x-amz-storage-class": frozenset({"STANDARD"}),
    "x-amz-tagging-directive": frozenset({"COPY"}),
    "x-amz-object-ownership": frozenset({"BucketOwnerEnforced"}),
    "x-amz-bucket-namespace": frozenset({"global"}),
}
EXPECTED_OWNER_HEADERS = ("x-amz-expected-bucket-owner", "x-amz-source-expected-bucket-owner")


def not_implemented(what: str) -> S3Error:
    return S3Error(
        "NotImplemented",
        f"A header or query you provided implies functionality that is not implemented: {what}",
    )


def operation(level: str, method: str, args: Mapping[str, str], headers: RequestHeaders) -> str:
    """The served operation this request names; 501 for S3 features segstore does not serve.

    ``level`` is ``service``, ``bucket`` or ``object``. A request naming two
    subresources (``?acl&tagging``) is refused, as no S3 operation takes both.
    """
    named = sorted(SUBRESOURCES.intersection(args))
    unknown = sorted(p for p, v in args.items() if p and not v and p not in _KNOWN)
    if unknown:
        raise not_implemented("?" + "&".join(unknown))
    if len(named) > 1:
        raise not_implemented("?" + "&".join(named))
    sub = named[0] if named else ""
    op = SERVED.get((level, method, sub))
    if op is None:
        if sub or (level, method) in _SERVED_METHODS:
            raise not_implemented(f"{method} ?{sub}" if sub else method)
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.")
    _check_headers(method, headers)
    return op


def _check_headers(method: str, headers: RequestHeaders) -> None:
    lowered = {name.lower() for name, _ in headers.items()}
    if method in ("GET", "HEAD"):
        refused: tuple[str, ...] = ("x-amz-server-side-encryption-customer-",)
        harmless: Mapping[str, frozenset[str]] = {}
    else:
        refused, harmless = REFUSED_HEADERS, HARMLESS_VALUES
    for name in sorted(lowered):
        if name in refused or any(p.endswith("-") and name.startswith(p) for p in refused):
            raise not_implemented(f"the {name} header")
    for name, values in harmless.items():
        value = headers.get(name)
        if value is not None and value.strip() not in values:
            raise not_implemented(f"{name}: {value}")
    for name in EXPECTED_OWNER_HEADERS:
        value = headers.get(name)
        if value is not None and value.strip() != OWNER_ID:
            raise S3Error("AccessDenied", f"the bucket is owned by {OWNER_ID!r}, not {value.strip()!r}")
