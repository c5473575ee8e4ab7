"""SegmentStore: the engine's front door (seed 000 "Segment Containers").

It validates names, routes each segment to one of ``container_count``
containers by a stable hash, and owns the containers' lifecycle: ``start``
recovers them (in parallel, in the background), ``close`` stops them cleanly.
It opens the data folder first (``engine/store/data_folder.py``: its lock, and the
store record of the container count, Tier 1 and Tier 2 it was created with).
With Tier 1 on S3 the data folder holds nothing: the record lives in the
bucket and each container log's fence replaces the lock. As a cluster node
(``node_id`` set) it runs only the containers whose leases it wins
(``engine/cluster/node.py``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from engine.config import Settings, tier1_location, tier2_location
from engine.container.composite import Step, StepResult, names_of
from engine.container.segment_container import SegmentContainer
from engine.container.state import FAILED
from engine.errors import ContainerNotReady, InvalidArgument, SegmentNotFound
from engine.metadata.attribute_updates import AttributeUpdate
from engine.metrics import EngineMetrics, register_process_metrics
from engine.naming import container_for, parent_of, transaction_name, validate_name
from engine.store import cross_container
from engine.store import record as store_record
from engine.store.collectors import ContainerCollector, SyncCollector
from engine.store.data_folder import DataFolder
from engine.store.tiers import Tiers
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo

if TYPE_CHECKING:
    from engine.cluster.node import ClusterNode
    from engine.cluster.peers import Transport
    from engine.store.cluster_wide import ClusterWide

log = logging.getLogger(__name__)

class SegmentStore:
    """All segments of one data directory. Thread-safe; blocking calls are cooperative under gevent."""

    def __init__(
        self,
        settings: Settings,
        *,
        containers: Iterable[SegmentContainer] | None = None,
        peer_transport: Transport | None = None,
    ):
        self.settings = settings
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
        self._hosted = 0
        self._started = threading.Event()
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
            if self.settings.node_id:
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
        """Run the containers this node wins leases for (engine/cluster/node.py), not all of them."""
        from engine.cluster.node import ClusterNode  # boto3: see _tier2 on the late import
        from engine.cluster.peers import HttpTransport, PeerClient
        from engine.store.cluster_wide import ClusterWide

        s = self.settings
        assert s.tier1_s3 is not None
        bucket, prefix = s.tier1_s3
        self._node = ClusterNode.on_s3(
            bucket, prefix, s.s3_endpoint or None, node_id=s.node_id, url=s.node_url,
            container_count=s.container_count, lease_s=s.lease_s, host=self._host, unhost=self._unhost,
            failed=self._hosted_failed,
        )
        node = self._node
        transport = self._peer_transport if self._peer_transport is not None else HttpTransport()
        self._wide = ClusterWide(self, node, PeerClient(transport, lambda: node.secret))
        self._started.set()
        self._node.start()
        log.info("segstore node %s (%s) joined the cluster in %s", s.node_id, s.node_url, s.tier1)

    def _host(self, container_id: int) -> None:
        """Start serving a container this node won (its recovery fences the previous owner)."""
        assert container_id not in self._by_id, f"container {container_id} hosted twice"
        container = self._build_container(container_id)
        container.start()
        self._hosted += 1
        self._host_serial[container_id] = self._hosted
        self._by_id[container_id] = container
        self._containers = sorted(self._by_id.values(), key=lambda c: c.container_id)
        threading.Thread(target=self._record_once_ready, args=(container,), daemon=True).start()

    def _record_once_ready(self, container: SegmentContainer) -> None:
        container.wait_started()
        if container.ready:
            self._folder.write_record()

    def _hosted_failed(self, container_id: int) -> bool:
        """Whether the container hosted here failed (its node hands it back: see the coordinator)."""
        container = self._by_id.get(container_id)
        return container is not None and container.state == FAILED

    def _unhost(self, container_id: int) -> None:
        """Stop serving a container: no new requests, those in flight finish, its log closes."""
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
        s = self.settings
        recoveries = ", ".join(
            f"{c.container_id}: {c.recovery_s:.2f}s" if c.failure is None else f"{c.container_id}: failed"
            for c in self._containers
        )
        log.info(
            "segstore store: data folder %s, Tier 1 %s, Tier 2 %s; containers recovered in %s",
            s.data_path.absolute(),
            store_record.shown(tier1_location(s), s),
            store_record.shown(tier2_location(s), s),
            recoveries,
        )

    def refusal(self) -> str | None:
        """Why this store must not serve at all (a misconfiguration a container met), or None."""
        for container in self._containers:
            if container.misconfigured is not None:
                return container.misconfigured
        return None

    def wait_refusal(self) -> str | None:
        """Block until every container is past start-up; then ``refusal()``.

        The server's process waits on this and exits when it says why.
        """
        self._started.wait()
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

        Appends and plain reads still work until ``close``.
        """
        self._draining = True
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
            raise ContainerNotReady(self._elsewhere(container_id))
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

    def _elsewhere(self, container_id: int) -> str:
        owner = self._node.view().owners.get(container_id) if self._node is not None else None
        if owner is None:
            return f"container {container_id} is not served by any node yet"
        return f"container {container_id} is served by node {owner}"

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

    # --------------------------------------------------------------- operations
    def create(self, name: str, *, rollover_bytes: int | None = None) -> SegmentInfo:
        """Create an empty segment. Raises SegmentExists if the name is taken."""
        return self._container(name).create(name, rollover_bytes=rollover_bytes)

    def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer_id: uuid.UUID | None = None,
        event_number: int | None = None,
        event_count: int = 1,
        attributes: Sequence[AttributeUpdate] = (),
    ) -> AppendResult:
        """Append ``data`` atomically; returns once it is durable in Tier 1.

        ``expected_offset``: append only if the length equals it (else
        ConditionalCheckFailed). ``writer_id`` + ``event_number``: append only
        if ``event_number`` is greater than the writer's stored one; otherwise
        the result is a duplicate and nothing is stored. ``attributes`` are
        updated atomically with the append: if one's condition fails, nothing
        is appended (ConditionalCheckFailed naming the key).
        """
        return self._container(name).append(
            name,
            data,
            expected_offset=expected_offset,
            writer_id=writer_id,
            event_number=event_number,
            event_count=event_count,
            attributes=attributes,
        )

    def composite(self, steps: Sequence[Step]) -> list[StepResult]:
        """Apply ``steps`` (segments of one container) as one composite operation.

        Judged together (every step's conditions hold, or nothing is applied
        and the refused step's error says which, in ``step``), written as one
        log entry, applied together (a reader sees all of it or none of it)
        and answered once: each step with the state its own change left
        (engine/container/composite.py). A crash leaves all of it or none of it.
        """
        if not steps:
            raise InvalidArgument("a composite operation needs at least one step")
        names = {n for step in steps for n in names_of(step)}
        for name in names:  # an internal segment (a transaction) is judged by its parent's name
            validate_name(parent_of(name))
        if len({container_for(n, self._count()) for n in names}) > 1:
            raise InvalidArgument("a composite operation's segments must live in one container")
        return self._container(parent_of(names_of(steps[0])[0])).composite(steps)

    def update_attributes(self, name: str, updates: Sequence[AttributeUpdate]) -> dict[uuid.UUID, int]:
        """Apply attribute updates atomically: all of them, or none (ConditionalCheckFailed).

        Returns the values the updated keys now have.
        """
        return self._container(name).update_attributes(name, updates)

    def get_attributes(self, name: str, keys: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        """The values of ``keys`` (None: no value)."""
        return self._container(name).get_attributes(name, keys)

    def attribute_items(self, name: str) -> dict[uuid.UUID, int]:
        """Every attribute the segment has (writer ids included), e.g. to carry them to a copy.

        A snapshot: an update running meanwhile may or may not show.
        """
        return self._container(name).attribute_items(name)

    def read(
        self,
        name: str,
        offset: int | None = None,
        max_length: int | None = None,
        *,
        wait_s: float = 0.0,
        anywhere: bool = False,
    ) -> ReadResult:
        """Read from ``offset`` (default: start offset) up to ``max_length`` bytes.

        Returns what is available now, at most ``max_read_bytes``. At the end of
        an unsealed segment it waits up to ``wait_s`` for the next append.
        Raises SegmentTruncated below the start offset, BadOffset past the length.
        ``anywhere``: on a cluster node, a segment another node serves is read
        through that node (one call, no wait), e.g. the source of a copy.
        """
        if anywhere:
            return self._source(name).read(name, offset, max_length, wait_s=0.0)
        return self._container(name).read(name, offset, max_length, wait_s=wait_s)

    def info(self, name: str, *, anywhere: bool = False) -> SegmentInfo:
        """The segment's state; ``anywhere`` as for ``read``."""
        return (self._source(name) if anywhere else self._container(name)).info(name)

    def seal(self, name: str) -> SegmentInfo:
        """Seal the segment (idempotent): no append is accepted afterwards."""
        return self._container(name).seal(name)

    def truncate(self, name: str, offset: int) -> SegmentInfo:
        """Set the start offset to max(current, offset); BadOffset past the length."""
        return self._container(name).truncate(name, offset)

    def delete(self, name: str) -> None:
        """Delete the segment; its Tier 2 data is removed in the background."""
        self._container(name).delete(name)

    def writer_event_number(self, name: str, writer_id: uuid.UUID) -> int | None:
        """The last event number stored for ``writer_id`` on the segment, or None."""
        return self._container(name).writer_event_number(name, writer_id)

    def partitions(self, name: str, target_bytes: int) -> list[tuple[int, int]]:
        """Ranges ``[start, end)`` covering the readable bytes, each starting on an append boundary.

        Boundaries are remembered sparsely (at least 64 KiB apart, fewer on
        very long segments), so ranges are near ``target_bytes``, not exact.
        """
        return self._container(name).partitions(name, target_bytes)

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
    ) -> list[SegmentInfo]:
        """The first ``limit`` segments ``list`` shows of ``containers``.

        Each must be served here, else ContainerNotReady.
        """
        found: list[SegmentInfo] = []
        for container_id in containers:
            found.extend(self._served(container_id).list(prefix, after, limit))
        found.sort(key=lambda i: i.name)
        return found[:limit]

    def scan(
        self, prefix: str = "", *, after: str | None = None, here: bool = False
    ) -> Iterator[SegmentInfo]:
        """Every segment ``list`` shows under ``prefix`` (after ``after``), a page at a time."""
        while True:
            page, after = self.list(prefix, after=after, here=here)
            yield from page
            if after is None:
                return

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

    # ------------------------------------------------- transactions and merges
    def open_transaction(self, parent: str) -> uuid.UUID:
        """Open a transaction of ``parent``; returns its id. SegmentNotFound without the parent."""
        return self._container(parent).open_transaction(parent)

    def append_transaction(
        self,
        parent: str,
        txid: uuid.UUID,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer_id: uuid.UUID | None = None,
        event_number: int | None = None,
        event_count: int = 1,
    ) -> AppendResult:
        """Append to a transaction, with the conditions and deduplication of ``append``."""
        return self._container(parent).append(
            transaction_name(parent, txid),
            data,
            expected_offset=expected_offset,
            writer_id=writer_id,
            event_number=event_number,
            event_count=event_count,
        )

    def transaction_info(self, parent: str, txid: uuid.UUID) -> SegmentInfo:
        """The state of an open (or sealed, not yet merged) transaction."""
        return self._container(parent).info(transaction_name(parent, txid))

    def commit_transaction(self, parent: str, txid: uuid.UUID) -> MergeResult:
        """Seal the transaction and merge it at the end of ``parent``, all at once.

        Idempotent: a retry answers with the first commit's offset and length
        (while the parent remembers it: its last MERGE_RECORDS_MAX merges).
        SegmentNotFound for an aborted, expired or unknown transaction.
        """
        return self._container(parent).commit_transaction(parent, txid)

    def fork(self, source: str, name: str, offset: int | None = None) -> SegmentInfo:
        """Create ``name`` holding ``source``'s bytes below ``offset`` (default: all of them).

        The new segment shares the source's Tier 2 chunks (no byte is copied
        where they are flushed; the unflushed rest is copied through Tier 1)
        and goes its own way after: appends, truncation and deletion of
        either leave the other's bytes alone. It starts with no attributes
        and an event count of zero. Both names must live in one container
        (``container_of``): chunks are shared within a container only.
        """
        into = self._container(name)
        if into is not self._container(source):
            raise InvalidArgument(
                f"a fork lives in its source's container: {name!r} is in container "
                f"{into.container_id}, {source!r} is not"
            )
        return into.fork(source, name, offset)

    def copy(self, source: str, name: str, offset: int | None = None) -> SegmentInfo:
        """Create ``name`` holding ``source``'s bytes below ``offset``, at the same offsets.

        Within one container this is ``fork`` (chunks shared). Across
        containers, another node's included, the bytes of the untruncated
        source are copied once; nothing is shared after.
        """
        into = self._container(name)
        origin = self._source(source)
        if into is origin:
            return into.fork(source, name, offset)
        return cross_container.fork(into, origin, source, name, offset, self.settings)

    def abort_transaction(self, parent: str, txid: uuid.UUID) -> None:
        """Drop the transaction and its bytes (a delete)."""
        self._container(parent).delete(transaction_name(parent, txid))

    def merge(self, target: str, source: str) -> MergeResult:
        """Append the whole of the sealed ``source`` to ``target`` at once; ``source`` goes away.

        Within one container this is one log operation. Across containers
        (another node's too: its bytes come through the peer calls) the
        source is first copied into a sealed staging segment beside the
        target, which is then merged the same way; the source is deleted
        after. A retry answers with the first merge's result.
        """
        into = self._container(target)
        origin = self._source(source)
        if into is origin:
            return into.merge(target, source)
        return cross_container.merge(into, origin, target, source, self.settings)

    def export_layout(self, name: str, *, timeout_s: float = 30.0) -> str:
        """Back up a segment's Tier 2 layout into a small object (seed 002 "Backup and Restore").

        The segment is flushed first; returns the object's name in Tier 2.
        """
        return self._container(name).export_layout(name, timeout_s)

    def import_segment(self, name: str) -> SegmentInfo:
        """Restore a segment from its exported layout, e.g. into an empty data directory.

        The chunks are taken over, not copied: import a layout only where the
        segment it came from no longer exists (two segments must not share chunks).
        """
        return self._container(name).import_segment(name)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every acknowledged byte is in Tier 2 (tests, shutdown, benchmarks)."""
        for container in self._containers:
            container.flush(timeout_s)
