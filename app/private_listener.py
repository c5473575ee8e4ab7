"""A process's own address, for a node of several processes (docs/design.md "Processes per node").

The processes of a node share its public port: whichever accepts a
connection answers it. To be reached by name (a request forwarded to the
owner of its container, a peer call, an owner-aware client told by
``Segment-Owner``), each process also listens on a loopback port of its
own, chosen by the kernel, on the public bind's host (loopback for a unix
socket); that URL, on the host clients are told (``advertise_url``, by
default the bind's), is its member's node URL.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from flask import Flask


def bind_private(bind: str, advertise_url: str) -> tuple[socket.socket, str]:
    """A listening socket on a free port of ``bind``'s host, and its URL on ``advertise_url``'s host."""
    host = "127.0.0.1" if bind.startswith("unix:") else bind.rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    shown = urlsplit(advertise_url).hostname if advertise_url and not bind.startswith("unix:") else None
    shown = shown or host
    return sock, f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"


def serve_private(sock: socket.socket, app: Flask) -> Any:
    """Serve ``app`` on ``sock`` in the background (gevent's WSGI server); the server, to stop."""
    from gevent.pywsgi import WSGIHandler, WSGIServer

    class _Handler(WSGIHandler):
        def get_environ(self) -> dict[str, Any]:
            environ: dict[str, Any] = super().get_environ()
            environ["RAW_URI"] = self.path  # the path and query as sent, which forwarding passes on
            return environ

    class _Server(WSGIServer):
        def handle(self, conn: socket.socket, address: Any) -> None:
            # As gunicorn does on the public port: an event stream's small writes go out at once,
            # not held by Nagle's algorithm until the reader's delayed ACK (up to 40 ms a write).
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            super().handle(conn, address)

    server = _Server(sock, app, handler_class=_Handler, log=None)
    server.start()
    return server
