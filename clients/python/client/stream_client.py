"""``StreamClient``: the stream API (docs/api.md "Streams", ``/v1/scopes``) over a ``SegmentClient``.

Scopes and streams (create, describe, seal, delete), segments and
successors, scaling, single events, stream cuts and truncation, stream
transactions. It shares the ``SegmentClient``'s connections, retries and
cluster endpoints. Requests that may be resent after a lost answer are the
idempotent ones (reads, creates that confirm, seal, scale, truncate,
commit, abort) and events that carry a writer id; a delete and a
transaction's open are not resent. ``StreamWriter`` (``client/stream_writer.py``)
writes events in batches straight to the segments.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from client.routing import header_value
from client.segment_client import SegmentClient
from client.transport import bytes_headers

# How long ``scale`` waits for a scale that waits for open transactions (202) before it raises.
SCALE_WAIT_S = 120.0
_SCALE_POLL_S = 0.2


@dataclass(frozen=True)
class StreamSegment:
    """A segment of a stream: its id, native name and key range ``[key_lo, key_hi)``."""

    id: int
    name: str
    key_lo: float
    key_hi: float
    predecessors: tuple[int, ...] = field(default=(), compare=False)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StreamSegment:
        return cls(doc["id"], doc["name"], doc["key_lo"], doc["key_hi"], tuple(doc.get("predecessors", ())))


@dataclass(frozen=True)
class StreamCut:
    """An offset per segment id, the segments covering [0, 1); ``epoch`` the newest of theirs."""

    epoch: int
    positions: dict[int, int]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StreamCut:
        return cls(doc["epoch"], {int(k): v for k, v in doc["positions"].items()})

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "positions": {str(k): v for k, v in self.positions.items()}}


class StreamTimeout(TimeoutError):
    """A scale that waits for open transactions did not complete within the wait."""


def stream_path(scope: str, stream: str) -> str:
    return f"/v1/scopes/{quote(scope, safe='')}/streams/{quote(stream, safe='')}"


class StreamClient:
    """The stream API of the server(s) ``client`` talks to."""

    def __init__(self, client: SegmentClient) -> None:
        self.client = client

    def _call(
        self, method: str, path: str, *, safe: bool, ok: tuple[int, ...] = (200,), **kwargs: Any
    ) -> Any:
        response = self.client._request(method, path, safe_to_resend=safe, ok=ok, **kwargs)
        return response.json() if response.status_code != 204 else None

    # ------------------------------------------------------------ scopes and streams
    def create_scope(self, scope: str) -> None:
        """Create the scope (nothing happens if it exists)."""
        self._call("PUT", f"/v1/scopes/{quote(scope, safe='')}", safe=True, ok=(200, 201))

    def scopes(self) -> list[str]:
        return self._call("GET", "/v1/scopes", safe=True)["scopes"]

    def streams(self, scope: str) -> list[str]:
        return self._call("GET", f"/v1/scopes/{quote(scope, safe='')}/streams", safe=True)["streams"]

    def create_stream(
        self,
        scope: str,
        stream: str,
        *,
        segments: int | None = None,
        scaling: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create the stream (or confirm it has this configuration); returns its description.

        ``scaling``: ``{"type": "fixed" | "events_per_s" | "kbytes_per_s", "target", "factor",
        "min_segments"}`` (docs/api.md "Streams").
        """
        body: dict[str, Any] = {}
        if segments is not None:
            body["segments"] = segments
        if scaling is not None:
            body["scaling"] = dict(scaling)
        return self._call("PUT", stream_path(scope, stream), safe=True, ok=(200, 201), json=body)

    def stream(self, scope: str, stream: str) -> dict[str, Any]:
        """The stream's configuration, state (``active``, ``sealed``), epoch and pending scale."""
        return self._call("GET", stream_path(scope, stream), safe=True)

    def seal(self, scope: str, stream: str) -> dict[str, Any]:
        return self._call("POST", stream_path(scope, stream) + ":seal", safe=True)

    def delete(self, scope: str, stream: str) -> None:
        """Delete a sealed stream and its segments (``StreamNotSealed`` otherwise)."""
        self._call("DELETE", stream_path(scope, stream), safe=False, ok=(204,))

    # ------------------------------------------------------------ segments and scaling
    def segments(self, scope: str, stream: str, epoch: int | None = None) -> tuple[int, list[StreamSegment]]:
        """(epoch, its segments by key range): the current epoch, or ``epoch``."""
        params = {} if epoch is None else {"epoch": epoch}
        doc = self._call("GET", stream_path(scope, stream) + "/segments", safe=True, params=params)
        return doc["epoch"], [StreamSegment.from_json(s) for s in doc["segments"]]

    def successors(self, scope: str, stream: str, segment_id: int) -> tuple[list[StreamSegment], bool]:
        """(the segments that replaced ``segment_id``, each with its predecessors; whether it is sealed)."""
        path = f"{stream_path(scope, stream)}/segments/{segment_id}/successors"
        doc = self._call("GET", path, safe=True)
        return [StreamSegment.from_json(s) for s in doc["successors"]], doc["sealed"]

    def scale(
        self,
        scope: str,
        stream: str,
        seal: Iterable[int],
        ranges: Iterable[tuple[float, float]],
        *,
        wait_s: float = SCALE_WAIT_S,
    ) -> tuple[int, list[StreamSegment]]:
        """Seal ``seal`` and create successors on ``ranges``; returns the new epoch and its new segments.

        A scale that waits for open transactions (202) is asked again until
        done, up to ``wait_s`` (then ``StreamTimeout``; it still completes).
        """
        body = {"seal": list(seal), "ranges": [list(r) for r in ranges]}
        deadline = time.monotonic() + wait_s
        while True:
            response = self.client._request(
                "POST", stream_path(scope, stream) + ":scale", safe_to_resend=True, ok=(200, 202), json=body
            )
            doc = response.json()
            if response.status_code == 200:
                return doc["epoch"], [StreamSegment.from_json(s) for s in doc["segments"]]
            if time.monotonic() >= deadline:
                raise StreamTimeout(f"the scale to epoch {doc['epoch']} still waits for open transactions")
            time.sleep(_SCALE_POLL_S)

    # ------------------------------------------------------------ events, cuts
    def write_event(
        self,
        scope: str,
        stream: str,
        payload: bytes,
        *,
        routing_key: str | None = None,
        writer_id: uuid.UUID | str | None = None,
        event_number: int | None = None,
    ) -> dict[str, Any]:
        """One event (``POST .../events``); returns ``{"segment", "offset"}`` or a duplicate's answer."""
        path = stream_path(scope, stream) + "/events"
        return self._post_event(path, payload, routing_key, writer_id, event_number)

    def cut(self, scope: str, stream: str, at: str = "tail") -> StreamCut:
        """The ``head`` or ``tail`` stream cut."""
        doc = self._call("GET", stream_path(scope, stream) + "/cut", safe=True, params={"at": at})
        return StreamCut.from_json(doc)

    def truncate(self, scope: str, stream: str, cut: StreamCut) -> StreamCut:
        """Delete what lies before ``cut``; returns the stream's new head."""
        doc = self._call("POST", stream_path(scope, stream) + ":truncate", safe=True, json=cut.to_json())
        return StreamCut.from_json(doc["head"])

    # ------------------------------------------------------------ transactions
    def open_transaction(self, scope: str, stream: str, *, timeout_s: float | None = None) -> str:
        """Open a stream transaction; returns its id."""
        body = {} if timeout_s is None else {"timeout_s": timeout_s}
        path = stream_path(scope, stream) + "/transactions"
        return self._call("POST", path, safe=False, ok=(201,), json=body)["id"]

    def transaction(self, scope: str, stream: str, txid: str) -> dict[str, Any]:
        """``{"id", "state", "epoch", "expires"}``."""
        return self._call("GET", f"{stream_path(scope, stream)}/transactions/{txid}", safe=True)

    def write_transaction_event(
        self,
        scope: str,
        stream: str,
        txid: str,
        payload: bytes,
        *,
        routing_key: str | None = None,
        writer_id: uuid.UUID | str | None = None,
        event_number: int | None = None,
    ) -> dict[str, Any]:
        """One event into an open transaction; returns ``{"segment"}`` (where it will be visible)."""
        path = f"{stream_path(scope, stream)}/transactions/{txid}/events"
        return self._post_event(path, payload, routing_key, writer_id, event_number)

    def _post_event(
        self,
        path: str,
        payload: bytes,
        routing_key: str | None,
        writer_id: uuid.UUID | str | None,
        event_number: int | None,
    ) -> dict[str, Any]:
        """One event with its key (percent-encoded) and writer; resent after a lost answer with a writer."""
        key = None if routing_key is None else header_value(routing_key)
        headers = bytes_headers({"Routing-Key": key, "Writer-Id": writer_id, "Event-Number": event_number})
        return self._call("POST", path, safe=writer_id is not None, data=payload, headers=headers)

    def commit(self, scope: str, stream: str, txid: str) -> dict[str, Any]:
        return self._call("POST", f"{stream_path(scope, stream)}/transactions/{txid}:commit", safe=True)

    def abort(self, scope: str, stream: str, txid: str) -> dict[str, Any]:
        return self._call("POST", f"{stream_path(scope, stream)}/transactions/{txid}:abort", safe=True)
