"""Operations: health, readiness, Prometheus metrics, and the HTTP request metrics.

Request metrics live in the store's registry, beside the engine's, so one
``/metrics`` scrape shows both. Routes are labelled by their pattern
(``/v1/segments/{name}:seal``), never by the concrete path, to keep the label
set small. ``/healthz`` answers 200 only while every container serves every
request (``running``, or ``degraded``: Tier 2 writes are being retried), and
503 with each container's state and reason otherwise, so a probe never calls
healthy a server whose requests get 503 or 507.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from app import node_wide
from engine import RECOVERED_STATES, SERVING_STATES, ContainerNotReady, SegmentStore

bp = Blueprint("ops", __name__)


class HttpMetrics:
    """Requests by route, method and status, and their latency (time to the response headers)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.event_streams = Gauge(
            "segstore_event_streams",
            "Server-Sent Event responses open now (native tails and Durable Streams).",
            registry=registry,
        )
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
REQUEST_ID_KEY = "segstore.request_id"


def set_route(route: str) -> None:
    """Label this request's metrics with ``route`` (a view that serves several patterns)."""
    request.environ[ROUTE_KEY] = route


def route_of(environ: dict[str, Any]) -> str:
    """The route pattern a view set with ``set_route``, else the matched rule's, else ``unmatched``."""
    route = environ.get(ROUTE_KEY)
    if route is None:
        rule = getattr(environ.get("werkzeug.request"), "url_rule", None)
        route = rule.rule if rule is not None else "unmatched"
    return route


def request_id(environ: dict[str, Any]) -> str:
    """The request's id, made when first asked for: its error answer and the server log name it."""
    found = environ.get(REQUEST_ID_KEY)
    if found is None:
        found = environ[REQUEST_ID_KEY] = uuid.uuid4().hex[:16].upper()
    return found


def request_ref() -> str:
    """What a logged error names its request by: ``GET /v1/segments/{name} request 1F0C...``."""
    environ = request.environ
    return f"{environ['REQUEST_METHOD']} {route_of(environ)} request {request_id(environ)}"


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
        event_stream = False

        def record(status: str, headers: Any, exc_info: Any = None) -> Any:
            nonlocal event_stream
            counter, latency = self.metrics.children(
                route_of(environ), environ["REQUEST_METHOD"], int(status[:3])
            )
            counter.inc()
            latency.observe(time.perf_counter() - started)
            if environ["REQUEST_METHOD"] == "GET":  # the one method that tails; appends skip the scan
                event_stream = any(
                    k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in headers
                )
            return start_response(status, headers, exc_info)

        body = self.wsgi_app(environ, record)
        if event_stream:
            return _Counted(body, self.metrics.event_streams)
        return body


class _Counted:
    """A response body counted in ``gauge`` until the server closes it."""

    def __init__(self, body: Any, gauge: Any) -> None:
        self.body = body
        self.gauge = gauge
        gauge.inc()

    def __iter__(self) -> Any:
        return iter(self.body)

    def close(self) -> None:
        if self.gauge is None:
            return  # closed already
        gauge, self.gauge = self.gauge, None
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            gauge.dec()


def install_request_metrics(app: Flask, registry: CollectorRegistry) -> None:
    """Count and time every request of ``app`` into ``registry``."""
    app.wsgi_app = _RequestMetrics(app.wsgi_app, HttpMetrics(registry))  # type: ignore[method-assign]


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    """200 while every container this node runs serves; else 503. Both list each container's state."""
    store = _store()
    containers = node_wide.container_states(store, here=_here())
    # A cluster node may serve no container at a given moment (the others do) and still be well;
    # a node of processes answers as one: every container of the node, from the process serving it.
    clustered = store.node is not None
    serving = (clustered or bool(containers)) and all(c["state"] in SERVING_STATES for c in containers)
    body = {"status": "ok" if serving else "unavailable", "containers": containers}
    return jsonify(body), 200 if serving else 503


@bp.get("/readyz")
def readyz() -> Response:
    """200 once every container has recovered (a node of processes: each by its own); a 503 problem before."""
    store = _store()
    if store.settings.local_members and not _here():
        waiting = [c["id"] for c in node_wide.container_states(store, here=False)
                   if c["state"] not in RECOVERED_STATES]
        if waiting:
            raise ContainerNotReady(f"containers {waiting} of the node have not recovered yet",
                                    retry_after_s=1.0)
        return jsonify({"status": "ready"})
    if not store.ready:
        failure = store.failure
        if failure is not None:
            raise ContainerNotReady(f"recovery failed, a restart is needed: {failure}")
        raise ContainerNotReady("containers are still recovering", retry_after_s=1.0)
    return jsonify({"status": "ready"})


def _here() -> bool:
    """Whether the request asks for the answering process alone (a node of several processes)."""
    return bool(request.headers.get(node_wide.HERE))


@bp.get("/v1/cluster", provide_automatic_options=False)
def cluster() -> Response:
    """This node's view of the cluster: nodes and their URLs, and the node serving each container.

    A single node (no ``node_id``) answers with ``node`` null, no nodes, and no owners.
    """
    store = _store()
    count = store.settings.container_count
    node = store.node
    if node is None:
        return jsonify({"node": None, "container_count": count, "nodes": [],
                        "containers": [{"id": c, "owner": None} for c in range(count)]})
    view = node.view()
    return jsonify({
        "node": node.node_id,
        "container_count": count,
        "nodes": [{"id": n, "url": url} for n, url in sorted(view.nodes.items())],
        "containers": [{"id": c, "owner": view.owners.get(c)} for c in range(count)],
    })


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text format: engine and HTTP metrics (a node's processes: all of them, labelled)."""
    text = node_wide.scrape(_store(), here=_here())
    return Response(text, content_type=CONTENT_TYPE_LATEST)
