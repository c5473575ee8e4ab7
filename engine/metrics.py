"""Engine metrics (Prometheus), registered in the store's own registry.

One registry per store keeps tests that build many stores independent; the
HTTP layer adds its request metrics to the same registry and serves it.
Labelled metrics the data path touches are bound to their labels once, here
(a ``labels()`` lookup per append would cost more than the increment).
Counters show no ``_created`` series: it doubles every counter's output and
no dashboard reads it.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)

disable_created_metrics()

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
_SIZE_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)


def _version() -> str:
    try:
        return metadata.version("segstore")
    except metadata.PackageNotFoundError:
        return "unknown"


def register_process_metrics(registry: CollectorRegistry) -> None:
    """The process's memory, CPU time and open files (``process_*``), and ``segstore_build_info``."""
    ProcessCollector(registry=registry)
    Info("segstore_build", "The running segstore's version and Python.", registry=registry).info(
        {"version": _version(), "python": platform.python_version()}
    )


class EngineMetrics:
    """Counters and histograms of the data path: appends, reads, Tier 1 writes, Tier 2 flushes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.appends = Counter("segstore_appends", "Appends made durable.", registry=registry)
        self.append_bytes = Counter(
            "segstore_append_bytes", "Bytes appended and made durable.", registry=registry
        )
        self.duplicates = Counter(
            "segstore_append_duplicates",
            "Appends answered as duplicates of an earlier event number.",
            registry=registry,
        )
        self._latency_by_type: dict[type, Any] = {}
        self.operation_latency = Histogram(
            "segstore_operation_latency_seconds",
            "Time from queueing an operation to its durable acknowledgement.",
            ["type"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tier1_write_operations = Histogram(
            "segstore_tier1_write_operations",
            "Operations carried by one Tier 1 write (an fdatasync, or a PutObject on S3): group commit.",
            buckets=_COUNT_BUCKETS,
            registry=registry,
        )
        self.tier1_frame_bytes = Histogram(
            "segstore_tier1_frame_bytes",
            "Size of each data frame written to Tier 1.",
            buckets=_SIZE_BUCKETS,
            registry=registry,
        )
        self.tier1_write_seconds = Histogram(
            "segstore_tier1_write_seconds",
            "Duration of one Tier 1 write (write + fdatasync, or PutObject), from its batch being begun.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tier2_flush_bytes = Counter(
            "segstore_tier2_flush_bytes", "Bytes written to Tier 2.", registry=registry
        )
        self.tier2_merge_bytes = Counter(
            "segstore_tier2_merge_bytes",
            "Bytes merged into a target's Tier 2 layout by naming the source's chunks (none copied).",
            registry=registry,
        )
        self.tier2_chunks_created = Counter(
            "segstore_tier2_chunks_created",
            "Chunks created in Tier 2 (flushes and defrag).",
            registry=registry,
        )
        self.tier2_chunks_deleted = Counter(
            "segstore_tier2_chunks_deleted",
            "Chunks deleted from Tier 2 (truncation, defrag, delete).",
            registry=registry,
        )
        self.tier2_errors = Counter(
            "segstore_tier2_errors", "Tier 2 operations that failed (retried).", registry=registry
        )
        self.attribute_index_bytes = Counter(
            "segstore_attribute_index_bytes",
            "Bytes of attribute index pages written to Tier 2 (seed 001).",
            registry=registry,
        )
        self.attributes_evicted = Counter(
            "segstore_attributes_evicted",
            "Attribute values dropped from memory once in the attribute index.",
            registry=registry,
        )
        self.writer_lag_bytes = Gauge(
            "segstore_writer_lag_bytes",
            "Acknowledged bytes not yet in Tier 2.",
            ["container"],
            registry=registry,
        )
        self.cache_bytes = Gauge(
            "segstore_cache_bytes", "Bytes held by the read cache.", ["container"], registry=registry
        )
        self.read_bytes = Counter("segstore_read_bytes", "Bytes returned by reads.", registry=registry)
        cache_reads = Counter(
            "segstore_cache_reads",
            "Reads by where their bytes came from: hit (all in the cache) or miss (some from Tier 2).",
            ["result"],
            registry=registry,
        )
        self.cache_hits = cache_reads.labels("hit")
        self.cache_misses = cache_reads.labels("miss")
        self.tier2_read_bytes = Counter(
            "segstore_tier2_read_bytes",
            "Bytes read from Tier 2 (cache misses and read-ahead).",
            registry=registry,
        )
        self.tier2_read_seconds = Histogram(
            "segstore_tier2_read_seconds",
            "Duration of one Tier 2 read of a cache miss.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tier2_flush_seconds = Histogram(
            "segstore_tier2_flush_seconds",
            "Duration of one segment's flush to Tier 2 (its bytes written and its layout made durable).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        throttled = Counter(
            "segstore_throttled_requests",
            "Requests refused for the state of their container, by reason: tier2_backlog and "
            "recovering (503 Throttled), failed and stopped (503), storage_full (507).",
            ["reason"],
            registry=registry,
        )
        self.throttled_backlog = throttled.labels("tier2_backlog")
        self.throttled_recovering = throttled.labels("recovering")
        self.throttled_failed = throttled.labels("failed")
        self.throttled_stopped = throttled.labels("stopped")
        self.throttled_storage_full = throttled.labels("storage_full")
        self.tail_waits = Gauge(
            "segstore_tail_waits",
            "Reads waiting at a segment's tail now (long-polls, and event streams between events).",
            registry=registry,
        )
        self.recovery_seconds = Gauge(
            "segstore_container_recovery_seconds",
            "How long the container's last recovery took.",
            ["container"],
            registry=registry,
        )
        self.recovery_operations = Gauge(
            "segstore_container_recovery_operations",
            "How many operations the container's last recovery replayed from Tier 1.",
            ["container"],
            registry=registry,
        )

    def observe_latency(self, op: object, seconds: float) -> None:
        """Queue-to-durable latency by operation type (label child looked up once per type)."""
        child = self._latency_by_type.get(type(op))
        if child is None:
            child = self._latency_by_type[type(op)] = self.operation_latency.labels(type(op).__name__)
        child.observe(seconds)


class ClusterMetrics:
    """A cluster node's leases (docs/cluster.md): held, renewed, lost, and the containers it took over."""

    LOSS_REASONS = ("expired", "taken")
    # What a claimed container's lease was: never written, released by a handover, run out, or
    # held by a node found dead before it ran out (its heartbeat late, its address refusing connections).
    TAKEOVER_LEASES = ("new", "released", "expired", "dead")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.leases_held = Gauge(
            "segstore_cluster_leases_held", "Container leases this node holds now.", registry=registry
        )
        self.renewals = Counter(
            "segstore_cluster_lease_renewals", "Lease renewals this node wrote.", registry=registry
        )
        self.renewal_errors = Counter(
            "segstore_cluster_lease_renewal_errors",
            "Lease renewals the bucket refused or did not answer (tried again next round).",
            registry=registry,
        )
        losses = Counter(
            "segstore_cluster_lease_losses",
            "Containers this node stopped because it lost their lease: expired (not renewed in time) "
            "or taken (another node holds it).",
            ["reason"],
            registry=registry,
        )
        self.losses = {reason: losses.labels(reason) for reason in self.LOSS_REASONS}
        takeovers = Counter(
            "segstore_cluster_takeovers",
            "Containers this node claimed, by what their lease was: new, released (a handover), "
            "expired (its holder stopped renewing it) or dead (its holder's heartbeat late and its "
            "address refusing connections).",
            ["lease"],
            registry=registry,
        )
        self.takeovers = {lease: takeovers.labels(lease) for lease in self.TAKEOVER_LEASES}
        self.takeover_seconds = Histogram(
            "segstore_cluster_takeover_seconds",
            "From a container's claim to serving it here (its recovery from Tier 1).",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
            registry=registry,
        )
