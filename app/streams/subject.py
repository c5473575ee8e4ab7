"""The segment a Durable Streams request is about: its stream's meta segment, where a cluster sends it.

A stream's data segment is placed beside its meta segment at creation, so
every request for ``/v1/stream/{name}`` touches the container of
``stream_meta_segment(name)``.
"""

from __future__ import annotations

from typing import Any

from app.streams.names import stream_meta_segment
from app.streams.protocol import PREFIX


def request_subject(environ: dict[str, Any]) -> str | None:
    """The meta segment of the stream ``/v1/stream/{name}`` names; None for any other path.

    The name is read as the stream route reads it (the decoded path, UTF-8);
    a path Flask redirects (``//``) or cannot decode is answered where it
    arrives.
    """
    path: str = environ.get("PATH_INFO", "")
    if not path.startswith(PREFIX) or len(path) == len(PREFIX) or "//" in path:
        return None
    try:
        name = path[len(PREFIX) :].encode("latin-1").decode("utf-8")
    except UnicodeError:
        return None
    return stream_meta_segment(name)
