"""Forwarding a request to the node that serves its subject's container, streamed both ways.

In a cluster (docs/cluster.md) any node answers any request. Each surface
maps a request to its subject, the segment whose container holds all it
touches (``request_subject`` of ``app.native``, ``app.streams``,
``app.s3``). A node that does not serve that container passes the request
on to the node that does, as it came (method, raw path and query, headers
with the client's ``Host``, the body as it arrives: a Signature V4 still
verifies there), and streams the answer back as it comes, long-polls and
SSE included. Answers name the serving node in ``Segment-Owner``. A
forwarded request carries ``Segstore-Forwarded`` and is never forwarded
again: the receiver answers it itself (503 ``ContainerNotReady`` if the
container moved meanwhile).

While no node serves the container (its owner is unknown, unreachable or
its lease lapsed; or this node won it and is recovering it), the request
waits up to ``takeover_wait_s`` for one to, without reading its body; then
the surface answers it (503 with ``Retry-After`` if still nobody serves).

An owner that fails during the request, or takes it and then sends nothing
for longer than a live node ever does (``tail_wait_max_s``, which bounds
every tail wait and SSE keep-alive, plus a lease: by then a paused or
cut-off node has lost its containers), is given up on. A request that is
safe to repeat is then sent again, to the container's next owner once one
serves it (or answered 503 with ``Retry-After`` past ``takeover_wait_s``):
a read (GET, HEAD), or an append with ``Writer-Id`` and ``Event-Number``,
which the owner deduplicates (its body, at most ``max_append_bytes``, is
kept for that). Anything else answers 502 ``OutcomeUnknown``: it may have
been applied. Such a request is also given up on, and sent again, as soon
as this node's view of the cluster no longer names the node it went to as
the container's owner (its lease ran out or moved: a paused owner loses its
container long before it would be silent for that long); the answer the
abandoned request may still get is dropped.

A body that breaks off while it is read from the client (a malformed
chunked body: ``MalformedBody``, app/http_chunked.py) gets the answer the
owner gives a body of its own, and the owner stores nothing: over the local
hop the body ends with a broken body frame and the owner answers it (400
problem+json, S3's ``IncompleteBody``); over HTTP the owner's connection is
cut inside the body, so it stores nothing and its answer is lost, and this
node answers 400 problem+json.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import requests
from prometheus_client import CollectorRegistry, Counter
from urllib3.exceptions import NewConnectionError

from app import handoff, ops
from app.errors import MalformedBody, render_segstore_error
from app.hop import HopClient, HopFailed, HopRefused
from app.hop_frames import RequestHead, is_variable
from engine import OutcomeUnknown, SegmentStore, Settings, container_for

FORWARDED = "Segstore-Forwarded"
# The route the request metrics count a request under that this node passed on.
FORWARDED_ROUTE = "forwarded"
OWNER = "Segment-Owner"
_FORWARDED_KEY = "HTTP_SEGSTORE_FORWARDED"
# RFC 9110 7.6.1: these describe one connection and are not passed on (lengths are re-derived).
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "content-length",
})
# Host stays: a signature covers it. Expect was answered here (gunicorn sends 100 Continue).
_NOT_PASSED_ON = _HOP_BY_HOP | {"expect"}
_HOP_BY_HOP_BUT_LENGTH = _HOP_BY_HOP - {"content-length"}
# Over the local hop the body arrives whole, up to its end frame, as its length and coding said.
_NOT_HANDED_ON = frozenset(
    "HTTP_" + name.upper().replace("-", "_")
    for name in _NOT_PASSED_ON - {"transfer-encoding", "content-length"}
)
_PIECE_BYTES = 64 * 1024
_CONNECT_S = 5.0
# How often a waiting request looks at the cluster view again.
_POLL_S = 0.1
# Requests that change nothing: one whose owner stopped answering is sent again.
_READS = frozenset({"GET", "HEAD"})
# With both, a write is deduplicated by its owner: one whose owner stopped answering is sent again.
_DEDUPLICATED = ("HTTP_WRITER_ID", "HTTP_EVENT_NUMBER")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# An owner's answer: its status line, its headers, and its body as it comes.
_Answer = tuple[str, list[tuple[str, str]], Any]
Subject = Callable[[dict[str, Any]], str | None]


class _Unreachable(Exception):
    """The owner refused or timed out the connection: nothing of the request was sent."""


class _Failed(Exception):
    """The owner failed during the request, or went silent: it may have acted on it."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Moved(Exception):
    """The container's owner is no longer the node a repeatable request went to: it is sent again."""


