"""Fixtures for the stream layer: a bare store (the layer is Flask-free) and its controller."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.scopes import events, records
from app.scopes.controller import Controller
from app.settings import HttpSettings
from client.routing import key_hash
from engine import SegmentStore, Settings


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentStore]:
    segment_store = SegmentStore(Settings(data_dir=str(tmp_path / "data"), container_count=4))
    segment_store.start(wait=True)
    try:
        yield segment_store
    finally:
        segment_store.close()


@pytest.fixture
def ctl(store: SegmentStore) -> Controller:
    controller = Controller(store, HttpSettings())
    controller.create_scope("sc")
    return controller


@pytest.fixture
def numbers(store: SegmentStore) -> events.WriterNumbers:
    return events.WriterNumbers(store)


def make_stream(ctl: Controller, segments: int = 1, stream: str = "st") -> records.StreamState:
    return ctl.create_stream("sc", stream, records.StreamConfig(segments))[0].state


def frames(store: SegmentStore, name: str) -> list[bytes]:
    """The events of a data segment, decoded from its frames."""
    data, out = store.read(name, 0, None).data, []
    while data:
        size = int.from_bytes(data[:4], "big")
        out.append(data[4 : 4 + size])
        data = data[4 + size :]
    return out


def key_in(lo: float, hi: float) -> str:
    """A routing key whose hash falls in ``[lo, hi)``."""
    return next(k for k in (f"k{i}" for i in range(10000)) if lo <= key_hash(k) < hi)
