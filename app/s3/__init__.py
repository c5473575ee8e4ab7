"""The S3-compatible surface (API.md "S3-compatible surface"): path-style S3 at the root.

Bucket = the first part of a segment name, key = the rest. Requests are
checked with Signature V4 (``sigv4``), bodies decoded and checked
(``chunked``), objects and uploads composed from engine calls (``objects``,
``multipart``), errors answered as S3 XML (``errors``).
"""

from app.s3.routes import bp

__all__ = ["bp"]
