"""segstore's HTTP layer: a Flask app over one ``SegmentStore``, with its protocol surfaces.

``native`` (``/v1/segments``), ``scopes`` (streams of parallel segments,
``/v1/scopes``), ``streams`` (Durable Streams, ``/v1/stream``) and ``s3``
(path-style S3 at the root) each map their protocol onto segments;
``console`` (``/console/``) is a page in the browser over the public API;
``auth``, ``errors``, ``ops``, ``inputs``, ``params``, ``periodic`` and
``http_chunked`` are the HTTP helpers they share.

``create_app`` builds the store inside the calling process (a gunicorn
worker, a test), starts its recovery in the background and serves requests
at once: until recovery ends, ``/readyz`` and segment requests answer 503.
Nothing is built at import time.
"""

from __future__ import annotations

import dataclasses

from flask import Flask, Response
from flask.json.provider import DefaultJSONProvider

from app.settings import HttpSettings, load_server_settings
from engine import SegmentStore, Settings


def create_app(settings: Settings | None = None, http: HttpSettings | None = None) -> Flask:
    """Build the app and its store.

    Without ``settings`` both the engine's and the server's come from
    ``load_server_settings()``; with them alone, the server's are the defaults.
    """
    # The surfaces come with the app, not with the package: gunicorn's arbiter reads app.settings
    # (deploy/gunicorn.conf.py) before gevent patches the worker, so it must not import clients of ssl.
    from app import (
        auth,
        console,
        errors,
        forwarding,
        handoff,
        hop,
        http_chunked,
        inputs,
        native,
        ops,
        peer,
        s3,
        scopes,
        streams,
    )
    from app.native import subject as native_subject
    from app.s3 import subject as s3_subject
    from app.scopes import subject as scopes_subject
    from app.streams import subject as streams_subject

    if settings is None:
        settings, loaded = load_server_settings()
        http = http or loaded
    http = http or HttpSettings()
    private = None
    if settings.local_members:  # one of a node's processes: reached by name at a port of its own
        from app.private_listener import bind_private

        private, url = bind_private(http.bind, settings.advertise_url)
        settings = dataclasses.replace(settings, advertise_url=url)
    app = Flask(__name__)
    json = DefaultJSONProvider(app)
    json.sort_keys = False  # answers list their fields in the order the docs give them
    app.json = json
    # A cluster member's Unix socket (a node's, or a process's of a node), bound before the store
    # joins so its record names it.
    local_hop = bool((settings.node_id or settings.local_members) and http.local_hop)
    hop_server = hop.HopServer.bind() if local_hop else None
    if hop_server is not None:
        store = SegmentStore(settings, hop=hop_server.address, machine=hop.this_machine())
    else:
        store = SegmentStore(settings)
    store.start()
    app.extensions["segstore"] = store
    app.extensions["segstore.http"] = http
    errors.register_error_handlers(app)
    app.before_request(inputs.require_utf8_path)  # first: auth judges names too
    auth.install(app, http)
    app.register_blueprint(ops.bp)
    peer.init_app(app, store)  # node-to-node calls of a cluster
    native.init_app(app)
    scopes.init_app(app, store)
    streams.init_app(app, store)
    app.register_blueprint(console.bp)
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
    app.wsgi_app = forwarding.Forwarding(  # type: ignore[method-assign]
        app.wsgi_app, store, subjects, takeover_wait_s=http.takeover_wait_s, local_hop=local_hop,
        registry=store.registry,
    )
    # Around every reader of a body (the stream append shortcut takes no chunked one).
    chunked_limit = http_chunked.max_chunk_bytes(settings.max_append_bytes)
    app.wsgi_app = http_chunked.ChunkedBodies(app.wsgi_app, chunked_limit)  # type: ignore[method-assign]
    # Outermost WSGI layer: it times the stream append shortcut too.
    ops.install_request_metrics(app, store.registry)
    if hop_server is not None:  # requests over it go through every layer, as over HTTP
        hop_server.start(app)
        app.extensions["segstore.hop"] = hop_server
    if private is not None:
        from app.private_listener import serve_private

        served = app.extensions["segstore.private"] = serve_private(private, app)
        # A connection a sibling forwarded a request of comes here whole, served as this listener's own.
        receiver = handoff.Receiver.bind(hop_server.address) if hop_server is not None else None
        if receiver is not None:
            receiver.start(served.adopt)
            app.extensions["segstore.handoff"] = receiver
    return app


def _no_type_without_body(response: Response) -> Response:
    """204 and 304 answers carry no body, so no Content-Type (Flask's default is text/html)."""
    if response.status_code in (204, 304):
        response.headers.pop("Content-Type", None)
    return response
