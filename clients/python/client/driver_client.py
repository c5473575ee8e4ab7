"""``DriverClient``: a Spark stream reader's HTTP client on the driver, opened once and kept between calls.

Spark calls a stream reader's offsets and planning on the driver again and
again, so both stream readers (``client.spark``, ``client.spark_stream``)
keep one client open for them instead of one per call. The reader is also
pickled to the executors for ``read``, which opens clients of its own: the
driver's session stays out of the pickle.
"""

from __future__ import annotations

from typing import Any, Protocol

from client.segment_client import SegmentClient


class Connects(Protocol):
    """Options that open a client to their endpoint."""

    def client(self) -> SegmentClient: ...


class DriverClient:
    """Mixin for a stream reader with ``options``: ``client`` opened at first use, closed by ``stop``."""

    options: Connects
    _client: SegmentClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled to the executors for ``read``: without the driver's HTTP session."""
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> SegmentClient:
        if self._client is None:
            self._client = self.options.client()
        return self._client

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
