"""A node's part in the cluster: heartbeat, leases, and starting and stopping its containers.

Seed 000 ("Integration with Controller", "Segment Container Manager"): a node
runs the containers assigned to it, starts them on assignment, stops them on
unassignment, and never restarts a failed one by itself. segstore assigns
with leases in the bucket instead of a controller (docs/cluster.md); each
node runs three things side by side:

1. renewals (``engine/cluster/holdings.py``), each lease a third of
   ``lease_s`` after its last, and the heartbeat: a container whose lease
   could not be renewed in time (``lease_s`` minus a margin since the start
   of its last successful renewal) is given up, and stopped apart;
2. rounds, every sixth of ``lease_s``, and at the moment a lease it saw is
   due to run out: read every node record and lease, and apply the
   balancer's plan: hand over (stop the container, then release the lease,
   then tell the other nodes to run a round, the taker first claiming the
   container before it reads: ``Offer``) or claim (win the lease, then
   start the container, whose recovery fences the old Tier 1 writer);
3. the stops of the containers given up.

Nothing in a round delays a renewal: a slow bucket read, a recovery or a
stop cannot make a live node lose its leases.

Invariant: a container is held by at most one node at any instant
(``holds``), provided the nodes' clocks run at the same rate within the
margin and a node whose URL refuses connections runs no more (``liveness``);
Tier 1's fence keeps acknowledged data safe even if either is false.
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
from engine.cluster.holdings import Holdings
from engine.cluster.liveness import Liveness
from engine.cluster.observation import Observed, observe
from engine.cluster.peers import refuses_connections
from engine.cluster.records import ClusterRecord, LeaseRecord, NodeRecord, Observer, Offer
from engine.cluster.registers import RegisterConflict, RegisterError, Registers
from engine.metrics import ClusterMetrics
from engine.naming import CLUSTER_RECORD, lease_register_name, node_register_name, validate_node_id

log = logging.getLogger(__name__)

# Registers read or written at once (a round's node records and leases, the renewals due).
_READERS = 16
# Rounds per lease: how soon a node sees a lease change (a release, a claim, a lease running out).
_ROUNDS_PER_LEASE = 6
# About how long a container takes to recover once claimed (its log since a checkpoint, a few
# seconds of writes at most), for the Retry-After of the requests refused meanwhile.
RECOVERY_S = 1.0


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


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What this node last saw: live nodes' URLs and the owner of each owned container."""

    nodes: dict[str, str] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)
    hops: dict[str, str] = field(default_factory=dict)  # node -> its Unix socket, for nodes on this machine


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
        released: Callable[[int, Offer | None], None] = lambda container, offer: None,
        hop: str = "",
        machine: str = "",
        gone: Callable[[str], bool] = lambda node: False,
        refuses: Callable[[str], bool] = refuses_connections,
    ) -> None:
        assert container_count >= 1 and lease_s > 0
        self.registers = registers
        self.node_id = validate_node_id(node_id)
        self.container_count = container_count
        self.host = host
        self.lease_s = lease_s
        self.clock = clock
        self._node = NodeRecord(node_id, url, hop=hop, machine=machine)
        self._node_version: str | None = None
        self._observer = Observer(lease_s)
        self._released = released
        self._gone = gone  # whether no process runs as a node now (the processes of one machine know)
        self._free_since: dict[int, float] = {}
        self._offers: dict[int, Offer] = {}  # handed over to this node, to claim at the next round's start
        self._view = ClusterView()
        self._leases: dict[int, tuple[LeaseRecord, str]] = {}  # as last observed, for ``describe``
        self._others: set[str] = set()  # the other nodes' records last observed
        self._lock = threading.RLock()  # one round (or leave) at a time
        self._wake = threading.Event()  # set: run a round now
        self._draining = False  # set: the node is stopping, and claims nothing more
        self._readers = ThreadPoolExecutor(_READERS, thread_name_prefix=f"registers-{node_id}")
        self._writers = ThreadPoolExecutor(_READERS, thread_name_prefix=f"renewals-{node_id}")
        self.liveness = Liveness(node_id, lease_s=lease_s, renew_every_s=self.renew_every_s,
                                 observer=self._observer, probes=self._readers, refuses=refuses)
        self.secret = ""  # the cluster's peer secret, known once joined
        self.metrics = metrics if metrics is not None else ClusterMetrics(CollectorRegistry())
        self.leases = Holdings(
            registers, node_id=self.node_id, lease_s=lease_s, clock=clock,
            stop_container=host.stop_container, metrics=self.metrics, writers=self._writers,
        )
        self.metrics.leases_held.set_function(lambda: len(self.held()))

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    @property
    def round_every_s(self) -> float:
        return self.lease_s / _ROUNDS_PER_LEASE

    # ------------------------------------------------------------ queries
    def holds(self, container: int) -> bool:
        """Whether this node holds ``container``'s lease now (and so may serve it)."""
        return self.leases.holds(container)

    def held(self) -> list[int]:
        return self.leases.held()

    def view(self) -> ClusterView:
        return self._view

    def learned(self, container: int, node: str) -> None:
        """``node`` says it serves ``container`` now (it just recovered it): route there before a round.

        Only where requests go: a node wrongly named answers a forwarded
        request 503 (it never forwards it again), and the round that ``node``
        asks for sets the view from the leases anyway.
        """
        view = self._view
        if node != self.node_id and node in view.nodes and not self.holds(container):
            self._view = ClusterView(view.nodes, view.owners | {container: node}, view.hops)

    def offered(self, offer: Offer) -> None:
        """Another node handed a container over: run a round now, claiming it first if it is for this one."""
        if offer.to == self.node_id:
            self._offers[offer.container] = offer
        self._wake.set()

    def unreachable(self, node: str) -> None:
        """Note that ``node`` could not be reached just now (a request to it was refused).

        The first such note in a lease runs a round, which times the next
        one for the moment the node's heartbeat is late (``liveness``).
        """
        if self.liveness.unreachable(node, self.clock()):
            self.nudge()

    def describe(self, container: int) -> tuple[str, float]:
        """Who serves ``container`` as far as this node knows, and about how long until it serves again.

        For the answer to a request this node refuses (its ``Retry-After``).
        An owner this node could not reach within the last lease is gone for
        the container until its lease runs out (its last renewal, as this node
        saw it, plus ``lease_s``): another node claims it then and recovers it
        (``RECOVERY_S``, which checkpoints bound: docs/cluster.md).
        """
        if self.holds(container):
            return f"container {container}: node {self.node_id} took it over and is recovering it", RECOVERY_S
        lease = self._leases.get(container)
        claimed = self.round_every_s + RECOVERY_S
        if lease is None or lease[0].owner is None:
            every = f"{self.round_every_s:.1f} s"
            why = f"container {container}: no node holds it; the next round (every {every}) claims it"
            return why, claimed
        owner, now = lease[0].owner, self.clock()
        age = self._observer.age(lease_register_name(container), now) or 0.0
        if age >= self.lease_s or owner in self.liveness.dead:
            return f"container {container}: node {owner}'s lease ran out; the next round claims it", claimed
        if self.liveness.unreachable_lately(owner, now):
            left = math.ceil(self.lease_s - age)
            why = f"container {container}: waiting for node {owner}'s lease to run out, about {left} s"
            return why, self.lease_s - age + RECOVERY_S
        return f"container {container} is served by node {owner}", RECOVERY_S

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

    def drain(self) -> None:
        """The node is stopping: claim nothing from now on (what it holds it hands over as it leaves).

        The processes of a node stop together: without this, one would claim
        the containers another just handed over, only to stop them in turn.
        """
        self._draining = True

    def leave(self) -> None:
        """Hand every container over cleanly and mark this node as leaving."""
        with self._lock:
            view = self._view
            counts = balancer.counts_of(set(view.nodes) - {self.node_id}, view.owners)
            for container in self.leases.held():
                taker = balancer.fewest(counts)
                self._release(container, taker)
                if taker is not None:
                    counts[taker] += 1
            self._node = self._node.next_beat(leaving=True)
            self._write_node()

    # ------------------------------------------------------------ the round
    def tick(self) -> None:
        """Renewals, one round and the stops it caused, one after another (the simulations' step)."""
        self.renew()
        self.round()
        self.leases.stop_lost()

    def renew(self) -> None:
        """Give up expired leases, and renew those due and write the heartbeat, all at once.

        A pass takes about one write to the bucket, however many leases it renews.
        """
        beat = self._writers.submit(self._beat)
        try:
            self.leases.renew()
        finally:
            beat.result()

    def round(self) -> None:
        """Hand failed containers back, observe the cluster, and claim or hand over what the balancer says."""
        with self._lock:
            self._hand_back_failed()
            self._take_offers()
            try:
                seen = self._observe()
            except RegisterError as exc:
                log.warning("node %s cannot see the cluster: %s", self.node_id, exc)
                return
            self._balance(seen)

    def nudge(self) -> None:
        """Run a round now (another node released a container this one may claim)."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Renewals, rounds and stops, each on its own thread, until ``stop`` is set.

        A failed round is logged and retried. After a round the next one
        comes a sixth of a lease later, or sooner: when a lease seen held by
        another node is due to run out (a crashed node's containers are
        claimed then, not a round later), or when another node asks for one.
        """
        renewals = threading.Thread(target=self.leases.run_renewals, args=(stop, self.renew),
                                    name=f"renewals-{self.node_id}", daemon=True)
        stops = threading.Thread(target=self.leases.run_stops, args=(stop,),
                                 name=f"stops-{self.node_id}", daemon=True)
        renewals.start()
        stops.start()
        while not stop.is_set():
            self._wake.clear()
            try:
                self.round()
            except Exception:
                log.exception("cluster round of node %s failed", self.node_id)
            wait_s = min(self.round_every_s, self._next_expiry() - self.clock())
            self._wake.wait(max(0.01, wait_s))
        self.leases.end_stops()
        renewals.join()
        stops.join()
        self._readers.shutdown(wait=False)
        self._writers.shutdown(wait=False)

    def _next_expiry(self) -> float:
        """When the next record of another node runs out as this node observes them (a lease it holds,
        or its heartbeat), or a node a request could not reach may be found dead.

        A dead node's leases and heartbeat run out at about the same moment,
        but the balancer gives its containers to the others only once the node
        is not live any more: whichever runs out last wakes the round that
        claims them, not the next round a sixth of a lease later.
        """
        names = [
            lease_register_name(container)
            for container, (record, _version) in list(self._leases.items())
            if record.owner is not None and record.owner != self.node_id
        ] + [node_register_name(node) for node in self._others]
        now = self.clock()
        return min(self._observer.next_stale(names, now), self.liveness.wake_at(now))

    def _hand_back_failed(self) -> None:
        """Release the leases of containers that failed here, rather than keep them out of service.

        A recovery fenced by a writer that claimed the container while this
        node's lease looked stale, or any other failed start, would otherwise
        hold the lease with nothing served until the node restarts. Released,
        the container is claimed again (here or elsewhere) and recovered anew.
        """
        for container in self.leases.held():
            if self.host.failed(container):
                log.warning("node %s hands failed container %d back", self.node_id, container)
                self._release(container)

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

    def _observe(self) -> Observed:
        return observe(self.registers, self._observer, self._readers, self.clock, self.container_count)

    def _balance(self, seen: Observed) -> None:
        self._leases = seen.leases
        self._others = set(seen.nodes) - {self.node_id}
        now = self.clock()
        dead = self.liveness.find_dead(seen.nodes, now)
        live = {
            node
            for node, record in seen.nodes.items()
            if not record.leaving and not self._observer.stale(node_register_name(node), now)
            and node not in dead and not self._gone(node)
        } | {self.node_id}
        mine = self.leases.held()
        owners: dict[int, str] = {c: self.node_id for c in mine}
        unusable: set[int] = set()  # held under this node's id by an earlier run, until that lease is stale
        for container, (record, _version) in seen.leases.items():
            holder = record.owner
            if container in owners or holder is None or holder in dead or self._gone(holder):
                continue  # a dead holder's lease is free at once
            if not self._observer.stale(lease_register_name(container), now):
                if holder == self.node_id:
                    unusable.add(container)
                else:
                    owners[container] = holder
        unusable |= self.leases.stopping()
        free = set(range(self.container_count)) - owners.keys() - unusable
        for container in list(self._free_since):
            if container not in free:
                del self._free_since[container]
        for container in free:
            self._free_since.setdefault(container, now)
        long_free = {c for c in free if now - self._free_since[c] >= self.lease_s}
        step = balancer.plan(
            self.node_id, live, owners, free, self.container_count, long_free, settled=self.leases.settled()
        )
        for container in step.release:
            self._release(container, balancer.fewest(balancer.counts_of(live - {self.node_id}, owners)))
        for container in () if self._draining else step.claim:
            self._claim(container, seen.leases.get(container))
        # The view after this round's own moves, so it agrees with what this node serves.
        after = {c: owner for c, owner in owners.items() if owner != self.node_id}
        after |= {c: self.node_id for c in self.leases.held()}
        urls = {node: seen.nodes[node].url for node in live if node in seen.nodes}
        hops = {node: hop for node in urls if (hop := seen.nodes[node].hop_from(self._node.machine))}
        self._view = ClusterView(urls | {self.node_id: self._node.url}, after, hops)

    def _take_offers(self) -> None:
        """Claim the containers handed over to this node, before the round reads the cluster.

        A hand-over then costs the taker one write, not a round of reads and
        a write. The giver chose this node by the same rule as the balancer
        (the live node with the fewest); one already at its fair share as
        far as it knows leaves the container to the round.
        """
        while self._offers:
            _, offer = self._offers.popitem()
            container, view = offer.container, self._view
            fair = -(-self.container_count // max(1, len(view.nodes)))
            if self._draining or self.holds(container) or container in self.leases.stopping():
                continue
            if len(self.leases.held()) >= fair:
                continue
            self._claim(container, (LeaseRecord(container, None, offer.epoch), offer.version))
            if self.holds(container):
                self._view = ClusterView(view.nodes, view.owners | {container: self.node_id}, view.hops)

    def _claim(self, container: int, current: tuple[LeaseRecord, str] | None) -> None:
        name = lease_register_name(container)
        with self.leases.moving(container):
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
            self.leases.won(container, record, version, started)
        self._free_since.pop(container, None)
        self.metrics.takeovers[
            "new" if current is None
            else "released" if current[0].owner is None
            else "dead" if current[0].owner in self.liveness.dead
            else "expired"
        ].inc()
        log.info("node %s claimed container %d (lease epoch %d)", self.node_id, container, record.epoch)
        self.host.start_container(container)

    def _release(self, container: int, taker: str | None = None) -> None:
        """Hand ``container`` over: stop it first, then free its lease, then tell the others.

        From the first step on it takes no request (503 with ``Retry-After``);
        the stop finishes what is in flight; the others run a round at once,
        and ``taker`` (the live node with the fewest, if any) claims it first
        thing in that round, before it reads the cluster (``Offer``).
        """
        with self.leases.moving(container):
            held = self.leases.take_back(container)
            if held is None:
                return
            stopping = self.clock()
            self.host.stop_container(container)
            stopped_s = self.clock() - stopping
            name = lease_register_name(container)
            try:
                version = self.registers.replace(name, held.record.released().encode(), held.version)
            except (RegisterConflict, RegisterError) as exc:
                log.warning("node %s could not release container %d (it expires instead): %s",
                            self.node_id, container, exc)
                return
        log.info("node %s handed container %d over%s (stopped in %.2f s)", self.node_id, container,
                 f" to node {taker}" if taker else "", stopped_s)
        offer = None if taker is None else Offer(container, taker, held.record.epoch, version)
        self._released(container, offer)

