"""A store as a cluster node: the coordinator's rounds start and stop the store's containers.

With ``node_id`` set (Tier 1 on S3), a ``SegmentStore`` builds no container
at start: this node joins the cluster whose records live beside Tier 1 in
the bucket (``cluster.json``, ``nodes/``, ``leases/``; docs/cluster.md) and
runs the containers whose leases it wins. Starting one recovers it from
Tier 1, which fences the previous owner's writer; stopping one closes it
after what is in flight. A request for a container this node does not hold
answers ``ContainerNotReady`` naming the owner when it is known.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from engine.cluster.coordinator import ClusterView, Coordinator
from engine.cluster.records import Offer
from engine.cluster.registers import Registers
from engine.metrics import ClusterMetrics

log = logging.getLogger(__name__)


class ClusterNode:
    """Runs a coordinator in the background for a store; ``host``/``unhost`` are the store's hooks."""

    def __init__(
        self,
        registers: Registers,
        *,
        node_id: str,
        url: str,
        container_count: int,
        lease_s: float,
        host: Callable[[int], None],
        unhost: Callable[[int], None],
        failed: Callable[[int], bool] = lambda container: False,
        clock: Callable[[], float] | None = None,
        metrics: ClusterMetrics | None = None,
        released: Callable[[int, Offer | None], None] = lambda container, offer: None,
        hop: str = "",
        machine: str = "",
        gone: Callable[[str], bool] = lambda node: False,
    ) -> None:
        self._host, self._unhost, self._failed = host, unhost, failed
        extra: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.coordinator = Coordinator(
            registers, node_id=node_id, url=url, container_count=container_count, host=self,
            lease_s=lease_s, metrics=metrics, released=released, hop=hop, machine=machine, gone=gone,
            **extra,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ContainerHost
    def start_container(self, container: int) -> None:
        self._host(container)

    def stop_container(self, container: int) -> None:
        self._unhost(container)

    def failed(self, container: int) -> bool:
        return self._failed(container)

    @property
    def node_id(self) -> str:
        return self.coordinator.node_id

    @property
    def secret(self) -> str:
        """The cluster's peer secret (``cluster.json``), known once joined."""
        return self.coordinator.secret

    def view(self) -> ClusterView:
        return self.coordinator.view()

    def holds(self, container: int) -> bool:
        return self.coordinator.holds(container)

    def nudge(self) -> None:
        """Run a round now: another node released a container."""
        self.coordinator.nudge()

    def offered(self, offer: Offer) -> None:
        """Another node handed a container over: run a round now, claiming it first if it is for this node."""
        self.coordinator.offered(offer)

    def learned(self, container: int, node: str) -> None:
        """``node`` just recovered ``container``: forward its requests there at once."""
        self.coordinator.learned(container, node)

    def unreachable(self, node: str) -> None:
        """Note that a request to ``node`` was refused (``describe`` then says its lease is waited out)."""
        self.coordinator.unreachable(node)

    def describe(self, container: int) -> tuple[str, float]:
        """Who serves ``container``, or what a takeover of it waits for, and for about how long."""
        return self.coordinator.describe(container)

    def start(self, before_rounds: Callable[[], None] = lambda: None) -> None:
        """Join (ClusterMismatch if the cluster disagrees), call ``before_rounds``, then run rounds."""
        self.coordinator.join()
        before_rounds()
        self._thread = threading.Thread(target=self.coordinator.run, args=(self._stop,),
                                        name="cluster", daemon=True)
        self._thread.start()

    def drain(self) -> None:
        """The node is stopping: it claims no container from now on."""
        self.coordinator.drain()

    def stop(self, *, hand_over: bool = True) -> None:
        """Stop the rounds; hand every container over cleanly unless told not to."""
        self._stop.set()
        self.coordinator.nudge()  # the round waiting for its next turn ends now
        if self._thread is not None:
            self._thread.join(30)
        if hand_over:
            try:
                self.coordinator.leave()
            except Exception:
                log.exception("node %s could not hand its containers over; their leases expire", self.node_id)
