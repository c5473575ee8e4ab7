"""The S3 surface's reserved names: ``#s3/<kind>/<rest>`` (buckets, etags, staging, uploads, parts...).

Data folders written before reserved names kept this state under ``.s3/``
(``LEGACY_S3_PREFIX``, read once by ``migration``).
"""

from __future__ import annotations

from engine import reserve

S3 = reserve("s3")
LEGACY_S3_PREFIX = ".s3/"


def s3_state_name(kind: str, rest: str) -> str:
    """A reserved name of the S3 surface's state: ``#s3/<kind>/<rest>`` (buckets, etags, uploads...)."""
    return S3.name(kind, rest)
