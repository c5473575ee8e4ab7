"""A process's own address, for a node of several processes (docs/design.md "Processes per node").

The processes of a node share its public port: whichever accepts a
connection answers it. To be reached by name (a request forwarded to the
owner of its container, a peer call, an owner-aware client told by
``Segment-Owner``), each process also listens on a loopback port of its
own, chosen by the kernel; that URL is its member's node URL.
"""

from __future__ import annotations

import socket
from typing import Any

from flask import Flask


def bind_private() -> tuple[socket.socket, str]:
    """A listening socket on a free loopback port, and its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    host, port = sock.getsockname()
    return sock, f"http://{host}:{port}"


def serve_private(sock: socket.socket, app: Flask) -> Any:
    """Serve ``app`` on ``sock`` in the background (gevent's WSGI server); the server, to stop."""
    from gevent.pywsgi import WSGIHandler, WSGIServer

    class _Handler(WSGIHandler):
        def get_environ(self) -> dict[str, Any]:
            environ: dict[str, Any] = super().get_environ()
            environ["RAW_URI"] = self.path  # the path and query as sent, which forwarding passes on
            return environ

    server = WSGIServer(sock, app, handler_class=_Handler, log=None)
    server.start()
    return server
