"""Metrics read off the containers when Prometheus scrapes, not kept up to date on the data path.

Per container: its state (``engine/container/state.py``: one series per
state, 1 for the current one), its segments and open transactions, and what
its Tier 1 log holds on the local disk (files and bytes, as the log tracks
them; nothing with Tier 1 on S3). Per node: the sync rounds of the Tier 1
files (``GroupSync``), the syncs they made and the writes they covered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine import naming
from engine.container import state as container_state
from engine.container.segment_container import SegmentContainer
from engine.tier1.group_sync import GroupSync


class ContainerCollector(Collector):
    """Samples the containers ``containers()`` returns at each scrape."""

    def __init__(self, containers: Callable[[], Sequence[SegmentContainer]]) -> None:
        self._containers = containers

    def collect(self) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "segstore_container_state",
            "1 for the container's current state, 0 for the others.",
            labels=["container", "state"],
        )
        segments = GaugeMetricFamily(
            "segstore_segments",
            "Segments (transactions and other internal ones not counted).",
            labels=["container"],
        )
        transactions = GaugeMetricFamily(
            "segstore_open_transactions",
            "Transactions open (not committed or aborted).",
            labels=["container"],
        )
        tier1_files = GaugeMetricFamily(
            "segstore_tier1_disk_files", "Files of the Tier 1 log on the local disk.", labels=["container"]
        )
        tier1_bytes = GaugeMetricFamily(
            "segstore_tier1_disk_bytes", "Bytes of the Tier 1 log on the local disk.", labels=["container"]
        )
        for container in self._containers():
            label = str(container.container_id)
            current = container.state
            for state in container_state.STATES:
                states.add_metric([label, state], 1.0 if state == current else 0.0)
            user, open_transactions = _count_segments(container)
            segments.add_metric([label], user)
            transactions.add_metric([label], open_transactions)
            disk_usage = getattr(container.durable_log.data_log, "disk_usage", None)
            if disk_usage is not None:
                files, size = disk_usage()
                tier1_files.add_metric([label], files)
                tier1_bytes.add_metric([label], size)
        yield from (states, segments, transactions, tier1_files, tier1_bytes)


class SyncCollector(Collector):
    """The node's Tier 1 sync rounds: writes per sync is how well group commit spans containers."""

    def __init__(self, group: GroupSync) -> None:
        self._group = group

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "segstore_tier1_sync_rounds", "Sync rounds of the Tier 1 files.", value=self._group.rounds
        )
        yield CounterMetricFamily(
            "segstore_tier1_syncs",
            "syncfs or fdatasync calls of the Tier 1 sync rounds.",
            value=self._group.syncs,
        )
        yield CounterMetricFamily(
            "segstore_tier1_synced_writes",
            "Tier 1 file writes made durable by a sync round (of every container).",
            value=self._group.writes,
        )


def _count_segments(container: SegmentContainer) -> tuple[int, int]:
    """(user segments, open transactions) of the container."""
    with container.metadata.lock:
        names = list(container.metadata.names)
    return (
        sum(not naming.is_internal(n) for n in names),
        sum(naming.is_transaction(n) for n in names),
    )
