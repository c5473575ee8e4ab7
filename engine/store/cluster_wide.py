"""Operations that span every container of a cluster: each part asked of the node serving it.

A listing merges this node's page with one page per other node (one call
each, ``peers``), cut to the limit in name order, so ``after`` and
``limit`` mean exactly what they mean on a single node. Reading the first
bytes of many small segments (``heads``) costs one call per node too. A
container no node serves fails the whole operation with
``ContainerNotReady`` (503 and ``Retry-After``): an answer is complete or
refused, never silently short.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from engine.cluster.peer_service import ServedSegments
from engine.cluster.peers import PeerClient, PeerSegments
from engine.cluster.records import Offer
from engine.config import Settings
from engine.errors import ContainerNotReady, SegstoreError
from engine.naming import container_for
from engine.types import SegmentInfo

if TYPE_CHECKING:
    from engine.cluster.node import ClusterNode  # boto3: imported only by a cluster node


log = logging.getLogger(__name__)


class LocalStore(ServedSegments, Protocol):
    """What a cluster-wide operation asks of this node's store (``hosting.ContainerHosting``)."""

    settings: Settings

    def serves(self, container_id: int) -> bool: ...

Node = tuple[str, str]  # node id, URL


class ClusterWide:
    """Whole-cluster listings and reads for ``store``, a node of ``node``'s cluster."""

    def __init__(self, store: LocalStore, node: ClusterNode, client: PeerClient) -> None:
        self.store = store
        self.node = node
        self.client = client

    def nudge(self, serves: int | None = None, offer: Offer | None = None) -> None:
        """Ask every other live node to run a round now: this node released a container (``offer``
        names who claims it first), or recovered the container ``serves`` (they forward its requests
        here at once)."""
        view = self.node.view()
        body: dict[str, object] = {} if serves is None else {"serves": serves, "node": self.node.node_id}
        if offer is not None:
            body["offer"] = offer.to_json()
        for node, url in view.nodes.items():
            if node != self.node.node_id:
                call = threading.Thread(target=self._nudge, args=(node, url, body), name="nudge", daemon=True)
                call.start()

    def _nudge(self, node: str, url: str, body: dict[str, object]) -> None:
        try:
            self.client.call(node, url, "round", body)
        except SegstoreError as exc:
            log.info("node %s was not told to run a round: %s", node, exc.detail)

    def placement(self, containers: Iterable[int]) -> tuple[list[int], dict[Node, list[int]]]:
        """The containers served here, and the others by the node serving them.

        ContainerNotReady for a container no live node serves now (one this
        node owns but has not recovered yet included).
        """
        here: list[int] = []
        elsewhere: dict[Node, list[int]] = {}
        view = self.node.view()
        for container in containers:
            if self.store.serves(container):
                here.append(container)
                continue
            owner = view.owners.get(container)
            if owner is None or owner == self.node.node_id or owner not in view.nodes:
                raise ContainerNotReady(f"container {container} is not served by any node now")
            elsewhere.setdefault((owner, view.nodes[owner]), []).append(container)
        return here, elsewhere

    def list(self, prefix: str, after: str | None, limit: int) -> tuple[list[SegmentInfo], str | None]:
        """``SegmentStore.list`` over every container of the cluster."""
        here, elsewhere = self.placement(range(self.store.settings.container_count))
        found = self.store.list_served(here, prefix, after=after, limit=limit + 1)
        for (node, url), containers in elsewhere.items():
            found.extend(self.client.list(node, url, containers, prefix, after, limit + 1))
        found.sort(key=lambda i: i.name)
        page = found[:limit]
        return page, (page[-1].name if len(found) > limit else None)

    def heads(self, names: builtins.list[str], max_length: int | None) -> dict[str, bytes | None]:
        """``SegmentStore.heads`` over the whole cluster: one call per other node."""
        count = self.store.settings.container_count
        by_container: dict[int, list[str]] = {}
        for name in names:
            by_container.setdefault(container_for(name, count), []).append(name)
        here, elsewhere = self.placement(sorted(by_container))
        found = self.store.heads([n for c in here for n in by_container[c]], max_length, here=True)
        for (node, url), containers in elsewhere.items():
            found |= self.client.heads(
                node, url, [n for c in containers for n in by_container[c]], max_length
            )
        return found

    def segments(self, name: str) -> PeerSegments:
        """The segments of ``name``'s container on the node serving it (not this one)."""
        container = container_for(name, self.store.settings.container_count)
        _, elsewhere = self.placement([container])
        if not elsewhere:
            raise ContainerNotReady(f"container {container} has just moved to this node")
        ((node, url),) = elsewhere
        return self.client.segments(node, url)
