"""Operations endpoints and request metrics."""

from __future__ import annotations

import shutil

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from engine import ContainerNotReady, SegmentStore, Settings
from tests.app.helpers import assert_problem


def test_healthz(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_readyz_once_recovered(client: FlaskClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ready"}


def test_readyz_is_503_while_recovering(
    client: FlaskClient, store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(store), "ready", property(lambda _self: False))
    response = client.get("/readyz")
    assert_problem(response, 503, "Throttled")
    assert response.headers["Retry-After"] == "1"


def _samples(client: FlaskClient) -> dict[tuple[str, frozenset], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for s in family.samples
    }


def test_metrics_count_requests_by_route_method_and_status(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    client.post(segment, data=b"def")
    client.get(segment + ":info")
    client.get("/v1/segments/no/such:info")
    client.get("/healthz")
    samples = _samples(client)
    counter = "segstore_http_requests_total"

    def count(route: str, method: str, status: str) -> float:
        labels = frozenset({"route": route, "method": method, "status": status}.items())
        return samples.get((counter, labels), 0.0)

    assert count("/v1/segments/{name}", "PUT", "201") == 1
    assert count("/v1/segments/{name}", "POST", "200") == 2
    assert count("/v1/segments/{name}:info", "GET", "200") == 1
    assert count("/v1/segments/{name}:info", "GET", "404") == 1
    assert count("/healthz", "GET", "200") == 1  # a plain rule is labelled by its pattern
    latency = frozenset({"route": "/v1/segments/{name}", "method": "POST"}.items())
    assert samples[("segstore_http_request_duration_seconds_count", latency)] == 2


def test_metrics_include_the_engine_metrics(client: FlaskClient, segment: str) -> None:
    client.post(segment, data=b"abc")
    samples = _samples(client)
    assert samples[("segstore_appends_total", frozenset())] >= 1


def test_readyz_says_why_recovery_failed(settings: Settings) -> None:
    first = create_app(settings)
    store = first.extensions["segstore"]
    store.wait_ready(30)
    first.test_client().put("/v1/segments/a/b")
    store.close()
    # Container 0's Tier 1 folder is replaced by a file: its recovery cannot read its log.
    log_folder = settings.data_path / "tier1" / "c0"
    shutil.rmtree(log_folder)
    log_folder.write_bytes(b"not a folder")
    broken = create_app(settings)
    try:
        with pytest.raises(ContainerNotReady):
            broken.extensions["segstore"].wait_ready(30)
        response = broken.test_client().get("/readyz")
        assert_problem(response, 503, "Throttled")
        detail = response.get_json()["detail"]
        assert "recovery failed" in detail and "container 0" in detail
    finally:
        broken.extensions["segstore"].close()
