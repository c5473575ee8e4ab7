"""The names of the stream layer: scopes, streams, their data segments and their reserved state.

- A scope or a stream name is 1 to 255 of ``A-Z a-z 0-9 _ . -``, not
  starting with ``.`` (so never ``.`` or ``..``): one part of a segment name,
  the same in a URL and in the data segments' names.
- A scope exists while its marker, the sealed empty segment
  ``#scopes/scopes/<scope>``, does.
- A stream's record is ``#scopes/streams/<scope>/<stream>``, hashed by
  ``<scope>/<stream>`` (``engine/naming.py`` ``subject_of``), so every
  request of a stream is about one container.
- Its data segments are ordinary segments ``<scope>/<stream>/<id>``.
- A stream transaction keeps its events for data segment ``s`` in
  ``#scopes/txns/<hex>``, a name drawn to hash into ``s``'s container, so
  the commit merges it without copying.
"""

from __future__ import annotations

import re
import uuid

from engine import InvalidName, SegmentStore, reserve

_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,254}")
SCOPES = reserve("scopes")
SCOPE_MARKERS = SCOPES.prefix("scopes")
STREAM_RECORDS = SCOPES.prefix("streams")


def check_part(value: str, what: str) -> str:
    """``value`` if it may name a scope or stream (``what`` says which), else InvalidName."""
    if not _PART.fullmatch(value):
        raise InvalidName(
            f"a {what} name is 1 to 255 of A-Z a-z 0-9 _ . - and does not start with '.'; got {value!r}"
        )
    return value


def scope_marker(scope: str) -> str:
    return SCOPES.name("scopes", scope)


def stream_record(scope: str, stream: str) -> str:
    return SCOPES.name("streams", f"{scope}/{stream}")


def stream_of_record(record: str) -> tuple[str, str]:
    """(scope, stream) of a record name."""
    scope, _, stream = record.removeprefix(STREAM_RECORDS).partition("/")
    return scope, stream


def segment_name(scope: str, stream: str, segment_id: int) -> str:
    """The data segment ``segment_id`` of a stream: an ordinary segment the native API reads."""
    return f"{scope}/{stream}/{segment_id}"


def transaction_segment(store: SegmentStore, parent: str) -> str:
    """A fresh ``#scopes/txns/<hex>`` in ``parent``'s container (a commit then merges it in place)."""
    want = store.container_of(parent)
    while True:
        name = SCOPES.name("txns", uuid.uuid4().hex)
        if store.container_of(name) == want:
            return name
