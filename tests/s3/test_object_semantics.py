"""What an S3 object keeps and the conditions writes honour, as S3 does (boto3, real server)."""

from __future__ import annotations

import base64
import concurrent.futures
import datetime
import hashlib
import os
import zlib
from typing import Any

import pytest
from botocore.exceptions import ClientError

from bench.servers import ServerProcess
from tests.s3.conftest import make_client

PART = 5 * 1024 * 1024
META = {
    "ContentType": "text/csv; charset=utf-8",
    "ContentEncoding": "gzip",
    "ContentDisposition": 'attachment; filename="x.csv"',
    "ContentLanguage": "en",
    "CacheControl": "max-age=60",
    "Metadata": {"owner": "ann", "batch": "42"},
}
FUTURE = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
PAST = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def _code(err: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = err.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def _meta_of(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: answer.get(k) for k in META}


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _crc32(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def test_metadata_is_stored_and_returned(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="m", Body=b"a,b\n", Expires=FUTURE, **META)
    head = s3.head_object(Bucket=bucket, Key="m")
    got = s3.get_object(Bucket=bucket, Key="m")
    assert _meta_of(head) == META and _meta_of(got) == META
    assert head["ExpiresString"].startswith("Fri, 01 Jan 2100")
    s3.put_object(Bucket=bucket, Key="plain", Body=b"x")
    plain = s3.head_object(Bucket=bucket, Key="plain")
    assert plain["ContentType"] == "binary/octet-stream" and plain["Metadata"] == {}
    assert "ContentEncoding" not in plain  # botocore's aws-chunked is not the object's encoding


def test_user_metadata_over_2_kb_is_refused(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="big-meta", Body=b"x", Metadata={"a": "v" * 2100})
    assert _code(err) == ("MetadataTooLarge", 400)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="big-meta")


def test_copy_keeps_or_replaces_metadata(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"data", **META)
    s3.copy_object(Bucket=bucket, Key="same", CopySource=f"{bucket}/src")
    assert _meta_of(s3.head_object(Bucket=bucket, Key="same")) == META
    s3.copy_object(
        Bucket=bucket, Key="new", CopySource=f"{bucket}/src", MetadataDirective="REPLACE",
        ContentType="text/plain", Metadata={"fresh": "yes"},
    )  # fmt: skip
    replaced = s3.head_object(Bucket=bucket, Key="new")
    assert replaced["ContentType"] == "text/plain" and replaced["Metadata"] == {"fresh": "yes"}
    assert "CacheControl" not in replaced
    assert s3.get_object(Bucket=bucket, Key="new")["Body"].read() == b"data"


def test_copy_onto_itself_needs_replace(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="self", Body=b"data", Metadata={"v": "1"})
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="self", CopySource=f"{bucket}/self")
    assert _code(err) == ("InvalidRequest", 400)
    s3.copy_object(
        Bucket=bucket,
        Key="self",
        CopySource=f"{bucket}/self",
        MetadataDirective="REPLACE",
        Metadata={"v": "2"},
    )
    answer = s3.get_object(Bucket=bucket, Key="self")
    assert answer["Metadata"] == {"v": "2"} and answer["Body"].read() == b"data"


@pytest.mark.parametrize(
    "condition",
    [
        {"CopySourceIfMatch": '"0123456789abcdef0123456789abcdef"'},
        {"CopySourceIfNoneMatch": "ETAG"},
        {"CopySourceIfModifiedSince": FUTURE},
        {"CopySourceIfUnmodifiedSince": PAST},
    ],
    ids=["if-match", "if-none-match", "if-modified-since", "if-unmodified-since"],
)
def test_copy_source_conditions_fail_with_412_and_write_nothing(
    s3: Any, bucket: str, condition: dict[str, Any]
) -> None:
    etag = s3.put_object(Bucket=bucket, Key="src", Body=b"data")["ETag"]
    condition = {k: etag if v == "ETAG" else v for k, v in condition.items()}
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource=f"{bucket}/src", **condition)
    assert _code(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="dst")
    assert _code(err)[1] == 404


def test_copy_source_conditions_that_hold_copy(s3: Any, bucket: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="src", Body=b"data")["ETag"]
    s3.copy_object(
        Bucket=bucket, Key="dst", CopySource=f"{bucket}/src", CopySourceIfMatch=etag,
        CopySourceIfUnmodifiedSince=PAST,  # If-Match holds, so this one does not count (as on S3)
    )  # fmt: skip
    s3.copy_object(
        Bucket=bucket, Key="dst2", CopySource=f"{bucket}/src", CopySourceIfNoneMatch='"other"',
        CopySourceIfModifiedSince=PAST,
    )  # fmt: skip
    assert s3.get_object(Bucket=bucket, Key="dst2")["Body"].read() == b"data"


