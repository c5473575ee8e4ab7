"""Bucket-level reads S3 tools call, listings' paging, version ids and bucket names (boto3, real server)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError


def _code(err: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = err.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_versioning_location_and_versions_of_a_never_versioned_bucket(s3: Any, bucket: str) -> None:
    versioning = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in versioning and "MFADelete" not in versioning
    assert s3.get_bucket_location(Bucket=bucket)["LocationConstraint"] is None
    for key in ("a", "b/1", "b/2", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    listed = s3.list_object_versions(Bucket=bucket)
    versions = listed["Versions"]
    assert [v["Key"] for v in versions] == ["a", "b/1", "b/2", "c"]
    assert all(v["VersionId"] == "null" and v["IsLatest"] for v in versions)
    assert [v["Size"] for v in versions] == [1, 3, 3, 1]
    etags = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert {v["Key"]: v["ETag"] for v in versions} == etags
    assert "DeleteMarkers" not in listed and listed["IsTruncated"] is False


def test_list_object_versions_pages_and_rolls_up(s3: Any, bucket: str) -> None:
    for key in ("a", "b/1", "b/2", "c", "d"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    seen: list[str] = []
    args: dict[str, Any] = {"Bucket": bucket, "Delimiter": "/", "MaxKeys": 2}
    while True:
        page = s3.list_object_versions(**args)
        seen += [v["Key"] for v in page.get("Versions", [])]
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        if not page["IsTruncated"]:
            break
        args["KeyMarker"] = page["NextKeyMarker"]
    assert sorted(seen) == ["a", "b/", "c", "d"]
    assert len(seen) == 4
    paginator = s3.get_paginator("list_object_versions")
    paginated = paginator.paginate(Bucket=bucket, PaginationConfig={"PageSize": 1})
    assert [v["Key"] for page in paginated for v in page.get("Versions", [])] == ["a", "b/1", "b/2", "c", "d"]


def test_list_objects_v1_next_marker_is_the_last_key_or_prefix_returned(s3: Any, bucket: str) -> None:
    for key in ("boo/1", "boo/2", "foo", "zoo/x"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    first = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=1)
    assert [p["Prefix"] for p in first["CommonPrefixes"]] == ["boo/"]
    assert first["IsTruncated"] and first["NextMarker"] == "boo/"
    second = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=1, Marker=first["NextMarker"])
    assert [o["Key"] for o in second["Contents"]] == ["foo"] and second["NextMarker"] == "foo"
    third = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=5, Marker="foo")
    assert [p["Prefix"] for p in third["CommonPrefixes"]] == ["zoo/"] and not third["IsTruncated"]
    pages = s3.get_paginator("list_objects").paginate(
        Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 1}
    )
    names = [
        item.get("Prefix") or item["Key"]
        for page in pages
        for item in page.get("CommonPrefixes", []) + page.get("Contents", [])
    ]
    assert names == ["boo/", "foo", "zoo/"]


def test_list_objects_v2_fetch_owner(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert "Owner" not in s3.list_objects_v2(Bucket=bucket)["Contents"][0]
    owner = s3.list_objects_v2(Bucket=bucket, FetchOwner=True)["Contents"][0]["Owner"]
    assert owner["ID"] == "segstore"


def test_list_buckets_pages_with_max_buckets_and_continuation_token(s3: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    mine = [f"lb-{tag}-{i}" for i in range(5)]
    for name in mine:
        s3.create_bucket(Bucket=name)
    got: list[str] = []
    args: dict[str, Any] = {"MaxBuckets": 2, "Prefix": f"lb-{tag}-"}
    while True:
        page = s3.list_buckets(**args)
        names = [b["Name"] for b in page["Buckets"]]
        assert len(names) <= 2
        got += names
        if "ContinuationToken" not in page:
            break
        args["ContinuationToken"] = page["ContinuationToken"]
    assert got == mine
    everything = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert set(mine) <= set(everything)


def test_version_id_null_is_the_object_and_others_are_refused(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"abc")
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"abc"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="k", VersionId="3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY")
    assert _code(err) == ("InvalidArgument", 400)
    with pytest.raises(ClientError):
        s3.delete_object(Bucket=bucket, Key="k", VersionId="3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"abc"
    s3.delete_object(Bucket=bucket, Key="k", VersionId="null")
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="k")
    assert _code(err)[1] == 404


@pytest.mark.parametrize(
    "name",
    ["ab", "a" * 64, "Upper", "-lead", "trail-", "two..dots", "dot.-dash", "dash-.dot", "192.168.5.4",
     "xn--punycode", "sthree-x", "bucket-s3alias", "bucket--ol-s3", "under_score"],
)  # fmt: skip
def test_bucket_names_follow_s3_rules(s3: Any, name: str) -> None:
    with pytest.raises(ClientError) as err:
        s3.create_bucket(Bucket=name)
    assert _code(err) == ("InvalidBucketName", 400)


def test_valid_bucket_names_are_created(s3: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    for name in (f"a.b-{tag}", f"{tag}1" + "x" * 56, f"9{tag}"):
        s3.create_bucket(Bucket=name)
        assert s3.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
