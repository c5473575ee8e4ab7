"""The segment a ``/v1/scopes`` request is about, read from its WSGI environ: where a cluster sends it.

A stream's requests (``/v1/scopes/{scope}/streams/{stream}...``) go to its
record's container; a scope's (``/v1/scopes/{scope}``, its stream listing)
to its marker's. The scope listing has no subject: any node answers it.
"""

from __future__ import annotations

from typing import Any

from app.scopes.names import scope_marker, stream_record
from engine import InvalidName

_PREFIX = "/v1/scopes/"


def request_subject(environ: dict[str, Any]) -> str | None:
    """The record or marker the path names; None for other paths and names the routes refuse."""
    try:
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8")
    except UnicodeError:
        return None
    if not path.startswith(_PREFIX):
        return None
    parts = path[len(_PREFIX) :].split("/")
    try:
        if len(parts) >= 3 and parts[1] == "streams":
            return stream_record(parts[0], parts[2].partition(":")[0])
        return scope_marker(parts[0])
    except InvalidName:
        return None
