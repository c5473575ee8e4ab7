"""GetObject and HeadObject: conditions, byte ranges, parts of multipart objects, stored headers.

The object's bytes stream from the engine read by read; a reader notices
(and stops) if the object is replaced while it streams. What the object
keeps besides its bytes (``metadata.Stored``) gives the ETag, the metadata
headers, the part sizes of a multipart object (``partNumber``) and, when the
client asks with ``x-amz-checksum-mode: ENABLED``, the checksum of exactly the
bytes answered: the object's for all of it, a part's for one part of a
composite multipart object, none for a byte range (a client would check it
against the range and fail).

A segment truncated through the native API keeps only its bytes from its
start offset on; S3 has no such state, so the object is those bytes
(``object_size``): byte 0 of the object is the segment's start offset, and
HEAD, ranges and listings agree on it. Its ETag is derived (the record of an
upload counts only for untruncated bytes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from flask import Response, request
from werkzeug.http import http_date, parse_date

from app.s3 import metadata, objects
from app.s3.errors import S3Error
from engine import SegmentInfo, SegmentNotFound, SegmentStore

PART_NUMBER_MAX = 10000
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_DIGITS = re.compile(r"[0-9]{1,19}")
# GetObject's query overrides of answer headers (S3 serves them on signed requests).
_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


def part_number_arg() -> int | None:
    """The ``partNumber`` query argument (1 to 10000), None if absent; 400 otherwise."""
    raw = request.args.get("partNumber")
    if raw is None:
        return None
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= PART_NUMBER_MAX:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {PART_NUMBER_MAX}")
    return int(raw)


def object_size(info: SegmentInfo) -> int:
    """The bytes S3 serves of the object segment ``info``: those from its start offset on."""
    return info.length - info.start_offset


def _object_headers(info: SegmentInfo, stored: metadata.Stored) -> dict[str, str]:
    return {
        "ETag": f'"{stored.etag}"',
        "Last-Modified": http_date(int(info.last_modified)),
        "Accept-Ranges": "bytes",
        **metadata.response_headers(stored.meta),
    }


def _preconditions(info: SegmentInfo, stored: metadata.Stored) -> Response | None:
    """If-Match / If-Unmodified-Since (412) and If-None-Match / If-Modified-Since (304)."""
    etag = stored.etag
    modified = int(info.last_modified)
    if_match = request.headers.get("If-Match")
    if if_match is not None and not request.if_match.contains(etag) and if_match.strip() != "*":
        raise objects.precondition_failed()
    since = parse_date(request.headers.get("If-Unmodified-Since"))
    if if_match is None and since is not None and modified > since.timestamp():
        raise objects.precondition_failed()
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None and (request.if_none_match.contains(etag) or if_none_match.strip() == "*"):
        return Response(status=304, headers=_object_headers(info, stored))
    since = parse_date(request.headers.get("If-Modified-Since"))
    if if_none_match is None and since is not None and modified <= since.timestamp():
        return Response(status=304, headers=_object_headers(info, stored))
    return None


def _byte_range(length: int) -> tuple[int, int] | None:
    """The inclusive range a ``Range`` header asks for, or None for the whole object."""
    raw = request.headers.get("Range")
    if raw is None:
        return None
    match = _RANGE.fullmatch(raw.strip())
    if match is None or (not match.group(1) and not match.group(2)):
        return None  # several ranges or another unit: S3 answers with the whole object
    first, last = match.group(1), match.group(2)
    if not first:
        suffix = int(last)
        if suffix == 0 or length == 0:
            raise _invalid_range(length)
        return max(0, length - suffix), length - 1
    start = int(first)
    end = min(int(last), length - 1) if last else length - 1
    if start >= length or (last and int(last) < start):
        raise _invalid_range(length)
    return start, end


def _part_range(stored: metadata.Stored, length: int, number: int) -> tuple[int, int] | None:
    """The inclusive range of part ``number``.

    An object that is not multipart is one part: part 1 is all of it (a 206
    naming the whole range, as S3 answers), except an empty object, whose
    range cannot be named (None: a plain 200).
    """
    if "Range" in request.headers:
        raise S3Error("InvalidRequest", "Cannot specify both Range header and partNumber query parameter")
    if not stored.parts:
        if number != 1:
            raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable")
        return (0, length - 1) if length else None
    if number > len(stored.parts):
        raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable")
    start = sum(stored.parts[: number - 1])
    return start, start + stored.parts[number - 1] - 1


def _invalid_range(length: int) -> S3Error:
    return S3Error(
        "InvalidRange",
        "The requested range is not satisfiable",
        headers={"Content-Range": f"bytes */{length}"},
    )


def stream(store: SegmentStore, info: SegmentInfo, start: int, end: int) -> Iterator[bytes]:
    """The segment's bytes [start, end) of the object ``info`` names, read by read; stops if it is replaced.

    A copy's source may live on another node of a cluster: it is read through it.
    """
    offset = start
    while offset < end:
        result = store.read(info.name, offset, end - offset, anywhere=True)
        if result.info.segment_id != info.segment_id:
            raise SegmentNotFound(f"{info.name!r} was replaced while it was read")
        if result.next_offset == offset:
            raise SegmentNotFound(f"{info.name!r} ended at {offset} while it was read")
        yield from result.pieces
        offset = result.next_offset


def get_object(store: SegmentStore, name: str, *, head: bool) -> Response:
    """GetObject or HeadObject of the object as it is at one moment.

    An object replaced between reading its state, its record and its first
    bytes (a publish committed meanwhile) is read again: an answer never
    mixes the old object's state with the new one's record or bytes.
    """
    for attempt in range(objects.RACED_TRIES_MAX):
        info = store.info(name)
        stored = objects.stored_of(store, info)
        if stored.etag == objects.derived_etag(info) and store.info(name).segment_id != info.segment_id:
            continue  # its record named the new object: replaced while it was read
        try:
            return _answer(store, info, stored, head=head)
        except SegmentNotFound:
            if attempt == objects.RACED_TRIES_MAX - 1:
                raise
    raise S3Error("SlowDown", f"{name!r} kept being replaced while it was read; please retry")


def _answer(store: SegmentStore, info: SegmentInfo, stored: metadata.Stored, *, head: bool) -> Response:
    not_modified = _preconditions(info, stored)
    if not_modified is not None:
        return not_modified
    headers = _object_headers(info, stored)
    size = object_size(info)
    number = part_number_arg()
    if number is not None:
        byte_range = _part_range(stored, size, number)
        if stored.parts:
            headers["x-amz-mp-parts-count"] = str(len(stored.parts))
            checksum = stored.part_checksum(number)
        else:
            checksum = stored.checksum  # the one part is the whole object
    else:
        byte_range = _byte_range(size)
        checksum = stored.checksum if byte_range is None else {}
    if request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
        headers.update(checksum)
    start, end, status = 0, size, 200
    if byte_range is not None:
        start, end, status = byte_range[0], byte_range[1] + 1, 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    headers["Content-Length"] = str(end - start)
    if not head:
        headers.update(
            {header: request.args[arg] for arg, header in _OVERRIDES.items() if arg in request.args}
        )
    if head:
        return Response(status=status, headers=headers)
    body = stream(store, info, info.start_offset + start, info.start_offset + end)
    # The first read happens now, so a failure still gets a proper error answer.
    first = next(body, b"")
    return Response(_chain(first, body), status=status, headers=headers)


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest
