"""A process's own port: on the public bind's host, named by the host clients are told."""

from __future__ import annotations

import socket
from functools import partial

import gevent
import gevent.socket
import pytest
import requests
from flask import Flask, request

from app.private_listener import bind_private, serve_private


@pytest.mark.parametrize(
    ("bind", "advertise_url", "host", "url_host"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080", "127.0.0.1", "http://127.0.0.1:"),
        ("0.0.0.0:8080", "http://10.1.2.3:8080", "0.0.0.0", "http://10.1.2.3:"),  # reached from elsewhere
        ("unix:/run/segstore.sock", "http://unix:/run/segstore.sock", "127.0.0.1", "http://127.0.0.1:"),
        ("[::1]:8080", "", "::1", "http://[::1]:"),
    ],
)
def test_a_process_listens_beside_the_public_bind(
    bind: str, advertise_url: str, host: str, url_host: str
) -> None:
    sock, url = bind_private(bind, advertise_url)
    try:
        bound_host, port = sock.getsockname()[:2]
        assert bound_host == host and port not in (0, 8080)
        assert url == f"{url_host}{port}"
    finally:
        sock.close()


def test_a_process_sends_its_small_writes_at_once() -> None:
    """TCP_NODELAY on each connection, as gunicorn sets on the public port: an event stream's
    small writes are not held until the reader's delayed ACK (a 25 ms median added to a tail)."""
    app = Flask(__name__)

    @app.get("/nodelay")
    def nodelay() -> str:
        conn = request.environ["wsgi.input"].socket  # gevent's input keeps it (for 100-continue)
        return str(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    sock, url = bind_private("127.0.0.1:0", "")
    # A server process is monkey-patched; here the listening socket is made gevent's by hand.
    server = serve_private(gevent.socket.socket(sock.family, sock.type, fileno=sock.detach()), app)
    try:  # the request from a real thread, while the hub runs the server here
        get = partial(requests.get, f"{url}/nodelay", headers={"Expect": "100-continue"}, timeout=10)
        answer = gevent.get_hub().threadpool.spawn(get).get()
        assert answer.status_code == 200 and answer.text != "0", answer.text
    finally:
        server.stop()
