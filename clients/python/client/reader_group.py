"""``ReaderGroup`` and ``StreamReader``: reading streams together (docs/api.md "Reader groups").

The server assigns the group's segments to its readers, keeps each
reader's lease and positions, and fences a stale generation (409
``ReaderFenced``). ``ReaderGroup`` creates, describes, checkpoints and
resets a group. ``StreamReader`` joins it and iterates events; before a
fetch it commits what the fetches before served, once ``commit_every_s``
passed since its last commit, or at once when the last fetch brought
nothing or showed a segment going (the server gives a segment to another
reader only once its holder committed what it was served of it). So an
event is delivered again only after a crash or a fence, up to
``commit_every_s`` of them: at least once. It answers checkpoints (their
ids are in ``checkpoints``, and ``on_checkpoint`` is called) and, once
fenced, joins again with a new generation and goes on. Fetches ask for the
frames form: the events as stored, no base64.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from client.errors import ReaderFenced, SegmentNotFound
from client.events import HEADER_BYTES
from client.segment_client import SegmentClient
from client.stream_client import StreamCut

DEFAULT_WAIT_S = 2.0
DEFAULT_COMMIT_EVERY_S = 1.0
FRAMES = "application/octet-stream"


@dataclass(frozen=True)
class ReadEvent:
    """One event: the segment it is in (``{scope}/{stream}/{id}``), its offset there, its payload."""

    segment: str
    offset: int
    data: bytes


def group_path(scope: str, group: str) -> str:
    return f"/v1/scopes/{quote(scope, safe='')}/reader-groups/{quote(group, safe='')}"


class ReaderGroup:
    """A reader group of ``scope`` on the server(s) ``client`` talks to."""

    def __init__(self, client: SegmentClient, scope: str, group: str) -> None:
        self.client = client
        self.scope = scope
        self.group = group
        self.path = group_path(scope, group)

    def _call(
        self, method: str, path: str, *, safe: bool, ok: tuple[int, ...] = (200,), **kwargs: Any
    ) -> Any:
        response = self.client._request(method, self.path + path, safe_to_resend=safe, ok=ok, **kwargs)
        return response.json() if response.status_code != 204 else None

    def create(
        self,
        streams: list[str],
        *,
        start: str | Mapping[str, StreamCut] = "head",
        lease_s: float | None = None,
    ) -> dict[str, Any]:
        """Create the group over ``streams`` (or confirm it); ``start``: head, tail or a cut per stream."""
        body: dict[str, Any] = {"streams": streams, "start": _start_json(start)}
        if lease_s is not None:
            body["lease_s"] = lease_s
        return self._call("PUT", "", safe=True, ok=(200, 201), json=body)

    def state(self) -> dict[str, Any]:
        """Readers (generation, segments at their committed positions, lag), unassigned, waiting."""
        return self._call("GET", "", safe=True)

    def delete(self) -> None:
        self._call("DELETE", "", safe=False, ok=(204,))

    def checkpoint(self) -> str:
        """Start a checkpoint (or name the pending one); returns its id."""
        return self._call("POST", "/checkpoints", safe=True, ok=(200, 201), json={})["id"]

    def checkpoint_cuts(self, checkpoint_id: str) -> dict[str, StreamCut] | None:
        """The checkpoint's cut per stream once it is complete; None while it is pending."""
        doc = self._call("GET", f"/checkpoints/{quote(checkpoint_id, safe='')}", safe=True)
        if not doc["complete"]:
            return None
        return {stream: StreamCut.from_json(cut) for stream, cut in doc["cuts"].items()}

    def reset(self, cuts: str | Mapping[str, StreamCut]) -> dict[str, Any]:
        """Start the group again at ``cuts`` (a checkpoint's, head or tail); every reader is fenced."""
        return self._call("POST", ":reset", safe=True, json={"cuts": _start_json(cuts)})

    def reader(self, reader_id: str, **options: Any) -> StreamReader:
        """A ``StreamReader`` of this group named ``reader_id`` (joined on its first fetch)."""
        return StreamReader(self, reader_id, **options)


def frames_to_events(segment: str, offset: int, data: bytes) -> list[ReadEvent]:
    """The events of a chunk of frames (4-byte big-endian length, then the payload) read at ``offset``."""
    found, position = [], 0
    view = memoryview(data)
    while position < len(data):
        size = int.from_bytes(view[position : position + HEADER_BYTES], "big")
        start = position + HEADER_BYTES
        found.append(ReadEvent(segment, offset + position, bytes(view[start : start + size])))
        position = start + size
    return found


