"""Which containers a node claims or hands over: Pravega's balancer rule, decided locally.

Seed 000 ("Segment Container Manager") balances containers so that the
counts of any two live nodes differ by at most one. segstore has no
controller: every node applies the same rule to the same view of the leases
and acts only for itself, one step at a time:

- a node claims free containers while it holds the fewest of all live nodes
  and fewer than its fair share rounded up; a container left free for a
  whole lease (its rightful claimer is slow or stuck) goes to any node below
  that share. Nodes tied for the fewest start at different free containers
  (by their rank among them), so a dead node's containers are claimed in
  one round, not one more round per container;
- while some node holds two or more fewer than the most loaded one and no
  container is free, the most loaded node (the first by id among equals)
  hands one container over, one that has settled (not just recovered after
  a move: a node that comes back then costs one more move, not two). A free
  container goes to the node with the fewest first: handing another over
  before that claim is seen would move one container too many (the giver
  would claim it back).

Views of different nodes may briefly differ; conflicting claims are settled
by the lease's compare-and-set, and the rule converges once views agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Plan:
    claim: tuple[int, ...] = ()
    release: tuple[int, ...] = ()


def plan(
    me: str,
    live: Set[str],
    owners: Mapping[int, str],
    free: Set[int],
    container_count: int,
    long_free: Set[int] = frozenset(),
    settled: Set[int] | None = None,
) -> Plan:
    """What ``me`` should claim or release now.

    ``live``: the live nodes (``me`` among them); ``owners``: containers held
    under a live lease by a live node; ``free``: containers nobody holds
    (unowned, released, or stale); ``long_free``: those of them free for a
    whole lease already; ``settled``: those of ``me``'s containers it may
    hand over (None: all).
    """
    assert me in live, (me, live)
    assert not free & owners.keys(), "a container is free or owned, not both"
    assert long_free <= free, "a container free for long is free"
    counts = counts_of(live, owners)
    fair_ceiling = -(-container_count // len(live))
    fewest = min(counts.values())
    mine = counts[me]
    if free and mine == fewest and mine < fair_ceiling:
        tied = sorted(node for node, count in counts.items() if count == fewest)
        order = sorted(free)
        start = tied.index(me) % len(order)
        return Plan(claim=tuple((order[start:] + order[:start])[: fair_ceiling - mine]))
    if long_free and mine < fair_ceiling:
        return Plan(claim=tuple(sorted(long_free)[: fair_ceiling - mine]))
    most = max(counts.values())
    if free:
        return Plan()  # claimed first, by the node with the fewest: then the counts say what moves
    if most - fewest > 1 and me == min(node for node, count in counts.items() if count == most):
        held = sorted(
            container
            for container, owner in owners.items()
            if owner == me and (settled is None or container in settled)
        )
        return Plan(release=(held[-1],)) if held else Plan()
    return Plan()


def counts_of(nodes: Set[str], owners: Mapping[int, str]) -> dict[str, int]:
    """How many containers each of ``nodes`` holds by ``owners``."""
    counts = dict.fromkeys(nodes, 0)
    for owner in owners.values():
        if owner in counts:
            counts[owner] += 1
    return counts


def fewest(counts: Mapping[str, int]) -> str | None:
    """The node with the fewest containers (the first by id among equals); None if there is none."""
    return min(counts, key=lambda node: (counts[node], node)) if counts else None
