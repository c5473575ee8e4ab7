"""The receiving side of node-to-node calls (``peers``): the secret's check and each call's answer.

Every call is answered from the containers this node serves, never passed
on: a call for a container served elsewhere (it moved meanwhile) answers
``ContainerNotReady`` and the caller's whole operation fails with it, to be
retried, rather than going round in circles.
"""

from __future__ import annotations

import hmac
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from engine.cluster.peers import bytes_to_json, error_to_json, info_to_json
from engine.cluster.records import Offer
from engine.container.composite import Step, StepResult, results_to_json, steps_from_json
from engine.errors import InvalidArgument, InvalidName, SegstoreError, Throttled
from engine.types import ReadResult, SegmentInfo

if TYPE_CHECKING:
    from engine.cluster.node import ClusterNode  # boto3: imported only by a cluster node


class ServedSegments(Protocol):
    """Listings and heads of the containers this node serves (``engine.store.hosting.ContainerHosting``)."""

    def list_served(
        self, containers: Iterable[int], prefix: str, *, after: str | None, limit: int
    ) -> list[SegmentInfo]: ...

    def heads(
        self, names: Iterable[str], max_length: int | None = None, *, here: bool = False
    ) -> dict[str, bytes | None]: ...


class LocalStore(ServedSegments, Protocol):
    """What the peer calls ask of this node's store (``engine.store.segment_store.SegmentStore``)."""

    @property
    def node(self) -> ClusterNode | None: ...

    def info(self, name: str, *, anywhere: bool = False) -> SegmentInfo: ...

    def read(
        self,
        name: str,
        offset: int | None = None,
        max_length: int | None = None,
        *,
        wait_s: float = 0.0,
        anywhere: bool = False,
    ) -> ReadResult: ...

    def delete(self, name: str) -> None: ...

    def composite(self, steps: Sequence[Step], *, anywhere: bool = False) -> list[StepResult]: ...

    def writer_event_number(
        self, name: str, writer_id: uuid.UUID, *, anywhere: bool = False
    ) -> int | None: ...


class PeerService:
    """Answers the calls of the other nodes of ``store``'s cluster."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store

    @property
    def enabled(self) -> bool:
        """Whether this store is a cluster node (a single node takes no peer calls)."""
        return self.store.node is not None

    def admits(self, presented: str | None) -> bool:
        """Whether ``presented`` is the cluster's secret (compared in constant time)."""
        node = self.store.node
        secret = node.secret if node is not None else ""
        if not secret or presented is None:
            return False
        return hmac.compare_digest(presented.encode("utf-8", "replace"), secret.encode())

    def knows(self, op: str) -> bool:
        return op in _OPS

    def answer(self, op: str, body: bytes) -> tuple[int, bytes]:
        """The status and JSON body answering call ``op`` with ``body`` (the caller checked ``admits``)."""
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict):
                raise InvalidArgument("a peer call carries a JSON object")
            status, result = 200, _OPS[op](self.store, doc)
        except SegstoreError as exc:
            status, result = _status(exc), error_to_json(exc)
        except (ValueError, KeyError, TypeError) as exc:
            status, result = 400, error_to_json(InvalidArgument(f"bad peer call {op}: {exc!r}"))
        return status, json.dumps(result, separators=(",", ":")).encode()


def _status(exc: SegstoreError) -> int:
    """The HTTP status of a refused call (the caller reads the error's class from the body)."""
    if isinstance(exc, Throttled):
        return 503
    return 400 if isinstance(exc, (InvalidArgument, InvalidName)) else 409


def _list(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    containers = [int(c) for c in doc["containers"]]
    page = store.list_served(containers, str(doc["prefix"]), after=doc.get("after"), limit=int(doc["limit"]))
    return {"page": [info_to_json(i) for i in page]}


def _heads(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    names = [str(n) for n in doc["names"]]
    max_length = doc.get("max_length")
    heads = store.heads(names, None if max_length is None else int(max_length), here=True)
    return {"heads": {n: None if d is None else bytes_to_json(d) for n, d in heads.items()}}


def _info(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    return {"info": info_to_json(store.info(str(doc["name"])))}


def _read(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    offset, max_length = doc.get("offset"), doc.get("max_length")
    result = store.read(
        str(doc["name"]),
        None if offset is None else int(offset),
        None if max_length is None else int(max_length),
    )
    return {"data": bytes_to_json(result.data), "offset": result.offset, "info": info_to_json(result.info)}


def _delete(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    store.delete(str(doc["name"]))
    return {}


def _composite(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    return {"results": results_to_json(store.composite(steps_from_json(doc["steps"])))}


def _writer_event_number(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    return {"event_number": store.writer_event_number(str(doc["name"]), uuid.UUID(doc["writer_id"]))}


def _round(store: LocalStore, doc: dict[str, Any]) -> dict[str, Any]:
    """Another node released a container (run a round now; ``offer``: the node that claims it first,
    before its round reads the cluster) or recovered one (``serves``: forward its requests there from
    now on, and run a round)."""
    if store.node is not None:
        if "serves" in doc:
            store.node.learned(int(doc["serves"]), str(doc["node"]))
        if "offer" in doc:
            store.node.offered(Offer.from_json(doc["offer"]))
        store.node.nudge()
    return {}


_OPS: dict[str, Callable[[LocalStore, dict[str, Any]], dict[str, Any]]] = {
    "list": _list,
    "heads": _heads,
    "info": _info,
    "read": _read,
    "delete": _delete,
    "composite": _composite,
    "writer_event_number": _writer_event_number,
    "round": _round,
}
