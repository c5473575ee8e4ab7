"""What a cluster node forwards where: each surface's request subject, and the bounded wait in a takeover.

No processes: the subjects are read from WSGI environs, and ``Forwarding``
runs over a stand-in store whose cluster view the test sets. Requests that
really travel between nodes are in tests/test_cluster_surfaces.py.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote_to_bytes

import pytest
from werkzeug.test import create_environ

from app.errors import MalformedBody
from app.forwarding import Forwarding
from app.native.subject import request_subject as native_subject
from app.ops import ROUTE_KEY
from app.s3 import objects
from app.s3.subject import request_subject as s3_subject
from app.streams.names import stream_data_segment, stream_meta_segment
from app.streams.subject import request_subject as streams_subject
from bench.servers import free_port
from engine import Settings
from engine.naming import container_for

SUBJECTS = [native_subject, streams_subject, s3_subject]


def environ(path: str, method: str = "GET", **headers: str) -> dict[str, Any]:
    """A WSGI environ as gunicorn builds it: ``PATH_INFO`` holds the path's bytes as latin-1."""
    env = create_environ(path, method=method, headers=headers)
    env["PATH_INFO"] = unquote_to_bytes(path.partition("?")[0]).decode("latin-1")
    return env


@pytest.mark.parametrize(
    ("path", "subject"),
    [
        ("/v1/segments/plain", "plain"),
        ("/v1/segments/a%2Fb/c:seal", "a/b/c"),
        ("/v1/segments/caf%C3%A9?offset=3", "café"),
        ("/v1/segments", None),
        ("/v1/segments/%FF", None),
        ("/v1/stream/x", None),
        ("/bucket/key", None),
    ],
)
def test_a_native_request_is_about_the_segment_it_names(path: str, subject: str | None) -> None:
    assert native_subject(environ(path)) == subject


@pytest.mark.parametrize(
    ("path", "stream"),
    [
        ("/v1/stream/events", "events"),
        ("/v1/stream/a/b%20c?offset=-1&live=sse", "a/b c"),
        ("/v1/stream/", None),
        ("/v1/stream/a//b", None),
        ("/v1/stream/%FF", None),
        ("/v1/segments/events", None),
    ],
)
def test_a_stream_request_is_about_its_meta_segment(path: str, stream: str | None) -> None:
    expected = None if stream is None else stream_meta_segment(stream)
    assert streams_subject(environ(path, "POST")) == expected


def test_a_stream_and_its_data_segment_share_the_subjects_container() -> None:
    meta = streams_subject(environ("/v1/stream/orders"))
    assert meta is not None
    # Creation draws the data segment's incarnation until it lands beside the meta segment.
    data = next(
        d
        for d in (stream_data_segment("orders", f"i{n}") for n in range(100))
        if container_for(d, 4) == container_for(meta, 4)
    )
    assert container_for(data, 4) == container_for(meta, 4)


@pytest.mark.parametrize(
    ("path", "subject"),
    [
        ("/bkt/dir/a%20b.txt", "bkt/dir/a b.txt"),
        ("/bkt/k?uploadId=abc&partNumber=2", "bkt/k"),
        ("/bkt/k?tagging", "bkt/k"),
        ("/bkt", objects.bucket_marker("bkt")),
        ("/bkt/", objects.bucket_marker("bkt")),
        ("/bkt?list-type=2&prefix=a/", objects.bucket_marker("bkt")),
        ("/", None),
        ("/v1", None),
        ("/metrics", None),
        ("/healthz", None),
        ("/Bad_Bucket/k", None),
        ("/a..b/k", None),
        ("/bkt/a%23b", None),
        ("/bkt/%FF", None),
    ],
)
def test_an_s3_request_is_about_its_object_or_its_bucket(path: str, subject: str | None) -> None:
    assert s3_subject(environ(path, "PUT")) == subject


def test_an_objects_record_and_its_bucket_marker_hash_as_the_subjects_do() -> None:
    record = objects.record_name("bkt/dir/key")
    assert record is not None and container_for(record, 7) == container_for("bkt/dir/key", 7)
    assert container_for(objects.bucket_marker("bkt"), 7) == container_for("bkt", 7)


