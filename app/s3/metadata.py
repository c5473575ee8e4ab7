"""What an S3 object keeps besides its bytes: ETag, metadata headers, checksum, part sizes.

One ``Stored`` per object, kept as one JSON line in the object's record
segment (``objects.record_name``) together with the segment id and length
it describes, so a record never speaks for other bytes than its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from app.s3.errors import S3Error

# The system metadata S3 stores as sent and returns on GetObject/HeadObject.
STORED_HEADERS = (
    "Content-Type",
    "Content-Encoding",
    "Content-Disposition",
    "Content-Language",
    "Cache-Control",
    "Expires",
)
USER_PREFIX = "x-amz-meta-"
# As on S3: the user-defined metadata of a PUT request is at most 2 KB (names and values, UTF-8).
USER_MAX_BYTES = 2048
DEFAULT_CONTENT_TYPE = "binary/octet-stream"
CHECKSUM_PREFIX = "x-amz-checksum-"
CHECKSUM_TYPE = "x-amz-checksum-type"


@dataclass(frozen=True)
class Stored:
    """An object's ETag, metadata (header name -> value), checksum headers, part sizes and checksums.

    ``part_checksums``: each part's checksum (base64) when the object has a
    composite checksum, in part order.
    """

    etag: str
    meta: dict[str, str] = field(default_factory=dict)
    checksum: dict[str, str] = field(default_factory=dict)
    parts: tuple[int, ...] = ()
    part_checksums: tuple[str, ...] = ()

    def to_json(self, segment_id: int, length: int) -> bytes:
        record = {"id": segment_id, "length": length, "etag": self.etag}
        if self.meta:
            record["meta"] = self.meta
        if self.checksum:
            record["checksum"] = self.checksum
        if self.parts:
            record["parts"] = list(self.parts)
        if self.part_checksums:
            record["part_checksums"] = list(self.part_checksums)
        assert sum(self.parts) in (0, length), (self.parts, length)
        assert len(self.part_checksums) in (0, len(self.parts)), (self.part_checksums, self.parts)
        return json.dumps(record, ensure_ascii=False).encode() + b"\n"

    def part_checksum(self, number: int) -> dict[str, str]:
        """The checksum headers of part ``number`` (1-based) of a composite multipart object, else none."""
        algorithm = self.checksum_algorithm()
        if algorithm is None or not self.part_checksums:
            return {}
        return {CHECKSUM_PREFIX + algorithm: self.part_checksums[number - 1], CHECKSUM_TYPE: "COMPOSITE"}

    def checksum_algorithm(self) -> str | None:
        """The algorithm of the stored checksum (``crc32``, ``sha256``, ...), None without one."""
        for header in self.checksum:
            if header != CHECKSUM_TYPE:
                return header.removeprefix(CHECKSUM_PREFIX)
        return None

    @classmethod
    def from_json(cls, record: Mapping) -> Stored:
        return cls(
            str(record["etag"]),
            dict(record.get("meta", {})),
            dict(record.get("checksum", {})),
            tuple(record.get("parts", ())),
            tuple(record.get("part_checksums", ())),
        )


class RequestHeaders(Protocol):
    """A request's headers as the HTTP side hands them over (werkzeug's ``Headers``: ``get`` ignores case)."""

    def get(self, key: str) -> str | None: ...

    def items(self) -> Iterable[tuple[str, str]]: ...


def from_request(headers: RequestHeaders) -> dict[str, str]:
    """The metadata a PutObject, CopyObject (REPLACE) or CreateMultipartUpload sends.

    ``aws-chunked`` is a transfer detail, not the object's encoding, and is
    dropped from Content-Encoding as S3 does. User metadata over 2 KB is 400.
    """
    meta: dict[str, str] = {}
    for name in STORED_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        if name == "Content-Encoding":
            value = ",".join(p.strip() for p in value.split(",") if p.strip().lower() != "aws-chunked")
        if value:
            meta[name] = value
    user = {k.lower(): v for k, v in headers.items() if k.lower().startswith(USER_PREFIX)}
    size = sum(len(k.removeprefix(USER_PREFIX).encode()) + len(v.encode()) for k, v in user.items())
    if size > USER_MAX_BYTES:
        raise S3Error(
            "MetadataTooLarge",
            f"Your metadata headers exceed the maximum allowed metadata size: {size} > {USER_MAX_BYTES}",
        )
    return meta | dict(sorted(user.items()))


def response_headers(meta: Mapping[str, str]) -> dict[str, str]:
    """The headers a GetObject or HeadObject answers with for ``meta``."""
    return {"Content-Type": DEFAULT_CONTENT_TYPE, **meta}