def test_delete_if_match(s3: Any, bucket: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="d", Body=b"data")["ETag"]
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket=bucket, Key="d", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert _code(err) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="d")["Body"].read() == b"data"
    s3.delete_object(Bucket=bucket, Key="d", IfMatch=etag)
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="d")
    assert _code(err)[1] == 404


def test_put_if_match_star_replaces_an_existing_object_only(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="p", Body=b"one")
    s3.put_object(Bucket=bucket, Key="p", Body=b"two", IfMatch="*")
    assert s3.get_object(Bucket=bucket, Key="p")["Body"].read() == b"two"
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="missing", Body=b"x", IfMatch="*")
    assert _code(err) == ("NoSuchKey", 404)


def _upload(s3: Any, bucket: str, key: str, sizes: list[int], **create: Any) -> tuple[str, list[dict], bytes]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    parts, data = [], b""
    for number, size in enumerate(sizes, 1):
        body = os.urandom(size)
        extra = {"ChecksumAlgorithm": create["ChecksumAlgorithm"]} if "ChecksumAlgorithm" in create else {}
        answer = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body, **extra
        )
        part = {"PartNumber": number, "ETag": answer["ETag"]}
        if "ChecksumCRC32" in answer and extra:
            part["ChecksumCRC32"] = answer["ChecksumCRC32"]
        parts.append(part)
        data += body
    return upload_id, parts, data


def test_complete_conditions(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="mp", Body=b"existing")
    upload_id, parts, data = _upload(s3, bucket, "mp", [10])
    done = {"Parts": parts}
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id, MultipartUpload=done,
                                     IfNoneMatch="*")  # fmt: skip
    assert _code(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id, MultipartUpload=done,
                                     IfMatch='"0123456789abcdef0123456789abcdef"')  # fmt: skip
    assert _code(err) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"existing"
    etag = s3.head_object(Bucket=bucket, Key="mp")["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=upload_id, MultipartUpload=done, IfMatch=etag
    )
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == data


def test_a_repeated_complete_answers_the_same_etag(s3: Any, bucket: str) -> None:
    upload_id, parts, data = _upload(s3, bucket, "again", [PART, 100])
    args = {"Bucket": bucket, "Key": "again", "UploadId": upload_id, "MultipartUpload": {"Parts": parts}}
    first = s3.complete_multipart_upload(**args)
    second = s3.complete_multipart_upload(**args)
    assert first["ETag"] == second["ETag"] and first["ETag"].endswith('-2"')
    assert s3.get_object(Bucket=bucket, Key="again")["Body"].read() == data
    # A retry is answered, not redone: its parts list and conditions are not judged again.
    third = s3.complete_multipart_upload(**{**args, "MultipartUpload": {"Parts": parts[:1]}}, IfNoneMatch="*")
    assert third["ETag"] == first["ETag"]
    assert s3.get_object(Bucket=bucket, Key="again")["Body"].read() == data
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(**{**args, "Key": "elsewhere"})
    assert _code(err) == ("NoSuchUpload", 404)


def test_part_number_reads_one_part(s3: Any, bucket: str, s3_server: ServerProcess) -> None:
    upload_id, parts, data = _upload(s3, bucket, "parts", [PART, 1000])
    s3.complete_multipart_upload(
        Bucket=bucket, Key="parts", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    first = s3.get_object(Bucket=bucket, Key="parts", PartNumber=1)
    assert first["PartsCount"] == 2 and first["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert first["ContentRange"] == f"bytes 0-{PART - 1}/{PART + 1000}"
    assert first["Body"].read() == data[:PART]
    second = s3.head_object(Bucket=bucket, Key="parts", PartNumber=2)
    assert second["ContentLength"] == 1000 and second["PartsCount"] == 2
    assert s3.get_object(Bucket=bucket, Key="parts", PartNumber=2)["Body"].read() == data[PART:]
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="parts", PartNumber=3)
    assert _code(err) == ("InvalidPartNumber", 416)
    s3.put_object(Bucket=bucket, Key="single", Body=b"whole")
    single = s3.get_object(Bucket=bucket, Key="single", PartNumber=1)
    assert single["Body"].read() == b"whole" and "PartsCount" not in single
    # As on S3: the one part of a single-part object is a range naming all of it.
    assert single["ResponseMetadata"]["HTTPStatusCode"] == 206 and single["ContentRange"] == "bytes 0-4/5"
    head = s3.head_object(Bucket=bucket, Key="single", PartNumber=1)
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 206 and head["ContentLength"] == 5
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    empty = s3.get_object(Bucket=bucket, Key="empty", PartNumber=1)
    assert empty["ResponseMetadata"]["HTTPStatusCode"] == 200 and empty["Body"].read() == b""
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="single", PartNumber=2)
    assert _code(err) == ("InvalidPartNumber", 416)
    unchecked = make_client(s3_server.url, parameter_validation=False)
    for bad in (0, 10001):
        with pytest.raises(ClientError) as err:
            unchecked.get_object(Bucket=bucket, Key="single", PartNumber=bad)
        assert _code(err) == ("InvalidArgument", 400)
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="parts", PartNumber=1, Range="bytes=0-1")
    assert _code(err) == ("InvalidRequest", 400)


