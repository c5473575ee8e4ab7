"""A round's observation: every node record and lease of the cluster, read at once.

A round waits about two reads (the two listings at once, then every register
at once), not one per register: a slow bucket would otherwise stretch it by
every read, and with it the time until a node sees a lease change. Each
version counts as seen when its own read ended (after the write that made it
began, as staleness needs), not when the slowest read of the round did.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from engine.cluster.records import LeaseRecord, NodeRecord, Observer
from engine.cluster.registers import Register, Registers
from engine.naming import lease_prefix, node_prefix, parse_lease_register_name, parse_node_register_name


@dataclass(slots=True)
class Observed:
    """The node records by node id, and each container's lease with its register version."""

    nodes: dict[str, NodeRecord]
    leases: dict[int, tuple[LeaseRecord, str]]


def observe(
    registers: Registers,
    observer: Observer,
    readers: ThreadPoolExecutor,
    clock: Callable[[], float],
    container_count: int,
) -> Observed:
    """Read every node record and lease on ``readers``; ``observer`` learns each version's age."""
    nodes: dict[str, NodeRecord] = {}
    leases: dict[int, tuple[LeaseRecord, str]] = {}
    listings = [readers.submit(registers.names, prefix) for prefix in (node_prefix(), lease_prefix())]
    names = [name for listing in listings for name in listing.result()]

    def read(name: str) -> tuple[Register | None, float]:
        register = registers.read(name)
        return register, clock()

    reads = [read(name) for name in names] if len(names) <= 1 else list(readers.map(read, names))
    for name, (register, read_at) in zip(names, reads, strict=True):
        if register is None:
            continue
        observer.saw(name, register.version, read_at)
        if (node := parse_node_register_name(name)) is not None:
            nodes[node] = NodeRecord.decode(name, register.data)
            continue
        container = parse_lease_register_name(name)
        if container is not None and container < container_count:
            leases[container] = (LeaseRecord.decode(name, register.data), register.version)
    observer.forget(set(names))
    return Observed(nodes, leases)
