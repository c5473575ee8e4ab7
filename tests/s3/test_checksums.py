"""The checksum implementations against their published check values ("123456789")."""

from __future__ import annotations

import base64

import pytest

from app.s3 import checksums


@pytest.mark.parametrize(
    ("algorithm", "check"),
    [
        (
            "crc32",
            0xCBF43926,
        ),
        ("crc32c", 0xE3069283),
        ("crc64nvme", 0xAE8B14860A799888),
    ],
)
def test_crc_check_values(algorithm: str, check: int) -> None:
    checksum = checksums.new(algorithm)
    assert checksum is not None
    checksum.update(b"1234")
    checksum.update(b"56789")  # incremental
    assert int.from_bytes(checksum.digest(), "big") == check
    assert base64.b64decode(checksums.encode(checksum)) == checksum.digest()


def test_unknown_algorithm() -> None:
    assert checksums.new("xxhash3") is None
