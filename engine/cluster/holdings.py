"""The leases a node holds: renewed on a schedule of their own, and given up in time.

Renewals never wait behind the rest of a node's work: not behind observing
the cluster and balancing (the coordinator's round, on another thread), not
behind a container's recovery or stop (a lost container is stopped by the
stopper, apart), and not behind each other (the leases due are written at
once). A lease being claimed or released by the round is skipped, not
waited for: its container is on the move anyway.

A holder gives a container up (``holds`` turns False) once ``lease_s`` less
the margin has passed since the start of its last successful renewal; the
clock decides, so a paused process wakes up holding nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from engine.cluster.records import LeaseRecord
from engine.cluster.registers import RegisterConflict, RegisterError, Registers
from engine.metrics import ClusterMetrics
from engine.naming import lease_register_name

log = logging.getLogger(__name__)

# A holder gives a container up this share of lease_s before an observer may call its lease stale.
MARGIN_SHARE = 0.2
# A container claimed this many leases ago or less is not handed over by the balancer: a node
# that restarts after a failover takes containers that did not just move, so each moves once.
SETTLE_LEASES = 3


@dataclass(slots=True)
class Held:
    record: LeaseRecord
    version: str
    renewed_at: float  # monotonic, at the start of the last write of the lease that succeeded
    claimed_at: float  # monotonic, when this node won the lease


class Holdings:
    """This node's leases: ``holds`` from the clock, ``renew`` on its own thread, stops apart."""

    def __init__(
        self,
        registers: Registers,
        *,
        node_id: str,
        lease_s: float,
        clock: Callable[[], float],
        stop_container: Callable[[int], None],
        metrics: ClusterMetrics,
        writers: ThreadPoolExecutor,
    ) -> None:
        self.registers = registers
        self.node_id = node_id
        self.lease_s = lease_s
        self.clock = clock
        self.metrics = metrics
        self._stop_container = stop_container
        self._writers = writers
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()  # guards _held, _moving and _to_stop; never held across a call out
        self._moving: set[int] = set()  # containers whose lease the round writes now
        self._to_stop: list[int] = []
        self._stopping: set[int] = set()  # lost, and not stopped yet: not to be claimed again meanwhile
        self._stops_due = threading.Condition(self._lock)
        self._moved = threading.Condition(self._lock)

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    # ------------------------------------------------------------ queries
    def deadline(self, held: Held) -> float:
        return held.renewed_at + self.lease_s * (1 - MARGIN_SHARE)

    def holds(self, container: int) -> bool:
        held = self._held.get(container)
        return held is not None and self.clock() < self.deadline(held)

    def held(self) -> list[int]:
        return sorted(c for c in list(self._held) if self.holds(c))

    def get(self, container: int) -> Held | None:
        return self._held.get(container)

    def snapshot(self) -> dict[int, Held]:
        with self._lock:
            return dict(self._held)

    def settled(self) -> set[int]:
        """The containers held long enough to be handed over (``SETTLE_LEASES``)."""
        now = self.clock()
        return {c for c, h in self.snapshot().items() if now - h.claimed_at > SETTLE_LEASES * self.lease_s}

    def stopping(self) -> set[int]:
        """The containers lost and not stopped yet (the round claims none of them meanwhile)."""
        with self._lock:
            return set(self._stopping)

    def next_due(self) -> float:
        """When the next renewal is due (monotonic): a renewal period after the oldest one."""
        renewed = [h.renewed_at for h in self.snapshot().values()]
        return min(renewed, default=self.clock()) + self.renew_every_s

    # ------------------------------------------------------------ the round's moves
    @contextmanager
    def moving(self, container: int) -> Iterator[None]:
        """While the round writes ``container``'s lease, renewals leave it alone (after one under way)."""
        with self._lock:
            while container in self._moving:
                self._moved.wait()
            self._moving.add(container)
        try:
            yield
        finally:
            with self._lock:
                self._moving.discard(container)
                self._moved.notify_all()

    def won(self, container: int, record: LeaseRecord, version: str, started: float) -> None:
        with self._lock:
            self._held[container] = Held(record, version, started, self.clock())

    def take_back(self, container: int) -> Held | None:
        """Stop holding ``container`` (to release it): no renewal, and ``holds`` is False from now."""
        with self._lock:
            return self._held.pop(container, None)

    # ------------------------------------------------------------ renewals
    def renew(self) -> None:
        """Give up the leases past their deadline, then renew those due, all at once."""
        now = self.clock()
        due: list[tuple[int, Held]] = []
        for container, held in sorted(self.snapshot().items()):
            if now >= self.deadline(held):
                self.lose(container, held, "expired", "its lease could not be renewed in time")
            elif now - held.renewed_at >= self.renew_every_s:
                due.append((container, held))
        for _ in self._writers.map(lambda item: self._renew_one(*item), due):
            pass

    def _renew_one(self, container: int, held: Held) -> None:
        with self._lock:
            if container in self._moving or self._held.get(container) is not held:
                return  # claimed again or released by the round meanwhile
            self._moving.add(container)
        try:
            started = self.clock()
            record = held.record.renewed()
            name = lease_register_name(container)
            try:
                version = self.registers.replace(name, record.encode(), held.version)
            except RegisterConflict:
                self.lose(container, held, "taken", "its lease was taken")
                return
            except RegisterError as exc:
                log.warning("node %s could not renew container %d's lease: %s", self.node_id, container, exc)
                self.metrics.renewal_errors.inc()
                return
            self.metrics.renewals.inc()
            with self._lock:
                if self._held.get(container) is held:
                    self._held[container] = Held(record, version, started, held.claimed_at)
        finally:
            with self._lock:
                self._moving.discard(container)
                self._moved.notify_all()

    def lose(self, container: int, held: Held, reason: str, why: str) -> None:
        """``container`` is no longer held: it stops at once for requests, and is stopped apart."""
        with self._lock:
            if self._held.get(container) is not held:
                return
            del self._held[container]
            self._to_stop.append(container)
            self._stopping.add(container)
            self._stops_due.notify()
        log.warning("node %s stops container %d: %s", self.node_id, container, why)
        self.metrics.losses[reason].inc()

    # ------------------------------------------------------------ stops
    def stop_lost(self) -> None:
        """Stop the containers lost since the last call (a stop finishes what is in flight)."""
        with self._lock:
            lost, self._to_stop = self._to_stop, []
        for container in lost:
            try:
                self._stop_container(container)
            except Exception:
                log.exception("node %s: stopping container %d failed", self.node_id, container)
            with self._lock:
                self._stopping.discard(container)

    def run_renewals(self, stop: threading.Event, renew: Callable[[], None]) -> None:
        """Call ``renew`` (the leases due, and the heartbeat) until ``stop``: each lease when it is due,
        the heartbeat every renewal period.

        A pass longer than the margin left (``lease_s`` less the margin, less
        a renewal period) lets leases run out while the node lives: the
        bucket answers too slowly for ``lease_s``. Such a pass is logged.
        """
        while not stop.is_set():
            began = self.clock()
            try:
                renew()
            except Exception:
                log.exception("lease renewals of node %s failed", self.node_id)
            took = self.clock() - began
            if took > self.lease_s * (1 - MARGIN_SHARE) - self.renew_every_s:
                log.warning(
                    "node %s: renewing its leases took %.1f s; a lease renewed every %.1f s runs out %.1f s "
                    "after its renewal began, so renewals this slow let leases run out while the node lives "
                    "(the bucket answers slowly: raise lease_s; or the process was paused meanwhile)",
                    self.node_id, took, self.renew_every_s, self.lease_s * (1 - MARGIN_SHARE),
                )
            due = min(self.next_due(), began + self.renew_every_s)
            stop.wait(max(0.01, due - self.clock()))

    def run_stops(self, stop: threading.Event) -> None:
        """Stop lost containers as they are lost, until ``stop`` is set (then call ``end_stops``)."""
        while not stop.is_set():
            with self._lock:
                if not self._to_stop:
                    self._stops_due.wait(1.0)
            self.stop_lost()

    def end_stops(self) -> None:
        """Wake ``run_stops`` so that it sees its ``stop``."""
        with self._lock:
            self._stops_due.notify_all()
