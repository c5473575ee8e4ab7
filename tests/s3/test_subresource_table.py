"""The subresource table and the refusal tests checked against botocore's model of S3.

The model names every S3 operation with its method, path and query. Each
one must be served by the table or driven through boto3 by
``test_refused.py`` (which proves it answers 501 and changes nothing), and
every query parameter a served operation sends must be known to the table:
an unknown one sent without a value is refused as an unknown subresource. An
operation of a newer botocore that the refusal tests do not drive yet must
at least be refused by the table.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import botocore.session
from botocore import xform_name

from app.s3 import subresources
from tests.s3 import test_refused

MODEL = botocore.session.get_session().get_service_model("s3")

# The boto3 operations segstore serves; CopyObject is PutObject with x-amz-copy-source.
SERVED = {
    "AbortMultipartUpload", "CompleteMultipartUpload", "CopyObject", "CreateBucket",
    "CreateMultipartUpload", "DeleteBucket", "DeleteObject", "DeleteObjects", "GetBucketLocation",
    "GetBucketVersioning", "GetObject", "HeadBucket", "HeadObject", "ListBuckets",
    "ListObjectVersions", "ListObjects", "ListObjectsV2", "ListParts", "PutObject", "UploadPart",
}  # fmt: skip
# Operations that never reach a bucket path of this server: ListDirectoryBuckets is sent as
# ``GET /``, the very request of ListBuckets, and answered as one (S3 Express directory buckets
# have their own endpoint); WriteGetObjectResponse goes to an Object Lambda host.
ELSEWHERE = {"ListDirectoryBuckets", "WriteGetObjectResponse"}


def _query_names(operation: str) -> set[str]:
    model = MODEL.operation_model(operation)
    uri = model.http["requestUri"]
    names = {name for name, _ in parse_qsl(urlsplit(uri).query, keep_blank_values=True)}
    members = model.input_shape.members.values() if model.input_shape else []
    in_query = [m for m in members if m.serialization.get("location") == "querystring"]
    return names | {m.serialization["name"] for m in in_query}


def _refused_by_the_table(operation: str) -> bool:
    """Whether the table answers 501 to the operation's request, as botocore would send it bare."""
    model = MODEL.operation_model(operation)
    path = urlsplit(model.http["requestUri"]).path
    level = "object" if "{Key" in path else "bucket" if "{Bucket}" in path else "service"
    args = {name: "" for name in _query_names(operation)}
    try:
        subresources.operation(level, model.http["method"], args, {})
    except subresources.S3Error as err:
        return err.code == "NotImplemented"
    return False


def test_every_operation_of_the_model_is_served_or_refused() -> None:
    """Each operation is served, driven through boto3 by test_refused.py, or at least refused by the
    table (one a newer botocore knows and the refusal tests do not drive yet)."""
    driven = {name for name, _ in test_refused.OBJECT_CALLS + test_refused.BUCKET_CALLS}
    missing = sorted(
        op
        for op in MODEL.operation_names
        if op not in SERVED | ELSEWHERE and xform_name(op) not in driven and not _refused_by_the_table(op)
    )
    assert not missing, f"S3 operations neither served nor refused: {missing}"


def test_every_query_parameter_of_a_served_operation_is_known_to_the_table() -> None:
    """A parameter the table does not know is refused when it comes bare: never one a served
    operation sends."""
    known = subresources.SUBRESOURCES | subresources.PARAMETERS
    unknown = {op: sorted(_query_names(op) - known) for op in SERVED}
    assert not {op: names for op, names in unknown.items() if names}


def test_each_refused_operation_names_a_subresource_or_a_refused_header() -> None:
    """An unserved operation on the path of a served one is told apart by its subresource."""
    for op in MODEL.operation_names:
        if op in SERVED | ELSEWHERE:
            continue
        subs = _query_names(op) & subresources.SUBRESOURCES
        assert subs or op == "UploadPartCopy", op


def test_the_table_refuses_unknown_bare_parameters_and_two_subresources() -> None:
    def refused(args: dict[str, str], method: str = "DELETE", headers: dict[str, str] | None = None) -> bool:
        try:
            subresources.operation("object", method, args, headers or {})
        except subresources.S3Error as err:
            return err.code == "NotImplemented"
        return False

    assert refused({"annotation": ""}) and refused({"somethingNew": ""})
    assert refused({"acl": "", "tagging": ""}, method="GET")
    assert not refused({"versionId": "null", "cache-buster": "1"})
    assert refused({}, method="PUT", headers={"x-amz-object-lock-event-hold": "ON"})
    assert refused({}, method="GET", headers={"x-amz-server-side-encryption-customer-key-MD5": "x"})
    assert not refused({}, method="PUT", headers={"x-amz-request-payer": "requester"})
