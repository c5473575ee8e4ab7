"""Which nodes are gone before their leases run out (docs/cluster.md "Failover").

A node's leases and heartbeat run out ``lease_s`` after this node first saw
their last versions. A node is dead sooner when its heartbeat is a renewal
period and a half late (``overdue_s``) and a TCP connection to its URL is
refused: nothing listens there, so no process serves as that node (it
crashed, or its server stopped). A paused node's address still accepts
connections (the kernel answers for it), and a node cut off from us (a
timeout) or slowed by its bucket (it still listens) keeps its leases until
they run out. Claiming a dead node's containers early is safe for the data
even if it did live: recovery fences its Tier 1 writer.

A request that could not reach a node is noted here (``unreachable``): the
coordinator then times a round for the moment that node's heartbeat is
late (``wake_at``), and tells clients what their request waits for.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engine.cluster.records import NodeRecord, Observer
from engine.naming import node_register_name

log = logging.getLogger(__name__)

# A heartbeat this many renewal periods late makes its node's address worth a probe.
_OVERDUE_RENEWALS = 1.5


class Liveness:
    """The nodes found dead in the last round, and the nodes requests could not reach lately."""

    def __init__(
        self,
        node_id: str,
        *,
        lease_s: float,
        renew_every_s: float,
        observer: Observer,
        probes: ThreadPoolExecutor,
        refuses: Callable[[str], bool],
    ) -> None:
        self.node_id = node_id
        self.lease_s = lease_s
        self.overdue_s = renew_every_s * _OVERDUE_RENEWALS
        self._observer = observer
        self._probes = probes
        self._refuses = refuses  # whether nothing listens at a URL now (connection refused)
        self.dead: set[str] = set()  # found dead by the last round, before their leases ran out
        self._unreachable: dict[str, float] = {}  # node -> when a request to it last failed

    def unreachable(self, node: str, now: float) -> bool:
        """Note that a request to ``node`` failed at ``now``; whether it is the first note in a lease."""
        noted = self.unreachable_lately(node, now)
        self._unreachable[node] = now
        return not noted

    def unreachable_lately(self, node: str, now: float) -> bool:
        return now - self._unreachable.get(node, -math.inf) < self.lease_s

    def wake_at(self, now: float) -> float:
        """When the heartbeat of a node a request could not reach lately turns late (inf: none)."""
        soonest = math.inf
        for node, when in list(self._unreachable.items()):
            age = self._observer.age(node_register_name(node), now)
            if now - when < self.lease_s and age is not None and age < self.overdue_s:
                soonest = min(soonest, now - age + self.overdue_s + 0.01)
        return soonest

    def find_dead(self, nodes: dict[str, NodeRecord], now: float) -> set[str]:
        """The nodes of ``nodes`` dead though their leases have not run out yet (also kept in ``dead``).

        The heartbeat's age is as this node saw it, so the heartbeat was
        written at least that long ago. The overdue nodes are probed at
        once: a round waits one probe at most.
        """
        overdue = {}
        for node, record in nodes.items():
            age = self._observer.age(node_register_name(node), now)
            if node != self.node_id and not record.leaving and age is not None and (
                self.overdue_s <= age < self.lease_s
            ):
                overdue[node] = (record.url, age)
        found: set[str] = set()
        if overdue:
            urls = [url for url, _ in overdue.values()]
            found = {node for node, refused in zip(overdue, self._probes.map(self._refuses, urls),
                                                   strict=True) if refused}
        for node in sorted(found - self.dead):
            url, age = overdue[node]
            log.warning("node %s: node %s renewed nothing for %.1f s and %s refuses connections: it is gone",
                        self.node_id, node, age, url)
        self.dead = found
        return found