def test_checksums_are_kept_and_returned_with_checksum_mode(s3: Any, bucket: str) -> None:
    data = b"checksummed bytes"
    s3.put_object(Bucket=bucket, Key="sha", Body=data, ChecksumAlgorithm="SHA256")
    head = s3.head_object(Bucket=bucket, Key="sha", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == _b64(hashlib.sha256(data).digest())
    assert head["ChecksumType"] == "FULL_OBJECT"
    got = s3.get_object(Bucket=bucket, Key="sha", ChecksumMode="ENABLED")
    assert got["ChecksumSHA256"] == head["ChecksumSHA256"] and got["Body"].read() == data
    assert "ChecksumSHA256" not in s3.head_object(Bucket=bucket, Key="sha")
    s3.copy_object(Bucket=bucket, Key="sha-copy", CopySource=f"{bucket}/sha")
    copied = s3.head_object(Bucket=bucket, Key="sha-copy", ChecksumMode="ENABLED")
    assert copied["ChecksumSHA256"] == head["ChecksumSHA256"]


def test_multipart_checksums_are_composite(s3: Any, bucket: str) -> None:
    created = s3.create_multipart_upload(Bucket=bucket, Key="crc", ChecksumAlgorithm="CRC32")
    assert created["ChecksumAlgorithm"] == "CRC32"
    s3.abort_multipart_upload(Bucket=bucket, Key="crc", UploadId=created["UploadId"])
    upload_id, parts, data = _upload(
        s3,
        bucket,
        "crc",
        [PART, 77],
        ChecksumAlgorithm="CRC32",
        ContentType="text/plain",
        Metadata={"k": "v"},
    )
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="crc", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    part_crcs = _crc32(data[:PART]) + _crc32(data[PART:])
    composite = f"{_b64(_crc32(part_crcs))}-2"
    assert done["ChecksumCRC32"] == composite
    head = s3.head_object(Bucket=bucket, Key="crc", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == composite and head["ChecksumType"] == "COMPOSITE"
    assert head["ContentType"] == "text/plain" and head["Metadata"] == {"k": "v"}


def test_multipart_part_without_the_upload_checksum_is_refused(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm="SHA256")["UploadId"]
    with pytest.raises(ClientError) as err:
        s3.upload_part(
            Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"x", ChecksumAlgorithm="CRC32"
        )
    assert _code(err) == ("InvalidRequest", 400)
    assert s3.list_parts(Bucket=bucket, Key="k", UploadId=upload_id).get("Parts", []) == []


def test_part_checksums_are_listed_and_read_per_part(s3: Any, bucket: str) -> None:
    upload_id, parts, data = _upload(s3, bucket, "pc", [PART, 300], ChecksumAlgorithm="CRC32")
    listed = s3.list_parts(Bucket=bucket, Key="pc", UploadId=upload_id)
    assert [p["ChecksumCRC32"] for p in listed["Parts"]] == [p["ChecksumCRC32"] for p in parts]
    assert listed["ChecksumAlgorithm"] == "CRC32"
    s3.complete_multipart_upload(
        Bucket=bucket, Key="pc", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    # The checksum of the bytes answered: one part's (botocore checks the body against it).
    second = s3.get_object(Bucket=bucket, Key="pc", PartNumber=2, ChecksumMode="ENABLED")
    assert second["ChecksumCRC32"] == _b64(_crc32(data[PART:])) and second["Body"].read() == data[PART:]
    first = s3.head_object(Bucket=bucket, Key="pc", PartNumber=1, ChecksumMode="ENABLED")
    assert first["ChecksumCRC32"] == _b64(_crc32(data[:PART]))
    ranged = s3.get_object(Bucket=bucket, Key="pc", Range="bytes=0-9", ChecksumMode="ENABLED")
    assert "ChecksumCRC32" not in ranged and ranged["Body"].read() == data[:10]
    whole = s3.head_object(Bucket=bucket, Key="pc", ChecksumMode="ENABLED")
    assert whole["ChecksumCRC32"].endswith("-2")


def test_complete_of_a_checksum_upload_needs_every_part_checksum(s3: Any, bucket: str) -> None:
    upload_id, parts, data = _upload(s3, bucket, "need", [PART, 10], ChecksumAlgorithm="CRC32")
    bare = [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in parts]
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="need", UploadId=upload_id, MultipartUpload={"Parts": bare}
        )
    assert _code(err) == ("InvalidRequest", 400)
    wrong = [{**parts[0], "ChecksumCRC32": parts[1]["ChecksumCRC32"]}, parts[1]]
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="need", UploadId=upload_id, MultipartUpload={"Parts": wrong}
        )
    assert _code(err) == ("InvalidPart", 400)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="need")
    s3.complete_multipart_upload(
        Bucket=bucket, Key="need", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert s3.get_object(Bucket=bucket, Key="need")["Body"].read() == data


def test_completes_sent_at_once_complete_once_and_answer_alike(s3: Any, bucket: str) -> None:
    upload_id, parts, data = _upload(s3, bucket, "race", [PART, 1000])
    args = {"Bucket": bucket, "Key": "race", "UploadId": upload_id, "MultipartUpload": {"Parts": parts}}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: s3.complete_multipart_upload(**args)["ETag"], range(4)))
    assert len(set(answers)) == 1 and answers[0].endswith('-2"')
    assert s3.get_object(Bucket=bucket, Key="race")["Body"].read() == data


