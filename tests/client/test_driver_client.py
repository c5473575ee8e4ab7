"""A stream reader's driver client: opened once at first use, closed by stop, never pickled."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from client.driver_client import DriverClient
from client.segment_client import SegmentClient


@dataclass
class _Options:
    endpoint: str

    def client(self) -> SegmentClient:
        return SegmentClient(self.endpoint)


class _Reader(DriverClient):
    def __init__(self, options: _Options) -> None:
        self.options = options


def test_the_client_is_opened_once_left_out_of_the_pickle_and_closed_by_stop() -> None:
    reader = _Reader(_Options("http://127.0.0.1:1"))
    first = reader.client
    assert reader.client is first
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options and copy._client is None
    assert reader.client is first  # pickling leaves the driver's client open
    reader.stop()
    assert reader._client is None
    assert reader.client is not first
    reader.stop()
