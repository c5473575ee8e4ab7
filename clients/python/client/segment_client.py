"""``SegmentClient``: the segstore HTTP contract (docs/api.md) over one pooled ``requests.Session``.

Retries. A 503 (``Throttled``: back-pressure or a recovering container) means
the server did not apply the request, so every request is retried on it,
after ``Retry-After`` seconds or the exponential backoff, whichever is longer.
A connection error (or timeout) is different: the request may have been
applied and only the answer lost; so may one answered 502 (``OutcomeUnknown``:
the node serving it failed, or lost its container, while it ran). Such a
request is retried only when a retry is safe: reads, info, seal, truncate, commit (all idempotent), and
appends that carry ``Writer-Id`` + ``Event-Number`` (the server drops the
duplicate) or ``Expected-Offset`` (a second copy fails with 412). A plain
append, a create, a delete, a merge and an open of a transaction are not
retried after a connection error: the error is raised to the caller, who
knows whether a duplicate would matter.

A cluster (docs/cluster.md). Any node answers; one that does not serve a
segment's container forwards the request and names the serving node in
``Segment-Owner``. The client then sends that segment's requests straight to
that node (its URL from ``GET /v1/cluster``), and goes back to the endpoint
it was given when the node refuses (503) or cannot be reached. The endpoint
may name several nodes, comma-separated: when the one in use cannot be
reached, the next takes its place. A request whose connection was refused
(nothing was sent) is retried on it whatever the request; any other
connection error follows the rules above.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import functools
import json as jsonlib
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict

from client import sse
from client.errors import error_from_response
from client.results import AppendResult, AttributeUpdate, LiveRead, ReadResult, SegmentInfo

DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 0.05
BACKOFF_MAX_S = 5.0
DEFAULT_TIMEOUT_S = 30.0
_LIVE_READ_BYTES = 64 * 1024  # the most a live stream's read returns; it returns what has arrived


def segment_path(name: str) -> str:
    """The URL path of a segment: ``/`` kept raw, everything else percent-encoded as UTF-8."""
    return "/v1/segments/" + quote(name, safe="/")


def _refused(err: requests.RequestException) -> bool:
    """Whether the connection itself failed, refused or timed out (nothing of the request was sent)."""
    reason = getattr(err.args[0], "reason", None) if err.args else None
    return isinstance(reason, urllib3.exceptions.ConnectTimeoutError)  # NewConnectionError is one


def _segment_of(path: str) -> str:
    """The segment a request path names (its route key), or "" for other paths."""
    rest = path.removeprefix("/v1/segments/")
    return rest.split("?", 1)[0].partition(":")[0] if rest != path else ""


class SegmentClient:
    """A client for one segstore endpoint; thread-safe as far as ``requests.Session`` is.

    ``endpoint``: a node's URL, or several comma-separated (a cluster's nodes, tried in turn).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.endpoints = [url.strip().rstrip("/") for url in endpoint.split(",") if url.strip()]
        if not self.endpoints:
            raise ValueError(f"no endpoint URL in {endpoint!r}")
        self._endpoint = 0  # the one in use: the next takes over when it cannot be reached
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.session = requests.Session()
        # Proxy and TLS settings from the environment are read once per node, not on every request
        # (requests would scan os.environ each time: a tenth of a small append's client CPU).
        self.session.trust_env = False
        self._environment: dict[str, dict[str, Any]] = {}
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self._routes: dict[str, str] = {}  # segment name -> URL of the node that serves it
        self._node_urls: dict[str, str] = {}  # node id -> URL, from GET /v1/cluster

    @property
    def endpoint(self) -> str:
        """The node URL a request goes to unless a route names another: the endpoint in use."""
        return self.endpoints[self._endpoint]

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> SegmentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------

    def _delay_s(self, attempt: int, response: requests.Response | None) -> float:
        """Exponential backoff, but never shorter than the server's ``Retry-After``."""
        delay = min(self.backoff_s * (2**attempt), BACKOFF_MAX_S)
        if response is not None:
            with contextlib.suppress(ValueError):
                delay = max(delay, float(response.headers.get("Retry-After", 0)))
        return delay

    def _request(
        self,
        method: str,
        path: str,
        *,
        safe_to_resend: bool,
        ok: tuple[int, ...] = (200,),
        wait_s: float = 0.0,
        **kwargs: Any,
    ) -> requests.Response:
        """Send with retries (see the module doc); return the response or raise its typed error."""
        segment = _segment_of(path)
        timeout = self.timeout_s + wait_s
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            base = self._routes.get(segment, self.endpoint) if segment else self.endpoint
            try:
                response = self._send(method, base, path, timeout, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as err:
                if base != self.endpoint:
                    self._routes.pop(segment, None)
                elif len(self.endpoints) > 1:
                    self._endpoint = (self._endpoint + 1) % len(self.endpoints)
                if last or not (safe_to_resend or _refused(err)):
                    raise
                time.sleep(self._delay_s(attempt, None))
                continue
            if segment:
                self._learn_route(segment, base, response)
            if response.status_code in ok:
                return response
            unknown = response.status_code == 502 and safe_to_resend
            if (response.status_code == 503 or unknown) and not last:
                if unknown and base != self.endpoint:
                    self._routes.pop(segment, None)
                response.close()  # a streamed body would hold its connection until collected
                time.sleep(self._delay_s(attempt, response))
                continue
            raise error_from_response(response)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _send(
        self,
        method: str,
        base: str,
        path: str,
        timeout: float,
        *,
        params: dict[str, Any] | None = None,
        data: bytes | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One request, straight to the session's adapter.

        ``Session.request`` would merge settings, cookies and hooks and follow
        redirects on every call: about as much client CPU as the rest of a
        small request, and none of it applies to segstore's API (no cookies,
        no redirects; the environment's settings are read once per node).
        """
        prepared = requests.PreparedRequest()
        prepared.method = method
        prepared.url = base + path + ("?" + urlencode(params) if params else "")
        prepared.headers = CaseInsensitiveDict(self.session.headers)
        if json is not None:
            data = jsonlib.dumps(json).encode()
            prepared.headers["Content-Type"] = "application/json"
        if headers:
            prepared.headers.update(headers)
        prepared.body = data
        if data is not None:
            prepared.headers["Content-Length"] = str(len(data))
        elif method not in ("GET", "HEAD"):
            prepared.headers["Content-Length"] = "0"
        adapter = self.session.get_adapter(prepared.url)
        return adapter.send(prepared, stream=stream, timeout=timeout, **self._environment_of(base))

    def _environment_of(self, base: str) -> dict[str, Any]:
        """The proxies, CA bundle and client certificate the environment names for ``base``."""
        found = self._environment.get(base)
        if found is None:
            with requests.Session() as reader:  # trust_env: reads the environment as requests does
                merged = reader.merge_environment_settings(base, {}, None, None, None)
            found = self._environment[base] = {k: merged[k] for k in ("proxies", "verify", "cert")}
        return found

    def route(self, name: str) -> str:
        """The node URL this client sends ``name``'s requests to (the endpoint until it learns better)."""
        return self._routes.get(_segment_of(segment_path(name)), self.endpoint)

    def use_route(self, name: str, url: str) -> None:
        """Send ``name``'s requests to the node at ``url`` (learnt elsewhere, e.g. when a job was planned).

        A miss there (503, or the node gone) returns to the endpoint as for a learnt route.
        """
        segment = _segment_of(segment_path(name))
        if url.rstrip("/") == self.endpoint:
            self._routes.pop(segment, None)
        else:
            self._routes[segment] = url.rstrip("/")

    def _learn_route(self, segment: str, base: str, response: requests.Response) -> None:
        """Remember the node a forwarded answer names; forget a direct route the node refused."""
        owner = response.headers.get("Segment-Owner")
        if owner is not None:
            url = self._node_urls.get(owner)
            if url is None:
                self._refresh_nodes()
                url = self._node_urls.get(owner)
            if url is not None:
                self._routes[segment] = url
        elif response.status_code == 503 and base != self.endpoint:
            self._routes.pop(segment, None)

    def _refresh_nodes(self) -> None:
        try:
            answer = self.session.get(
                self.endpoint + "/v1/cluster", timeout=self.timeout_s, **self._environment_of(self.endpoint)
            )
            nodes = answer.json().get("nodes", []) if answer.status_code == 200 else []
        except (requests.RequestException, ValueError):
            return
        self._node_urls = {node["id"]: node["url"].rstrip("/") for node in nodes}

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
        headers: dict[str, str] = {"Content-Type": "application/octet-stream"}
        if expected_offset is not None:
            headers["Expected-Offset"] = str(expected_offset)
        if writer_id is not None:
            headers["Writer-Id"] = str(writer_id)
        if event_number is not None:
            headers["Event-Number"] = str(event_number)
        if event_count is not None:
            headers["Event-Count"] = str(event_count)
        if previous_event_number is not None:
            headers["Previous-Event-Number"] = str(previous_event_number)
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
