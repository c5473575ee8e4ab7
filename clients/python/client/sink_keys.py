"""Where a streaming sink keeps its progress: attribute keys derived from its id, transaction ids in halves.

Both streaming sinks commit each micro-batch once through attributes
(docs/api.md "Attributes"): ``spark_sink`` on the target segment (the last
committed batch and the commit intent), ``stream_sink`` on the stream's
sidecar segment (the last committed batch and the claim). A key is the
UUID 5 of ``<sink id>\\n<what>`` in its sink's namespace; each sink keeps
the namespace it has always had, so the keys already written are found.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

SEGMENT_SINK = uuid.UUID("6f1d3c2e-9a4b-5c7d-8e0f-1a2b3c4d5e6f")  # spark_sink's keys
STREAM_SINK = uuid.UUID("0c6b1a54-3f0e-5d8a-9b7c-2e4f6a8d0b1c")  # stream_sink's keys and writer ids


@dataclass(frozen=True)
class SinkKeys:
    """The attribute keys of one streaming sink, in its sink's ``namespace`` (SEGMENT_SINK, STREAM_SINK)."""

    sink_id: str
    namespace: uuid.UUID

    def key(self, what: str) -> uuid.UUID:
        return uuid.uuid5(self.namespace, f"{self.sink_id}\n{what}")

    @property
    def last(self) -> uuid.UUID:
        """The last committed batch id (both sinks)."""
        return self.key("last-committed-batch")

    @property
    def intent(self) -> uuid.UUID:
        """``spark_sink``: the batch being committed."""
        return self.key("intent-batch")

    @property
    def count(self) -> uuid.UUID:
        """``spark_sink``: how many transactions the batch being committed has."""
        return self.key("intent-count")

    def half(self, index: int, which: str) -> uuid.UUID:
        """``spark_sink``: half ``which`` (``hi``, ``lo``) of the batch's ``index``-th transaction id."""
        return self.key(f"intent-tx-{index}-{which}")

    @property
    def batch(self) -> uuid.UUID:
        """``stream_sink``: the batch the claimed transaction is for."""
        return self.key("claimed-batch")

    @property
    def high(self) -> uuid.UUID:
        """``stream_sink``: the high half of the claimed transaction's id."""
        return self.key("claimed-transaction-high")

    @property
    def low(self) -> uuid.UUID:
        """``stream_sink``: the low half of the claimed transaction's id."""
        return self.key("claimed-transaction-low")


def halves(txid: str) -> tuple[int, int]:
    """A transaction id (a UUID) as two signed int64 attribute values."""
    value = uuid.UUID(txid).int
    return _signed(value >> 64), _signed(value & (2**64 - 1))


def _signed(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


def from_halves(high: int, low: int) -> str:
    """The transaction id ``halves`` split."""
    return str(uuid.UUID(int=((high % 2**64) << 64) | (low % 2**64)))
