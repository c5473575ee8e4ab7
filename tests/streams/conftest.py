"""Fixtures for the Durable Streams tests: a fresh app (store and stream layer) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.settings import HttpSettings
from app.streams.store import StreamStore
from engine import SegmentStore, Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=str(tmp_path / "data"),
        container_count=2,
        max_append_bytes=64 * 1024,
        max_read_bytes=4096,
        flush_threshold_ms=50,
    )


# Long-polls and the reaper at test speed.
HTTP = HttpSettings(stream_long_poll_s=0.3, stream_reap_interval_s=0.1)


def open_app(settings: Settings, http: HttpSettings = HTTP) -> Flask:
    flask_app = create_app(settings, http)
    flask_app.extensions["segstore"].wait_ready(30)
    return flask_app


def close_app(flask_app: Flask) -> None:
    flask_app.extensions["streams"].close()
    flask_app.extensions["segstore"].close()


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    flask_app = open_app(settings)
    try:
        yield flask_app
    finally:
        close_app(flask_app)


@pytest.fixture
def store(app: Flask) -> SegmentStore:
    return app.extensions["segstore"]


@pytest.fixture
def streams(app: Flask) -> StreamStore:
    return app.extensions["streams"]


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
