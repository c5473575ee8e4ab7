"""One ``/metrics`` scrape for a node of several processes: every process's metrics, each labelled.

Each process of a node (docs/design.md "Processes per node") keeps its own
registry. A scrape that lands on any of them asks the others at their own
addresses (with ``Segstore-Metrics-Here``, which answers that process's
alone) and merges the families, each sample labelled ``process="p<i>"``. A
process that does not answer is left out of that scrape; its containers are
then counted by the process that took them over.
"""

from __future__ import annotations

from collections.abc import Iterable

import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engine import SegmentStore

HERE = "Segstore-Metrics-Here"
_TIMEOUT_S = 5.0


def scrape(store: SegmentStore, here: bool) -> bytes:
    """This process's metrics, or (a node's process asked without ``here``) the whole node's."""
    own = generate_latest(store.registry)
    node = store.node
    if here or node is None or not store.settings.local_members:
        return own
    texts = {node.node_id: own.decode()}
    for member, url in sorted(store.sibling_urls().items()):
        try:
            answer = requests.get(f"{url}/metrics", headers={HERE: "1"}, timeout=_TIMEOUT_S)
            answer.raise_for_status()
        except requests.RequestException:
            continue
        texts[member] = answer.text
    return merged(texts)


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
