"""Nodes sharing containers through leases: balance, failover, pauses, partitions, graceful handover.

A simulated cluster: coordinators over one set of in-memory registers (atomic
compare-and-set), a shared fake clock, and hosts that record what they run.
After every step the one-holder invariant is checked: no container is held
by two nodes at any instant.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from engine.cluster.coordinator import RECOVERY_S, ClusterMismatch, Coordinator
from engine.cluster.records import LeaseRecord, Offer
from engine.cluster.registers import MemoryRegisters, Register, RegisterError, S3Registers
from engine.metrics import ClusterMetrics
from engine.naming import lease_register_name

LEASE_S = 9.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Cut:
    """Registers that fail while ``down`` (a node cut off from the bucket)."""

    def __init__(self, registers: Any) -> None:
        self.registers = registers
        self.down = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.registers, name)

        def call(*args: Any) -> Any:
            if self.down:
                raise RegisterError("cut off")
            return method(*args)

        return call


class Host:
    """Records the containers a node runs; a stop happens while the lease still names this node."""

    def __init__(self, node: str, registers: MemoryRegisters) -> None:
        self.node = node
        self.registers = registers
        self.running: set[int] = set()
        self.failing: set[int] = set()  # started, but their recovery failed
        self.starts = 0

    def start_container(self, container: int) -> None:
        assert container not in self.running
        self.running.add(container)
        self.failing.discard(container)
        self.starts += 1

    def stop_container(self, container: int) -> None:
        self.running.discard(container)

    def failed(self, container: int) -> bool:
        return container in self.failing


class Cluster:
    def __init__(self, containers: int) -> None:
        self.containers = containers
        self.registers = MemoryRegisters()
        self.clock = Clock()
        self.nodes: dict[str, Coordinator] = {}
        self.hosts: dict[str, Host] = {}
        self.cuts: dict[str, Cut] = {}
        self.registries: dict[str, CollectorRegistry] = {}
        self.released: list[tuple[str, int]] = []  # (node, container) each hand-over announced
        self.refusing: set[str] = set()  # the URLs nothing listens at (their node's process is gone)

    def add(self, node: str) -> Coordinator:
        cut = Cut(self.registers)
        host = Host(node, self.registers)
        self.registries[node] = CollectorRegistry()
        coordinator = Coordinator(
            cut, node_id=node, url=f"http://{node}", container_count=self.containers, host=host,
            lease_s=LEASE_S, clock=self.clock, metrics=ClusterMetrics(self.registries[node]),
            released=lambda container, offer: self.announce(node, container, offer),
            refuses=lambda url: url in self.refusing,
        )
        coordinator.join()
        self.nodes[node], self.hosts[node], self.cuts[node] = coordinator, host, cut
        return coordinator

    def announce(self, node: str, container: int, offer: Offer | None) -> None:
        """``node`` handed ``container`` over: tell the others, as its peer calls would."""
        self.released.append((node, container))
        for other, coordinator in self.nodes.items():
            if other != node and offer is not None:
                coordinator.offered(offer)

    def check(self) -> None:
        for container in range(self.containers):
            holders = [node for node, c in self.nodes.items() if c.holds(container)]
            assert len(holders) <= 1, f"container {container} held by {holders} at {self.clock.now}"

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.check()

    def rounds(self, count: int, nodes: list[str] | None = None) -> None:
        """``count`` rounds: the clock moves a third of a lease, then each node (or those named) ticks."""
        for _ in range(count):
            self.advance(LEASE_S / 3)
            for node in nodes if nodes is not None else list(self.nodes):
                self.nodes[node].tick()
                self.check()

    def metric(self, node: str, name: str, **labels: str) -> float:
        return self.registries[node].get_sample_value(name, labels) or 0.0

    def held(self) -> dict[str, list[int]]:
        return {node: c.held() for node, c in self.nodes.items()}

    def owned_once_by(self, nodes: list[str]) -> bool:
        held = [container for node in nodes for container in self.nodes[node].held()]
        return sorted(held) == list(range(self.containers))


def counts(held: dict[str, list[int]], nodes: list[str]) -> list[int]:
    return sorted(len(held[node]) for node in nodes)


def test_three_nodes_share_containers_within_one_of_each_other() -> None:
    cluster = Cluster(8)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(12)
    assert counts(cluster.held(), ["a", "b", "c"]) == [2, 3, 3]
    assert cluster.owned_once_by(["a", "b", "c"])
    for node, host in cluster.hosts.items():
        assert sorted(host.running) == cluster.nodes[node].held()


def test_a_dead_nodes_containers_move_within_a_lease_and_a_round() -> None:
    cluster = Cluster(6)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(10)
    lost = cluster.nodes["b"].held()
    assert len(lost) == 2
    died_at = cluster.clock.now
    moved_at = None
    for _ in range(12):
        cluster.rounds(1, ["a", "c"])
        if moved_at is None and cluster.owned_once_by(["a", "c"]):
            moved_at = cluster.clock.now
    assert moved_at is not None and moved_at - died_at <= LEASE_S + 2 * LEASE_S / 3
    assert counts(cluster.held(), ["a", "c"]) == [3, 3]


def test_a_dead_nodes_containers_are_claimed_the_moment_its_last_record_runs_out() -> None:
    """Its heartbeat seen half a second after its leases: the round when the leases run out finds it
    still live, and the balancer then claims nothing; the round when the heartbeat runs out claims."""
    cluster = Cluster(6)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(10)
    b = cluster.nodes["b"]
    cluster.advance(LEASE_S / 3)
    b.leases.renew()  # b's last renewals...
    for node in ("a", "c"):
        cluster.nodes[node].round()
    cluster.advance(0.5)
    b.renew()  # ...and its last heartbeat; then b dies
    for node in ("a", "c"):
        cluster.nodes[node].round()
    last_seen = cluster.clock.now
    moved_at = None
    while moved_at is None and cluster.clock.now < last_seen + 2 * LEASE_S:
        a = cluster.nodes["a"]  # as its run loop waits: a round's period, or until the next expiry
        cluster.advance(max(0.01, min(a.round_every_s, a._next_expiry() - cluster.clock.now)))
        for node in ("a", "c"):
            cluster.nodes[node].tick()
        if cluster.owned_once_by(["a", "c"]):
            moved_at = cluster.clock.now
    assert moved_at is not None and moved_at <= last_seen + LEASE_S + 0.05, (moved_at, last_seen)


@pytest.mark.parametrize("refused", [True, False], ids=["crashed", "paused"])
def test_a_node_whose_address_refuses_connections_loses_its_containers_before_its_leases_run_out(
    refused: bool,
) -> None:
    """A crashed node (nothing listens at its URL) is found dead once its heartbeat is late; a paused
    one (the kernel still accepts for it) keeps its leases until they run out."""
    cluster = Cluster(6)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(10)
    b = cluster.nodes.pop("b")  # it dies (or stops) right after its last renewal: it holds nothing now
    lost = b.held()
    if refused:
        cluster.refusing.add("http://b")
    died_at = cluster.clock.now
    a = cluster.nodes["a"]
    a.unreachable("b")  # a request a forwarded to it failed
    moved_at = None
    while moved_at is None and cluster.clock.now < died_at + 2 * LEASE_S:
        cluster.advance(max(0.01, min(a.round_every_s, a._next_expiry() - cluster.clock.now)))
        for node in ("a", "c"):
            cluster.nodes[node].tick()
        if cluster.owned_once_by(["a", "c"]):
            moved_at = cluster.clock.now
    assert moved_at is not None
    dead = sum(cluster.metric(node, "segstore_cluster_takeovers_total", lease="dead") for node in ("a", "c"))
    if refused:
        # Overdue as each node saw its last heartbeat, which one saw a round late.
        assert moved_at <= died_at + a.liveness.overdue_s + a.round_every_s + 0.05, moved_at - died_at
        assert moved_at - died_at < LEASE_S
        assert dead == len(lost)
        said, _ = cluster.nodes["c"].describe(lost[0])
        assert "served by node" in said or "took it over" in said
    else:
        assert moved_at >= died_at + LEASE_S
        assert dead == 0


def test_a_node_that_recovered_a_container_is_routed_to_before_the_next_round() -> None:
    cluster = Cluster(3)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(10)
    a = cluster.nodes["a"]
    (mine,) = a.held()
    (moved,) = cluster.nodes["b"].held()
    a.learned(moved, "c")  # c says it recovered b's container (as after b's death)
    assert a.view().owners[moved] == "c"
    a.learned(mine, "c")  # a holds this one: it stays here
    a.learned(moved, "z")  # no such live node
    assert a.view().owners[mine] == "a" and a.view().owners[moved] == "c"
    cluster.rounds(1)  # the round sets the view from the leases again
    assert a.view().owners[moved] == "b"


def test_a_dead_owners_container_says_what_its_takeover_waits_for_and_how_long() -> None:
    cluster = Cluster(3)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(10)
    (lost,) = cluster.nodes["b"].held()
    assert cluster.nodes["a"].describe(lost) == (f"container {lost} is served by node b", RECOVERY_S)
    assert cluster.nodes["b"].describe(lost) == (
        f"container {lost}: node b took it over and is recovering it", RECOVERY_S
    )
    cluster.rounds(2, ["a", "c"])  # b is dead: its lease keeps its version
    cluster.nodes["a"].unreachable("b")  # a request forwarded to it was refused
    said, wait_s = cluster.nodes["a"].describe(lost)
    assert said.startswith(f"container {lost}: waiting for node b's lease to run out, about ")
    left = int(said.split("about ")[1].split(" s")[0])
    assert 0 < left < LEASE_S
    assert left - 1 < wait_s - RECOVERY_S <= left  # the Retry-After: the lease's rest, then a recovery
    cluster.rounds(3, ["a", "c"])
    (taker,) = [node for node in ("a", "c") if lost in cluster.nodes[node].held()]
    other = "a" if taker == "c" else "c"
    assert cluster.nodes[other].describe(lost)[0] == f"container {lost} is served by node {taker}"
    assert cluster.metric(taker, "segstore_cluster_takeovers_total", lease="expired") == 1
    assert cluster.metric(taker, "segstore_cluster_leases_held") == 2
    assert cluster.metric(taker, "segstore_cluster_lease_renewals_total") > 0


def test_a_container_that_failed_is_handed_back_and_started_again() -> None:
    """A failed recovery (fenced by a claimant that since lost the lease) does not keep a lease idle."""
    cluster = Cluster(4)
    for node in ("a", "b"):
        cluster.add(node)
    cluster.rounds(10)
    container = cluster.nodes["a"].held()[0]
    starts = sum(host.starts for host in cluster.hosts.values())
    cluster.hosts["a"].failing.add(container)
    cluster.rounds(2)
    assert container not in cluster.hosts["a"].failing  # stopped, lease released, claimed and started anew
    assert sum(host.starts for host in cluster.hosts.values()) == starts + 1
    assert any(container in host.running for host in cluster.hosts.values())
    assert cluster.owned_once_by(["a", "b"])


def test_a_paused_node_stops_serving_before_others_take_over_and_rejoins_owning_nothing() -> None:
    """SIGSTOP past the leases, then SIGCONT: the node gives its containers up, acknowledging nothing."""
    cluster = Cluster(6)
    for node in ("a", "b", "c"):
        cluster.add(node)
    cluster.rounds(10)
    paused = cluster.nodes["a"]
    had = paused.held()
    assert had
    cluster.rounds(9, ["b", "c"])  # three leases: every check passed while a did nothing
    assert not paused.held()  # its leases ran out on its own clock, without a round
    assert cluster.owned_once_by(["b", "c"])
    paused.tick()  # resumed: its first round stops what it had, before anything else
    assert cluster.hosts["a"].running == set()
    assert not paused.held()
    assert cluster.metric("a", "segstore_cluster_lease_losses_total", reason="expired") == len(had)
    assert cluster.metric("a", "segstore_cluster_leases_held") == 0
    cluster.rounds(8)
    assert counts(cluster.held(), ["a", "b", "c"]) == [2, 2, 2]


def test_a_node_cut_off_from_the_bucket_gives_up_in_time() -> None:
    cluster = Cluster(4)
    for node in ("a", "b"):
        cluster.add(node)
    cluster.rounds(8)
    cluster.cuts["a"].down = True
    for _ in range(9):
        cluster.rounds(1)
    assert cluster.hosts["a"].running == set()
    assert cluster.owned_once_by(["b"])
    cluster.cuts["a"].down = False
    cluster.rounds(10)
    assert counts(cluster.held(), ["a", "b"]) == [2, 2]


def test_a_joining_node_gets_its_share_by_graceful_handover() -> None:
    cluster = Cluster(6)
    for node in ("a", "b"):
        cluster.add(node)
    cluster.rounds(8)
    assert counts(cluster.held(), ["a", "b"]) == [3, 3]
    stopped_while_leased: list[bool] = []
    for node in ("a", "b"):
        host = cluster.hosts[node]
        plain_stop = host.stop_container

        def stop(container: int, node: str = node, plain_stop: Any = plain_stop) -> None:
            register = cluster.registers.read(lease_register_name(container))
            assert register is not None
            stopped_while_leased.append(LeaseRecord.decode("lease", register.data).owner == node)
            plain_stop(container)

        host.stop_container = stop  # type: ignore[method-assign]
    cluster.add("c")
    joined_at = cluster.clock.now
    cluster.rounds(10)
    assert counts(cluster.held(), ["a", "b", "c"]) == [2, 2, 2]
    assert cluster.owned_once_by(["a", "b", "c"])
    assert stopped_while_leased and all(stopped_while_leased)
    assert len(cluster.released) == len(stopped_while_leased)  # each announced: c claims it at once
    # handed over, not expired: the newcomer has its share well before a lease could run out twice
    assert cluster.clock.now - joined_at <= 10 * LEASE_S / 3


def test_a_node_that_leaves_hands_everything_over_at_once() -> None:
    cluster = Cluster(4)
    for node in ("a", "b"):
        cluster.add(node)
    cluster.rounds(8)
    cluster.nodes["a"].leave()
    assert cluster.hosts["a"].running == set()
    cluster.rounds(2, ["b"])
    assert cluster.owned_once_by(["b"])


def test_nodes_stopping_together_do_not_claim_what_the_other_hands_over() -> None:
    """The processes of a node get SIGTERM at once: each drains, then leaves; none takes the other's."""
    cluster = Cluster(4)
    for node in ("a", "b"):
        cluster.add(node)
    cluster.rounds(8)
    kept = cluster.held()["b"]
    for node in ("a", "b"):
        cluster.nodes[node].drain()
    cluster.nodes["a"].leave()
    cluster.rounds(3, ["b"])
    assert cluster.held()["b"] == kept, "a draining node claimed a container"
    cluster.nodes["b"].leave()
    assert cluster.held() == {"a": [], "b": []}


