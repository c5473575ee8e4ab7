"""A node's part in the cluster: heartbeat, leases, and starting and stopping its containers.

Seed 000 ("Integration with Controller", "Segment Container Manager"): a node
runs the containers assigned to it, starts them on assignment, stops them on
unassignment, and never restarts a failed one by itself. segstore assigns
with leases in the bucket instead of a controller (docs/cluster.md); each
node runs ``Coordinator.tick`` every third of ``lease_s``:

1. give up every container whose lease it could not renew in time (before
   ``lease_s`` minus a margin since the start of its last successful renewal);
2. renew its node record (the heartbeat) and the leases it holds;
3. read every node record and lease, and apply the balancer's plan: hand
   over (stop the container, then release the lease) or claim (win the
   lease, then start the container, whose recovery fences the old Tier 1
   writer).

Invariant: a container is held by at most one node at any instant
(``holds``), provided the nodes' clocks run at the same rate within the
margin; Tier 1's fence keeps acknowledged data safe even if they do not.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

from engine.cluster import balancer
from engine.cluster.records import ClusterRecord, LeaseRecord, NodeRecord, Observer
from engine.cluster.registers import Register, RegisterConflict, RegisterError, Registers
from engine.metrics import ClusterMetrics
from engine.naming import (
    CLUSTER_RECORD,
    lease_prefix,
    lease_register_name,
    node_prefix,
    node_register_name,
    parse_lease_register_name,
    parse_node_register_name,
    validate_node_id,
)

log = logging.getLogger(__name__)

# A holder gives a container up this share of lease_s before an observer may call its lease stale.
MARGIN_SHARE = 0.2
# Registers a round reads at once (node records and leases).
_READERS = 16


class ClusterMismatch(Exception):
    """This node's settings contradict the cluster it joins (its container count)."""


class ContainerHost(Protocol):
    """What the coordinator starts and stops: the node's segment containers."""

    def start_container(self, container: int) -> None:
        """Begin serving ``container`` (recovery fences its previous owner's Tier 1 writer)."""
        ...

    def stop_container(self, container: int) -> None:
        """Stop taking requests for ``container``, finish what is in flight, and return."""
        ...

    def failed(self, container: int) -> bool:
        """Whether ``container`` cannot serve until it is started again (its recovery failed, say)."""
        ...


@dataclass(slots=True)
class _Held:
    record: LeaseRecord
    version: str
    renewed_at: float  # monotonic, at the start of the last write of the lease that succeeded


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What this node last saw: live nodes' URLs and the owner of each owned container."""

    nodes: dict[str, str] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Observed:
    nodes: dict[str, NodeRecord]
    leases: dict[int, tuple[LeaseRecord, str]]