def _start_json(start: str | Mapping[str, StreamCut]) -> str | dict[str, Any]:
    if isinstance(start, str):
        return start
    return {stream: {"positions": cut.to_json()["positions"]} for stream, cut in start.items()}


class StreamReader:
    """One reader of a group: iterate it for events; it commits, checkpoints and rejoins by itself.

    ``wait_s``: how long a fetch waits for events; ``max_bytes``: a fetch's
    size; ``commit_every_s``: how often positions are committed (0: before
    every fetch); ``on_checkpoint``: called with a checkpoint's id once the
    reader reached it (everything it yielded before is before the checkpoint).
    """

    def __init__(
        self,
        group: ReaderGroup,
        reader_id: str,
        *,
        wait_s: float = DEFAULT_WAIT_S,
        max_bytes: int | None = None,
        commit_every_s: float = DEFAULT_COMMIT_EVERY_S,
        on_checkpoint: Callable[[str], None] | None = None,
    ) -> None:
        self.group = group
        self.reader_id = reader_id
        self.wait_s = wait_s
        self.max_bytes = max_bytes
        self.commit_every_s = commit_every_s
        self.on_checkpoint = on_checkpoint
        self.generation: int | None = None
        self.lease_s: float | None = None
        self.checkpoints: list[str] = []
        self.fences = 0  # how many times it found itself fenced and joined again
        self._served: dict[str, int] = {}  # positions served and not yet committed
        self._last: dict[str, int] = {}  # the last fetch's positions
        self._committed_at = time.monotonic()
        self._commit_now = False  # the last fetch brought nothing, or a segment went
        self._path = f"/readers/{quote(reader_id, safe='')}"

    def join(self) -> int:
        """Join (again): a new generation, fencing any older one of this id."""
        doc = self.group._call("POST", "/readers", safe=False, ok=(201,), json={"reader": self.reader_id})
        self.generation, self.lease_s = doc["generation"], doc["lease_s"]
        self._served, self._last = {}, {}
        return doc["generation"]

    def commit(self) -> None:
        """Commit the positions served so far (what was yielded)."""
        if self.generation is not None and self._served:
            body = {"generation": self.generation, "positions": self._served}
            self.group._call("POST", self._path + "/positions", safe=True, ok=(204,), json=body)
        self._served = {}
        self._committed_at = time.monotonic()
        self._commit_now = False

    def fetch(self) -> list[ReadEvent]:
        """Commit if due (see the module), then fetch: the events (maybe none). Rejoins once fenced."""
        if self.generation is None:
            self.join()
        try:
            if self._commit_now or time.monotonic() - self._committed_at >= self.commit_every_s:
                self.commit()
            return self._fetch()
        except ReaderFenced:
            self.fences += 1
            self.join()
            return self._fetch()

    def _fetch(self) -> list[ReadEvent]:
        """One fetch, in the frames form (the events as stored, placed by a JSON line before them)."""
        params: dict[str, Any] = {"generation": self.generation, "wait": self.wait_s}
        if self.max_bytes is not None:
            params["max_bytes"] = self.max_bytes
        response = self.group.client._request(
            "GET", self.group.path + self._path + "/events", safe_to_resend=True, wait_s=self.wait_s,
            params=params, headers={"Accept": FRAMES}, stream=True,
        )  # fmt: skip
        with response:
            body = response.raw.read(decode_content=True)  # one call: ``.content`` joins 10 KiB pieces
        end = body.index(b"\n")
        doc = json.loads(body[:end])
        positions = doc["positions"]
        self._commit_now = not doc["chunks"] or not set(self._last) <= set(positions)
        self._served.update(positions)
        self._last = positions
        if doc["checkpoint"] is not None:
            self.checkpoints.append(doc["checkpoint"])
            if self.on_checkpoint is not None:
                self.on_checkpoint(doc["checkpoint"])
        events, at = [], end + 1
        for segment, offset, length in doc["chunks"]:
            events.extend(frames_to_events(segment, offset, body[at : at + length]))
            at += length
        return events

    def __iter__(self) -> Iterator[ReadEvent]:
        """Events, forever (a fetch that brings none waits up to ``wait_s`` and tries again)."""
        while True:
            yield from self.fetch()

    def close(self) -> None:
        """Commit what was yielded and leave the group (its segments go to the other readers)."""
        if self.generation is None:
            return
        with contextlib.suppress(ReaderFenced, SegmentNotFound):
            self.commit()
            params = {"generation": self.generation}
            self.group._call("DELETE", self._path, safe=False, ok=(204,), params=params)
        self.generation = None

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
