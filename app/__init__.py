"""segstore's HTTP layer: a Flask app over one ``SegmentStore``, with its protocol surfaces.

``native`` (``/v1/segments``), ``scopes`` (streams of parallel segments,
``/v1/scopes``), ``streams`` (Durable Streams, ``/v1/stream``) and ``s3``
(path-style S3 at the root) each map their protocol onto segments;
``auth``, ``errors``, ``ops``, ``inputs``, ``params`` and ``chunked_body``
are the HTTP helpers they share.

``create_app`` builds the store inside the calling process (a gunicorn
worker, a test), starts its recovery in the background and serves requests
at once: until recovery ends, ``/readyz`` and segment requests answer 503.
Nothing is built at import time.
"""

from __future__ import annotations

from flask import Flask, Response

from app import auth, chunked_body, errors, forwarding, inputs, native, ops, peer, s3, scopes, streams
from app.native import subject as native_subject
from app.s3 import subject as s3_subject
from app.scopes import subject as scopes_subject
from app.streams import subject as streams_subject
from engine import SegmentStore, Settings, load_settings


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app and its store (``settings`` default to ``load_settings()``)."""
    settings = settings if settings is not None else load_settings()
    app = Flask(__name__)
    app.json.sort_keys = False
    store = SegmentStore(settings)
    store.start()
    app.extensions["segstore"] = store
    errors.register_error_handlers(app)
    app.before_request(inputs.require_utf8_path)  # first: auth judges names too
    auth.install(app, settings)
    app.register_blueprint(ops.bp)
    peer.init_app(app, store)  # node-to-node calls of a cluster
    native.init_app(app)
    scopes.init_app(app, store)
    streams.init_app(app, store)
    # Last: its routes take whatever path the native ones leave (path-style S3 at the root).
    s3.init_app(app, store)
    app.after_request(_no_type_without_body)
    # A cluster node passes a request whose subject's container it does not serve to its node,
    # before the append shortcuts (installed by native and streams init_app, inside this layer).
    subjects = [
        native_subject.request_subject,
        scopes_subject.request_subject,
        streams_subject.request_subject,
        s3_subject.request_subject,
    ]
    app.wsgi_app = forwarding.Forwarding(app.wsgi_app, store, subjects)  # type: ignore[method-assign]
    # Around every reader of a body (the stream append shortcut takes no chunked one).
    chunked_limit = chunked_body.max_chunk_bytes(settings.max_append_bytes)
    app.wsgi_app = chunked_body.ChunkedBodies(app.wsgi_app, chunked_limit)  # type: ignore[method-assign]
    # Outermost WSGI layer: it times the stream append shortcut too.
    ops.install_request_metrics(app, store.registry)
    return app


def _no_type_without_body(response: Response) -> Response:
    """204 and 304 answers carry no body, so no Content-Type (Flask's default is text/html)."""
    if response.status_code in (204, 304):
        response.headers.pop("Content-Type", None)
    return response