def test_a_node_with_another_container_count_is_refused() -> None:
    cluster = Cluster(4)
    cluster.add("a")
    stranger = Coordinator(cluster.registers, node_id="z", url="http://z", container_count=8,
                           host=Host("z", cluster.registers), clock=cluster.clock)
    with pytest.raises(ClusterMismatch, match="4 containers"):
        stranger.join()


def test_a_restarted_node_waits_out_the_lease_its_earlier_run_held() -> None:
    """Same node id, new process: the old process may still be alive, so its lease must expire first."""
    cluster = Cluster(2)
    cluster.add("a")
    cluster.rounds(3)
    old = cluster.nodes["a"]
    assert old.held() == [0, 1]
    host = Host("a", cluster.registers)
    again = Coordinator(cluster.registers, node_id="a", url="http://a", container_count=2, host=host,
                        lease_s=LEASE_S, clock=cluster.clock)
    again.join()
    again.tick()
    assert again.held() == [] and old.held() == [0, 1]
    del cluster.nodes["a"]
    cluster.nodes["a"] = again
    cluster.rounds(6)
    assert again.held() == [0, 1] and not old.held()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tick", "wait", "pause", "cut"]), st.integers(0, 2)), max_size=80))
def test_any_schedule_keeps_one_holder_and_converges_once_healed(schedule: list[tuple[str, int]]) -> None:
    cluster = Cluster(5)
    names = ["a", "b", "c"]
    for node in names:
        cluster.add(node)
    paused: set[str] = set()
    for action, index in schedule:
        node = names[index]
        if action == "tick" and node not in paused:
            cluster.nodes[node].tick()
        elif action == "wait":
            cluster.advance(LEASE_S / 4 * (index + 1))
        elif action == "pause":
            paused ^= {node}
        elif action == "cut":
            cluster.cuts[node].down = not cluster.cuts[node].down
        cluster.check()
    for cut in cluster.cuts.values():
        cut.down = False
    cluster.rounds(14)
    assert cluster.owned_once_by(names)
    assert max(counts(cluster.held(), names)) - min(counts(cluster.held(), names)) <= 1
    for node, host in cluster.hosts.items():
        assert sorted(host.running) == cluster.nodes[node].held()


