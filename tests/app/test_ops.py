"""Operations endpoints and request metrics."""

from __future__ import annotations

import shutil
import threading

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from engine import ContainerNotReady, SegmentStore, Settings
from engine.container import state as container_state
from engine.container.segment_container import SegmentContainer
from engine.store.tiers import Tiers
from engine.tier2.faults import FaultyChunkStorage
from engine.tier2.local import LocalChunkStorage
from tests.app.helpers import assert_problem
from tests.app.openapi_check import check_response
from tests.polling import wait_until


def test_healthz_lists_each_running_container(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {
        "status": "ok",
        "containers": [{"id": 0, "state": "running"}, {"id": 1, "state": "running"}],
    }


def test_healthz_is_503_while_appends_are_throttled(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tier 2 down: the backlog fills, appends answer 503, and so does /healthz, until Tier 2 is back."""
    made: list[FaultyChunkStorage] = []

    def faulty_tier2(self: Tiers) -> FaultyChunkStorage:
        if not made:
            made.append(FaultyChunkStorage(LocalChunkStorage(self.settings.tier2_path)))
        return made[0]

    monkeypatch.setattr(Tiers, "tier2", faulty_tier2)
    app = create_app(settings.replace(tier1_backlog_max_bytes=16 * 1024))
    store: SegmentStore = app.extensions["segstore"]
    client = app.test_client()
    try:
        store.wait_ready(30)
        made[0].outage()
        assert client.put("/v1/segments/s").status_code == 201
        assert client.post("/v1/segments/s", data=b"x" * 4096).status_code == 200

        def mine(body: dict) -> dict:
            return next(c for c in body["containers"] if c["id"] == store.container_of("s"))

        wait_until(lambda: mine(client.get("/healthz").get_json())["state"] == "degraded", what="degraded")
        degraded = client.get("/healthz")
        assert degraded.status_code == 200  # appends are still taken
        assert "Tier 2 writes fail" in mine(degraded.get_json())["reason"]
        statuses = [client.post("/v1/segments/s", data=b"x" * 4096).status_code for _ in range(7)]
        assert statuses[0] == 200 and statuses[-1] == 503, statuses
        health = client.get("/healthz")
        check_response(health)
        assert health.status_code == 503
        body = health.get_json()
        assert body["status"] == "unavailable"
        assert mine(body)["state"] == "throttled" and "Tier 2" in mine(body)["reason"]
        refused = store.registry.get_sample_value(
            "segstore_throttled_requests_total", {"reason": "tier2_backlog"}
        )
        assert refused == statuses.count(503)
        made[0].end_outage()
        wait_until(lambda: client.get("/healthz").status_code == 200, timeout_s=20, what="healthy again")
        assert client.post("/v1/segments/s", data=b"y").status_code == 200
    finally:
        store.close()


def test_healthz_is_503_while_recovering(client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SegmentContainer, "state", property(lambda _self: container_state.RECOVERING))
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["containers"][0] == {
        "id": 0,
        "state": "recovering",
        "reason": "replaying Tier 1, or waiting for Tier 2 to answer",
    }


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
        health = broken.test_client().get("/healthz")
        assert health.status_code == 503
        failed = health.get_json()["containers"][0]
        assert failed["state"] == "failed" and failed["reason"]
    finally:
        broken.extensions["segstore"].close()


OPERATOR_METRICS = (
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "segstore_build_info",
    "segstore_read_bytes_total",
    "segstore_cache_reads_total",
    "segstore_tier2_read_bytes_total",
    "segstore_tier2_read_seconds_count",
    "segstore_tier2_flush_seconds_count",
    "segstore_throttled_requests_total",
    "segstore_container_state",
    "segstore_container_recovery_seconds",
    "segstore_tier1_disk_bytes",
    "segstore_tier1_disk_files",
    "segstore_tail_waits",
    "segstore_event_streams",
    "segstore_open_transactions",
    "segstore_segments",
)


def test_metrics_an_operator_looks_for(client: FlaskClient, store: SegmentStore, segment: str) -> None:
    client.post(segment, data=b"abc")
    assert client.get(segment).data == b"abc"
    assert client.post(segment + ":transactions").status_code == 201
    store.flush()
    samples = _samples(client)
    names = {name for name, _ in samples}
    assert set(OPERATOR_METRICS) <= names, set(OPERATOR_METRICS) - names
    assert not [n for n in names if n.endswith("_created")]
    container = str(store.container_of("scope/stream/0"))
    mine = frozenset({("container", container)})
    assert samples[("segstore_read_bytes_total", frozenset())] >= 3
    assert samples[("segstore_cache_reads_total", frozenset({("result", "hit")}))] >= 1
    assert samples[("segstore_segments", mine)] == 1
    assert samples[("segstore_open_transactions", mine)] == 1
    assert samples[("segstore_tier1_disk_files", mine)] >= 1
    assert samples[("segstore_tier1_disk_bytes", mine)] > 0
    assert samples[("segstore_tier2_flush_seconds_count", frozenset())] >= 1
    assert samples[("segstore_container_state", mine | {("state", "running")})] == 1
    assert samples[("segstore_container_state", mine | {("state", "recovering")})] == 0
    assert samples[("segstore_container_recovery_seconds", mine)] > 0
    assert samples[("process_resident_memory_bytes", frozenset())] > 0


def test_metrics_count_cache_misses_and_tier2_reads(
    client: FlaskClient, store: SegmentStore, segment: str
) -> None:
    client.post(segment, data=b"abc" * 100)
    store.flush()
    container = store._containers[store.container_of("scope/stream/0")]
    cache = container.read_index.cache
    budget, cache.max_bytes = cache.max_bytes, 0
    container.read_index.evict(container.metadata.storage_lengths())
    cache.max_bytes = budget
    assert client.get(segment, headers={"Range": "bytes=150-249"}).data == (b"abc" * 100)[150:250]
    value = store.registry.get_sample_value
    assert value("segstore_cache_reads_total", {"result": "miss"}) >= 1
    assert value("segstore_tier2_read_bytes_total") >= 100
    assert value("segstore_tier2_read_seconds_count") >= 1


def test_open_tails_and_event_streams_are_gauges(app: Flask, store: SegmentStore, segment: str) -> None:
    value = store.registry.get_sample_value
    stream = app.test_client().get(segment, headers={"Accept": "text/event-stream"}, buffered=False)
    assert stream.status_code == 200
    assert value("segstore_event_streams") == 1
    stream.close()
    stream.close()
    assert value("segstore_event_streams") == 0
    waiting = threading.Thread(target=lambda: store.read("scope/stream/0", 0, wait_s=5))
    waiting.start()
    wait_until(lambda: value("segstore_tail_waits") == 1, what="a parked tail read")
    store.append("scope/stream/0", b"wake")
    waiting.join(5)
    assert value("segstore_tail_waits") == 0


def test_a_single_node_has_no_cluster_map_but_says_how_many_containers(client: FlaskClient) -> None:
    answer = client.get("/v1/cluster")
    assert answer.status_code == 200
    count = answer.json["container_count"]
    assert answer.json == {
        "node": None,
        "container_count": count,
        "nodes": [],
        "containers": [{"id": c, "owner": None} for c in range(count)],
    }
