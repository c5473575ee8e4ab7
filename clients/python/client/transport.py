"""How ``SegmentClient`` sends a request: one pooled ``requests.Session``, retries, routes to nodes.

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

import contextlib
import json as jsonlib
import time
from collections.abc import Mapping
from typing import Any, Self
from urllib.parse import quote, urlencode

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict

from client.errors import error_from_response

DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 0.05
BACKOFF_MAX_S = 5.0
DEFAULT_TIMEOUT_S = 30.0


def segment_path(name: str) -> str:
    """The URL path of a segment: ``/`` kept raw, everything else percent-encoded as UTF-8."""
    return "/v1/segments/" + quote(name, safe="/")


def bytes_headers(named: Mapping[str, object]) -> dict[str, str]:
    """A body of bytes' headers: its ``Content-Type``, and each of ``named`` whose value is not None."""
    headers = {"Content-Type": "application/octet-stream"}
    headers.update((name, str(value)) for name, value in named.items() if value is not None)
    return headers


def _refused(err: requests.RequestException) -> bool:
    """Whether the connection itself failed, refused or timed out (nothing of the request was sent)."""
    reason = getattr(err.args[0], "reason", None) if err.args else None
    return isinstance(reason, urllib3.exceptions.ConnectTimeoutError)  # NewConnectionError is one


def _segment_of(path: str) -> str:
    """The segment a request path names (its route key), or "" for other paths."""
    rest = path.removeprefix("/v1/segments/")
    return rest.split("?", 1)[0].partition(":")[0] if rest != path else ""


class Transport:
    """Requests to one segstore endpoint; thread-safe as far as ``requests.Session`` is.

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
