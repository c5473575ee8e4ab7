"""The balancer: claims spread over the nodes tied for the fewest; only settled containers are handed over;
nothing is handed over while a container is free."""

from __future__ import annotations

from engine.cluster import balancer


def test_nodes_tied_for_the_fewest_claim_different_free_containers() -> None:
    live = {"b", "c"}
    owners = {2: "b", 3: "c"}
    free = {0, 1}  # a dead node's two containers
    claims = [balancer.plan(node, live, owners, free, 4).claim for node in ("b", "c")]
    assert claims == [(0,), (1,)]


def test_only_a_settled_container_is_handed_over() -> None:
    live = {"a", "b", "c"}
    owners = {0: "b", 2: "b", 1: "c", 3: "c"}  # a came back owning nothing; b took 0 over just now
    assert balancer.plan("b", live, owners, set(), 4, settled={2}).release == (2,)
    assert balancer.plan("b", live, owners, set(), 4, settled=set()).release == ()
    assert balancer.plan("b", live, owners, set(), 4).release == (2,)


def test_nothing_is_handed_over_while_a_container_is_free() -> None:
    """A node back from a restart, with two containers just handed to it and not claimed yet, as b sees it.

    Handing a third over would leave b with one and a with three once a claims: b would claim one back.
    """
    live = {"a", "b", "c"}
    owners = {0: "b", 2: "b", 1: "c", 3: "c"}
    free = {4, 5}  # released by b and c for a, which has not claimed them yet
    assert balancer.plan("b", live, owners, free, 6) == balancer.Plan()
    assert balancer.plan("a", live, owners, free, 6).claim == (4, 5)
    assert balancer.plan("b", live, owners | {4: "a", 5: "a"}, set(), 6) == balancer.Plan()
