"""S3 features segstore does not serve answer 501 NotImplemented and change nothing (boto3, real server).

Each call below names a subresource (``?acl``, ``?tagging``, ...) or a header
(tags, object lock, encryption, grants) that S3 defines and segstore does not
keep. Before the routing table, several of them ran the plain operation of
the same path: ``PUT ?acl`` replaced the object with an empty body, ``DELETE
?tagging`` deleted it, ``DELETE ?cors`` deleted an empty bucket.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

B = "{bucket}"
BODY = b"the object's bytes, which must survive every refused request"
RETAIN = "2030-01-01T00:00:00Z"
LOCK = {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}}
RULES = {"Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}]}
SSE = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
CORS = {"CORSRules": [{"AllowedMethods": ["GET"], "AllowedOrigins": ["*"]}]}
TAGS = {"TagSet": [{"Key": "a", "Value": "b"}]}
REPLICATION = {
    "Role": "arn:aws:iam::1:role/r",
    "Rules": [{"Status": "Enabled", "Prefix": "", "Destination": {"Bucket": "arn:aws:s3:::x"}}],
}
IT = {"Id": "t", "Status": "Enabled", "Tierings": [{"Days": 90, "AccessTier": "ARCHIVE_ACCESS"}]}
INVENTORY = {
    "Id": "i", "IsEnabled": True, "IncludedObjectVersions": "Current", "Schedule": {"Frequency": "Daily"},
    "Destination": {"S3BucketDestination": {"Bucket": "arn:aws:s3:::x", "Format": "CSV"}},
}  # fmt: skip
PAB = {"BlockPublicAcls": True}
KMS_KEY = "arn:aws:kms:us-east-1:111122223333:key/k"
JOURNAL = {"JournalTableConfiguration": {"RecordExpiration": {"Expiration": "DISABLED"}}}
SSE_C = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}

# (boto3 operation, its arguments): every one must answer 501 and touch nothing.
OBJECT_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("put_object_acl", {"ACL": "public-read"}),
    ("get_object_acl", {}),
    ("put_object_tagging", {"Tagging": TAGS}),
    ("get_object_tagging", {}),
    ("delete_object_tagging", {}),
    ("put_object_retention", {"Retention": {"Mode": "GOVERNANCE", "RetainUntilDate": RETAIN}}),
    ("get_object_retention", {}),
    ("put_object_legal_hold", {"LegalHold": {"Status": "ON"}}),
    ("get_object_legal_hold", {}),
    ("get_object_attributes", {"ObjectAttributes": ["ETag", "ObjectSize"]}),
    ("restore_object", {"RestoreRequest": {"Days": 1}}),
    ("get_object_torrent", {}),
    ("put_object_annotation", {"AnnotationName": "n", "AnnotationPayload": b"note"}),
    ("get_object_annotation", {"AnnotationName": "n"}),
    ("delete_object_annotation", {"AnnotationName": "n"}),
    ("list_object_annotations", {}),
    ("update_object_encryption", {"ObjectEncryption": {"SSEKMS": {"KMSKeyArn": KMS_KEY}}}),
    ("rename_object", {"RenameSource": f"{B}/k"}),
    ("select_object_content", {"Expression": "select * from s3object", "ExpressionType": "SQL",
                               "InputSerialization": {"CSV": {}}, "OutputSerialization": {"CSV": {}}}),
    ("upload_part_copy", {"UploadId": "u", "PartNumber": 1, "CopySource": f"{B}/k"}),
    ("put_object", {"Body": b"x", "Tagging": "a=b"}),
    ("put_object", {"Body": b"x", "ObjectLockMode": "GOVERNANCE", "ObjectLockRetainUntilDate": RETAIN}),
    ("put_object", {"Body": b"x", "ObjectLockLegalHoldStatus": "ON"}),
    ("put_object", {"Body": b"x", "ServerSideEncryption": "aws:kms"}),
    ("put_object", {"Body": b"x", **SSE_C}),
    ("put_object", {"Body": b"x", "StorageClass": "GLACIER"}),
    ("put_object", {"Body": b"x", "ACL": "public-read"}),
    ("put_object", {"Body": b"x", "GrantRead": "id=someone"}),
    ("put_object", {"Body": b"x", "WebsiteRedirectLocation": "/elsewhere"}),
    ("put_object", {"Body": b"x", "ObjectLockEventHold": "ON"}),
    ("delete_object", {"IfMatchSize": 3}),
    ("delete_object", {"IfMatchLastModifiedTime": RETAIN}),
    ("get_object", SSE_C),
    ("copy_object", {"CopySource": f"{B}/k", "MetadataDirective": "REPLACE", "Tagging": "a=b",
                     "TaggingDirective": "REPLACE"}),
    ("create_multipart_upload", {"Tagging": "a=b"}),
    ("create_multipart_upload", {"ServerSideEncryption": "AES256"}),
    ("abort_multipart_upload", {"UploadId": "u", "IfMatchInitiatedTime": RETAIN}),
]  # fmt: skip

BUCKET_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("put_bucket_acl", {"ACL": "public-read"}),
    ("get_bucket_acl", {}),
    ("put_bucket_tagging", {"Tagging": TAGS}),
    ("get_bucket_tagging", {}),
    ("delete_bucket_tagging", {}),
    ("put_bucket_versioning", {"VersioningConfiguration": {"Status": "Enabled"}}),
    ("put_bucket_policy", {"Policy": '{"Version": "2012-10-17", "Statement": []}'}),
    ("get_bucket_policy", {}),
    ("get_bucket_policy_status", {}),
    ("delete_bucket_policy", {}),
    ("put_bucket_cors", {"CORSConfiguration": CORS}),
    ("get_bucket_cors", {}),
    ("delete_bucket_cors", {}),
    ("put_bucket_lifecycle_configuration", {"LifecycleConfiguration": RULES}),
    ("get_bucket_lifecycle_configuration", {}),
    ("delete_bucket_lifecycle", {}),
    ("put_bucket_encryption", {"ServerSideEncryptionConfiguration": SSE}),
    ("get_bucket_encryption", {}),
    ("delete_bucket_encryption", {}),
    ("put_bucket_logging", {"BucketLoggingStatus": {}}),
    ("get_bucket_logging", {}),
    ("put_bucket_website", {"WebsiteConfiguration": {"IndexDocument": {"Suffix": "index.html"}}}),
    ("get_bucket_website", {}),
    ("delete_bucket_website", {}),
    ("put_bucket_replication", {"ReplicationConfiguration": REPLICATION}),
    ("get_bucket_replication", {}),
    ("delete_bucket_replication", {}),
    ("put_bucket_notification_configuration", {"NotificationConfiguration": {}}),
    ("get_bucket_notification_configuration", {}),
    ("put_bucket_accelerate_configuration", {"AccelerateConfiguration": {"Status": "Enabled"}}),
    ("get_bucket_accelerate_configuration", {}),
    ("put_bucket_request_payment", {"RequestPaymentConfiguration": {"Payer": "Requester"}}),
    ("get_bucket_request_payment", {}),
    ("put_bucket_ownership_controls",
     {"OwnershipControls": {"Rules": [{"ObjectOwnership": "ObjectWriter"}]}}),
    ("get_bucket_ownership_controls", {}),
    ("delete_bucket_ownership_controls", {}),
    ("put_public_access_block", {"PublicAccessBlockConfiguration": PAB}),
    ("get_public_access_block", {}),
    ("delete_public_access_block", {}),
    ("put_object_lock_configuration", {"ObjectLockConfiguration": LOCK}),
    ("get_object_lock_configuration", {}),
    ("put_bucket_intelligent_tiering_configuration", {"Id": "t", "IntelligentTieringConfiguration": IT}),
    ("get_bucket_intelligent_tiering_configuration", {"Id": "t"}),
    ("delete_bucket_intelligent_tiering_configuration", {"Id": "t"}),
    ("list_bucket_intelligent_tiering_configurations", {}),
    ("put_bucket_inventory_configuration", {"Id": "i", "InventoryConfiguration": INVENTORY}),
    ("get_bucket_inventory_configuration", {"Id": "i"}),
    ("delete_bucket_inventory_configuration", {"Id": "i"}),
    ("list_bucket_inventory_configurations", {}),
    ("get_bucket_analytics_configuration", {"Id": "a"}),
    ("delete_bucket_analytics_configuration", {"Id": "a"}),
    ("list_bucket_analytics_configurations", {}),
    ("put_bucket_metrics_configuration", {"Id": "m", "MetricsConfiguration": {"Id": "m"}}),
    ("get_bucket_metrics_configuration", {"Id": "m"}),
    ("delete_bucket_metrics_configuration", {"Id": "m"}),
    ("list_bucket_metrics_configurations", {}),
    ("put_bucket_analytics_configuration",
     {"Id": "a", "AnalyticsConfiguration": {"Id": "a", "StorageClassAnalysis": {}}}),
    ("put_bucket_lifecycle", {"LifecycleConfiguration": {"Rules": [
        {"Prefix": "", "Status": "Enabled", "Expiration": {"Days": 1}}]}}),
    ("get_bucket_lifecycle", {}),
    ("put_bucket_notification", {"NotificationConfiguration": {}}),
    ("get_bucket_notification", {}),
    ("put_bucket_abac", {"AbacStatus": {"Status": "Enabled"}}),
    ("get_bucket_abac", {}),
    ("create_bucket_metadata_configuration", {"MetadataConfiguration": JOURNAL}),
    ("get_bucket_metadata_configuration", {}),
    ("delete_bucket_metadata_configuration", {}),
    ("create_bucket_metadata_table_configuration", {"MetadataTableConfiguration": {
        "S3TablesDestination": {"TableBucketArn": "arn:aws:s3tables:x", "TableName": "t"}}}),
    ("get_bucket_metadata_table_configuration", {}),
    ("delete_bucket_metadata_table_configuration", {}),
    ("update_bucket_metadata_inventory_table_configuration",
     {"InventoryTableConfiguration": {"ConfigurationState": "ENABLED"}}),
    ("update_bucket_metadata_journal_table_configuration", JOURNAL),
    ("update_bucket_metadata_annotation_table_configuration",
     {"AnnotationTableConfiguration": {"ConfigurationState": "ENABLED"}}),
    ("create_session", {}),
    ("list_multipart_uploads", {}),
]  # fmt: skip


def _fill(value: Any, bucket: str) -> Any:
    if isinstance(value, str):
        return value.replace(B, bucket)
    if isinstance(value, dict):
        return {k: _fill(v, bucket) for k, v in value.items()}
    return value


def _snapshot(s3: Any, bucket: str) -> tuple[Any, ...]:
    """Everything a refused request could have changed: the bucket, its keys, the object."""
    s3.head_bucket(Bucket=bucket)
    listing = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    keys = [(o["Key"], o["ETag"], o["Size"], o["LastModified"]) for o in listing]
    obj = s3.get_object(Bucket=bucket, Key="k") if keys else None
    return keys, obj and obj["Body"].read(), obj and obj["ETag"]


def _assert_refused(call: Callable[..., Any], **kwargs: Any) -> None:
    with pytest.raises(ClientError) as err:
        call(**kwargs)
    response = err.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 501, response
    assert response["Error"]["Code"] == "NotImplemented", response


OBJECT_IDS = [f"{operation}-{i}" for i, (operation, _) in enumerate(OBJECT_CALLS)]


@pytest.mark.parametrize(("operation", "args"), OBJECT_CALLS, ids=OBJECT_IDS)
def test_unserved_object_operations_answer_501_and_touch_nothing(
    s3: Any, bucket: str, operation: str, args: dict[str, Any]
) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=BODY)
    before = _snapshot(s3, bucket)
    assert before[1] == BODY
    _assert_refused(getattr(s3, operation), Bucket=bucket, Key="k", **_fill(args, bucket))
    assert _snapshot(s3, bucket) == before


@pytest.mark.parametrize(("operation", "args"), BUCKET_CALLS, ids=[o for o, _ in BUCKET_CALLS])
@pytest.mark.parametrize("empty", [True, False], ids=["empty", "holding"])
def test_unserved_bucket_operations_answer_501_and_touch_nothing(
    s3: Any, bucket: str, operation: str, args: dict[str, Any], empty: bool
) -> None:
    if not empty:
        s3.put_object(Bucket=bucket, Key="k", Body=BODY)
    before = _snapshot(s3, bucket)
    _assert_refused(getattr(s3, operation), Bucket=bucket, **args)
    assert _snapshot(s3, bucket) == before


def test_a_new_bucket_with_object_lock_is_refused(s3: Any) -> None:
    name = f"b-{uuid.uuid4().hex[:12]}"
    _assert_refused(s3.create_bucket, Bucket=name, ObjectLockEnabledForBucket=True)
    with pytest.raises(ClientError):
        s3.head_bucket(Bucket=name)


def test_harmless_header_values_are_served(s3: Any, bucket: str) -> None:
    """The values that ask for what segstore does anyway: private ACL, STANDARD storage class."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"abc", ACL="private", StorageClass="STANDARD")
    s3.put_object(Bucket=bucket, Key="j", Body=b"abc", ACL="bucket-owner-full-control")
    s3.copy_object(Bucket=bucket, Key="c", CopySource=f"{bucket}/k", TaggingDirective="COPY")
    assert s3.get_object(Bucket=bucket, Key="c")["Body"].read() == b"abc"


