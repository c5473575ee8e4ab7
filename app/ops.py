"""Operations: liveness, readiness, Prometheus metrics, and the HTTP request metrics.

Request metrics live in the store's registry, beside the engine's, so one
``/metrics`` scrape shows both. Routes are labelled by their pattern
(``/v1/segments/{name}:seal``), never by the concrete path, to keep the label
set small.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from engine import ContainerNotReady, SegmentStore

bp = Blueprint("ops", __name__)


class HttpMetrics:
    """Requests by route, method and status, and their latency (time to the response headers)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.requests = Counter(
            "segstore_http_requests",
            "HTTP requests answered, by route pattern, method and status.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "segstore_http_request_duration_seconds",
            "Time from request to response headers, by route pattern and method.",
            ["route", "method"],
            registry=registry,
            buckets=(
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1,
                2.5,
                5,
                10,
                30,
                60,
            ),
        )

    def children(self, route: str, method: str, status: int) -> tuple[Any, Any]:
        """The labelled counter and histogram, looked up once per combination (hot path)."""
        key = (route, method, status)
        found = self._children.get(key)
        if found is None:
            found = (self.requests.labels(route, method, str(status)), self.latency.labels(route, method))
            self._children[key] = found
        return found


def _store() -> SegmentStore:
    return current_app.extensions["segstore"]


ROUTE_KEY = "segstore.route"


def set_route(route: str) -> None:
    """Label this request's metrics with ``route`` (a view that serves several patterns)."""
    request.environ[ROUTE_KEY] = route


class _RequestMetrics:
    """WSGI middleware: counts and times every request.

    A middleware rather than Flask before/after hooks: on the append hot path
    the two hook dispatches cost several percent of a request. The route is
    the one a view set with ``set_route``, else the matched rule's pattern.
    """

    def __init__(self, wsgi_app: Any, metrics: HttpMetrics) -> None:
        self.wsgi_app = wsgi_app
        self.metrics = metrics

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        started = time.perf_counter()

        def record(status: str, headers: Any, exc_info: Any = None) -> Any:
            route = environ.get(ROUTE_KEY)
            if route is None:
                rule = getattr(environ.get("werkzeug.request"), "url_rule", None)
                route = rule.rule if rule is not None else "unmatched"
            counter, latency = self.metrics.children(route, environ["REQUEST_METHOD"], int(status[:3]))
            counter.inc()
            latency.observe(time.perf_counter() - started)
            return start_response(status, headers, exc_info)

        return self.wsgi_app(environ, record)


def install_request_metrics(app: Flask, registry: CollectorRegistry) -> None:
    """Count and time every request of ``app`` into ``registry``."""
    app.wsgi_app = _RequestMetrics(app.wsgi_app, HttpMetrics(registry))  # type: ignore[method-assign]


@bp.get("/healthz")
def healthz() -> Response:
    """The process is alive and serving HTTP (recovery may still run)."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """200 once every container has recovered; a 503 problem before."""
    store = _store()
    if not store.ready:
        failure = store.failure
        if failure is not None:
            raise ContainerNotReady(f"recovery failed, a restart is needed: {failure}")
        raise ContainerNotReady("containers are still recovering", retry_after_s=1.0)
    return jsonify({"status": "ready"})


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text format: engine and HTTP metrics."""
    return Response(generate_latest(_store().registry), content_type=CONTENT_TYPE_LATEST)
