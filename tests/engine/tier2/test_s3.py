"""S3ChunkStorage beyond the contract: the multipart plan, the requests a concat makes, failures."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from hypothesis import given
from hypothesis import strategies as st

from bench.servers import free_port
from engine.tier2.chunk_storage import (
    ChunkExists,
    ChunkHandle,
    ChunkNotFound,
    ChunkStorageError,
    ChunkStorageUnusable,
)
from engine.tier2.s3 import MIN_PART_BYTES, Piece, S3ChunkStorage, make_client, plan_parts

MiB = 1024 * 1024


# ------------------------------------------------------------------ the plan
def pieces(*sizes: int) -> list[Piece]:
    return [Piece(f"k{i}", f'"etag{i}"', 0, size) for i, size in enumerate(sizes)]


def covered(parts: list[Any]) -> list[tuple[str, int, int]]:
    """The (key, start, end) runs the parts cover, in order, with adjacent runs of one key merged."""
    runs: list[tuple[str, int, int]] = []
    for piece in itertools.chain.from_iterable(part.pieces for part in parts):
        if runs and runs[-1][0] == piece.key and runs[-1][2] == piece.start:
            runs[-1] = (piece.key, runs[-1][1], piece.end)
        else:
            runs.append((piece.key, piece.start, piece.end))
    return runs


@given(
    st.lists(st.integers(min_value=1, max_value=40), max_size=12),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=10),
)
def test_the_plan_covers_every_byte_in_order_with_big_enough_parts(
    sizes: list[int], min_part: int, extra: int
) -> None:
    part_bytes = min_part + extra
    objects = pieces(*sizes)
    parts = plan_parts(objects, min_part, part_bytes)
    assert covered(parts) == [(p.key, 0, p.end) for p in objects]
    for part in parts[:-1]:
        assert part.length >= min_part
    for part in parts:
        assert part.pieces and all(p.length > 0 for p in part.pieces)
        if part.copy:
            assert len(part.pieces) == 1
            assert min_part <= part.length <= max(part_bytes, 2 * min_part - 1)
        else:
            assert part.length < 2 * min_part


def test_the_plan_copies_big_pieces_and_gathers_small_ones() -> None:
    k = MiB
    parts = plan_parts(pieces(6 * k, 11 * k, 100, 6 * k, 7), MIN_PART_BYTES, 5 * k)
    shape = [(p.copy, [(q.key, q.start, q.end) for q in p.pieces]) for p in parts]
    assert shape == [
        (True, [("k0", 0, 6 * k)]),
        (True, [("k1", 0, 11 * k // 2)]),  # split in two ranges: 11 MiB > 5 MiB per part
        (True, [("k1", 11 * k // 2, 11 * k)]),
        (False, [("k2", 0, 100), ("k3", 0, 5 * k - 100)]),  # topped up from the next piece
        (False, [("k3", 5 * k - 100, 6 * k), ("k4", 0, 7)]),
    ]
    assert plan_parts(pieces(1, 2, 3), MIN_PART_BYTES, 8 * k) == [
        type(parts[0])(tuple(pieces(1, 2, 3)), copy=False)
    ]
    assert plan_parts([], MIN_PART_BYTES, 8 * k) == []


# --------------------------------------------------------- against moto
@pytest.fixture
def requests_made(s3_client: Any) -> Iterator[list[str]]:
    """The names of the S3 operations the shared client sends during the test."""
    made: list[str] = []

    def record(model: Any, **_: Any) -> None:
        made.append(model.name)

    s3_client.meta.events.register("before-call.s3", record)
    yield made
    s3_client.meta.events.unregister("before-call.s3", record)


@pytest.fixture
def storage(s3_bucket: str, s3_client: Any) -> S3ChunkStorage:
    return S3ChunkStorage(s3_bucket, "p/", client=s3_client, multipart_part_bytes=MIN_PART_BYTES)


def test_concat_copies_big_pieces_server_side(storage: S3ChunkStorage, requests_made: list[str]) -> None:
    big = random.Random(1).randbytes(11 * MiB)
    handle = storage.create("t", big)
    storage.create("s", b"tail")
    requests_made.clear()
    assert storage.concat(handle, ["s"]) == len(big) + 4
    assert requests_made == [
        "HeadObject",
        "HeadObject",
        "CreateMultipartUpload",
        "UploadPartCopy",
        "UploadPartCopy",
        "GetObject",
        "UploadPart",
        "CompleteMultipartUpload",
    ]
    assert storage.read(handle, 0, 12 * MiB) == big + b"tail"


def test_concat_of_small_pieces_is_one_uploaded_part(
    storage: S3ChunkStorage, requests_made: list[str]
) -> None:
    handle = storage.create("t")
    for i in range(3):
        storage.create(f"s{i}", b"%d" % i * 10)
    requests_made.clear()
    assert storage.concat(handle, ["s0", "s1", "s2"]) == 30
    assert requests_made.count("UploadPart") == 1 and "UploadPartCopy" not in requests_made
    assert requests_made.count("GetObject") == 3  # the empty target is not read
    assert storage.read(handle, 0, 100) == b"0" * 10 + b"1" * 10 + b"2" * 10


def test_a_failed_concat_aborts_its_upload_and_keeps_the_target(
    storage: S3ChunkStorage, s3_client: Any, s3_bucket: str
) -> None:
    handle = storage.create("t", b"target")
    storage.create("s", b"source")

    def refuse(**_: Any) -> None:
        raise EndpointConnectionError(endpoint_url="http://injected")

    s3_client.meta.events.register("before-call.s3.UploadPart", refuse)
    try:
        with pytest.raises(ChunkStorageError):
            storage.concat(handle, ["s"])
    finally:
        s3_client.meta.events.unregister("before-call.s3.UploadPart", refuse)
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert storage.read(handle, 0, 100) == b"target"


def test_a_source_replaced_during_a_concat_fails_it(
    storage: S3ChunkStorage, s3_client: Any, s3_bucket: str
) -> None:
    handle = storage.create("t", b"target")
    storage.create("s", b"source")

    def replace_source(**_: Any) -> None:
        s3_client.meta.events.unregister("before-call.s3.CreateMultipartUpload", replace_source)
        s3_client.put_object(Bucket=s3_bucket, Key="p/s", Body=b"replaced!")

    s3_client.meta.events.register("before-call.s3.CreateMultipartUpload", replace_source)
    with pytest.raises(ChunkStorageError, match="PreconditionFailed"):
        storage.concat(handle, ["s"])
    assert storage.read(handle, 0, 100) == b"target"


class RetriedAfterLanding:
    """A client whose PutObject is sent, then answers 412 as a retry would after the first one landed."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **kwargs: Any) -> None:
        with contextlib.suppress(ClientError):
            self._client.put_object(**kwargs)
        raise ClientError(
            {
                "Error": {"Code": "PreconditionFailed", "Message": "At least one precondition failed"},
                "ResponseMetadata": {"HTTPStatusCode": 412, "RetryAttempts": 1},
            },
            "PutObject",
        )


