"""Node-to-node calls: what a whole-cluster operation asks of the node serving a container.

A call is ``POST <node url>/v1/peer/<op>`` with a JSON object, carrying the
cluster's secret (``cluster.json``, readable only by those who can read the
bucket) in ``Segstore-Peer-Secret``; the receiving node compares it in
constant time and refuses the call otherwise (``peer_service``). The answer
is a JSON object, or an engine error as ``{"error": class, "detail", ...}``
that the caller raises again as the same typed exception. A node that cannot
be reached is ``ContainerNotReady``: its containers move within a lease.

The calls (docs/cluster.md "Whole-cluster operations"):

- ``list``: a listing page of the named containers, all served by that node;
- ``heads``: the first bytes (from the start offset) of many small segments
  at once, e.g. the S3 object records a listing page shows the ETags of;
- ``info``, ``read``, ``delete``: one segment, for a merge or a copy whose
  source lives on that node (``PeerSegments``);
- ``composite``, ``writer_event_number``: a composite operation on segments
  of a container that node serves, and a writer's event number on one,
  for a surface that spans containers (the stream layer).
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import socket
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from engine import errors
from engine.container.composite import Step, StepResult, results_from_json, steps_to_json
from engine.errors import ContainerNotReady, EventNumberMismatch, SegstoreError, Throttled
from engine.types import ReadResult, SegmentInfo

PEER_PATH = "/v1/peer/"
SECRET_HEADER = "Segstore-Peer-Secret"
CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 60.0
# How long a liveness probe waits for a connection (a refusal comes within a round trip).
PROBE_TIMEOUT_S = 0.5


def refuses_connections(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``url``'s host and port is refused now: nothing listens there.

    Only a refusal counts: a timeout (a paused process whose kernel queue
    is full, a network cut) or a name that does not resolve proves nothing.
    """
    parts = urlsplit(url)
    if parts.hostname is None:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


_ERRORS: dict[str, type[SegstoreError]] = {
    cls.__name__: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, SegstoreError)
}


def info_to_json(info: SegmentInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


def info_from_json(doc: dict[str, Any]) -> SegmentInfo:
    return SegmentInfo(**doc)


def bytes_to_json(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def bytes_from_json(text: str) -> bytes:
    return base64.b64decode(text)


def error_to_json(exc: SegstoreError) -> dict[str, Any]:
    """An engine error as a peer answer: its class, detail, retry delay and segment state."""
    doc: dict[str, Any] = {"error": type(exc).__name__, "detail": exc.detail}
    if isinstance(exc, Throttled):
        doc["retry_after_s"] = exc.retry_after_s
    if exc.segment is not None:
        doc["segment"] = info_to_json(exc.segment)
    if exc.step is not None:
        doc["step"] = exc.step
    if isinstance(exc, EventNumberMismatch):
        doc["stored"] = exc.stored
    return doc


def error_from_json(doc: dict[str, Any]) -> SegstoreError:
    """The engine error a peer answered (an unknown one is an internal error)."""
    cls = _ERRORS.get(str(doc.get("error")), SegstoreError)
    detail = str(doc.get("detail", "a peer node failed"))
    segment = info_from_json(doc["segment"]) if isinstance(doc.get("segment"), dict) else None
    error: SegstoreError
    if issubclass(cls, Throttled):
        error = cls(detail, retry_after_s=float(doc.get("retry_after_s", 1.0)), segment=segment)
    elif issubclass(cls, EventNumberMismatch):
        error = cls(detail, stored=doc.get("stored"), segment=segment)
    else:
        error = cls(detail, segment=segment)
    error.step = doc.get("step")
    return error


class Transport(Protocol):
    """How a call reaches a node: HTTP between processes, a direct call in tests."""

    def post(self, url: str, op: str, doc: dict[str, Any], secret: str) -> tuple[int, dict[str, Any]]:
        """Send ``doc`` to ``op`` of the node at ``url``; its status and JSON answer.

        OSError if the node cannot be reached.
        """
        ...


class HttpTransport:
    """Peer calls over HTTP with one connection pool."""

    def __init__(self) -> None:
        # Late: the engine is imported before gevent patches ssl, which requests imports (see tiers.py).
        import requests

        self.http = requests.Session()

    def post(self, url: str, op: str, doc: dict[str, Any], secret: str) -> tuple[int, dict[str, Any]]:
        import requests

        try:
            answer = self.http.post(
                url + PEER_PATH + op,
                json=doc,
                headers={SECRET_HEADER: secret},
                timeout=(CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S),
            )
            return answer.status_code, answer.json()
        except (requests.RequestException, ValueError) as exc:
            raise OSError(str(exc)) from exc


class PeerClient:
    """Calls to other nodes of this node's cluster, with its secret."""

    def __init__(self, transport: Transport, secret: Callable[[], str]) -> None:
        self.transport = transport
        self.secret = secret

    def call(self, node: str, url: str, op: str, doc: dict[str, Any]) -> dict[str, Any]:
        """``op`` on ``node``; its answer, or the engine error it answered raised here."""
        try:
            status, answer = self.transport.post(url, op, doc, self.secret())
        except OSError as exc:
            raise ContainerNotReady(f"node {node} cannot be reached: {exc}") from None
        if status != 200:
            raise error_from_json(answer)
        return answer

    def list(
        self, node: str, url: str, containers: Iterable[int], prefix: str, after: str | None, limit: int
    ) -> list[SegmentInfo]:
        """The first ``limit`` segments of ``containers`` (all served by ``node``) under ``prefix``."""
        doc = {"containers": sorted(containers), "prefix": prefix, "after": after, "limit": limit}
        return [info_from_json(i) for i in self.call(node, url, "list", doc)["page"]]

    def heads(
        self, node: str, url: str, names: builtins.list[str], max_length: int | None
    ) -> dict[str, bytes | None]:
        """The first bytes of each segment (None: there is none), all served by ``node``."""
        answer = self.call(node, url, "heads", {"names": names, "max_length": max_length})["heads"]
        return {name: None if data is None else bytes_from_json(data) for name, data in answer.items()}

    def segments(self, node: str, url: str) -> PeerSegments:
        return PeerSegments(self, node, url)


class PeerSegments:
    """Segments of a container another node serves, as far as a merge or copy reads and drops them."""

    def __init__(self, client: PeerClient, node: str, url: str) -> None:
        self.client, self.node, self.url = client, node, url

    def info(self, name: str) -> SegmentInfo:
        return info_from_json(self.client.call(self.node, self.url, "info", {"name": name})["info"])

    def read(
        self, name: str, offset: int | None, max_length: int | None, *, wait_s: float = 0.0
    ) -> ReadResult:
        doc = {"name": name, "offset": offset, "max_length": max_length}
        answer = self.client.call(self.node, self.url, "read", doc)
        data = bytes_from_json(answer["data"])
        return ReadResult(
            (data,), answer["offset"], answer["offset"] + len(data), info_from_json(answer["info"])
        )

    def delete(self, name: str) -> None:
        self.client.call(self.node, self.url, "delete", {"name": name})

    def composite(self, steps: list[Step]) -> list[StepResult]:
        answer = self.client.call(self.node, self.url, "composite", {"steps": steps_to_json(steps)})
        return results_from_json(answer["results"])

    def writer_event_number(self, name: str, writer_id: uuid.UUID) -> int | None:
        doc = {"name": name, "writer_id": str(writer_id)}
        number = self.client.call(self.node, self.url, "writer_event_number", doc)["event_number"]
        return None if number is None else int(number)
