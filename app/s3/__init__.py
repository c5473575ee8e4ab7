"""The S3-compatible surface: path-style S3 at the root, buckets and keys over segments.

Bucket = the first part of a segment name, key = the rest. The mapping onto
segments is Flask-free and testable on a bare ``SegmentStore``: ``objects``
(buckets, objects and their records, publishing), ``multipart`` (uploads as
transactions), ``metadata`` (what an object keeps besides its bytes),
``checksums``, ``subresources`` (which S3 features answer what), ``errors``
(``S3Error`` and its status table), ``migration`` (state moved out of
ordinary names). The HTTP side: ``routes`` (the
blueprint, one view per level), ``buckets``, ``listing``, ``reading``,
``chunked`` (aws-chunked bodies), ``sigv4`` (Signature V4), ``xml`` and
``answers`` (errors as S3 XML).
"""

from app.s3.routes import bp, init_app

__all__ = ["bp", "init_app"]
