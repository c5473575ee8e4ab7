"""CreateBucket's configuration, DeleteObjects' per-object fields, bucket names (boto3, real server)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from app.s3 import objects
from bench.servers import ServerProcess
from engine import SegmentStore, Settings
from tests.processes import killed_at_exit
from tests.s3.conftest import ACCESS_KEY, SECRET_KEY, make_client


def _error(err: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = err.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def _absent(s3: Any, name: str) -> bool:
    with pytest.raises(ClientError) as err:
        s3.head_bucket(Bucket=name)
    return _error(err)[1] == 404 and name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_create_bucket_takes_the_one_region(s3: Any) -> None:
    name = f"r-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-east-1"})
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] is None
    listed = {b["Name"]: b for b in s3.list_buckets(Prefix=name)["Buckets"]}
    assert listed[name]["BucketRegion"] == "us-east-1"
    assert s3.list_buckets(Prefix=name, BucketRegion="us-east-1")["Buckets"]
    assert not s3.list_buckets(Prefix=name, BucketRegion="eu-west-1")["Buckets"]


@pytest.mark.parametrize(
    ("configuration", "expected"),
    [
        ({"LocationConstraint": "eu-west-1"}, ("IllegalLocationConstraintException", 400)),
        ({"Tags": [{"Key": "a", "Value": "b"}]}, ("NotImplemented", 501)),
        ({"Location": {"Type": "AvailabilityZone", "Name": "use1-az4"}}, ("NotImplemented", 501)),
        ({"Bucket": {"Type": "Directory"}}, ("NotImplemented", 501)),
    ],
    ids=["other-region", "tags", "location", "directory"],
)
def test_create_bucket_refuses_what_it_would_not_keep(
    s3: Any, configuration: dict[str, Any], expected: tuple[str, int]
) -> None:
    name = f"r-{uuid.uuid4().hex[:12]}"
    with pytest.raises(ClientError) as err:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration=configuration)
    assert _error(err) == expected
    assert _absent(s3, name)


def test_delete_objects_honours_each_objects_fields(s3: Any, bucket: str) -> None:
    for key in ("plain", "null", "other-version", "etag-ok", "etag-bad", "size"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    etag = s3.head_object(Bucket=bucket, Key="etag-ok")["ETag"]
    answer = s3.delete_objects(
        Bucket=bucket,
        Delete={
            "Objects": [
                {"Key": "plain"},
                {"Key": "null", "VersionId": "null"},
                {"Key": "other-version", "VersionId": "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"},
                {"Key": "etag-ok", "ETag": etag},
                {"Key": "etag-bad", "ETag": '"0123456789abcdef0123456789abcdef"'},
                {"Key": "size", "Size": 4},
            ]
        },
    )
    assert sorted(d["Key"] for d in answer["Deleted"]) == ["etag-ok", "null", "plain"]
    errors = {e["Key"]: e["Code"] for e in answer["Errors"]}
    assert errors == {
        "other-version": "InvalidArgument",
        "etag-bad": "PreconditionFailed",
        "size": "NotImplemented",
    }
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert left == ["etag-bad", "other-version", "size"]


@pytest.mark.parametrize("name", ["ab", "Upper", "dot.-dash", "192.168.5.4", "xn--punycode", "under_score"])
def test_other_operations_on_a_name_no_bucket_can_have_answer_no_such_bucket(s3: Any, name: str) -> None:
    """Only CreateBucket says InvalidBucketName; elsewhere the bucket just does not exist."""
    for call, args in [
        (s3.head_bucket, {}),
        (s3.list_objects_v2, {}),
        (s3.put_object, {"Key": "k", "Body": b"x"}),
        (s3.delete_bucket, {}),
    ]:
        with pytest.raises(ClientError) as err:
            call(Bucket=name, **args)
        assert _error(err)[1] == 404
    assert _absent(s3, name)


@pytest.mark.process
def test_a_bucket_named_before_the_rules_stays_reachable(tmp_path: Path) -> None:
    """A data folder holding ``192.168.5.4`` and ``a.-b`` (creatable before S3's full rules)."""
    data = tmp_path / "data"
    store = SegmentStore(Settings(data_dir=str(data)))
    store.start(wait=True)
    for bucket in ("192.168.5.4", "a.-b"):
        store.create(objects.bucket_marker(bucket))
        store.seal(objects.bucket_marker(bucket))
        store.create(f"{bucket}/k")
        store.append(f"{bucket}/k", b"old bytes")
    store.close()
    env = {"SEGSTORE_S3_KEYS": f"{ACCESS_KEY}:{SECRET_KEY}"}
    with killed_at_exit(ServerProcess(data, env=env)) as server:
        s3 = make_client(server.url)
        for bucket in ("192.168.5.4", "a.-b"):
            assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"old bytes"
            assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]
            s3.delete_object(Bucket=bucket, Key="k")
            s3.delete_bucket(Bucket=bucket)
            with pytest.raises(ClientError) as err:
                s3.create_bucket(Bucket=bucket)
            assert _error(err) == ("InvalidBucketName", 400)
        assert not s3.list_buckets()["Buckets"]