class Coordinator:
    """One node's leases and heartbeat over ``registers``; ``host`` runs the containers."""

    def __init__(
        self,
        registers: Registers,
        *,
        node_id: str,
        url: str,
        container_count: int,
        host: ContainerHost,
        lease_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: ClusterMetrics | None = None,
    ) -> None:
        assert container_count >= 1 and lease_s > 0
        self.registers = registers
        self.node_id = validate_node_id(node_id)
        self.container_count = container_count
        self.host = host
        self.lease_s = lease_s
        self.clock = clock
        self._node = NodeRecord(node_id, url)
        self._node_version: str | None = None
        self._observer = Observer(lease_s)
        self._held: dict[int, _Held] = {}
        self._free_since: dict[int, float] = {}
        self._view = ClusterView()
        self._leases: dict[int, tuple[LeaseRecord, str]] = {}  # as last observed, for ``describe``
        self._unreachable: dict[str, float] = {}  # node -> when a request to it was last refused
        self._lock = threading.RLock()
        self._readers = ThreadPoolExecutor(_READERS, thread_name_prefix=f"registers-{node_id}")
        self.secret = ""  # the cluster's peer secret, known once joined
        self.metrics = metrics if metrics is not None else ClusterMetrics(CollectorRegistry())
        self.metrics.leases_held.set_function(lambda: len(self.held()))

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    # ------------------------------------------------------------ queries
    def holds(self, container: int) -> bool:
        """Whether this node holds ``container``'s lease now (and so may serve it)."""
        held = self._held.get(container)
        return held is not None and self.clock() < self._deadline(held)

    def held(self) -> list[int]:
        return sorted(c for c in list(self._held) if self.holds(c))

    def view(self) -> ClusterView:
        return self._view

    def unreachable(self, node: str) -> None:
        """Note that ``node`` could not be reached just now (a request to it was refused)."""
        self._unreachable[node] = self.clock()

    def describe(self, container: int) -> str:
        """Who serves ``container`` as far as this node knows, for the answer to a request it refuses.

        An owner this node could not reach within the last lease is gone for
        the container until its lease runs out (its last renewal, as this node
        saw it, plus ``lease_s``): another node claims it then.
        """
        if self.holds(container):
            return f"container {container}: node {self.node_id} took it over and is recovering it"
        lease = self._leases.get(container)
        if lease is None or lease[0].owner is None:
            every = f"{self.renew_every_s:.1f} s"
            return f"container {container}: no node holds it; the next round (every {every}) claims it"
        owner, now = lease[0].owner, self.clock()
        age = self._observer.age(lease_register_name(container), now) or 0.0
        if age >= self.lease_s:
            return f"container {container}: node {owner}'s lease ran out; the next round claims it"
        if now - self._unreachable.get(owner, -math.inf) < self.lease_s:
            left = math.ceil(self.lease_s - age)
            return f"container {container}: waiting for node {owner}'s lease to run out, about {left} s"
        return f"container {container} is served by node {owner}"

    def _deadline(self, held: _Held) -> float:
        return held.renewed_at + self.lease_s * (1 - MARGIN_SHARE)

    # ------------------------------------------------------------ joining and leaving
    def join(self) -> None:
        """Check or write ``cluster.json`` and announce this node; ClusterMismatch if they disagree.

        Learns the cluster's peer secret (``secret``), giving an older record
        without one a secret by a compare-and-set (whoever wins, all agree).
        """
        while True:
            register = self.registers.read(CLUSTER_RECORD)
            try:
                if register is None:
                    record = ClusterRecord(self.container_count)
                    self.registers.create(CLUSTER_RECORD, record.encode())
                    break
                record = ClusterRecord.decode(CLUSTER_RECORD, register.data)
                if record.containers != self.container_count:
                    raise ClusterMismatch(
                        f"the cluster has {record.containers} containers, "
                        f"this node is set up for {self.container_count}"
                    )
                if record.secret:
                    break
                record = record.with_secret()
                self.registers.replace(CLUSTER_RECORD, record.encode(), register.version)
                break
            except RegisterConflict:
                continue  # another node wrote it first: read what it wrote
        self.secret = record.secret
        self._beat()

    def leave(self) -> None:
        """Hand every container over cleanly and mark this node as leaving."""
        with self._lock:
            for container in sorted(self._held):
                self._release(container)
            self._node = self._node.next_beat(leaving=True)
            self._write_node()

    # ------------------------------------------------------------ the round
    def tick(self) -> None:
        """One round: give up expired leases, heartbeat, renew, observe, balance."""
        with self._lock:
            self._give_up_expired()
            self._hand_back_failed()
            self._beat()
            self._renew()
            try:
                seen = self._observe()
            except RegisterError as exc:
                log.warning("node %s cannot see the cluster: %s", self.node_id, exc)
                return
            self._balance(seen)

    def run(self, stop: threading.Event) -> None:
        """Tick every third of ``lease_s`` until ``stop`` is set; a failed round is logged and retried.

        A long round delays the next renewals: one longer than the margin
        leaves (``lease_s`` less the margin, less a renewal period) lets
        leases run out while the node is alive, and their containers move
        (and recover) for nothing. Such a round is logged, as the cause.
        """
        while not stop.is_set():
            began = self.clock()
            try:
                self.tick()
            except Exception:
                log.exception("cluster round of node %s failed", self.node_id)
            took = self.clock() - began
            if took > self.lease_s * (1 - MARGIN_SHARE) - self.renew_every_s:
                log.warning(
                    "node %s: a cluster round took %.1f s; a lease renewed every %.1f s runs out %.1f s "
                    "after its renewal began, so rounds this long let leases run out while the node lives "
                    "(the bucket answers slowly, or stopping a container took long)",
                    self.node_id, took, self.renew_every_s, self.lease_s * (1 - MARGIN_SHARE),
                )
            stop.wait(max(0.0, self.renew_every_s - took))
        self._readers.shutdown(wait=False)

    def _give_up_expired(self) -> None:
        now = self.clock()
        for container, held in sorted(self._held.items()):
            if now >= self._deadline(held):
                self._lose(container, "expired", "its lease could not be renewed in time")

    def _hand_back_failed(self) -> None:
        """Release the leases of containers that failed here, rather than keep them out of service.

        A recovery fenced by a writer that claimed the container while this
        node's lease looked stale, or any other failed start, would otherwise
        hold the lease with nothing served until the node restarts. Released,
        the container is claimed again (here or elsewhere) and recovered anew.
        """
        for container in sorted(self._held):
            if self.host.failed(container):
                log.warning("node %s hands failed container %d back", self.node_id, container)
                self._release(container)

    def _lose(self, container: int, reason: str, why: str) -> None:
        log.warning("node %s stops container %d: %s", self.node_id, container, why)
        self.metrics.losses[reason].inc()
        del self._held[container]
        self.host.stop_container(container)

    def _beat(self) -> None:
        self._node = self._node.next_beat()
        self._write_node()

    def _write_node(self) -> None:
        name = node_register_name(self.node_id)
        try:
            if self._node_version is None:
                current = self.registers.read(name)
                if current is None:
                    self._node_version = self.registers.create(name, self._node.encode())
                    return
                self._node_version = current.version
            self._node_version = self.registers.replace(name, self._node.encode(), self._node_version)
        except RegisterConflict:
            self._node_version = None  # written by an earlier run of this node: read it again next round
        except RegisterError as exc:
            log.warning("node %s heartbeat failed: %s", self.node_id, exc)

    def _renew(self) -> None:
        for container, held in sorted(self._held.items()):
            if self.clock() - held.renewed_at < self.renew_every_s:
                continue
            started = self.clock()
            record = held.record.renewed()
            name = lease_register_name(container)
            try:
                version = self.registers.replace(name, record.encode(), held.version)
            except RegisterConflict:
                self._lose(container, "taken", "its lease was taken")
                continue
            except RegisterError as exc:
                log.warning("node %s could not renew container %d's lease: %s", self.node_id, container, exc)
                self.metrics.renewal_errors.inc()
                continue
            self.metrics.renewals.inc()
            self._held[container] = _Held(record, version, started)

    def _observe(self) -> _Observed:
        nodes: dict[str, NodeRecord] = {}
        leases: dict[int, tuple[LeaseRecord, str]] = {}
        names = self.registers.names(node_prefix()) + self.registers.names(lease_prefix())
        for name, register in zip(names, self._read_all(names), strict=True):
            if register is None:
                continue
            self._observer.saw(name, register.version, self.clock())
            if (node := parse_node_register_name(name)) is not None:
                nodes[node] = NodeRecord.decode(name, register.data)
                continue
            container = parse_lease_register_name(name)
            if container is not None and container < self.container_count:
                leases[container] = (LeaseRecord.decode(name, register.data), register.version)
        self._observer.forget(set(names))
        return _Observed(nodes, leases)

    def _read_all(self, names: list[str]) -> list[Register | None]:
        """The registers of ``names``, read at once: a round waits about one read, not one per register.

        A slow bucket would otherwise stretch the round by every read, and with
        it the time until the next renewals (see ``run``).
        """
        if len(names) <= 1:
            return [self.registers.read(name) for name in names]
        return list(self._readers.map(self.registers.read, names))

    def _balance(self, seen: _Observed) -> None:
        self._leases = seen.leases
        now = self.clock()
        live = {
            node
            for node, record in seen.nodes.items()
            if not record.leaving and not self._observer.stale(node_register_name(node), now)
        } | {self.node_id}
        owners: dict[int, str] = {c: self.node_id for c in self._held}
        unusable: set[int] = set()  # held under this node's id by an earlier run, until that lease is stale
        for container, (record, _version) in seen.leases.items():
            if container in owners or record.owner is None:
                continue
            if not self._observer.stale(lease_register_name(container), now):
                if record.owner == self.node_id:
                    unusable.add(container)
                else:
                    owners[container] = record.owner
        free = set(range(self.container_count)) - owners.keys() - unusable
        for container in list(self._free_since):
            if container not in free:
                del self._free_since[container]
        for container in free:
            self._free_since.setdefault(container, now)
        long_free = {c for c in free if now - self._free_since[c] >= self.lease_s}
        step = balancer.plan(self.node_id, live, owners, free, self.container_count, long_free)
        for container in step.release:
            self._release(container)
        for container in step.claim:
            self._claim(container, seen.leases.get(container))
        # The view after this round's own moves, so it agrees with what this node serves.
        after = {c: owner for c, owner in owners.items() if owner != self.node_id}
        after |= {c: self.node_id for c in self._held}
        urls = {node: seen.nodes[node].url for node in live if node in seen.nodes}
        self._view = ClusterView(urls | {self.node_id: self._node.url}, after)

    def _claim(self, container: int, current: tuple[LeaseRecord, str] | None) -> None:
        name = lease_register_name(container)
        started = self.clock()
        try:
            if current is None:
                record = LeaseRecord(container, self.node_id, 1)
                version = self.registers.create(name, record.encode())
            else:
                record = current[0].claimed_by(self.node_id)
                version = self.registers.replace(name, record.encode(), current[1])
        except RegisterConflict:
            return
        except RegisterError as exc:
            log.warning("node %s could not claim container %d: %s", self.node_id, container, exc)
            return
        self._held[container] = _Held(record, version, started)
        self._free_since.pop(container, None)
        self.metrics.takeovers[
            "new" if current is None else "released" if current[0].owner is None else "expired"
        ].inc()
        log.info("node %s claimed container %d (lease epoch %d)", self.node_id, container, record.epoch)
        self.host.start_container(container)

    def _release(self, container: int) -> None:
        """Hand ``container`` over: stop it first, then free its lease for the next owner."""
        held = self._held.pop(container)
        self.host.stop_container(container)
        name = lease_register_name(container)
        try:
            self.registers.replace(name, held.record.released().encode(), held.version)
        except (RegisterConflict, RegisterError) as exc:
            log.warning("node %s could not release container %d (it expires instead): %s",
                        self.node_id, container, exc)
        else:
            log.info("node %s handed container %d over", self.node_id, container)