@pytest.mark.slow
def test_nodes_racing_in_threads_never_share_a_container() -> None:
    registers = MemoryRegisters()
    lease_s = 0.3
    nodes = []
    for name in "abcd":
        coordinator = Coordinator(registers, node_id=name, url=f"http://{name}", container_count=16,
                                  host=Host(name, registers), lease_s=lease_s)
        coordinator.join()
        nodes.append(coordinator)
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,)) for c in nodes]
    for thread in threads:
        thread.start()
    shared: list[tuple[int, list[str]]] = []
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        for container in range(16):
            holders = [c.node_id for c in nodes if c.holds(container)]
            if len(holders) > 1:
                shared.append((container, holders))
        time.sleep(0.001)
    stop.set()
    for thread in threads:
        thread.join()
    assert not shared
    held = sorted(container for c in nodes for container in c.held())
    assert held == list(range(16))
    assert max(len(c.held()) for c in nodes) - min(len(c.held()) for c in nodes) <= 1


def test_two_nodes_on_s3_split_the_containers_and_one_takes_all_when_the_other_leaves(
    s3_bucket: str, s3_client: Any
) -> None:
    clock = Clock()
    registers = S3Registers(s3_bucket, "cluster", client=s3_client)
    nodes = []
    for name in "ab":
        coordinator = Coordinator(registers, node_id=name, url=f"http://{name}", container_count=4,
                                  host=Host(name, MemoryRegisters()), lease_s=LEASE_S, clock=clock)
        coordinator.join()
        nodes.append(coordinator)
    for _ in range(6):
        clock.now += LEASE_S / 3
        for coordinator in nodes:
            coordinator.tick()
    assert sorted(len(c.held()) for c in nodes) == [2, 2]
    assert registers.read("cluster.json") is not None
    assert isinstance(registers.read(lease_register_name(0)), Register)
    nodes[0].leave()
    for _ in range(2):
        clock.now += LEASE_S / 3
        nodes[1].tick()
    assert nodes[1].held() == [0, 1, 2, 3]
    assert set(nodes[1].view().owners.values()) == {"b"}


