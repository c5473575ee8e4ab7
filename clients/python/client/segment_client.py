"""``SegmentClient``: the segstore HTTP contract (docs/api.md), one method per operation.

How a request travels (retries, which are safe, routes to a cluster's
nodes) is ``client.transport``'s.
"""

from __future__ import annotations

import base64
import builtins
import functools
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import requests
import urllib3

from client import sse
from client.results import AppendResult, AttributeUpdate, LiveRead, ReadResult, SegmentInfo
from client.transport import Transport, bytes_headers, segment_path

__all__ = ["SegmentClient", "segment_path"]

_LIVE_READ_BYTES = 64 * 1024  # the most a live stream's read returns; it returns what has arrived


class SegmentClient(Transport):
    """A client for one segstore endpoint (or a cluster's nodes): see ``Transport`` for the arguments."""

    # -- segments ----------------------------------------------------------------------------

    def create(self, name: str, *, rollover_bytes: int | None = None) -> SegmentInfo:
        """Create a segment; ``SegmentExists`` if the name is taken."""
        body = None if rollover_bytes is None else {"rollover_bytes": rollover_bytes}
        response = self._request("PUT", segment_path(name), safe_to_resend=False, ok=(201,), json=body)
        return SegmentInfo.from_json(response.json())

    def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer_id: uuid.UUID | str | None = None,
        event_number: int | None = None,
        event_count: int | None = None,
        previous_event_number: int | None = None,
    ) -> AppendResult:
        """Append ``data`` atomically, optionally conditional (``Expected-Offset``) or deduplicated.

        ``previous_event_number`` (with ``writer_id`` and ``event_number``):
        append only if the writer's last stored number is that one, else
        ``ConditionalCheckFailed`` (its ``headers`` name the stored number in
        ``Writer-Event-Number``); so batches pipelined on several connections
        never land out of order (docs/api.md "Appends").
        """
        return self._append(
            segment_path(name),
            data,
            expected_offset,
            writer_id,
            event_number,
            event_count,
            previous_event_number,
        )

    def _append(
        self,
        path: str,
        data: bytes,
        expected_offset: int | None,
        writer_id: uuid.UUID | str | None,
        event_number: int | None,
        event_count: int | None,
        previous_event_number: int | None = None,
    ) -> AppendResult:
        headers = bytes_headers(
            {
                "Expected-Offset": expected_offset,
                "Writer-Id": writer_id,
                "Event-Number": event_number,
                "Event-Count": event_count,
                "Previous-Event-Number": previous_event_number,
            }
        )
        safe = expected_offset is not None or (writer_id is not None and event_number is not None)
        body = self._request("POST", path, safe_to_resend=safe, data=data, headers=headers).json()
        if body.get("duplicate"):
            return AppendResult(None, body["length"], True, body.get("event_number"))
        return AppendResult(body["offset"], body["length"], False, event_number)

    def read(
        self, name: str, offset: int | None = None, length: int | None = None, *, wait_s: float | None = None
    ) -> ReadResult:
        """Read from ``offset`` (default: the start offset); ``wait_s`` long-polls at the tail."""
        params: dict[str, Any] = {}
        if offset is not None:
            params["offset"] = offset
        if length is not None:
            params["length"] = length
        if wait_s:
            params["wait"] = f"{wait_s:g}"
        response = self._request(
            "GET",
            segment_path(name),
            safe_to_resend=True,
            ok=(200, 204),
            wait_s=wait_s or 0.0,
            params=params,
            stream=True,
        )
        with response:
            # One call for the whole body: ``.content`` reads it 10 KiB at a time and
            # joins the pieces, which costs a bulk reader (Spark) more CPU than the read.
            data = response.raw.read(decode_content=True)
        return ReadResult(
            data=data,
            next_offset=int(response.headers["Segment-Next-Offset"]),
            sealed=response.headers.get("Segment-Sealed") == "true",
            length=int(response.headers["Segment-Length"]),
        )

    def follow(self, name: str, offset: int | None = None) -> Iterator[LiveRead]:
        """The bytes appended from ``offset`` on (default: the start offset), as they come, until sealed.

        One live stream (Server-Sent Events, docs/api.md "Reads") instead of a
        long-poll per batch: the server pushes each batch as it commits. A
        stream that ends early (a lost connection, a server draining or
        restarting, a forwarded container moving) is opened again where it
        stopped, with the retries and backoff of any read; a segment deleted
        meanwhile raises ``SegmentNotFound`` there.
        """
        path = segment_path(name)
        failures = 0
        while True:
            response = self._request(
                "GET",
                path,
                safe_to_resend=True,
                params={} if offset is None else {"offset": offset},
                headers={"Accept": sse.MEDIA_TYPE},
                stream=True,
            )
            read = functools.partial(response.raw.read1, _LIVE_READ_BYTES)
            try:
                for kind, event_id, data in sse.events(read):
                    if kind == "sealed":
                        return
                    if kind == "data" and event_id is not None:
                        offset = int(event_id)
                        failures = 0
                        yield LiveRead(base64.b64decode(data), offset)
            except urllib3.exceptions.HTTPError as exc:
                if failures >= self.retries:
                    raise requests.ConnectionError(f"the live stream of {name} broke off: {exc}") from exc
                time.sleep(self._delay_s(failures, None))
                failures += 1
            finally:
                response.close()

    def info(self, name: str) -> SegmentInfo:
        """The segment's JSON info."""
        response = self._request("GET", segment_path(name) + ":info", safe_to_resend=True)
        return SegmentInfo.from_json(response.json())

    def seal(self, name: str) -> SegmentInfo:
        """Seal the segment (idempotent)."""
        response = self._request("POST", segment_path(name) + ":seal", safe_to_resend=True)
        return SegmentInfo.from_json(response.json())

    def truncate(self, name: str, offset: int) -> SegmentInfo:
        """Raise the start offset to ``offset`` (never lowers it)."""
        response = self._request(
            "POST", segment_path(name) + ":truncate", safe_to_resend=True, json={"offset": offset}
        )
        return SegmentInfo.from_json(response.json())

    def delete(self, name: str) -> None:
        """Delete the segment."""
        self._request("DELETE", segment_path(name), safe_to_resend=False, ok=(204,))

    def list(self, prefix: str = "", *, page_size: int | None = None) -> Iterator[SegmentInfo]:
        """Every segment whose name starts with ``prefix``, in name order, fetched page by page."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"prefix": prefix}
            if page_size is not None:
                params["limit"] = page_size
            if after is not None:
                params["after"] = after
            body = self._request("GET", "/v1/segments", safe_to_resend=True, params=params).json()
            for item in body["segments"]:
                yield SegmentInfo.from_json(item)
            after = body["next"]
            if after is None:
                return

    def writer_event_number(self, name: str, writer_id: uuid.UUID | str) -> int | None:
        """The last event number stored for ``writer_id`` on the segment, or ``None``."""
        path = f"{segment_path(name)}:writers/{writer_id}"
        return self._request("GET", path, safe_to_resend=True).json()["event_number"]

    # -- the server ---------------------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether every container the node runs serves (``/healthz`` 200), and its answer's body."""
        response = self._request("GET", "/healthz", safe_to_resend=True, ok=(200, 503))
        return response.status_code == 200, response.json()

    def cluster(self) -> dict[str, Any]:
        """``GET /v1/cluster``: the node's id, the live nodes and their URLs, each container's owner."""
        return self._request("GET", "/v1/cluster", safe_to_resend=True).json()

    # -- transactions and merge --------------------------------------------------------------

    def open_transaction(self, name: str) -> str:
        """Open a transaction on ``name``; returns its id."""
        path = segment_path(name) + ":transactions"
        return self._request("POST", path, safe_to_resend=False, ok=(201,)).json()["id"]

    def append_transaction(
        self,
        name: str,
        txid: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer_id: uuid.UUID | str | None = None,
        event_number: int | None = None,
        event_count: int | None = None,
    ) -> AppendResult:
        """Append to an open transaction; same headers and retry rules as ``append``."""
        path = f"{segment_path(name)}:transactions/{txid}"
        return self._append(path, data, expected_offset, writer_id, event_number, event_count)

    def transaction_info(self, name: str, txid: str) -> dict[str, Any]:
        """An open transaction's info (``id``, ``parent`` and a segment's info fields)."""
        path = f"{segment_path(name)}:transactions/{txid}"
        return self._request("GET", path, safe_to_resend=True).json()

    def commit_transaction(self, name: str, txid: str) -> AppendResult:
        """Merge the transaction at the end of ``name`` atomically (idempotent)."""
        path = f"{segment_path(name)}:transactions/{txid}/commit"
        body = self._request("POST", path, safe_to_resend=True).json()
        return AppendResult(body["offset"], body["length"])

    def abort_transaction(self, name: str, txid: str) -> None:
        """Drop the transaction and its bytes."""
        path = f"{segment_path(name)}:transactions/{txid}"
        self._request("DELETE", path, safe_to_resend=False, ok=(204,))

    def merge(self, target: str, source: str) -> AppendResult:
        """Append the sealed segment ``source`` at the end of ``target`` atomically."""
        path = segment_path(target) + ":merge"
        body = self._request("POST", path, safe_to_resend=False, json={"source": source}).json()
        return AppendResult(body["offset"], body["length"])

    # -- partitions and attributes -----------------------------------------------------------

    def partitions(self, name: str, target_bytes: int | None = None) -> builtins.list[tuple[int, int]]:
        """Contiguous ``(start, end)`` ranges covering the readable bytes, each on an append boundary."""
        params = {} if target_bytes is None else {"target_bytes": target_bytes}
        path = segment_path(name) + ":partitions"
        body = self._request("GET", path, safe_to_resend=True, params=params).json()
        return [(int(p["start"]), int(p["end"])) for p in body["partitions"]]

    def get_attributes(self, name: str, keys: Sequence[uuid.UUID | str]) -> dict[str, int | None]:
        """The values of attribute ``keys`` (UUIDs) on the segment; ``None`` where unset."""
        path = segment_path(name) + ":attributes"
        params = {"keys": ",".join(str(k) for k in keys)}
        return self._request("GET", path, safe_to_resend=True, params=params).json()["attributes"]

    def update_attributes(self, name: str, updates: builtins.list[AttributeUpdate]) -> None:
        """Apply ``updates`` atomically, all or none; a failed condition raises ``ConditionalCheckFailed``.

        Resent after a lost answer only when every update is idempotent
        (``accumulate`` is not: a second copy would add twice).
        """
        path = segment_path(name) + ":attributes"
        body = {"updates": [update.to_json() for update in updates]}
        safe = all(update.type != "accumulate" for update in updates)
        self._request("POST", path, safe_to_resend=safe, json=body)