def _with_query(s3: Any, event: str, query: str) -> Callable[..., None]:
    """A botocore hook that adds ``query`` to the URL of ``event``'s requests before they are signed."""

    def add(request: Any, **_: Any) -> None:
        request.url += ("&" if "?" in request.url else "?") + query

    s3.meta.events.register(f"before-sign.s3.{event}", add)
    return add


@pytest.mark.parametrize("query", ["annotationz", "futureFeature=", "acl&tagging"])
def test_a_subresource_this_table_does_not_know_is_refused(s3: Any, bucket: str, query: str) -> None:
    """A parameter S3 may define later, sent the way subresources are sent, is not run as DeleteObject."""
    s3.put_object(Bucket=bucket, Key="k", Body=BODY)
    before = _snapshot(s3, bucket)
    hook = _with_query(s3, "DeleteObject", query)
    try:
        _assert_refused(s3.delete_object, Bucket=bucket, Key="k")
    finally:
        s3.meta.events.unregister("before-sign.s3.DeleteObject", hook)
    assert _snapshot(s3, bucket) == before


def test_parameters_with_a_value_that_s3_does_not_define_are_ignored(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=BODY)
    hook = _with_query(s3, "GetObject", "cache-buster=12&prefix=")
    try:
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == BODY
    finally:
        s3.meta.events.unregister("before-sign.s3.GetObject", hook)


