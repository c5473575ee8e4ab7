"""WSGI shortcuts: the plain form of a hot request served in front of Flask.

An append, or a long-poll at the tail, costs less than Flask's request,
context, routing and response objects around it. A shortcut recognises the
plain form of such a request in the WSGI environ and serves it there; any
other form (and every request while native auth is on, which Flask checks)
goes to Flask untouched. Its errors are rendered by Flask's handlers, so
they read exactly as the view's would. No Flask hook runs for a request a
shortcut serves: a ``before_request`` that matters to it must be added to
the shortcut too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from flask import Flask

from app import ops
from app.auth import AuthConfig
from app.errors import rendered_in_flask
from engine import SegstoreError

P = TypeVar("P")


class WsgiShortcut(Generic[P]):
    """A WSGI layer in front of ``wsgi_app``; subclasses say what is plain and how it is served."""

    route: str  # the route the request metrics count it under (the view's)

    def __init__(self, app: Flask, wsgi_app: Any) -> None:
        self.app = app
        self.wsgi_app = wsgi_app
        self.auth: AuthConfig = app.extensions["segstore.auth"]

    def plain(self, environ: dict[str, Any]) -> P | None:
        """What the shortcut needs of a plain request (name, length, parameters), else None."""
        raise NotImplementedError

    def serve(self, environ: dict[str, Any], start_response: Any, plain: P) -> Iterable[bytes]:
        """Answer the plain request; a SegstoreError is rendered as Flask's handlers would."""
        raise NotImplementedError

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        plain = None if self.auth.native_enabled else self.plain(environ)
        if plain is None:
            return self.wsgi_app(environ, start_response)
        environ[ops.ROUTE_KEY] = self.route
        try:
            return self.serve(environ, start_response, plain)
        except SegstoreError as err:
            return rendered_in_flask(self.app, environ, start_response, err)
