"""WSGI shortcuts: the plain form of a hot request served in front of Flask.

An append, or a long-poll at the tail, costs less than Flask's request,
context, routing and response objects around it. A shortcut recognises the
plain form of such a request in the WSGI environ and serves it there; any
other form goes to Flask untouched. Its errors are rendered by Flask's
handlers, so they read exactly as the view's would. No Flask hook runs for a
request a shortcut serves, so the shortcut does what the ``before_request``
hooks would: a plain form has a UTF-8 path (``plain`` says so), and
``auth.judge`` (with native auth on) answers 401 or 403 exactly as before a
view, a refusal being counted under the route Flask matches, as the view's.
A hook added later that matters to these requests must be added here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from flask import Flask

from app import auth, ops
from app.errors import rendered_in_flask
from engine import SegstoreError

P = TypeVar("P")


class WsgiShortcut(Generic[P]):
    """A WSGI layer in front of ``wsgi_app``; subclasses say what is plain and how it is served."""

    route: str  # the route the request metrics count it under (the view's)

    def __init__(self, app: Flask, wsgi_app: Any) -> None:
        self.app = app
        self.wsgi_app = wsgi_app

    def plain(self, environ: dict[str, Any]) -> P | None:
        """What the shortcut needs of a plain request (name, length, parameters), else None."""
        raise NotImplementedError

    def serve(self, environ: dict[str, Any], start_response: Any, plain: P) -> Iterable[bytes]:
        """Answer the plain request; a SegstoreError is rendered as Flask's handlers would."""
        raise NotImplementedError

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        plain = self.plain(environ)
        if plain is None:
            return self.wsgi_app(environ, start_response)
        try:
            auth.judge(self.app, environ)
            environ[ops.ROUTE_KEY] = self.route
            return self.serve(environ, start_response, plain)
        except SegstoreError as err:
            return rendered_in_flask(self.app, environ, start_response, err)
