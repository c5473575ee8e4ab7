"""What a node of several processes answers as one: ``/metrics``, ``/healthz`` and ``/readyz``.

Each process of a node (docs/design.md "Processes per node") keeps its own
registry and runs its own containers. A request that lands on any of them
asks the others at their own addresses (with ``Segstore-Process-Here``, which
answers for that process alone) and merges their answers: metric families
with each sample labelled ``process="p<i>"``; each container's state from the
process serving it. A process that does not answer is left out: its
containers are counted by the process that takes them over, and until then
the node is not healthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engine import RECOVERING, SegmentStore

HERE = "Segstore-Process-Here"
_TIMEOUT_S = 5.0


def scrape(store: SegmentStore, here: bool) -> bytes:
    """This process's metrics, or (a node's process asked without ``here``) the whole node's."""
    own = generate_latest(store.registry)
    node = store.node
    if here or node is None or not store.settings.local_members:
        return own
    texts = {node.node_id: own.decode()}
    texts.update((member, answer.text) for member, answer in _ask_siblings(store, "/metrics"))
    return merged(texts)


def container_states(store: SegmentStore, here: bool) -> list[dict[str, Any]]:
    """Each container's id, state and why it does not serve: this process's, or the whole node's.

    On a node of several processes (asked without ``here``), every container
    of the node with the ``process`` serving it; one no process reports is
    ``recovering`` (its next owner has not claimed it yet).
    """
    own = [
        {"id": cid, "state": state, **({"reason": reason} if reason else {})}
        for cid, state, reason in store.container_states()
    ]
    node = store.node
    if here or node is None or not store.settings.local_members:
        return own
    found = {c["id"]: {**c, "process": node.node_id} for c in own}
    for member, answer in _ask_siblings(store, "/healthz"):
        try:
            theirs = answer.json()["containers"]
        except (ValueError, KeyError, TypeError):
            continue
        found.update((c["id"], {**c, "process": member}) for c in theirs if c["id"] not in found)
    return [
        found.get(c, {"id": c, "state": RECOVERING, "reason": "no process of the node serves it yet"})
        for c in range(store.settings.container_count)
    ]


def _ask_siblings(store: SegmentStore, path: str) -> Iterator[tuple[str, requests.Response]]:
    """Each other process's own answer at ``path`` (a 503 is an answer too); those that fail are left out."""
    for member, url in sorted(store.sibling_urls().items()):
        try:
            answer = requests.get(f"{url}{path}", headers={HERE: "1"}, timeout=_TIMEOUT_S)
        except requests.RequestException:
            continue
        if answer.ok or answer.status_code == 503:
            yield member, answer


def merged(texts: dict[str, str]) -> bytes:
    """The metric families of every process's text, one family each, samples labelled by process."""
    families: dict[str, Metric] = {}
    for member, text in texts.items():
        for family in text_string_to_metric_families(text):
            into = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                           family.unit))
            into.samples.extend(s._replace(labels={**s.labels, "process": member}) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families.values()))
    return generate_latest(registry)


class _Families:
    """A collector that gives fixed families."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families