class FakeNode:
    node_id = "here"


class FakeStore:
    """The parts of a cluster node's store ``Forwarding`` reads; ``ready_at`` is when it serves."""

    def __init__(self, *, wait_s: float, ready_at: float | None, node: object | None = FakeNode()) -> None:
        self.node = node
        self.settings = Settings(container_count=4)
        self.wait_s = wait_s
        self.ready_at = ready_at
        self.owner: tuple[str, str] | None = None
        self.unreachable: list[str] = []

    def owner_unreachable(self, node: str) -> None:
        self.unreachable.append(node)

    def container_ready(self, container: int) -> bool:
        return self.ready_at is not None and time.monotonic() >= self.ready_at

    def owner_of(self, name: str) -> tuple[str, str] | None:
        return self.owner


def run(store: FakeStore, env: dict[str, Any]) -> tuple[list[str], float]:
    """Call the middleware over an app that records that it answered; returns (answers, seconds)."""
    answered: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        answered.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b""]

    started = time.monotonic()
    Forwarding(app, store, SUBJECTS, takeover_wait_s=store.wait_s)(env, lambda status, headers: None)  # type: ignore[arg-type]
    return answered, time.monotonic() - started


def test_a_single_node_answers_at_once_without_reading_the_path() -> None:
    def no_subject(environ: dict[str, Any]) -> str | None:
        raise AssertionError("a single node maps no subject")

    answered: list[str] = []
    store = FakeStore(wait_s=5, ready_at=None, node=None)
    middleware = Forwarding(  # type: ignore[arg-type]
        lambda e, s: answered.append(e["PATH_INFO"]) or [], store, [no_subject], takeover_wait_s=store.wait_s
    )
    middleware(environ("/v1/segments/x"), lambda status, headers: None)
    assert answered == ["/v1/segments/x"]


def test_a_request_waits_for_its_container_then_is_served() -> None:
    store = FakeStore(wait_s=5, ready_at=time.monotonic() + 0.3)
    answered, took = run(store, environ("/v1/stream/s", "POST"))
    assert answered == ["/v1/stream/s"] and 0.3 <= took < 3


def test_past_the_bound_the_surface_answers_it() -> None:
    store = FakeStore(wait_s=0.2, ready_at=None)  # no node serves it: the app raises 503 itself
    answered, took = run(store, environ("/bkt/k", "PUT"))
    assert answered == ["/bkt/k"] and 0.2 <= took < 2


def test_an_owner_that_refuses_connections_is_waited_out_until_the_container_is_served() -> None:
    store = FakeStore(wait_s=5, ready_at=time.monotonic() + 0.5)
    store.owner = ("a", f"http://127.0.0.1:{free_port()}")  # nothing listens: a killed node
    answered, took = run(store, environ("/v1/segments/x", "POST"))
    assert answered == ["/v1/segments/x"] and 0.45 <= took < 4  # timed from a little after ready_at's base
    assert set(store.unreachable) == {"a"}  # so a 503 meanwhile says its lease is waited out


def test_a_forwarded_request_for_a_container_served_elsewhere_is_answered_at_once() -> None:
    store = FakeStore(wait_s=5, ready_at=None)
    store.owner = ("a", "http://127.0.0.1:9")
    answered, took = run(store, environ("/v1/segments/x", Segstore_Forwarded="b"))
    assert answered == ["/v1/segments/x"] and took < 1


def test_requests_without_a_subject_are_answered_where_they_arrive() -> None:
    store = FakeStore(wait_s=5, ready_at=None)
    for path in ("/", "/v1/segments", "/v1/cluster", "/metrics"):
        answered, took = run(store, environ(path))
        assert answered == [path] and took < 1


