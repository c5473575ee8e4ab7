"""Fixtures for the HTTP layer: a fresh app and store per test, on a temporary data directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from app import create_app
from app.settings import HttpSettings
from engine import SegmentStore, Settings
from tests.app.openapi_check import check_response

# Small limits keep the limit tests cheap and the tails quick.
MAX_APPEND_BYTES = 4096
MAX_READ_BYTES = 2048
TAIL_WAIT_MAX_S = 5.0
SSE_KEEPALIVE_S = 0.2


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=str(tmp_path / "data"),
        container_count=2,
        max_append_bytes=MAX_APPEND_BYTES,
        max_read_bytes=MAX_READ_BYTES,
        tail_wait_max_s=TAIL_WAIT_MAX_S,
        flush_threshold_ms=50,
    )


@pytest.fixture
def http() -> HttpSettings:
    return HttpSettings(sse_keepalive_s=SSE_KEEPALIVE_S)


@pytest.fixture
def app(settings: Settings, http: HttpSettings) -> Iterator[Flask]:
    """The app with its store recovered; the store is closed after the test."""
    flask_app = create_app(settings, http)
    store: SegmentStore = flask_app.extensions["segstore"]
    try:
        store.wait_ready(30)
        yield flask_app
    finally:
        store.close()


@pytest.fixture
def store(app: Flask) -> SegmentStore:
    return app.extensions["segstore"]


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """The test client every HTTP test goes through; each answer is checked against openapi.yaml."""
    test_client = app.test_client()
    send = test_client.open

    def open_and_check(*args: Any, **kwargs: Any) -> TestResponse:
        response = send(*args, **kwargs)
        check_response(response)
        return response

    test_client.open = open_and_check
    return test_client


@pytest.fixture
def raw_client(app: Flask) -> FlaskClient:
    """A client whose answers are not checked against openapi.yaml.

    Only for what the contract does not describe: unknown routes, wrong
    methods, HEAD on custom methods, and errors injected into the store
    that no real request causes on that route (a 409 from ``:info``, a 500).
    """
    return app.test_client()


@pytest.fixture
def segment(client: FlaskClient) -> str:
    """A freshly created, empty segment; returns its URL."""
    url = "/v1/segments/scope/stream/0"
    assert client.put(url).status_code == 201
    return url
