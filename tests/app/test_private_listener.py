"""A process's own port: on the public bind's host, named by the host clients are told."""

from __future__ import annotations

import io
import json
import socket
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import gevent
import gevent.socket
import pytest
import requests
from flask import Flask, request

from app.private_listener import RequestHeaders, bind_private, serve_private

T = TypeVar("T")


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


def _raw(url: str, head: bytes) -> bytes:
    """Send ``head`` (a request without a body) on a plain socket; the whole answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.fixture
def echo_url() -> Iterator[str]:
    """A process's own port serving an app that answers with the request's HTTP_* and CONTENT_* variables."""
    app = Flask(__name__)

    @app.route("/echo", methods=["GET", "POST"])
    def echo() -> dict[str, str]:
        return {
            key: value for key, value in request.environ.items()
            if key.startswith(("HTTP_", "CONTENT_")) and isinstance(value, str)
        }

    sock, url = bind_private("127.0.0.1:0", "")
    server = serve_private(gevent.socket.socket(sock.family, sock.type, fileno=sock.detach()), app)
    try:
        yield url
    finally:
        server.stop()


def _in_thread(call: Callable[[], T]) -> T:
    """``call`` on a real thread while the hub runs the server here."""
    return gevent.get_hub().threadpool.spawn(call).get()  # type: ignore[no-any-return]


def test_a_process_reads_headers_as_a_wsgi_server_should(echo_url: str) -> None:
    head = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Twice: one\r\nx-twice: two\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 3\r\nX_Under: dropped\r\nCookie: a=1\r\n"
        b"Cookie: b=2\r\nX-Spaced:   padded  \r\n\r\nabc"
    )
    answer = _in_thread(lambda: _raw(echo_url, head))
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200"), answer
    seen = json.loads(body)
    assert seen["HTTP_X_TWICE"] == "one,two"
    assert seen["HTTP_COOKIE"] == "a=1; b=2"
    assert seen["CONTENT_TYPE"] == "text/plain" and seen["CONTENT_LENGTH"] == "3"
    assert seen["HTTP_X_SPACED"] == "padded"
    assert "HTTP_X_UNDER" not in seen and "HTTP_CONTENT_TYPE" not in seen


@pytest.mark.parametrize(
    "bad",
    [
        b"X-Folded: one\r\n two\r\n",
        b"No colon here\r\n",
        b"Bad Name: x\r\n",
        b"X-Long: " + b"a" * 70_000 + b"\r\n",
        b"".join(b"X-%d: v\r\n" % i for i in range(101)),
    ],
    ids=["folded", "no colon", "space in name", "line too long", "too many"],
)
def test_a_process_refuses_header_lines_it_cannot_read_with_400(echo_url: str, bad: bytes) -> None:
    head = b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + bad + b"\r\n"
    answer = _in_thread(lambda: _raw(echo_url, head))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


def test_request_headers_read_and_forget_as_gevent_asks() -> None:
    headers = RequestHeaders(io.BytesIO(b"A: 1\r\nContent-Length: 5\r\na: 2\r\n\r\nbody"))
    assert headers.status == ""
    assert headers.get("a") == "1" and headers.getheader("CONTENT-LENGTH") == "5"
    assert headers.get("missing", "d") == "d" and headers.typeheader is None
    del headers["content-length"]
    assert list(headers.headers) == ["A: 1\r\n", "a: 2\r\n"]


@pytest.fixture
def timed() -> Iterator[tuple[Any, str, int]]:
    """A process's own listener serving /fast and /slow (half a second): the server, host and port."""
    app = Flask(__name__)

    @app.get("/slow")
    def slow() -> str:
        gevent.sleep(0.5)
        return "slow"

    @app.get("/fast")
    def fast() -> str:
        return "fast"

    sock, url = bind_private("127.0.0.1:0", "")
    server = serve_private(gevent.socket.socket(sock.family, sock.type, fileno=sock.detach()), app)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        yield server, host, int(port)
    finally:
        server.stop()


def _fast(conn: socket.socket) -> None:
    """One keep-alive request for /fast on ``conn``, its answer read."""
    conn.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"fast"):
        answer += conn.recv(65536)


def test_a_closing_listener_ends_its_idle_connections_and_the_busy_ones_after_their_answer(
    timed: tuple[Any, str, int],
) -> None:
    """A graceful stop waits for this listener's connections (app/worker.py): an idle keep-alive
    connection must not hold it."""
    server, host, port = timed

    def answers(path: str) -> bytes:
        """A request for ``path`` (or, with none, one for /fast first), read till the close."""
        with socket.create_connection((host, port), timeout=10) as conn:
            if path:
                conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            else:
                _fast(conn)
            got = b""
            while chunk := conn.recv(65536):
                got += chunk
            return got

    pool = gevent.get_hub().threadpool
    idle = pool.spawn(answers, "")
    busy = pool.spawn(answers, "/slow")
    gevent.sleep(0.2)
    server.close()
    assert server.pool.join(timeout=3)
    assert idle.get(timeout=5) == b""  # ended without a word: it waited for a request
    slow_answer = busy.get(timeout=5)
    assert slow_answer.startswith(b"HTTP/1.1 200") and slow_answer.endswith(b"slow"), slow_answer


def test_an_idle_connection_is_closed_after_the_keep_alive_time(
    timed: tuple[Any, str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As gunicorn's ``keepalive`` on the public port: connections moved here must not pile up idle."""
    monkeypatch.setattr("app.private_listener.KEEPALIVE_S", 0.3)
    _, host, port = timed

    def idle_for() -> float:
        """Seconds from an answer to the server's close of the kept-alive connection."""
        with socket.create_connection((host, port), timeout=10) as conn:
            _fast(conn)
            began = time.monotonic()
            assert conn.recv(65536) == b""  # closed by the server
            return time.monotonic() - began

    assert 0.2 < _in_thread(idle_for) < 3


def test_a_body_announced_with_expect_100_continue_is_asked_for_at_once(timed: tuple[Any, str, int]) -> None:
    """As gunicorn on the public port: the client sends the body, which the next request then follows.
    Answered only at the body's first read, an answer that never reads it (a 404) left the client's
    next request to be read as that body: botocore's next request after a refused PutObject came out
    as ``ELETE /bucket``."""
    _, host, port = timed

    def exchange() -> list[bytes]:
        with socket.create_connection((host, port), timeout=10) as conn:
            expect = b"Content-Length: 1\r\nExpect: 100-continue\r\n"
            conn.sendall(b"PUT /missing HTTP/1.1\r\nHost: x\r\n" + expect + b"\r\n")
            first = conn.recv(65536)
            conn.sendall(b"x")
            answer = first if first.count(b"HTTP/1.1") > 1 else first + conn.recv(65536)
            _fast(conn)
            return answer.split(b"\r\n\r\n")

    interim, final, *_ = _in_thread(exchange)
    assert interim == b"HTTP/1.1 100 Continue", interim
    assert final.startswith(b"HTTP/1.1 404"), final
