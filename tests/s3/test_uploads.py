"""Multipart uploads, boto3's managed transfers and aws-chunked bodies against a real server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import requests
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum, Sha1Checksum, Sha256Checksum

from bench.servers import ServerProcess
from tests.s3.conftest import ACCESS_KEY, SECRET_KEY

MiB = 1024 * 1024


def test_multipart_upload_of_three_parts_in_part_order(s3: Any, bucket: str) -> None:
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(MiB // 3)]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big/object")
    upload_id = upload["UploadId"]
    etags = {}
    for number in (3, 1, 2):  # sent out of order: the complete request sets the order
        etags[number] = s3.upload_part(
            Bucket=bucket, Key="big/object", UploadId=upload_id, PartNumber=number, Body=parts[number - 1]
        )["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="big/object", UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [(n, len(parts[n - 1])) for n in (1, 2, 3)]
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # nothing visible before completion
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="big/object",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3)]},
    )
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    assert done["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-3"'
    got = s3.get_object(Bucket=bucket, Key="big/object")
    assert got["Body"].read() == b"".join(parts)
    assert got["ETag"] == done["ETag"]
    with pytest.raises(ClientError) as err:
        s3.list_parts(Bucket=bucket, Key="big/object", UploadId=upload_id)
    assert err.value.response["Error"]["Code"] == "NoSuchUpload"


def test_complete_checks_order_and_etags_and_abort_drops_parts(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"one")["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=2, Body=b"two")["ETag"]
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]},
        )
    assert err.value.response["Error"]["Code"] == "InvalidPartOrder"
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e2}]},
        )
    assert err.value.response["Error"]["Code"] == "InvalidPart"
    s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id)
    with pytest.raises(ClientError) as err:
        s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=3, Body=b"x")
    assert err.value.response["Error"]["Code"] == "NoSuchUpload"
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="k")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_managed_transfers_upload_and_parallel_ranged_download(s3: Any, bucket: str, tmp_path: Path) -> None:
    data = os.urandom(12 * MiB + 5)
    source = tmp_path / "up.bin"
    source.write_bytes(data)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4)
    s3.upload_file(str(source), bucket, "managed.bin", Config=config)
    assert s3.head_object(Bucket=bucket, Key="managed.bin")["ETag"].endswith('-3"')
    target = tmp_path / "down.bin"
    small = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB, max_concurrency=6)
    s3.download_file(bucket, "managed.bin", str(target), Config=small)  # 13 ranged GETs, 6 at a time
    assert target.read_bytes() == data


def _signed_headers(url: str, payload: str, extra: dict[str, str]) -> dict[str, str]:
    """Headers of a PUT signed as botocore signs, but with ``payload`` as x-amz-content-sha256."""

    class StreamingAuth(S3SigV4Auth):
        def payload(self, request: AWSRequest) -> str:
            return payload

    request = AWSRequest(method="PUT", url=url, headers=extra)
    StreamingAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def _chunk_signature(headers: dict[str, str], previous: str, chunk: bytes) -> str:
    timestamp = headers["X-Amz-Date"]
    scope = f"{timestamp[:8]}/us-east-1/s3/aws4_request"
    key = f"AWS4{SECRET_KEY}".encode()
    for part in (timestamp[:8], "us-east-1", "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    text = "\n".join(
        [
            "AWS4-HMAC-SHA256-PAYLOAD",
            timestamp,
            scope,
            previous,
            hashlib.sha256(b"").hexdigest(),
            hashlib.sha256(chunk).hexdigest(),
        ]
    )
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _signed_chunked_put(url: str, chunks: list[bytes], *, corrupt: bool = False) -> requests.Response:
    size = sum(len(c) for c in chunks)
    headers = _signed_headers(
        url,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(size)},
    )
    previous = headers["Authorization"].rsplit("Signature=", 1)[1]
    body = b""
    for chunk in [*chunks, b""]:
        signature = _chunk_signature(headers, previous, chunk)
        previous = signature
        sent = chunk[:-1] + b"?" if corrupt and chunk else chunk
        body += f"{len(chunk):x};chunk-signature={signature}\r\n".encode() + sent + b"\r\n"
    return requests.put(url, data=body, headers=headers, timeout=30)


def test_signed_aws_chunked_body(s3: Any, s3_server: ServerProcess, bucket: str) -> None:
    url = f"{s3_server.url}/{bucket}/chunked.bin"
    chunks = [os.urandom(64 * 1024), os.urandom(64 * 1024), b"tail"]
    response = _signed_chunked_put(url, chunks)
    assert response.status_code == 200, response.text
    assert s3.get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == b"".join(chunks)
    bad = _signed_chunked_put(f"{s3_server.url}/{bucket}/bad.bin", chunks, corrupt=True)
    assert bad.status_code == 403
    assert b"SignatureDoesNotMatch" in bad.content
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="bad.bin")


def _trailer_put(url: str, data: bytes, crc: str) -> requests.Response:
    headers = _signed_headers(
        url,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        {
            "Content-Encoding": "aws-chunked",
            "X-Amz-Decoded-Content-Length": str(len(data)),
            "X-Amz-Trailer": "x-amz-checksum-crc32",
        },
    )
    body = (
        f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n" + f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    )
    return requests.put(url, data=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("algorithm", "checksum_cls"),
    [("crc32", Crc32Checksum), ("sha256", Sha256Checksum), ("sha1", Sha1Checksum)],
)
def test_botocore_aws_chunked_body_as_sent_over_https(
    s3: Any, s3_server: ServerProcess, bucket: str, algorithm: str, checksum_cls: type
) -> None:
    """Over https botocore sends uploads aws-chunked with a checksum trailer; its own encoder builds one."""
    data = os.urandom(300_000)
    header = f"x-amz-checksum-{algorithm}"
    body = AwsChunkedWrapper(
        io.BytesIO(data), checksum_cls=checksum_cls, checksum_name=header, chunk_size=65536
    )
    url = f"{s3_server.url}/{bucket}/wrapped-{algorithm}"
    headers = _signed_headers(
        url,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        {
            "Content-Encoding": "aws-chunked",
            "X-Amz-Decoded-Content-Length": str(len(data)),
            "X-Amz-Trailer": header,
        },
    )
    response = requests.put(url, data=body.read(), headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert s3.get_object(Bucket=bucket, Key=f"wrapped-{algorithm}")["Body"].read() == data


def test_unsigned_trailer_checksum_is_checked(s3: Any, s3_server: ServerProcess, bucket: str) -> None:
    data = b"trailer checked bytes"
    good = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    response = _trailer_put(f"{s3_server.url}/{bucket}/t.bin", data, good)
    assert response.status_code == 200, response.text
    assert response.headers["x-amz-checksum-crc32"] == good
    assert s3.get_object(Bucket=bucket, Key="t.bin")["Body"].read() == data
    response = _trailer_put(f"{s3_server.url}/{bucket}/t.bin", b"other bytes", good)
    assert response.status_code == 400
    assert b"BadDigest" in response.content
    assert s3.get_object(Bucket=bucket, Key="t.bin")["Body"].read() == data  # the old object stays


@pytest.mark.parametrize("algorithm", ["CRC32", "SHA1", "SHA256"])  # CRC32C, CRC64NVME need awscrt
def test_botocore_default_checksums(s3: Any, bucket: str, algorithm: str) -> None:
    """Over http botocore sends the checksum as a header beside a signed SHA-256; both are checked."""
    data = os.urandom(100_000)
    s3.put_object(Bucket=bucket, Key=f"sum-{algorithm}", Body=data, ChecksumAlgorithm=algorithm)
    assert s3.get_object(Bucket=bucket, Key=f"sum-{algorithm}")["Body"].read() == data


def test_content_md5_mismatch_is_bad_digest(s3: Any, bucket: str) -> None:
    wrong = base64.b64encode(hashlib.md5(b"something else").digest()).decode()
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="md5", Body=b"payload", ContentMD5=wrong)
    assert err.value.response["Error"]["Code"] == "BadDigest"


def test_parts_but_the_last_are_at_least_5_mib(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="small")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="small", UploadId=upload_id, PartNumber=n, Body=b"tiny")["ETag"]
        for n in (1, 2)
    ]
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="small",
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n - 1]} for n in (1, 2)]},
        )
    assert err.value.response["Error"]["Code"] == "EntityTooSmall"
    done = s3.complete_multipart_upload(  # a single small part is the last part: fine
        Bucket=bucket,
        Key="small",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": etags[1]}]},
    )
    assert done["ETag"].endswith('-1"')
    assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == b"tiny"


def test_copy_object(s3: Any, bucket: str) -> None:
    data = os.urandom(3 * MiB)
    s3.put_object(Bucket=bucket, Key="src/a", Body=data)
    copied = s3.copy_object(Bucket=bucket, Key="dst/b", CopySource={"Bucket": bucket, "Key": "src/a"})
    assert copied["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="dst/b")["Body"].read() == data
    assert s3.get_object(Bucket=bucket, Key="src/a")["Body"].read() == data
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst/c", CopySource={"Bucket": bucket, "Key": "src/missing"})
    assert err.value.response["Error"]["Code"] == "NoSuchKey"