def test_expected_bucket_owner_is_checked(s3: Any, bucket: str) -> None:
    """Every bucket's owner is ``segstore`` (the Owner ID listings show); another expected owner is 403."""
    s3.put_object(Bucket=bucket, Key="k", Body=BODY, ExpectedBucketOwner="segstore")
    owner = s3.list_objects_v2(Bucket=bucket, FetchOwner=True)["Contents"][0]["Owner"]["ID"]
    assert owner == "segstore"
    before = _snapshot(s3, bucket)
    for call, args in [
        (s3.delete_object, {"Key": "k"}),
        (s3.put_object, {"Key": "k", "Body": b"other"}),
        (s3.delete_bucket, {}),
        (s3.copy_object, {"Key": "c", "CopySource": f"{bucket}/k", "ExpectedSourceBucketOwner": "1"}),
    ]:
        expected = {} if "ExpectedSourceBucketOwner" in args else {"ExpectedBucketOwner": "111122223333"}
        with pytest.raises(ClientError) as err:
            call(Bucket=bucket, **args, **expected)
        assert err.value.response["Error"]["Code"] == "AccessDenied"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert _snapshot(s3, bucket) == before


def test_request_payer_changes_nothing(s3: Any, bucket: str) -> None:
    """No bucket is Requester Pays, so ``x-amz-request-payer`` is accepted as S3 accepts it there."""
    s3.put_object(Bucket=bucket, Key="k", Body=BODY, RequestPayer="requester")
    assert s3.get_object(Bucket=bucket, Key="k", RequestPayer="requester")["Body"].read() == BODY