class Forwarding:
    """WSGI middleware: a request whose subject's container is served elsewhere goes to its node."""

    def __init__(
        self, app: WsgiApp, store: SegmentStore, subjects: Sequence[Subject], *, takeover_wait_s: float,
        local_hop: bool = False, registry: CollectorRegistry | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.subjects = tuple(subjects)
        self.takeover_wait_s = takeover_wait_s
        self.http = requests.Session()
        self.silence_s = _owner_silence_s(store.settings)
        self.hop = HopClient(connect_s=_CONNECT_S, silence_s=self.silence_s) if local_hop else None
        forwarded = Counter(
            "segstore_forwarded_requests",
            "Requests this node passed on to the node serving their container, by transport: "
            "hop (the owner's Unix socket on this machine) or http.",
            ["transport"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        self.transports = {transport: forwarded.labels(transport) for transport in ("hop", "http")}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self.store.node is None:
            return self.app(environ, start_response)
        subject = self._subject(environ)
        if subject is None:
            return self.app(environ, start_response)
        forwarded = bool(environ.get(_FORWARDED_KEY))
        container = container_for(subject, self.store.settings.container_count)
        deadline = time.monotonic() + self.takeover_wait_s
        body: bytes | None = None  # a repeatable request's body, once read
        retrying = False
        while True:
            if self.store.container_ready(container):
                if environ.get(handoff.ADOPTED):
                    start_response = _naming(start_response, self.store.node.node_id)
                return self._here(environ, start_response, body)
            owner = self.store.owner_of(subject)
            if owner is not None and forwarded:
                return self.app(environ, start_response)  # never a second hop: 503 naming the owner
            if owner is not None:
                if body is None and self._repeatable(environ):
                    body = _read_all(environ)
                try:
                    return self._forward(environ, start_response, subject, *owner, deadline, body)
                except MalformedBody as broken:  # over HTTP: the owner's connection was cut inside it
                    return render_segstore_error(broken)(environ, start_response)
                except _Unreachable:
                    self.store.owner_unreachable(owner[0])  # gone, or paused: wait for its lease to move
                except (_Failed, _Moved) as failed:
                    if body is None:  # not repeatable: not a 503, which says "not applied, resend"
                        assert isinstance(failed, _Failed), "only a repeatable request is given up on"
                        return render_segstore_error(OutcomeUnknown(failed.detail))(environ, start_response)
                    if isinstance(failed, _Failed):
                        self.store.owner_unreachable(owner[0])
                    if not retrying:  # sent again to the next owner, within one more takeover wait
                        retrying, deadline = True, time.monotonic() + self.takeover_wait_s
            left = deadline - time.monotonic()
            if left <= 0:  # the surface answers 503 with Retry-After
                return self._here(environ, start_response, body)
            time.sleep(min(_POLL_S, left))

    def _here(self, environ: dict[str, Any], start_response: Callable[..., Any],
              body: bytes | None) -> Iterable[bytes]:
        """Answer the request on this node, with its body as read for forwarding if it was."""
        if body is not None:
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        return self.app(environ, start_response)

    def _repeatable(self, environ: dict[str, Any]) -> bool:
        """Whether the request may be sent again after its owner failed: a read, or a deduplicated append."""
        if environ["REQUEST_METHOD"] in _READS:
            return True
        length = environ.get("CONTENT_LENGTH") or ""
        deduplicated = all(environ.get(key) for key in _DEDUPLICATED)
        return deduplicated and length.isdigit() and int(length) <= self.store.settings.max_append_bytes

    def _subject(self, environ: dict[str, Any]) -> str | None:
        for subject_of in self.subjects:
            subject = subject_of(environ)
            if subject is not None:
                return subject
        return None

    def _forward(self, environ: dict[str, Any], start_response: Callable[..., Any], subject: str,
                 node: str, base: str, deadline: float, kept: bytes | None) -> Iterable[bytes]:
        environ[ops.ROUTE_KEY] = FORWARDED_ROUTE
        address = self.store.hop_of(node) if self.hop is not None else None

        def owns() -> bool:
            owner = self.store.owner_of(subject)
            return owner is not None and owner[0] == node

        def watched(send: Callable[[], _Answer]) -> _Answer:
            return send() if kept is None else _while_owner(send, owns)

        answer = None
        if address is not None:
            with contextlib.suppress(HopRefused):  # not on this machine after all, or gone: HTTP tells
                answer = watched(lambda: self._over_hop(environ, node, address, kept))
        transport = "hop" if answer is not None else "http"
        if address is not None and answer is not None:  # the owner may take the connection itself
            handoff.suggest(address)
        if answer is None:
            answer = watched(lambda: self._over_http(environ, node, base, deadline, kept))
        status, headers, pieces = answer
        headers.append((OWNER, node))
        self.transports[transport].inc()
        start_response(status, headers)
        return pieces

    def _over_hop(self, environ: dict[str, Any], node: str, address: str,
                  kept: bytes | None) -> _Answer:
        """The request through the owner's Unix socket (app/hop.py): its WSGI variables, no HTTP."""
        assert self.hop is not None
        variables = {
            key: value for key, value in environ.items()
            if is_variable(key) and isinstance(value, str) and key not in _NOT_HANDED_ON
        }
        variables[_FORWARDED_KEY] = self.store.settings.node_id
        length = environ.get("CONTENT_LENGTH")
        body: Iterable[bytes] = ()
        if kept is not None:
            body = (kept,)
        elif length:
            body = _body(environ["wsgi.input"], int(length))
        elif "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            body = _body(environ["wsgi.input"], None)
        try:
            head, pieces = self.hop.send(address, RequestHead(variables, environ["wsgi.url_scheme"]), body)
        except HopFailed as err:
            raise _Failed(f"node {node} serving the container {err}") from err
        out = [(k, v) for k, v in head.headers if k.lower() not in _HOP_BY_HOP_BUT_LENGTH]
        return head.status, out, pieces

    def _over_http(self, environ: dict[str, Any], node: str, base: str, deadline: float,
                   kept: bytes | None) -> _Answer:
        """The request over HTTP to the owner's URL, as it came."""
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
        headers = {name: value for name, value in _headers(environ) if name.lower() not in _NOT_PASSED_ON}
        assert self.store.node is not None  # only a node forwards
        headers[FORWARDED] = self.store.node.node_id
        length = environ.get("CONTENT_LENGTH")
        body: Iterable[bytes] | bytes | None = None
        if kept is not None:
            body = kept
        elif length:
            body = _Sized(_body(environ["wsgi.input"], int(length)), int(length))
        elif "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            body = _body(environ["wsgi.input"], None)  # passed on chunked, as it came
        prepared = requests.Request(environ["REQUEST_METHOD"], base, headers=headers, data=body).prepare()
        prepared.url = base + raw  # byte for byte: requests would requote the path and query
        connect_s = min(_CONNECT_S, max(deadline - time.monotonic(), _POLL_S))
        try:
            timeout = (connect_s, self.silence_s)
            answer = self.http.send(prepared, stream=True, allow_redirects=False, timeout=timeout)
        except (requests.ConnectTimeout, requests.ConnectionError, requests.ReadTimeout) as err:
            if isinstance(err, requests.ConnectTimeout) or _refused(err):
                raise _Unreachable from err
            silent = isinstance(err, requests.ReadTimeout)
            what = f"did not answer in {self.silence_s:g} s" if silent else "failed during the request"
            raise _Failed(f"node {node} serving the container {what}") from err
        out = [(k, v) for k, v in answer.raw.headers.items() if k.lower() not in _HOP_BY_HOP]
        if "Content-Length" in answer.raw.headers:
            out.append(("Content-Length", answer.raw.headers["Content-Length"]))
        return f"{answer.status_code} {answer.reason}", out, _Streamed(answer)


def _naming(start_response: Callable[..., Any], node: str) -> Callable[..., Any]:
    """``start_response`` adding ``Segment-Owner: node`` to the answer's headers."""

    def named(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, [*headers, (OWNER, node)], exc_info)

    return named


def _owner_silence_s(settings: Settings) -> float:
    """The longest a live owner sends nothing on a request: the longest tail wait, plus a lease."""
    return settings.tail_wait_max_s + settings.lease_s


def _refused(err: requests.RequestException) -> bool:
    """Whether the connection itself failed (nothing was sent), not the request on it."""
    reason = getattr(err.args[0], "reason", None) if err.args else None
    return isinstance(reason, NewConnectionError)


def _headers(environ: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            yield key[5:].replace("_", "-").title(), value
    if environ.get("CONTENT_TYPE"):
        yield "Content-Type", environ["CONTENT_TYPE"]


def _read_all(environ: dict[str, Any]) -> bytes:
    """The whole body of a request to be sent again if need be (GET and HEAD: none)."""
    length = environ.get("CONTENT_LENGTH")
    return b"".join(_body(environ["wsgi.input"], int(length))) if length else b""


def _body(stream: Any, length: int | None) -> Iterator[bytes]:
    """The request body read in pieces as they arrive: ``length`` bytes, or (None) up to its end."""
    while length is None or length > 0:
        piece = stream.read(_PIECE_BYTES if length is None else min(_PIECE_BYTES, length))
        if not piece:
            return
        if length is not None:
            length -= len(piece)
        yield piece


class _Sized:
    """A body of known length streamed in pieces (requests sends it with Content-Length, not chunked)."""

    def __init__(self, pieces: Iterator[bytes], length: int) -> None:
        self._pieces = pieces
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        return self._pieces


class _Streamed:
    """An owner's answer body over HTTP, passed on as it comes; closing it closes the owner's answer."""

    def __init__(self, answer: requests.Response) -> None:
        self._answer = answer

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._answer.raw.stream(_PIECE_BYTES, decode_content=False)
        finally:
            self._answer.close()

    def close(self) -> None:
        self._answer.close()


def _while_owner(send: Callable[[], _Answer], owns: Callable[[], bool]) -> _Answer:
    """``send()``'s answer, unless ``owns()`` turns False before its head arrives: then ``_Moved``.

    ``send`` runs in a thread of its own (a greenlet under gevent), which a
    request given up on leaves behind: it ends with the owner's answer,
    which it drops, or with the forwarder's own timeouts.
    """
    done = threading.Event()
    lock = threading.Lock()
    outcome: list[Any] = []  # the answer, or the exception send raised
    abandoned = False

    def run() -> None:
        try:
            got: Any = send()
        except BaseException as exc:  # raised again by the waiting request
            got = exc
        with lock:
            outcome.append(got)
            done.set()
            dropped = abandoned
        if dropped and not isinstance(got, BaseException):
            got[2].close()

    threading.Thread(target=run, name="forward", daemon=True).start()
    while not done.wait(_POLL_S):
        if not owns():
            with lock:
                if not done.is_set():
                    abandoned = True
                    raise _Moved
    got = outcome[0]
    if isinstance(got, BaseException):
        raise got
    return got
