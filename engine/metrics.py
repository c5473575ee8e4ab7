"""Engine metrics (Prometheus), registered in the store's own registry.

One registry per store keeps tests that build many stores independent; the
HTTP layer adds its request metrics to the same registry and serves it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
_SIZE_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)


class EngineMetrics:
    """Counters and histograms of the data path: appends, Tier 1 writes, Tier 2 flushes."""

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

    def observe_latency(self, op: object, seconds: float) -> None:
        """Queue-to-durable latency by operation type (label child looked up once per type)."""
        child = self._latency_by_type.get(type(op))
        if child is None:
            child = self._latency_by_type[type(op)] = self.operation_latency.labels(type(op).__name__)
        child.observe(seconds)
