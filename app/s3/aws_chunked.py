"""Request bodies of PutObject and UploadPart: plain or ``aws-chunked``, checked as they stream.

``x-amz-content-sha256`` says how the body comes:

- a SHA-256 in hex, or ``UNSIGNED-PAYLOAD``: the plain bytes (the hash is
  checked at the end: XAmzContentSHA256Mismatch);
- ``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` (botocore's default for uploads over
  https; over http it sends the plain body, its SHA-256 signed, and an
  ``x-amz-checksum-crc32`` header):
  ``aws-chunked`` chunks ``<hex size>\\r\\n<bytes>\\r\\n``, a zero chunk, then
  trailers such as ``x-amz-checksum-crc32:<base64>``;
- ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` (``-TRAILER``): each chunk header
  carries ``;chunk-signature=<hex>``, chained from the request's signature,
  and the trailer, if any, its ``x-amz-trailer-signature``.

The decoded length must equal ``x-amz-decoded-content-length``; a checksum
named by ``x-amz-trailer`` or sent as an ``x-amz-checksum-*`` header must
match (BadDigest), as must ``Content-MD5`` (BadDigest). The MD5 of the bytes
is always computed: it is a single-part object's ETag. Nothing is trusted
before ``finish`` has run, so callers stage the bytes and publish after it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterator
from typing import IO

from flask import Request

from app.s3 import checksums
from app.s3.errors import S3Error
from app.s3.sigv4 import Signing

UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK_HEADER = re.compile(rb"([0-9a-fA-F]{1,16})(?:;chunk-signature=([0-9a-f]{64}))?\r?\n")
_LINE_MAX = 4096
_READ_BYTES = 256 * 1024


class _Chunks:
    """The decoded bytes of an ``aws-chunked`` body, chunk signatures checked as they arrive."""

    def __init__(self, stream: IO[bytes], signing: Signing | None, signed: bool) -> None:
        self.stream = stream
        self.signing = signing
        self.signed = signed
        self.previous = signing.seed_signature if signing else ""
        self.left = 0
        self.done = False
        self.trailers: dict[str, str] = {}
        self.buffer = b""  # the current chunk's bytes, ``pos`` the next to hand out
        self.pos = 0

    def _line(self) -> bytes:
        line = self.stream.readline(_LINE_MAX)
        if not line.endswith(b"\n"):
            raise S3Error("IncompleteBody", "the aws-chunked body ended inside a chunk header")
        return line

    def _exact(self, size: int) -> bytes:
        pieces, left = [], size
        while left:
            piece = self.stream.read(left)
            if not piece:
                raise S3Error("IncompleteBody", "the aws-chunked body ended inside a chunk")
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces)

    def _next_chunk(self) -> bytes:
        match = _CHUNK_HEADER.fullmatch(self._line())
        if match is None or (self.signed and match.group(2) is None):
            raise S3Error("InvalidRequest", "malformed aws-chunked chunk header")
        size = int(match.group(1), 16)
        data = self._exact(size)
        if size:
            self._exact(2)  # the CRLF after the chunk's bytes
        if self.signed:
            assert self.signing is not None
            expected = self.signing.chunk_signature(self.previous, hashlib.sha256(data).hexdigest())
            if not hmac.compare_digest(expected, match.group(2).decode()):
                raise S3Error(
                    "SignatureDoesNotMatch", "a chunk signature of the aws-chunked body does not match"
                )
            self.previous = expected
        if size == 0:
            self._read_trailers()
        return data

    def _read_trailers(self) -> None:
        raw = b""
        while True:
            line = self.stream.readline(_LINE_MAX)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "x-amz-trailer-signature":
                if self.signing is not None and self.signed:
                    expected = self.signing.trailer_signature(self.previous, raw)
                    if not hmac.compare_digest(expected, value):
                        raise S3Error("SignatureDoesNotMatch", "the trailer signature does not match")
                continue
            raw += f"{name}:{value}\n".encode("latin-1")
            self.trailers[name] = value
        self.done = True

    def read(self, size: int) -> bytes:
        """Up to ``size`` decoded bytes; ``b""`` at the end."""
        while self.left == 0 and not self.done:
            self.buffer = self._next_chunk()
            self.left = len(self.buffer)
            self.pos = 0
        if self.left == 0:
            return b""
        take = min(size, self.left)
        data = self.buffer[self.pos : self.pos + take]
        self.pos += take
        self.left -= take
        return data


class Body:
    """One upload body: ``pieces`` yields its bytes, ``finish`` checks them (call it before trusting).

    ``checksum_headers``: whether ``x-amz-checksum-*`` headers are checksums
    of this body (on CompleteMultipartUpload they are the object's instead).
    """

    def __init__(self, req: Request, signing: Signing | None, *, checksum_headers: bool = True) -> None:
        payload = req.headers.get("X-Amz-Content-SHA256", UNSIGNED)
        self.payload_sha256 = payload if _HEX64.fullmatch(payload) else None
        self.md5 = hashlib.md5()
        self.sha256 = hashlib.sha256() if self.payload_sha256 else None
        self.length = 0
        self.content_md5 = req.headers.get("Content-MD5")
        self.checks: dict[str, tuple[checksums.Checksum, str | None]] = {}
        for name, value in req.headers.items() if checksum_headers else ():
            lname = name.lower()
            if lname.startswith(checksums.HEADER_PREFIX) and lname != "x-amz-checksum-type":
                self._expect(lname, value)
        trailer = req.headers.get("X-Amz-Trailer", "").strip().lower()
        if trailer:
            self._expect(trailer, None)
        if payload in (STREAMING_UNSIGNED_TRAILER, STREAMING_SIGNED, STREAMING_SIGNED_TRAILER):
            declared = req.headers.get("X-Amz-Decoded-Content-Length")
            if declared is None or not declared.isdigit():
                raise S3Error("MissingContentLength", "aws-chunked needs x-amz-decoded-content-length")
            self.declared: int | None = int(declared)
            signed = payload != STREAMING_UNSIGNED_TRAILER
            if signed and signing is None:
                raise S3Error("InvalidRequest", f"{payload} needs a signed request")
            self.chunks: _Chunks | None = _Chunks(req.stream, signing, signed)
            self.source: _Chunks | IO[bytes] = self.chunks
        else:
            self.declared = req.content_length
            self.chunks = None
            self.source = req.stream

    def _expect(self, header: str, value: str | None) -> None:
        algorithm = header.removeprefix(checksums.HEADER_PREFIX)
        checksum = checksums.new(algorithm)
        if checksum is None:
            raise S3Error("InvalidRequest", f"checksum algorithm {algorithm!r} is not supported here")
        self.checks[header] = (checksum, value)

    def pieces(self, piece_bytes: int) -> Iterator[bytes]:
        """The decoded body in pieces of at most ``piece_bytes`` (the last may be shorter)."""
        buffer = bytearray()
        while True:
            data = self.source.read(min(_READ_BYTES, piece_bytes - len(buffer)))
            if not data:
                break
            self._account(data)
            buffer += data
            if len(buffer) >= piece_bytes:
                yield bytes(buffer)
                buffer.clear()
        if buffer:
            yield bytes(buffer)

    def read_all(self, max_bytes: int) -> bytes:
        """The whole decoded body, refused (EntityTooLarge) past ``max_bytes``."""
        out = bytearray()
        for piece in self.pieces(_READ_BYTES):
            out += piece
            if len(out) > max_bytes:
                raise S3Error("EntityTooLarge", f"this request takes at most {max_bytes} bytes")
        return bytes(out)

    def _account(self, data: bytes) -> None:
        self.length += len(data)
        self.md5.update(data)
        if self.sha256 is not None:
            self.sha256.update(data)
        for checksum, _ in self.checks.values():
            checksum.update(data)

    def finish(self) -> None:
        """Check length, payload hash, Content-MD5 and checksums of everything read."""
        if self.declared is not None and self.length != self.declared:
            raise S3Error(
                "IncompleteBody", f"the body has {self.length} bytes; {self.declared} were declared"
            )
        if self.sha256 is not None and self.sha256.hexdigest() != self.payload_sha256:
            raise S3Error(
                "XAmzContentSHA256Mismatch",
                "The provided 'x-amz-content-sha256' header does not match what was computed.",
            )
        if self.content_md5 is not None:
            try:
                wanted = base64.b64decode(self.content_md5, validate=True)
            except binascii.Error:
                raise S3Error("InvalidDigest", "The Content-MD5 you specified was invalid.") from None
            if wanted != self.md5.digest():
                raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.")
        trailers = self.chunks.trailers if self.chunks is not None else {}
        for header, (checksum, value) in self.checks.items():
            sent = value if value is not None else trailers.get(header)
            if sent is None:
                raise S3Error("InvalidRequest", f"the trailer {header} was announced but not sent")
            if sent != checksums.encode(checksum):
                algorithm = header.removeprefix(checksums.HEADER_PREFIX).upper()
                message = f"The {algorithm} you specified did not match the calculated checksum."
                raise S3Error("BadDigest", message)

    @property
    def etag(self) -> str:
        return self.md5.hexdigest()

    def checksum_headers(self) -> dict[str, str]:
        """The checked checksums, echoed in the answer as S3 does."""
        return {header: checksums.encode(checksum) for header, (checksum, _) in self.checks.items()}