def test_an_owner_that_fails_during_the_request_gives_an_unknown_outcome_not_a_503() -> None:
    """The request may have been applied: 502 OutcomeUnknown, which no client resends blindly."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def accept_then_die() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)  # the request arrived, then the node is gone
        conn.close()

    threading.Thread(target=accept_then_die, daemon=True).start()
    store = FakeStore(wait_s=5, ready_at=None)
    store.owner = ("a", f"http://127.0.0.1:{listener.getsockname()[1]}")
    answered: list[str] = []
    statuses: list[str] = []
    body = Forwarding(
        lambda e, s: answered.append(e["PATH_INFO"]) or [],  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        SUBJECTS,
        takeover_wait_s=store.wait_s,
    )(request := environ("/v1/segments/x", "POST"), lambda status, headers: statuses.append(status))
    listener.close()
    assert answered == []  # not answered here as if nothing had been sent
    assert statuses == ["502 BAD GATEWAY"]
    assert request[ROUTE_KEY] == "forwarded"  # the request metrics count it so
    assert json.loads(b"".join(body))["code"] == "OutcomeUnknown"


class OneAnswer(ThreadingHTTPServer):
    """A node that answers every request 200 with the body it got."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_deduplicated_append_whose_owner_fails_during_it_is_sent_to_the_next_owner() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def accept_then_die() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=accept_then_die, daemon=True).start()
    next_owner = OneAnswer()
    store = FakeStore(wait_s=5, ready_at=None)
    store.owner = ("a", f"http://127.0.0.1:{listener.getsockname()[1]}")
    store.owner_unreachable = lambda node: setattr(  # type: ignore[method-assign]
        store, "owner", ("b", f"http://127.0.0.1:{next_owner.server_address[1]}")
    )
    statuses: list[str] = []
    request = environ("/v1/segments/x", "POST", Writer_Id=str(uuid.UUID(int=1)), Event_Number="3")
    request["wsgi.input"], request["CONTENT_LENGTH"] = io.BytesIO(b"event"), "5"
    body = Forwarding(
        lambda e, s: [],  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        SUBJECTS,
        takeover_wait_s=store.wait_s,
    )(request, lambda status, headers: statuses.append(status))
    listener.close()
    assert statuses == ["200 OK"] and b"".join(body) == b"event"
    next_owner.shutdown()
    next_owner.server_close()