def test_copy_answers_its_checksum_and_refuses_other_source_versions(s3: Any, bucket: str) -> None:
    data = b"copied bytes"
    s3.put_object(Bucket=bucket, Key="what now", Body=data, ChecksumAlgorithm="SHA256")
    copied = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "what now"})
    assert copied["CopyObjectResult"]["ChecksumSHA256"] == _b64(hashlib.sha256(data).digest())
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == data
    with pytest.raises(ClientError) as err:
        s3.copy_object(
            Bucket=bucket, Key="copy2", CopySource={"Bucket": bucket, "Key": "what now", "VersionId": "v7"}
        )
    assert _code(err) == ("InvalidArgument", 400)
    s3.copy_object(
        Bucket=bucket, Key="copy2", CopySource={"Bucket": bucket, "Key": "what now", "VersionId": "null"}
    )
    assert s3.get_object(Bucket=bucket, Key="copy2")["Body"].read() == data


def test_copy_onto_an_existing_key_with_if_none_match_is_refused(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    s3.put_object(Bucket=bucket, Key="dst", Body=b"kept")
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource=f"{bucket}/src", IfNoneMatch="*")
    assert _code(err) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"kept"
    with pytest.raises(ClientError) as err:
        s3.copy_object(
            Bucket=bucket, Key="dst", CopySource=f"{bucket}/src", IfMatch='"0123456789abcdef0123456789abcdef"'
        )
    assert _code(err) == ("PreconditionFailed", 412)
    s3.copy_object(Bucket=bucket, Key="new", CopySource=f"{bucket}/src", IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="new")["Body"].read() == b"source"


def test_a_complete_checksum_header_is_the_objects_composite_checksum(s3: Any, bucket: str) -> None:
    upload_id, parts, data = _upload(s3, bucket, "sum", [PART, 10], ChecksumAlgorithm="CRC32")
    composite = f"{_b64(_crc32(_crc32(data[:PART]) + _crc32(data[PART:])))}-2"
    args = {"Bucket": bucket, "Key": "sum", "UploadId": upload_id, "MultipartUpload": {"Parts": parts}}
    for wrong in (f"{_b64(_crc32(data))}-2", _b64(_crc32(b"other")), f"{composite[:-2]}-3"):
        with pytest.raises(ClientError) as err:
            s3.complete_multipart_upload(**args, ChecksumCRC32=wrong)
        assert _code(err) == ("BadDigest", 400)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="sum")  # refused: nothing published, the upload is intact
    done = s3.complete_multipart_upload(**args, ChecksumCRC32=composite)
    assert done["ChecksumCRC32"] == composite
    assert s3.get_object(Bucket=bucket, Key="sum")["Body"].read() == data


def test_a_complete_checksum_header_needs_an_upload_with_that_checksum(s3: Any, bucket: str) -> None:
    upload_id, parts, _ = _upload(s3, bucket, "plain", [10])
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="plain", UploadId=upload_id, MultipartUpload={"Parts": parts},
            ChecksumCRC32=_b64(_crc32(b"x")),
        )  # fmt: skip
    assert _code(err) == ("InvalidRequest", 400)
