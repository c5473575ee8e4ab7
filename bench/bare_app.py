"""A Flask app that stores nothing: the framework's ceiling for the append benchmark.

It answers the same routes the benchmark uses (create, append, readiness)
with the same shapes as segstore, so gunicorn + gevent + Flask are measured
without the engine: ``gunicorn -c deploy/gunicorn.conf.py 'bench.bare_app:create_app()'``.
"""

from __future__ import annotations

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue


def create_app() -> Flask:
    """Build the bare app: appends read the body and answer a small JSON."""
    app = Flask(__name__)

    @app.put("/v1/segments/<path:name>")
    def create(name: str) -> ResponseReturnValue:
        return jsonify(name=name, length=0), 201

    @app.post("/v1/segments/<path:name>")
    def append(name: str) -> ResponseReturnValue:
        return jsonify(offset=0, length=len(request.get_data()))

    @app.get("/readyz")
    def readyz() -> ResponseReturnValue:
        return jsonify(ready=True)

    return app