def test_renewals_slow_enough_to_let_leases_run_out_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Such renewals let leases run out while the node lives: the log says why containers moved."""
    cluster = Cluster(4)
    node = cluster.add("a")
    stop = threading.Event()

    passes = [LEASE_S * 0.45, LEASE_S * 0.5]  # the margin: 0.8 lease less a third, about 0.47 lease

    def slow_renewals() -> None:
        cluster.clock.now += passes.pop(0)
        if not passes:
            stop.set()

    with caplog.at_level(logging.WARNING, logger="engine.cluster.holdings"):
        node.leases.run_renewals(stop, slow_renewals)
    (record,) = caplog.records  # the second pass only
    assert record.getMessage().startswith(
        f"node a: renewing its leases took {LEASE_S / 2:.1f} s; a lease renewed every {LEASE_S / 3:.1f} s "
        f"runs out {LEASE_S * 0.8:.1f} s after its renewal began"
    )


class StalledListings(MemoryRegisters):
    """A bucket whose listings (a round's first step) wait while ``stalled`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = threading.Event()
        self.released = threading.Event()

    def names(self, prefix: str) -> list[str]:
        if self.stalled.is_set():
            self.released.wait(10)
        return super().names(prefix)


def test_renewals_never_wait_behind_a_round() -> None:
    registers = StalledListings()
    lease_s = 0.3
    node = Coordinator(registers, node_id="a", url="http://a", container_count=4,
                       host=Host("a", registers), lease_s=lease_s)
    node.join()
    node.tick()
    assert node.held() == [0, 1, 2, 3]
    registers.stalled.set()  # every round from now on waits for its listing
    stop = threading.Event()
    runner = threading.Thread(target=node.run, args=(stop,))
    runner.start()
    try:
        until = time.monotonic() + 6 * lease_s
        while time.monotonic() < until:
            assert node.held() == [0, 1, 2, 3]
            time.sleep(0.005)
    finally:
        stop.set()
        registers.released.set()
        runner.join()


class SlowReads(MemoryRegisters):
    """A bucket that takes ``READ_S`` to answer each read and each listing once ``slow`` is set."""

    READ_S = 0.5
    slow = False

    def read(self, name: str) -> Register | None:
        time.sleep(self.READ_S if self.slow else 0)
        return super().read(name)

    def names(self, prefix: str) -> list[str]:
        time.sleep(self.READ_S if self.slow else 0)
        return super().names(prefix)


def test_a_round_reads_the_registers_at_once() -> None:
    """Two listings and seven registers (three nodes, four leases) cost a round about two reads, not nine."""
    cluster = Cluster(4)
    registers = cluster.registers = SlowReads()
    for node in "abc":
        cluster.add(node)
    cluster.rounds(3)
    registers.slow = True
    started = time.monotonic()
    cluster.nodes["a"].round()
    assert time.monotonic() - started < 2.5 * SlowReads.READ_S  # one after another: at least three


def _handed_to_b(cluster: Cluster) -> int:
    """Node a holds every container for long; b joins, and a hands one over to it: that container."""
    cluster.add("a")
    cluster.rounds(12)
    assert counts(cluster.held(), ["a"]) == [4]
    cluster.add("b")
    cluster.nodes["a"].round()
    (handed,) = [container for node, container in cluster.released if node == "a"]
    assert not cluster.nodes["b"].holds(handed)

    def listing_fails(prefix: str) -> list[str]:
        raise RegisterError(f"listing of {prefix!r} failed")

    cluster.cuts["b"].names = listing_fails  # type: ignore[attr-defined]
    return handed


def test_a_hand_overs_taker_claims_it_before_it_reads_the_cluster() -> None:
    cluster = Cluster(4)
    handed = _handed_to_b(cluster)
    cluster.nodes["b"].round()  # its reads of the cluster fail: the claim came first
    assert cluster.nodes["b"].holds(handed) and handed in cluster.hosts["b"].running
    assert cluster.metric("b", "segstore_cluster_takeovers_total", lease="released") == 1


def test_a_hand_over_someone_else_took_meanwhile_is_left_to_them() -> None:
    cluster = Cluster(4)
    handed = _handed_to_b(cluster)
    name = lease_register_name(handed)
    register = cluster.registers.read(name)
    assert register is not None
    taken = LeaseRecord.decode(name, register.data).claimed_by("c")
    cluster.registers.replace(name, taken.encode(), register.version)
    cluster.nodes["b"].round()
    assert not cluster.nodes["b"].holds(handed) and handed not in cluster.hosts["b"].running
    cluster.check()
