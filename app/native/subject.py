"""The segment a native request is about, read from its WSGI environ: where a cluster sends it."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

_PREFIX = "/v1/segments/"


def request_subject(environ: dict[str, Any]) -> str | None:
    """``{name}`` of ``/v1/segments/{name}[:{method}...]``; None for any other path or a bad name.

    It reads the raw path as the segment route does (``%2F`` is a slash of
    the name, ``:`` starts a custom method); a name it cannot decode is
    refused where the request is answered.
    """
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
    path = raw.split("?", 1)[0]
    if not path.startswith(_PREFIX):
        return None
    try:
        name = unquote_to_bytes(path[len(_PREFIX) :]).decode("utf-8").partition(":")[0]
    except UnicodeDecodeError:
        return None
    return name or None
