"""S3ChunkStorage: Tier 2 in an S3 bucket (or any S3-compatible endpoint), one object per chunk.

The key of a chunk is the binding's prefix (``"segstore/"``, or none) plus
its name. boto3 talks over sockets, which gevent makes cooperative, so no
call here goes through ``run_blocking``.

- create: PutObject with ``If-None-Match: *``; a 412 means the name is taken
  (ChunkExists). When that 412 answers a retry botocore made on its own, the
  first attempt may have landed: if the object holds exactly our bytes, the
  create succeeded.
- read: a ranged GetObject; a range past the end (InvalidRange) is b"".
- No append and no truncation: objects are immutable, every write is a new
  chunk (``write``, ``open_write`` and ``truncate`` raise ChunkNotSupported).
- concat: the target is rewritten as target + sources by a multipart upload
  (see ``plan_parts``): pieces of at least 5 MiB are copied server-side with
  UploadPartCopy, runs of smaller ones are read and uploaded as one part.
  Every source is pinned to the ETag its HeadObject saw, so an object
  replaced meanwhile fails the concat instead of mixing versions. The new
  object replaces the target atomically when the upload completes; any
  failure aborts the upload and leaves the target as it was.
- Errors: NoSuchKey (404) is ChunkNotFound; a missing bucket or refused
  credentials (``PERMANENT_CODES``) are ChunkStorageUnusable, which no retry
  mends; every other service or connection error (refused connections,
  timeouts, 5xx, throttling) is a ChunkStorageError. botocore already retried
  the transient ones (standard mode) before it reached us.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError

from engine.tier2.chunk_storage import (
    ChunkExists,
    ChunkHandle,
    ChunkInfo,
    ChunkNotFound,
    ChunkNotSupported,
    ChunkStorageError,
    ChunkStorageUnusable,
    Pieces,
    pieces_of,
)

MiB = 1024 * 1024
# S3's multipart limits: every part but the last at least 5 MiB, at most 5 GiB, 10,000 parts.
MIN_PART_BYTES = 5 * MiB
MAX_PART_BYTES = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_KEY_BYTES = 1024
DEFAULT_REGION = "us-east-1"
# S3 error codes that say the bucket or the credentials are wrong, not that S3 is down.
PERMANENT_CODES = frozenset(
    {
        "NoSuchBucket",
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidBucketName",
        "AuthorizationHeaderMalformed",
        "PermanentRedirect",
        "InvalidToken",
        "ExpiredToken",
        "AccountProblem",
        "Forbidden",
        "403",  # a HEAD answer has no body, so no code but its status
    }
)


def make_client(endpoint_url: str | None = None) -> Any:
    """An S3 client: credentials and region from the usual AWS variables, retries, a wide pool.

    A custom endpoint (MinIO, moto, ...) is addressed path-style, which they all accept.
    Response checksums are checked only where the API requires it: every read
    here is a ranged GetObject, for which S3 sends no checksum of the bytes
    returned; endpoints that send the whole object's checksum for a range
    covering it (moto) would cost a CRC32 pass over every byte read.
    """
    session = boto3.session.Session()
    config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        max_pool_connections=64,
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        response_checksum_validation="when_required",
    )
    return session.client(
        "s3", region_name=session.region_name or DEFAULT_REGION, endpoint_url=endpoint_url, config=config
    )


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes ``[start, end)`` of the object ``key`` as it was at ``etag``."""

    key: str
    etag: str
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a multipart upload: one piece copied server-side, or pieces read and uploaded."""

    pieces: tuple[Piece, ...]
    copy: bool

    @property
    def length(self) -> int:
        return sum(p.length for p in self.pieces)


def plan_parts(objects: Sequence[Piece], min_part_bytes: int, part_bytes: int) -> list[Part]:
    """Split the concatenation of ``objects`` into multipart-upload parts, in order.

    Every part but the last holds at least ``min_part_bytes``. A run of
    at least ``min_part_bytes`` within one object is copied server-side, in
    parts of at most ``part_bytes`` (or just under ``2 * min_part_bytes``
    when that is larger). Smaller runs gather into one uploaded part until it
    reaches ``min_part_bytes``, topped up from the next object if needed, or
    until the end.
    """
    assert 0 < min_part_bytes <= part_bytes, (min_part_bytes, part_bytes)
    parts: list[Part] = []
    pending: list[Piece] = []
    pending_bytes = 0
    for obj in objects:
        assert obj.end > obj.start, obj
        start = obj.start
        if pending:
            take = min(obj.end - start, min_part_bytes - pending_bytes)
            pending.append(replace(obj, end=start + take))
            pending_bytes += take
            start += take
            if pending_bytes == min_part_bytes:
                parts.append(Part(tuple(pending), copy=False))
                pending, pending_bytes = [], 0
        rest = obj.end - start
        if rest >= min_part_bytes:
            count = min(math.ceil(rest / part_bytes), rest // min_part_bytes)
            bounds = [start + rest * i // count for i in range(count + 1)]
            for a, b in itertools.pairwise(bounds):
                parts.append(Part((replace(obj, start=a, end=b),), copy=True))
        elif rest:
            pending.append(replace(obj, start=start))
            pending_bytes += rest
    if pending:
        parts.append(Part(tuple(pending), copy=False))
    return parts


class S3ChunkStorage:
    """Chunks as objects in ``bucket`` under ``prefix``; no append, concat by multipart upload."""

    supports_append = False
    supports_concat = True
    supports_truncation = False

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client: Any = None,
        multipart_part_bytes: int = 8 * MiB,
    ) -> None:
        if not MIN_PART_BYTES <= multipart_part_bytes <= MAX_PART_BYTES:
            raise ValueError(f"multipart_part_bytes must lie in [5 MiB, 5 GiB], not {multipart_part_bytes}")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.multipart_part_bytes = multipart_part_bytes
        self.client = client if client is not None else make_client(endpoint_url)

    def _key(self, name: str) -> str:
        key = self.prefix + name
        if not name or len(key.encode()) > MAX_KEY_BYTES:
            raise ValueError(f"bad chunk name {name!r}")
        return key

    # ------------------------------------------------------------ create
    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        """PutObject if no object has the name yet; ChunkExists otherwise."""
        key = self._key(name)
        with _translated("create", name):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
            except ClientError as exc:
                if error_code(exc) != "PreconditionFailed" and error_status(exc) != 412:
                    raise
                if not (was_retried(exc) and self._holds(name, data)):
                    raise ChunkExists(f"chunk {name!r} exists") from None
        return ChunkHandle(name, read_only=False)

    def _holds(self, name: str, data: bytes) -> bool:
        """Whether chunk ``name`` holds exactly ``data``."""
        return self.read(ChunkHandle(name, read_only=True), 0, len(data) + 1) == data

    # ------------------------------------------------------------ lookups
    def exists(self, name: str) -> bool:
        try:
            self.info(name)
        except ChunkNotFound:
            return False
        return True

    def open_read(self, name: str) -> ChunkHandle:
        self.info(name)
        return ChunkHandle(name, read_only=True)

    def open_write(self, name: str) -> ChunkHandle:
        raise ChunkNotSupported("S3 objects cannot be written to once created")

    def info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, self._head(name)[0])

    def _head(self, name: str) -> tuple[int, str]:
        """The object's length and ETag."""
        with _translated("head", name):
            answer = self.client.head_object(Bucket=self.bucket, Key=self._key(name))
        return int(answer["ContentLength"]), str(answer["ETag"])

    # ------------------------------------------------------------- data
    def _ranged_get(self, handle: ChunkHandle, offset: int, length: int) -> dict[str, Any] | None:
        """GetObject of ``length`` (> 0) bytes from ``offset``; None past the object's end."""
        with _translated("read", handle.name):
            try:
                return self.client.get_object(
                    Bucket=self.bucket,
                    Key=self._key(handle.name),
                    Range=f"bytes={offset}-{offset + length - 1}",
                )
            except ClientError as exc:
                if error_code(exc) == "InvalidRange":
                    return None
                raise

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """A ranged GetObject; fewer bytes only at the end, b"" past it or for length 0."""
        _check_range(offset, length)
        answer = self._ranged_get(handle, offset, length) if length else None
        if answer is None:
            return b""
        with _translated("read", handle.name):
            data = _body(answer)
        content_range = answer.get("ContentRange")
        if content_range is None:  # the endpoint ignored the range and sent the whole object
            return data[offset : offset + length]
        expected = _expected_length(content_range, offset, length)
        if len(data) != expected:
            raise ChunkStorageError(f"read of {handle.name!r} at {offset}: {len(data)} bytes, not {expected}")
        return data

    def read_stream(self, handle: ChunkHandle, offset: int, length: int, piece_bytes: int) -> Pieces:
        """One ranged GetObject, its body read piece by piece as the caller consumes it."""
        _check_range(offset, length)
        if piece_bytes <= 0:
            raise ValueError(f"piece_bytes must be positive, not {piece_bytes}")
        answer = self._ranged_get(handle, offset, length) if length else None
        if answer is None:
            return
        body = answer["Body"]
        content_range = answer.get("ContentRange")
        if content_range is None:  # the endpoint ignored the range
            body.close()
            yield from pieces_of(self.read, handle, offset, length, piece_bytes)
            return
        left = _expected_length(content_range, offset, length)
        try:
            while left > 0:
                with _translated("read", handle.name):
                    piece = body.read(min(piece_bytes, left))
                if not piece:
                    raise ChunkStorageError(f"read of {handle.name!r} at {offset}: the body ended early")
                left -= len(piece)
                yield piece
        finally:
            body.close()

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        raise ChunkNotSupported("S3 objects cannot be appended to")

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        raise ChunkNotSupported("S3 objects cannot be truncated")

    def concat(self, target: ChunkHandle, sources: Sequence[str]) -> int:
        """Rewrite ``target`` as target + sources with one multipart upload; returns its new length."""
        if target.read_only:
            raise ValueError(f"chunk handle {target.name!r} is read-only")
        key = self._key(target.name)
        names = [target.name, *sources]
        heads = [self._head(name) for name in names]
        total = sum(length for length, _ in heads)
        if total == heads[0][0]:
            return total  # nothing to append
        objects = [
            Piece(self._key(name), etag, 0, length)
            for name, (length, etag) in zip(names, heads, strict=True)
            if length
        ]
        parts = plan_parts(objects, MIN_PART_BYTES, self.multipart_part_bytes)
        if len(parts) > MAX_PARTS:
            raise ChunkNotSupported(
                f"concat into {target.name!r} needs {len(parts)} parts; S3 allows {MAX_PARTS}"
            )
        with _translated("concat into", target.name):
            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
            try:
                done = [
                    {"PartNumber": number, "ETag": self._upload_part(key, upload, number, part)}
                    for number, part in enumerate(parts, start=1)
                ]
                self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}
                )
            except BaseException:
                with contextlib.suppress(ClientError, BotoCoreError):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
                raise
        return total

    def _upload_part(self, key: str, upload: str, number: int, part: Part) -> str:
        """Copy or upload one part; returns its ETag."""
        common = {"Bucket": self.bucket, "Key": key, "UploadId": upload, "PartNumber": number}
        if part.copy:
            (piece,) = part.pieces
            answer = self.client.upload_part_copy(
                **common,
                CopySource={"Bucket": self.bucket, "Key": piece.key},
                CopySourceRange=f"bytes={piece.start}-{piece.end - 1}",
                CopySourceIfMatch=piece.etag,
            )
            return str(answer["CopyPartResult"]["ETag"])
        body = b"".join(self._read_piece(piece) for piece in part.pieces)
        assert len(body) == part.length, (len(body), part)
        return str(self.client.upload_part(**common, Body=body)["ETag"])

    def _read_piece(self, piece: Piece) -> bytes:
        answer = self.client.get_object(
            Bucket=self.bucket,
            Key=piece.key,
            Range=f"bytes={piece.start}-{piece.end - 1}",
            IfMatch=piece.etag,
        )
        data = _body(answer)
        if len(data) != piece.length:
            raise ChunkStorageError(f"concat read {len(data)} bytes of {piece}, not {piece.length}")
        return data

    # ---------------------------------------------------------- clean-up
    def delete(self, name: str) -> None:
        """DeleteObject; S3 answers the same whether or not the object existed."""
        key = self._key(name)
        with _translated("delete", name):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    def list(self, prefix: str = "") -> Iterator[ChunkInfo]:
        """ListObjectsV2 page by page (S3 lists keys in name order)."""
        paginator = self.client.get_paginator("list_objects_v2")
        with _translated("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for obj in page.get("Contents", ()):
                    yield ChunkInfo(obj["Key"][len(self.prefix) :], int(obj["Size"]))


@contextlib.contextmanager
def _translated(what: str, name: str) -> Iterator[None]:
    """botocore's errors as chunk errors: NoSuchKey is ChunkNotFound, the rest ChunkStorageError."""
    try:
        yield
    except ClientError as exc:
        code = error_code(exc)
        if code in ("NoSuchKey", "NotFound", "404"):
            raise ChunkNotFound(f"no chunk {name!r}") from exc
        if code in PERMANENT_CODES:
            raise ChunkStorageUnusable(f"S3 {what} {name!r} failed: {code}: {exc}") from exc
        raise ChunkStorageError(f"S3 {what} {name!r} failed: {code or error_status(exc)}: {exc}") from exc
    except ParamValidationError:
        raise
    except NoCredentialsError as exc:
        raise ChunkStorageUnusable(f"S3 {what} {name!r} failed: {exc}") from exc
    except BotoCoreError as exc:
        raise ChunkStorageError(f"S3 {what} {name!r} failed: {exc}") from exc


def _check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise ValueError(f"bad read range: offset {offset}, length {length}")


def _expected_length(content_range: str, offset: int, length: int) -> int:
    """How many bytes a ranged answer holds: ``length``, cut at the object's end."""
    return max(0, min(length, int(content_range.rpartition("/")[2]) - offset))


def _body(answer: dict[str, Any]) -> bytes:
    body = answer["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_status(exc: ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def was_retried(exc: ClientError) -> bool:
    """Whether botocore retried the request before this answer (an earlier attempt may have landed)."""
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0