def test_a_deduplicated_append_answered_here_after_its_owner_failed_keeps_its_body() -> None:
    store = FakeStore(wait_s=0.3, ready_at=None)
    store.owner = ("a", "http://127.0.0.1:9")  # refuses: the request waits, then this node answers
    request = environ("/v1/segments/x", "POST", Writer_Id=str(uuid.UUID(int=1)), Event_Number="3")
    request["wsgi.input"], request["CONTENT_LENGTH"] = io.BytesIO(b"event"), "5"
    read: list[bytes] = []

    def here(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        read.append(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"])))
        start_response("503 SERVICE UNAVAILABLE", [])
        return [b""]

    Forwarding(here, store, SUBJECTS, takeover_wait_s=store.wait_s)(  # type: ignore[arg-type]
        request, lambda status, headers: None
    )
    assert read == [b"event"]


def silent_owner() -> tuple[socket.socket, list[socket.socket]]:
    """A node that takes one request and never answers it (a paused node's kernel takes it so).

    Its listener, and the connections it took (left open until the test closes them).
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    taken: list[socket.socket] = []

    def accept_then_pause() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        taken.append(conn)

    threading.Thread(target=accept_then_pause, daemon=True).start()
    return listener, taken


@pytest.mark.parametrize(
    ("method", "status", "code"),
    [("GET", "200 OK", None), ("POST", "502 BAD GATEWAY", "OutcomeUnknown")],
)
def test_an_owner_that_takes_the_request_and_goes_silent_is_given_up_on(
    method: str, status: str, code: str | None
) -> None:
    """A read is sent again (here it ends answered by this node's surface: 503 while nobody serves)."""
    listener, taken = silent_owner()
    store = FakeStore(wait_s=0.5, ready_at=None)
    store.settings = Settings(
        container_count=4, tail_wait_max_s=0.3, lease_s=1
    )
    store.owner = ("a", f"http://127.0.0.1:{listener.getsockname()[1]}")
    answered: list[str] = []
    statuses: list[str] = []
    started = time.monotonic()
    def here(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        answered.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b""]

    forwarding = Forwarding(here, store, SUBJECTS, takeover_wait_s=store.wait_s)  # type: ignore[arg-type]
    body = forwarding(environ("/v1/segments/x", method), lambda status, headers: statuses.append(status))
    took = time.monotonic() - started
    forwarding.http.close()
    for conn in taken:
        conn.close()
    listener.close()
    assert statuses == [status]
    if code is None:  # sent again while the retry lasted, then answered here
        assert answered == ["/v1/segments/x"] and 2.6 <= took < 5
    else:
        assert answered == [] and json.loads(b"".join(body))["code"] == code
        assert 1.3 <= took < 4  # tail_wait_max_s + lease_s, not for ever


@pytest.mark.parametrize(
    ("headers", "moves"),
    [
        ({"Writer_Id": str(uuid.UUID(int=1)), "Event_Number": "3"}, True),
        ({}, False),
    ],
    ids=["deduplicated", "plain"],
)
def test_a_repeatable_request_to_a_paused_owner_goes_to_the_next_owner_once_the_view_names_it(
    headers: dict[str, str], moves: bool
) -> None:
    """Not after the owner's silence: a paused owner loses its container long before.

    A plain append stays with the owner it went to (it may have been applied there).
    """
    listener, taken = silent_owner()
    next_owner = OneAnswer()
    store = FakeStore(wait_s=5, ready_at=None)
    store.settings = Settings(container_count=4, tail_wait_max_s=2, lease_s=1)  # silent for 3 s
    store.owner = ("a", f"http://127.0.0.1:{listener.getsockname()[1]}")
    mover = threading.Timer(
        0.4, lambda: setattr(store, "owner", ("b", f"http://127.0.0.1:{next_owner.server_address[1]}"))
    )
    mover.start()
    statuses: list[str] = []
    owners: list[str | None] = []
    request = environ("/v1/segments/x", "POST", **headers)
    request["wsgi.input"], request["CONTENT_LENGTH"] = io.BytesIO(b"event"), "5"

    def start_response(status: str, answer_headers: list[tuple[str, str]]) -> None:
        statuses.append(status)
        owners.append(dict(answer_headers).get("Segment-Owner"))

    started = time.monotonic()
    forwarding = Forwarding(
        lambda e, s: [],  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        SUBJECTS,
        takeover_wait_s=store.wait_s,
    )
    body = b"".join(forwarding(request, start_response))
    took = time.monotonic() - started
    mover.join()
    for conn in taken:
        conn.close()
    listener.close()
    next_owner.shutdown()
    next_owner.server_close()
    if moves:
        assert statuses == ["200 OK"] and owners == ["b"] and body == b"event"
        assert 0.4 <= took < 1.5, f"answered after {took:.2f} s"
    else:
        assert statuses == ["502 BAD GATEWAY"] and json.loads(body)["code"] == "OutcomeUnknown"
        assert took >= 3.0, f"given up on after {took:.2f} s, before the owner's silence"


def test_a_client_body_that_breaks_off_while_passed_on_over_http_is_a_400_and_cut_at_the_owner() -> None:
    """The owner's connection ends inside the chunked body (it stores nothing); the client gets its 400."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    received: list[bytes] = []

    def read_until_cut() -> None:
        conn, _ = listener.accept()
        with conn:
            while piece := conn.recv(65536):
                received.append(piece)

    reader = threading.Thread(target=read_until_cut, daemon=True)
    reader.start()

    class Broken(io.RawIOBase):
        def read(self, size: int | None = -1) -> bytes:
            raise MalformedBody("the chunked request body is malformed: bad size line")

    store = FakeStore(wait_s=5, ready_at=None)
    store.owner = ("a", f"http://127.0.0.1:{listener.getsockname()[1]}")
    statuses: list[str] = []
    request = environ("/v1/segments/x", "POST", Transfer_Encoding="chunked")
    request["wsgi.input"] = Broken()
    body = Forwarding(
        lambda e, s: [],  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        SUBJECTS,
        takeover_wait_s=store.wait_s,
    )(request, lambda status, headers: statuses.append(status))
    reader.join(5)
    listener.close()
    assert statuses == ["400 BAD REQUEST"]
    problem = json.loads(b"".join(body))
    assert problem["code"] == "InvalidArgument" and "bad size line" in problem["detail"]
    assert not reader.is_alive() and not b"".join(received).endswith(b"0\r\n\r\n")  # no end of body
