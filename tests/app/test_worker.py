"""The gunicorn worker (app/worker.py): a stop ends at once when idle, and not before an open request."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import gevent
import gevent.socket
import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger

from app.worker import Worker

REQUEST = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture
def worker() -> Iterator[tuple[Worker, gevent.Greenlet, tuple[str, int]]]:
    listener = gevent.socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    cfg = Config()
    running = Worker(0, os.getppid(), [listener], None, 30, cfg, Logger(cfg))
    running.wsgi = _app
    greenlet = gevent.spawn(running.run)
    gevent.sleep(0.05)  # serving, and past its first look at ``alive``
    yield running, greenlet, listener.getsockname()
    greenlet.kill()
    listener.close()
    running.tmp.close()


def test_an_idle_worker_told_to_stop_ends_at_once(worker: tuple[Worker, gevent.Greenlet, Any]) -> None:
    running, greenlet, _ = worker
    running.alive = False  # SIGTERM's handler, or gunicorn's max_requests
    greenlet.join(timeout=0.5)
    assert greenlet.dead  # gunicorn's own looks once a second


def test_a_request_open_when_told_to_stop_is_answered_then_the_worker_ends(
    worker: tuple[Worker, gevent.Greenlet, tuple[str, int]],
) -> None:
    running, greenlet, address = worker
    client = gevent.socket.create_connection(address)
    client.sendall(REQUEST + b"01234")
    gevent.sleep(0.1)
    running.alive = False
    greenlet.join(timeout=0.3)
    assert not greenlet.dead  # the request is half sent: the worker waits for it
    client.sendall(b"56789")
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"0123456789")
    greenlet.join(timeout=0.5)
    assert greenlet.dead
    client.close()


def test_a_keep_alive_connection_answered_once_told_to_stop_ends_after_its_answer(
    worker: tuple[Worker, gevent.Greenlet, tuple[str, int]],
) -> None:
    running, greenlet, address = worker

    def stopped_during_the_answer(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        running.alive = False  # SIGTERM arriving while the request runs, after gunicorn's own look
        return _app(environ, start_response)

    running.wsgi = stopped_during_the_answer
    answer = b""
    with gevent.socket.create_connection(address) as client:
        client.sendall(REQUEST.replace(b"Connection: close\r\n", b"") + b"0123456789")
        with gevent.Timeout(1):  # gunicorn's worker keeps it open for its keep-alive wait
            while chunk := client.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"0123456789")
    greenlet.join(timeout=0.5)
    assert greenlet.dead
