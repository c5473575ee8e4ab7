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

import contextlib
import socket
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from flask import Flask

from app import handoff
from app.settings import KEEPALIVE_S, MAX_CONNECTIONS

# As http.client's own limits: the longest header line, and the most header lines.
_MAX_LINE = 65536
_MAX_HEADERS = 100
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class RequestHeaders:
    """A request's header lines, read as gevent's WSGI handler asks (``MessageClass``).

    gevent parses them with the email package (``http.client.parse_headers``),
    which costs about a fifth of a small append's time in this process. This
    reads the same lines plainly. What it refuses (``status`` set: the
    handler answers 400 and closes): a line over 64 KiB, over 100 lines, a
    line without a colon, a name with spaces, and folded (continued) lines,
    which RFC 9112 lets a server refuse.
    """

    __slots__ = ("items", "status")

    def __init__(self, rfile: BinaryIO, *_: Any) -> None:
        self.items: list[tuple[str, str]] = []
        self.status = ""
        while True:
            raw = rfile.readline(_MAX_LINE + 1)
            if len(raw) > _MAX_LINE:
                self.status = "Line too long"
                return
            if raw in (b"\r\n", b"\n", b""):
                return
            if len(self.items) == _MAX_HEADERS:
                self.status = "Too many headers"
                return
            name, colon, value = raw.decode("latin-1").partition(":")
            if not colon or not name or name != name.strip() or " " in name or "\t" in name:
                self.status = "Malformed header line" if raw[:1] not in b" \t" else "Folded header line"
                return
            self.items.append((name, value.strip()))

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of header ``name`` (any case), as ``email.message.Message.get``."""
        wanted = name.lower()
        for key, value in self.items:
            if key.lower() == wanted:
                return value
        return default

    getheader = get

    def __delitem__(self, name: str) -> None:
        wanted = name.lower()
        self.items = [(key, value) for key, value in self.items if key.lower() != wanted]

    @property
    def typeheader(self) -> str | None:
        return self.get("content-type")

    @property
    def headers(self) -> Iterator[str]:
        for key, value in self.items:
            yield f"{key}: {value}\r\n"


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
    from gevent.pool import Pool
    from gevent.pywsgi import WSGIHandler, WSGIServer

    class _Handler(WSGIHandler):
        MessageClass = RequestHeaders

        def _headers(self) -> Iterator[tuple[str, str]]:
            """``HTTP_*`` variables of the headers (a name with ``_`` dropped, as gevent does)."""
            for key, value in self.headers.items:
                if "_" in key:
                    continue
                variable = key.replace("-", "_").upper()
                if variable not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                    yield "HTTP_" + variable, value

        def read_requestline(self) -> str:
            """The next request's line; none ("") once the server closes or after ``KEEPALIVE_S``
            without one, which ends the connection (as gunicorn's ``keepalive`` on the public port)."""
            server: _Server = self.server
            server.idle.add(self.socket)
            self.socket.settimeout(KEEPALIVE_S)
            try:
                return "" if server.closing else str(super().read_requestline())
            except TimeoutError:
                return ""
            finally:
                server.idle.discard(self.socket)
                self.socket.settimeout(None)

        def log_request(self) -> None:
            """Nothing: this listener keeps no access log, so its line is not even formatted."""

        def get_environ(self) -> dict[str, Any]:
            environ: dict[str, Any] = super().get_environ()
            environ["RAW_URI"] = self.path  # the path and query as sent, which forwarding passes on
            if self.wsgi_input.socket is not None:
                # Expect: 100-continue, answered at once as gunicorn does on the public port. gevent
                # answers it at the first read of the body; an answer given without reading it (a 404)
                # then leaves the client's next request to be taken for the body it never sent.
                self.socket.sendall(_CONTINUE)
                self.wsgi_input.send_100_continue_enabled = False
            if self.socket in self.server.adopted:
                environ[handoff.ADOPTED] = True
            return environ

    class _Server(WSGIServer):
        closing = False
        idle: set[socket.socket]
        adopted: set[socket.socket]

        def adopt(self, conn: socket.socket, address: Any) -> None:
            """Serve a connection a sibling passed here (app/handoff.py) as one of this listener's."""
            self.adopted.add(conn)
            self.do_handle(conn, address)

        def close(self) -> None:
            """Take no connection; end the idle ones now, the others after the answer under way."""
            self.closing = True
            super().close()
            for conn in list(self.idle):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RD)  # its wait for a next request line ends, empty

        def handle(self, conn: socket.socket, address: Any) -> None:
            # As gunicorn does on the public port: an event stream's small writes go out at once,
            # not held by Nagle's algorithm until the reader's delayed ACK (up to 40 ms a write).
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                super().handle(conn, address)
            finally:
                self.adopted.discard(conn)

    # In a pool of its own, which a graceful stop waits for (app/worker.py); a full one takes no
    # connection until one ends, a passed one included (app/handoff.py: its sender then keeps it).
    server = _Server(sock, app, handler_class=_Handler, log=None, spawn=Pool(MAX_CONNECTIONS))
    server.idle, server.adopted = set(), set()
    server.start()
    return server