def test_a_retried_create_that_had_landed_succeeds(s3_bucket: str, s3_client: Any) -> None:
    storage = S3ChunkStorage(s3_bucket, client=RetriedAfterLanding(s3_client))
    assert storage.create("c", b"mine") == ChunkHandle("c", read_only=False)
    assert storage.create("empty") == ChunkHandle("empty", read_only=False)
    assert storage.read(ChunkHandle("c", read_only=True), 0, 10) == b"mine"


def test_a_retried_create_of_a_name_taken_before_is_chunk_exists(s3_bucket: str, s3_client: Any) -> None:
    s3_client.put_object(Bucket=s3_bucket, Key="c", Body=b"someone else's")
    storage = S3ChunkStorage(s3_bucket, client=RetriedAfterLanding(s3_client))
    with pytest.raises(ChunkExists):
        storage.create("c", b"mine")
    assert storage.read(ChunkHandle("c", read_only=True), 0, 100) == b"someone else's"


def test_names_are_keys_under_the_prefix(storage: S3ChunkStorage, s3_client: Any, s3_bucket: str) -> None:
    storage.create("c0/a", b"abc")
    s3_client.put_object(Bucket=s3_bucket, Key="other/c0/b", Body=b"not ours")
    s3_client.put_object(Bucket=s3_bucket, Key="p-not/c0/c", Body=b"not ours")
    assert s3_client.get_object(Bucket=s3_bucket, Key="p/c0/a")["Body"].read() == b"abc"
    assert [i.name for i in storage.list()] == ["c0/a"]
    assert [i.name for i in S3ChunkStorage(s3_bucket, client=s3_client).list("c0/")] == []


def test_a_missing_bucket_is_a_storage_error_not_a_missing_chunk(s3_client: Any, moto_endpoint: str) -> None:
    storage = S3ChunkStorage("no-such-bucket", client=s3_client)
    with pytest.raises(ChunkStorageError) as caught:
        storage.create("c", b"x")
    assert not isinstance(caught.value, ChunkNotFound)
    with pytest.raises(ChunkStorageError) as caught:
        storage.read(ChunkHandle("c", read_only=True), 0, 1)
    assert not isinstance(caught.value, ChunkNotFound)
    with pytest.raises(ChunkStorageUnusable, match="NoSuchBucket"):  # a misconfiguration, not an outage
        list(storage.list())


def test_an_unreachable_endpoint_is_a_storage_error(moto_endpoint: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    storage = S3ChunkStorage("bucket", client=client)
    for call in (
        lambda: storage.create("c", b"x"),
        lambda: storage.exists("c"),
        lambda: storage.read(ChunkHandle("c", read_only=True), 0, 1),
        lambda: storage.delete("c"),
    ):
        with pytest.raises(ChunkStorageError) as caught:
            call()
        assert not isinstance(caught.value, ChunkNotFound | ChunkStorageUnusable)  # an outage: retried


def test_the_default_client(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    client = make_client(moto_endpoint)
    assert client.meta.region_name == "us-east-1"
    assert client.meta.config.max_pool_connections >= 32
    assert client.meta.config.retries["total_max_attempts"] >= 3
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert make_client().meta.region_name == "eu-west-1"


def test_a_storage_built_from_an_endpoint_works(s3_bucket: str, moto_endpoint: str) -> None:
    storage = S3ChunkStorage(s3_bucket, "/segstore/", endpoint_url=moto_endpoint)
    storage.create("c0/x", b"hello")
    assert storage.prefix == "segstore/"
    assert [(i.name, i.length) for i in storage.list()] == [("c0/x", 5)]


def test_part_sizes_outside_what_s3_allows_are_refused(s3_client: Any) -> None:
    with pytest.raises(ValueError):
        S3ChunkStorage("b", client=s3_client, multipart_part_bytes=MIN_PART_BYTES - 1)
    with pytest.raises(ValueError):
        S3ChunkStorage("b", client=s3_client, multipart_part_bytes=6 * 1024 * MiB)
