"""S3 reads of a segment truncated through the native API: the object is the bytes that remain."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError

from app.s3.answers import from_engine
from bench.servers import ServerProcess
from engine import SegmentTruncated
from tests.s3.conftest import TOKEN

DATA = bytes(range(100))
CUT = 30


def _truncate(server: ServerProcess, name: str, offset: int) -> None:
    response = requests.post(
        f"{server.url}/v1/segments/{name}:truncate",
        json={"offset": offset},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.json()["start_offset"] == offset


def test_get_head_ranges_and_listings_agree_on_the_bytes_that_remain(
    s3: Any, s3_server: ServerProcess, bucket: str
) -> None:
    whole = s3.put_object(Bucket=bucket, Key="log/0", Body=DATA)["ETag"]
    _truncate(s3_server, f"{bucket}/log/0", CUT)
    rest = DATA[CUT:]

    head = s3.head_object(Bucket=bucket, Key="log/0")
    assert head["ContentLength"] == len(rest)
    assert head["ETag"] != whole and head["ETag"].endswith('-1"')  # no longer the MD5 of the upload
    got = s3.get_object(Bucket=bucket, Key="log/0")
    assert got["Body"].read() == rest
    assert got["ETag"] == head["ETag"]

    ranged = s3.get_object(Bucket=bucket, Key="log/0", Range="bytes=0-9")
    assert ranged["ContentRange"] == f"bytes 0-9/{len(rest)}"
    assert ranged["Body"].read() == rest[:10]
    assert s3.get_object(Bucket=bucket, Key="log/0", Range="bytes=-5")["Body"].read() == rest[-5:]
    assert s3.get_object(Bucket=bucket, Key="log/0", PartNumber=1)["Body"].read() == rest
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="log/0", Range=f"bytes={len(rest)}-")
    assert err.value.response["Error"]["Code"] == "InvalidRange"

    [listed] = s3.list_objects_v2(Bucket=bucket, Prefix="log/")["Contents"]
    assert (listed["Size"], listed["ETag"]) == (len(rest), head["ETag"])
    [version] = s3.list_object_versions(Bucket=bucket, Prefix="log/")["Versions"]
    assert version["Size"] == len(rest)


def test_a_copy_of_a_truncated_object_holds_the_bytes_that_remain(
    s3: Any, s3_server: ServerProcess, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=DATA)
    _truncate(s3_server, f"{bucket}/src", CUT)
    copied = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert copied["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(DATA[CUT:]).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == DATA[CUT:]


def test_appends_to_a_truncated_object_take_its_size_as_write_offset(
    s3: Any, s3_server: ServerProcess, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="app", Body=DATA, WriteOffsetBytes=0)
    _truncate(s3_server, f"{bucket}/app", CUT)
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="app", Body=b"!", WriteOffsetBytes=len(DATA))
    assert err.value.response["Error"]["Code"] == "InvalidWriteOffset"
    assert f"{len(DATA) - CUT} bytes long" in err.value.response["Error"]["Message"]
    s3.put_object(Bucket=bucket, Key="app", Body=b"!", WriteOffsetBytes=len(DATA) - CUT)
    assert s3.get_object(Bucket=bucket, Key="app")["Body"].read() == DATA[CUT:] + b"!"


def test_a_truncation_racing_a_read_is_a_conflict_not_an_internal_error() -> None:
    err = from_engine(SegmentTruncated("offset 0 is below the start offset 30"))
    assert (err.code, err.status) == ("OperationAborted", 409)
