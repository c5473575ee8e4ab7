"""Which S3 operations the surface serves: one table on method + subresource, the rest refused.

S3 selects an operation on a path by the method and a *subresource*: a query
parameter such as ``?acl`` or ``?tagging`` (see the S3 API reference). A
server that ignores a subresource runs the plain operation of the same path
instead: ``PUT ?acl`` would replace the object, ``DELETE ?tagging`` delete
it. So every request is first matched against ``SERVED``; a subresource S3
defines and segstore does not serve answers ``501 NotImplemented`` before
anything is read or written, and so does a header that would change what a
served operation means (tags, object lock, server-side encryption, ACL
grants, other storage classes). Query parameters that S3 does not define
are ignored, as S3 ignores them.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.s3.errors import S3Error

# Subresources that select an operation (bucket and object level). ``partNumber`` and
# ``versionId`` qualify an operation rather than select one; they are judged by the views.
SUBRESOURCES = frozenset(
    {
        "accelerate", "acl", "analytics", "attributes", "cors", "delete", "encryption",
        "intelligent-tiering", "inventory", "legal-hold", "lifecycle", "location", "logging",
        "metadataConfiguration", "metadataInventoryTable", "metadataJournalTable", "metadataTable",
        "metrics", "notification", "object-lock", "ownershipControls", "policy", "policyStatus",
        "publicAccessBlock", "renameObject", "replication", "requestPayment", "restore",
        "retention", "select", "session", "tagging", "torrent", "uploadId", "uploads",
        "versioning", "versions", "website",
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

# Headers whose meaning segstore does not keep: honouring them silently would store an object
# other than the one asked for (no tags, no retention, no encryption, no grants).
REFUSED_HEADERS = (
    "x-amz-tagging",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-bucket-object-lock-enabled",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-context",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-copy-source-server-side-encryption-customer-algorithm",
    "x-amz-website-redirect-location",
    "x-amz-grant-full-control",
    "x-amz-grant-read",
    "x-amz-grant-read-acp",
    "x-amz-grant-write",
    "x-amz-grant-write-acp",
    "x-amz-mfa",
    "x-amz-copy-source-range",
)
# Header values that ask for nothing beyond what segstore does anyway.
HARMLESS_VALUES: Mapping[str, frozenset[str]] = {
    "x-amz-acl": frozenset({"private", "bucket-owner-full-control"}),
    "x-amz-storage-class": frozenset({"STANDARD"}),
    "x-amz-tagging-directive": frozenset({"COPY"}),
    "x-amz-object-ownership": frozenset({"BucketOwnerEnforced"}),
}


def not_implemented(what: str) -> S3Error:
    return S3Error(
        "NotImplemented",
        f"A header or query you provided implies functionality that is not implemented: {what}",
    )


def operation(level: str, method: str, args: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """The served operation this request names; 501 for S3 features segstore does not serve.

    ``level`` is ``service``, ``bucket`` or ``object``. A request naming two
    subresources (``?acl&tagging``) is refused, as no S3 operation takes both.
    """
    named = sorted(SUBRESOURCES.intersection(args))
    if len(named) > 1:
        raise not_implemented("?" + "&".join(named))
    sub = named[0] if named else ""
    op = SERVED.get((level, method, sub))
    if op is None:
        if sub or (level, method) in {(lv, m) for lv, m, _ in SERVED}:
            raise not_implemented(f"{method} ?{sub}" if sub else method)
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.")
    if method not in ("GET", "HEAD"):
        for header in REFUSED_HEADERS:
            if header in headers:
                raise not_implemented(f"the {header} header")
        for header, harmless in HARMLESS_VALUES.items():
            value = headers.get(header)
            if value is not None and value.strip() not in harmless:
                raise not_implemented(f"{header}: {value}")
    elif "x-amz-server-side-encryption-customer-algorithm" in headers:
        raise not_implemented("the x-amz-server-side-encryption-customer-algorithm header")
    return op
