"""The balancer: claims spread over the nodes tied for the fewest; only settled containers are handed over."""

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
