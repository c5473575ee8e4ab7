"""Every name the engine gives or accepts: segment names, containers, files, keys.

- Segment names follow API.md "Names"; ``validate_segment_name`` is the check.
- ``container_for`` maps a name to a container with a stable hash (BLAKE2b),
  never Python's salted ``hash()``.
- Tier 1 log files are ``<data>/tier1/c<container>/<first frame seq>.log``.
- Tier 2 objects are ``c<container>/<escaped name>.<segment id>``; a name too
  long for a file name is replaced by its SHA-256. No name becomes a path
  unescaped.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from urllib.parse import quote

from engine.errors import InvalidName

MAX_NAME_BYTES = 1024
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f:#?\\%]")
_LOG_FILE = re.compile(r"^(\d{20})\.log$")
_MAX_KEY_PART = 180


@functools.lru_cache(maxsize=65536)
def validate_segment_name(name: str) -> str:
    """Return ``name`` if it is a valid segment name, else raise InvalidName saying why."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_NAME_BYTES:
        raise InvalidName(f"a segment name is 1 to {MAX_NAME_BYTES} bytes, got {size}")
    bad = _FORBIDDEN.search(name)
    if bad:
        raise InvalidName(f"segment name contains a forbidden character {bad.group()!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName("segment name is not valid UTF-8") from None
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise InvalidName(f"segment name part {part!r} is empty, '.' or '..'")
    return name


@functools.lru_cache(maxsize=65536)
def container_for(name: str, container_count: int) -> int:
    """The container that owns ``name``: stable across processes and versions."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % container_count


def tier1_dir(data_dir: Path, container_id: int) -> Path:
    return data_dir / "tier1" / f"c{container_id}"


def log_file_name(first_frame_seq: int) -> str:
    return f"{first_frame_seq:020d}.log"


def parse_log_file_name(file_name: str) -> int | None:
    """The first frame sequence number of a log file, or None if it is not one."""
    match = _LOG_FILE.match(file_name)
    return int(match.group(1)) if match else None


def segment_object_key(container_id: int, name: str, segment_id: int) -> str:
    """The Tier 2 key of a segment's data (one object per segment for now)."""
    escaped = quote(name, safe="")
    if len(escaped) > _MAX_KEY_PART:
        escaped = "~" + hashlib.sha256(name.encode("utf-8")).hexdigest()
    return f"c{container_id}/{escaped}.{segment_id}"
