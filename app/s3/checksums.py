"""The checksums S3 clients send (``x-amz-checksum-*`` headers and trailers), computed incrementally.

Each is base64 of the big-endian digest, as S3 writes them. CRC64/NVME is
table-driven pure Python (slow, about 10 MB/s): botocore sends it only when
asked to, as it needs awscrt to compute it itself.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable
from typing import Protocol

import crc32c

_CRC64NVME_POLY = 0x9A6C9329AC4BC9B5
_MASK64 = 0xFFFFFFFFFFFFFFFF


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC64NVME_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC64_TABLE = _crc64_table()


class Checksum(Protocol):
    def update(self, data: bytes) -> None: ...
    def digest(self) -> bytes: ...


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


class _Crc32c(_Crc32):
    def update(self, data: bytes) -> None:
        self.value = crc32c.crc32c(data, value=self.value)


class _Crc64Nvme:
    def __init__(self) -> None:
        self.value = _MASK64

    def update(self, data: bytes) -> None:
        crc, table = self.value, _CRC64_TABLE
        for byte in data:
            crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        self.value = crc

    def digest(self) -> bytes:
        return (self.value ^ _MASK64).to_bytes(8, "big")


_ALGORITHMS: dict[str, Callable[[], Checksum]] = {
    "crc32": _Crc32,
    "crc32c": _Crc32c,
    "crc64nvme": _Crc64Nvme,
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
    "md5": hashlib.md5,
}
HEADER_PREFIX = "x-amz-checksum-"


def new(algorithm: str) -> Checksum | None:
    """A fresh checksum for ``crc32``, ``sha256``, ...; None for an algorithm this server lacks."""
    factory = _ALGORITHMS.get(algorithm.lower())
    return factory() if factory is not None else None


def encode(checksum: Checksum) -> str:
    return base64.b64encode(checksum.digest()).decode("ascii")
