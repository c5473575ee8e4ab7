"""ContainerHosting: which containers a store runs, their lifecycle, and where a name is served.

``start`` opens the data folder (``engine/store/data_folder.py``: its lock,
and the store record of the container count, Tier 1 and Tier 2 it was
created with) and recovers every container (in parallel, in the
background); ``close`` stops them cleanly. With Tier 1 on S3 the data
folder holds nothing: the record lives in the bucket and each container
log's fence replaces the lock. As a cluster node (``node_id`` set) a store
runs only the containers whose leases it wins (``engine/cluster/node.py``),
and a name whose container another node serves is answered there
(``owner_of``, ``engine/store/cluster_wide.py``).
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from engine.cluster.records import Offer
from engine.config import Settings, tier1_location, tier2_location
from engine.container.segment_container import SegmentContainer
from engine.container.state import FAILED
from engine.errors import ContainerNotReady, InvalidArgument, SegmentNotFound
from engine.metrics import ClusterMetrics, EngineMetrics, register_process_metrics
from engine.naming import container_for, validate_name
from engine.store import cross_container
from engine.store import record as store_record
from engine.store.collectors import ContainerCollector, SyncCollector
from engine.store.data_folder import DataFolder
from engine.store.tiers import Tiers
from engine.types import SegmentInfo

if TYPE_CHECKING:
    from engine.cluster.node import ClusterNode
    from engine.cluster.peers import Transport
    from engine.store.cluster_wide import ClusterWide

log = logging.getLogger(__name__)


class ContainerHosting:
    """The containers of one data directory that this process serves; the base of ``SegmentStore``."""

    def __init__(
        self,
        settings: Settings,
        *,
        containers: Iterable[SegmentContainer] | None = None,
        peer_transport: Transport | None = None,
        hop: str = "",
        machine: str = "",
    ):
        self.settings = settings
        # This node's Unix socket and its machine (app/hop.py), published in its node record.
        self._hop, self._machine = hop, machine
        self.registry = CollectorRegistry()
        register_process_metrics(self.registry)
        self.metrics = EngineMetrics(self.registry)
        self.registry.register(ContainerCollector(lambda: self._containers))
        self._tiers = Tiers(settings)
        self.registry.register(SyncCollector(self._tiers.file_syncs))
        self._containers: list[SegmentContainer] = list(containers) if containers else []
        self._by_id: dict[int, SegmentContainer] = dict(enumerate(self._containers))
        self._node: ClusterNode | None = None
        self._wide: ClusterWide | None = None
        self._peer_transport = peer_transport
        self._host_serial: dict[int, int] = {}
        self._hosting = threading.Lock()  # a container's start (rounds) against another's stop (stops)
        self._hosted = 0
        self._started = threading.Event()
        self._refused = threading.Event()  # a container this node hosted found the store misconfigured
        self._refusal: str | None = None
        self._announcer: threading.Thread | None = None
        self._folder = DataFolder(settings, self._tiers.tier1_objects)
        self._closed = False
        self._draining = False

    # ----------------------------------------------------------------- lifecycle
    def start(self, *, wait: bool = False) -> None:
        """Lock the data directory, check its record, and recover every container (in the background).

        Raises ``Misconfigured`` when the settings contradict the store record,
        ``StoreLocked`` when another process owns the data folder.
        """
        if not self._containers:
            self._folder.open()
            if self.settings.node_id or self.settings.local_members:
                self._join_cluster()
                return
            self._containers = [self._build_container(i) for i in range(self.settings.container_count)]
            self._by_id = dict(enumerate(self._containers))
        for container in self._containers:
            container.start()
        self._started.set()
        self._announcer = threading.Thread(target=self._announce, name="start-up", daemon=True)
        self._announcer.start()
        if wait:
            self.wait_ready()

    def _join_cluster(self) -> None:
        """Run the containers whose leases this node (or process) wins (engine/cluster/node.py), not all."""
        from engine.cluster.node import ClusterNode  # boto3: see _tier2 on the late import
        from engine.cluster.peers import HttpTransport, PeerClient
        from engine.cluster.processes import REGISTERS
        from engine.cluster.registers import FolderRegisters, Registers, S3Registers
        from engine.store.cluster_wide import ClusterWide

        s = self.settings
        registers: Registers
        slot = self._folder.slot  # one of the processes of this node, over the data folder
        if s.tier1_s3 is None:
            registers, where = FolderRegisters(s.data_path.resolve() / REGISTERS), s.data_dir
        else:
            bucket, prefix = s.tier1_s3
            registers, where = S3Registers(bucket, prefix, endpoint_url=s.s3_endpoint or None), s.tier1
        node_id = slot.member if slot is not None else s.node_id
        self._cluster_metrics = ClusterMetrics(self.registry)
        self._node = ClusterNode(
            registers, node_id=node_id, url=s.node_url,
            container_count=s.container_count, lease_s=s.lease_s, host=self._host, unhost=self._unhost,
            failed=self._hosted_failed, metrics=self._cluster_metrics, released=self._released,
            hop=self._hop, machine=self._machine,
            gone=slot.member_gone if slot is not None else lambda node: False,
        )
        node = self._node
        transport = self._peer_transport if self._peer_transport is not None else HttpTransport()
        self._wide = ClusterWide(self, node, PeerClient(transport, lambda: node.secret))
        self._started.set()
        if slot is not None:  # the processes of a node start together: each takes its share at once
            self._node.start(lambda: slot.wait_for_the_others(registers, timeout_s=s.lease_s / 3))
        else:
            self._node.start()
        log.info("segstore node %s (%s) joined the cluster in %s", node_id, s.node_url, where)
        if slot is not None and slot.slot == 0 and s.tier1_s3 is None:  # a node of processes: one line
            threading.Thread(target=self._announce_processes, name="start-up", daemon=True).start()

    def _host(self, container_id: int) -> None:
        """Start serving a container this node won (its recovery fences the previous owner)."""
        assert container_id not in self._by_id, f"container {container_id} hosted twice"
        claimed_at = time.monotonic()
        container = self._build_container(container_id)
        container.start()
        with self._hosting:
            self._hosted += 1
            self._host_serial[container_id] = self._hosted
            self._by_id[container_id] = container
            self._containers = sorted(self._by_id.values(), key=lambda c: c.container_id)
        threading.Thread(target=self._record_once_ready, args=(container, claimed_at), daemon=True).start()

    def _released(self, container_id: int, offer: Offer | None) -> None:
        """This node handed ``container_id`` over: the others run a round, and its next owner
        (``offer.to``) claims it first thing in that round."""
        if self._wide is not None:
            self._wide.nudge(offer=offer)

    def _record_once_ready(self, container: SegmentContainer, claimed_at: float) -> None:
        """Once recovered: the takeover's time, the store record, and the other nodes told to look.

        They run a round at once and forward the container's requests here,
        instead of at their next round.
        """
        container.wait_started()
        if container.misconfigured is not None:  # the node cannot serve any container: it stops
            self._refusal = self._refusal or container.misconfigured
            self._refused.set()
        if container.ready:
            self._cluster_metrics.takeover_seconds.observe(time.monotonic() - claimed_at)
            if self._wide is not None:
                self._wide.nudge(serves=container.container_id)
            self._folder.write_record()

    def _hosted_failed(self, container_id: int) -> bool:
        """Whether the container hosted here failed (its node hands it back: see the coordinator)."""
        container = self._by_id.get(container_id)
        return container is not None and container.state == FAILED

    def _unhost(self, container_id: int) -> None:
        """Stop serving a container: no new requests, those in flight finish, its log closes."""
        with self._hosting:
            container = self._by_id.pop(container_id, None)
            self._containers = sorted(self._by_id.values(), key=lambda c: c.container_id)
        if container is not None:
            container.close()

    def container_ready(self, container_id: int) -> bool:
        """Whether this store serves container ``container_id`` now (hosted, recovered, leased)."""
        container = self._by_id.get(container_id)
        held = self._node is None or self._node.holds(container_id)
        return container is not None and container.ready and held

    def serves(self, container_id: int) -> bool:
        """Whether container ``container_id`` runs here and (in a cluster) this node holds its lease."""
        return container_id in self._by_id and (self._node is None or self._node.holds(container_id))

    def served_containers(self) -> dict[int, int]:
        """The containers this store serves now, each with the number of its hosting here.

        A container that leaves and comes back gets a new number: what was
        known of it before may have changed on another node meanwhile.
        """
        return {c: self._host_serial.get(c, 0) for c in list(self._by_id) if self.container_ready(c)}

    @property
    def node(self) -> ClusterNode | None:
        """This store's cluster node, or None for a single node."""
        return self._node

    def _announce(self) -> None:
        """Once every container is past recovery: one line naming the store and each recovery's time."""
        for container in self._containers:
            container.wait_started()
        if self.refusal() is not None or self._closed:
            return  # the server refuses to start, and says why (or it is stopping already)
        if self.ready:
            self._folder.write_record()
        recoveries = ", ".join(
            f"{c.container_id}: {c.recovery_s:.2f}s" if c.failure is None else f"{c.container_id}: failed"
            for c in self._containers
        )
        log.info("segstore store: %s; containers recovered in %s", self._where(), recoveries)

    def _where(self) -> str:
        """The data folder and both tiers, for the start-up line."""
        s = self.settings
        return (
            f"data folder {s.data_path.absolute()}, Tier 1 {store_record.shown(tier1_location(s), s)}, "
            f"Tier 2 {store_record.shown(tier2_location(s), s)}"
        )

    def _announce_processes(self) -> None:
        """The first process of a node of several: once each container has one, a line naming them.

        The node's own start-up line (as ``_announce`` for one process), said
        once however many processes the node runs; each recovery's time is on
        the line of the process that ran it.
        """
        s, node = self.settings, self._node
        assert node is not None
        deadline = time.monotonic() + 10 * s.lease_s
        while not self._closed and time.monotonic() < deadline:
            owners = node.view().owners
            if all(c in owners for c in range(s.container_count)):
                served = ", ".join(f"{c}: {owners[c]}" for c in range(s.container_count))
                log.info("segstore store: %s; containers served by %d processes: %s",
                         self._where(), s.processes, served)
                return
            time.sleep(0.1)

    def refusal(self) -> str | None:
        """Why this store must not serve at all (a misconfiguration a container met), or None."""
        for container in self._containers:
            if container.misconfigured is not None:
                return container.misconfigured
        return self._refusal

    def wait_refusal(self) -> str | None:
        """Block until every container is past start-up; then ``refusal()``.

        A cluster node (or a process of a node) runs containers as it claims
        them: it waits until one it hosts finds the store misconfigured, for
        as long as it runs. The server's process waits on this and exits when
        it says why.
        """
        self._started.wait()
        if self._node is not None:
            self._refused.wait()
        for container in self._containers:
            container.wait_started()
        return self.refusal()

    def container_states(self) -> list[tuple[int, str, str | None]]:
        """Each container's id, state (``engine.container.state``) and why it is not serving."""
        return [(c.container_id, c.state, c.state_reason) for c in self._containers]

    def _build_container(self, container_id: int) -> SegmentContainer:
        data_log = self._tiers.tier1_log(container_id)
        return SegmentContainer(container_id, self.settings, data_log, self._tiers.tier2(), self.metrics)

    @property
    def ready(self) -> bool:
        """True once every container has recovered and accepts requests."""
        return self._started.is_set() and all(c.ready for c in self._containers)

    @property
    def failure(self) -> str | None:
        """Why a container could not start (it stays down until a restart), or None."""
        for container in self._containers:
            if container.failure is not None:
                return f"container {container.container_id}: {container.failure}"
        return None

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until every container is ready; re-raise a container's recovery failure."""
        self._started.wait(timeout_s)
        for container in self._containers:
            container.wait_ready(timeout_s)

    def drain(self) -> None:
        """Shutdown has begun: waiting tail reads return now and new ones do not wait.

        Appends and plain reads still work until ``close``; a cluster node (or
        process) claims no container any more.
        """
        self._draining = True
        if self._node is not None:
            self._node.drain()
        for container in self._containers:
            container.drain()

    @property
    def draining(self) -> bool:
        return self._draining

    def close(self) -> None:
        """Stop every container: pending tails wake, the storage writer stops, logs close."""
        if self._closed:
            return
        if self.ready and self._announcer is not None:
            self._announcer.join(30)  # it writes the store record
        self._closed = True
        if self._node is not None:
            self._node.stop()
        for container in self._containers:
            container.close()
        self._tiers.close()
        self._folder.close()

    # ------------------------------------------------------------------ routing
    def _container(self, name: str) -> SegmentContainer:
        validate_name(name)
        if not self._started.is_set():
            raise ContainerNotReady("the store has not started")
        return self._served(container_for(name, self._count()))

    def _served(self, container_id: int) -> SegmentContainer:
        container = self._by_id.get(container_id)
        if container is None or (self._node is not None and not self._node.holds(container_id)):
            why, wait_s = self._elsewhere(container_id)
            raise ContainerNotReady(why, retry_after_s=wait_s)
        return container

    def _source(self, name: str) -> cross_container.Source:
        """``name``'s container here, or (in a cluster) on the node serving it."""
        try:
            return self._container(name)
        except ContainerNotReady:
            if self._wide is None or self.owner_of(name) is None:
                raise
            return self._wide.segments(name)

    def owner_of(self, name: str) -> tuple[str, str] | None:
        """(node id, URL) of the other node serving ``name``'s container, or None (here, or unknown)."""
        if self._node is None:
            return None
        container_id = container_for(name, self.settings.container_count)
        if container_id in self._by_id and self._node.holds(container_id):
            return None
        view = self._node.view()
        owner = view.owners.get(container_id)
        if owner is None or owner == self._node.node_id or owner not in view.nodes:
            return None
        return owner, view.nodes[owner]

    def hop_of(self, node: str) -> str | None:
        """The Unix socket of ``node`` if it runs on this machine and has one (app/hop.py), else None."""
        if self._node is None:
            return None
        return self._node.view().hops.get(node)

    def sibling_urls(self) -> dict[str, str]:
        """The other processes of this node (``processes`` > 1) and their URLs, as last seen."""
        slot = self._folder.slot
        if self._node is None or slot is None:
            return {}
        return {member: url for member, url in self._node.view().nodes.items() if slot.sibling(member)}

    def owner_unreachable(self, node: str) -> None:
        """A request forwarded to ``node`` was refused: the answers that wait for it say why."""
        if self._node is not None:
            self._node.unreachable(node)

    def _elsewhere(self, container_id: int) -> tuple[str, float]:
        """Why ``container_id`` is not served here, and about how long until it is served again."""
        if self._node is None:
            return f"container {container_id} is not served here", 1.0
        return self._node.describe(container_id)

    def container_of(self, name: str) -> int:
        """The id of the container that owns ``name`` (served here or not).

        Two segments of one container merge as metadata only; across containers
        a merge copies the bytes, so a caller staging data for a merge picks a
        name in its target's container. On a cluster node it answers for
        containers other nodes serve too.
        """
        validate_name(name)
        if not self._started.is_set():
            raise ContainerNotReady("the store has not started")
        return container_for(name, self._count())

    def _count(self) -> int:
        return self.settings.container_count if self._node is not None else len(self._by_id)

    # ----------------------------------------------------------------- listings
    def list(
        self, prefix: str = "", *, after: str | None = None, limit: int = 1000, here: bool = False
    ) -> tuple[list[SegmentInfo], str | None]:
        """Segments whose name starts with ``prefix``, in name order, after ``after``.

        Internal segments never show, reserved names (``#<owner>/...``) only
        to a reserved ``prefix``. Returns the page and the name to pass as
        ``after`` for the next page (None when there is no more). On a
        cluster node the listing spans every container of the cluster
        (``engine/store/cluster_wide.py``; ContainerNotReady while one is served
        by no node); ``here``: only the containers this node serves (work
        each node does for its own, such as expiry).
        """
        if limit < 1:
            raise InvalidArgument("limit must be at least 1")
        if self._wide is not None and not here:
            return self._wide.list(prefix, after, limit)
        served = [c for c in sorted(self._by_id) if self.serves(c)]
        found = self.list_served(served, prefix, after=after, limit=limit + 1)
        page = found[:limit]
        return page, (page[-1].name if len(found) > limit else None)

    def list_served(
        self, containers: Iterable[int], prefix: str, *, after: str | None, limit: int
    ) -> builtins.list[SegmentInfo]:
        """The first ``limit`` segments ``list`` shows of ``containers``.

        Each must be served here, else ContainerNotReady.
        """
        found: list[SegmentInfo] = []
        for container_id in containers:
            found.extend(self._served(container_id).list(prefix, after, limit))
        found.sort(key=lambda i: i.name)
        return found[:limit]

    def heads(
        self, names: Iterable[str], max_length: int | None = None, *, here: bool = False
    ) -> dict[str, bytes | None]:
        """The first bytes (from the start offset, up to ``max_length``) of each segment; None: none such.

        For many small segments at once, e.g. the records of a listing page:
        on a cluster node those of another node's containers cost one call
        to that node in all. ``here``: only segments served here.
        """
        names = list(names)
        if self._wide is not None and not here:
            return self._wide.heads(names, max_length)
        found: dict[str, bytes | None] = {}
        for name in names:
            try:
                found[name] = self._container(name).read(name, None, max_length, wait_s=0).data
            except SegmentNotFound:
                found[name] = None
        return found
