"""The local hop's frames and its two ends in one process: torn frames, oversized heads, streamed answers.

Requests that really travel between node processes over the hop are in
tests/test_cluster_hop.py.
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.errors import MalformedBody
from app.forwarding import Forwarding
from app.hop import FramedInput, HopClient, HopFailed, HopRefused, HopServer
from app.hop_frames import (
    DATA,
    DATA_LIMIT,
    END,
    HEAD_LIMIT,
    REQUEST,
    AnswerHead,
    FrameError,
    FrameTooLarge,
    RequestHead,
    TornFrame,
    broken_frame,
    data_frames,
    expect_frame,
    frame,
    read_frame,
)
from engine import Settings
from tests.app.test_forwarding import SUBJECTS, FakeStore, OneAnswer, environ


def frames_of(data: bytes) -> list[tuple[bytes, bytes]]:
    stream = io.BytesIO(data)
    found = []
    while (one := read_frame(stream)) is not None:
        found.append(one)
    return found


def test_heads_and_data_read_back_as_written() -> None:
    head = RequestHead({"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/segments/caf\xc3\xa9", "HTTP_X_A": "1"})
    answer = AnswerHead("200 OK", [("Content-Type", "text/plain"), ("Set", "a"), ("Set", "b")])
    wire = head.encode() + b"".join(data_frames(b"abc")) + frame(END) + answer.encode()
    (q, q_payload), (d, d_payload), (e, e_payload), (_, a_payload) = frames_of(wire)
    assert (q, d, e) == (REQUEST, DATA, END) and d_payload == b"abc" and e_payload == b""
    assert RequestHead.decode(q_payload) == head
    assert AnswerHead.decode(a_payload) == answer


def test_a_large_piece_is_split_into_frames_of_at_most_the_limit() -> None:
    piece = os.urandom(DATA_LIMIT * 2 + 5)
    frames = frames_of(b"".join(data_frames(piece)))
    assert [len(p) for _, p in frames] == [DATA_LIMIT, DATA_LIMIT, 5]
    assert b"".join(p for _, p in frames) == piece
    assert list(data_frames(b"")) == []


@pytest.mark.parametrize("cut", [1, 4, 5, 9])
def test_a_connection_that_ends_inside_a_frame_is_a_torn_frame(cut: int) -> None:
    whole = frame(DATA, b"abcdefgh")  # 5 bytes of prefix, 8 of payload
    with pytest.raises(TornFrame):
        read_frame(io.BytesIO(whole[:cut]))


def test_an_end_between_frames_is_clean_but_not_where_a_frame_is_due() -> None:
    assert read_frame(io.BytesIO(b"")) is None
    with pytest.raises(TornFrame):
        expect_frame(io.BytesIO(b""))


def test_an_oversized_head_is_refused_before_its_payload_is_read() -> None:
    class Prefix(io.BytesIO):
        """A stream that fails the test if more than the prefix is read."""

        def read(self, size: int | None = -1) -> bytes:
            assert size == 5, "the payload of an oversized frame was read"
            return super().read(size)

    with pytest.raises(FrameTooLarge):
        read_frame(Prefix(struct.pack(">cI", REQUEST, HEAD_LIMIT + 1)))
    with pytest.raises(FrameTooLarge):
        read_frame(Prefix(struct.pack(">cI", DATA, DATA_LIMIT + 1)))
    with pytest.raises(FrameTooLarge):
        read_frame(Prefix(struct.pack(">cI", END, 1)))
    assert read_frame(io.BytesIO(frame(REQUEST, b"x" * HEAD_LIMIT))) == (REQUEST, b"x" * HEAD_LIMIT)


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"{}",
        b"[{}]",
        b'[{"REQUEST_METHOD": "GET"}, "http"]',  # no path
        b'[{"REQUEST_METHOD": "GET", "PATH_INFO": "/", "wsgi.input": "x"}, "http"]',  # not a request's
        b'[{"REQUEST_METHOD": "GET", "PATH_INFO": "/", "HTTP_X": 1}, "http"]',
    ],
)
def test_a_malformed_request_head_is_refused(payload: bytes) -> None:
    with pytest.raises(FrameError):
        RequestHead.decode(payload)


def test_an_unknown_frame_kind_is_refused() -> None:
    with pytest.raises(FrameError):
        read_frame(io.BytesIO(b"Z\x00\x00\x00\x00"))


def test_a_request_body_that_breaks_off_is_malformed_not_short() -> None:
    body = FramedInput(io.BytesIO(b"".join(data_frames(b"hello")) + frame(DATA, b"wor")[:6]))
    assert body.read(5) == b"hello"
    with pytest.raises(MalformedBody):
        body.read(5)


def test_a_request_body_reads_in_any_sizes_up_to_its_end_frame() -> None:
    wire = b"".join(data_frames(b"hello ")) + b"".join(data_frames(b"world")) + frame(END) + b"next"
    stream = io.BytesIO(wire)
    body = FramedInput(stream)
    assert body.read(3) == b"hel"
    assert body.read(5) == b"lo wo"  # across frames: a short read only at the end, as gunicorn's
    assert body.read(100) + body.read() == b"rld"
    assert body.read(1) == b""
    assert stream.read() == b"next"  # the next request's frames are left alone


def test_a_broken_body_frame_fails_every_read_as_a_malformed_body() -> None:
    stream = io.BytesIO(b"".join(data_frames(b"hel")) + broken_frame("bad size line") + b"next")
    body = FramedInput(stream)
    assert body.read(3) == b"hel"
    for _ in range(2):
        with pytest.raises(MalformedBody, match=r"^bad size line$"):
            body.read(5)
    body.drain()  # the body ended at its broken frame
    assert stream.read() == b"next"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HopServer]:
    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        if environ["PATH_INFO"] == "/unread":
            start_response("413 Too Large", [("Content-Length", "0")])
            return iter([])
        try:
            body = environ["wsgi.input"].read()
        except MalformedBody as err:  # as a surface answers it
            start_response("400 Bad Request", [])
            return iter([err.detail.encode()])
        remote = environ.get("REMOTE_ADDR", "")
        start_response("200 OK", [("X-Path", environ["PATH_INFO"]), ("X-Remote", remote)])
        return iter([b"got ", body, b""])

    hop = HopServer.bind(tmp_path / "run")
    assert hop is not None
    hop.start(app)
    yield hop
    hop.close()


def test_the_socket_is_the_users_alone(server: HopServer, tmp_path: Path) -> None:
    assert stat.S_IMODE(os.stat(server.address).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(server.address).st_mode)


def test_a_folder_others_may_write_in_gets_no_socket(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    assert HopServer.bind(folder) is None


def test_a_socket_left_by_a_killed_process_is_removed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    gone = folder / f"{2**22 + 1}-deadbeef.sock"  # above the largest pid Linux hands out
    gone.touch()
    hop = HopServer.bind(folder)
    assert hop is not None
    hop.close()
    assert not gone.exists() and not Path(hop.address).exists()


def test_requests_go_over_one_connection_each_after_the_other(server: HopServer) -> None:
    client = HopClient(connect_s=1, silence_s=5)
    for n in range(3):
        head = RequestHead({"REQUEST_METHOD": "POST", "PATH_INFO": f"/p{n}", "REMOTE_ADDR": "10.0.0.7"})
        answer, pieces = client.send(server.address, head, [b"bo", b"dy"])
        assert answer.status == "200 OK"
        assert dict(answer.headers) == {"X-Path": f"/p{n}", "X-Remote": "10.0.0.7"}
        assert b"".join(pieces) == b"got body"
    assert len(client._idle[server.address]) == 1
    client.close()


def test_a_body_the_owner_left_unread_is_drained(server: HopServer) -> None:
    client = HopClient(connect_s=1, silence_s=5)
    head = RequestHead({"REQUEST_METHOD": "PUT", "PATH_INFO": "/unread"})
    answer, pieces = client.send(server.address, head, [b"x" * 300_000] * 4)
    assert answer.status == "413 Too Large" and b"".join(pieces) == b""
    answer, pieces = client.send(server.address, RequestHead({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}), [])
    assert b"".join(pieces) == b"got "
    client.close()


def test_a_client_body_that_breaks_off_is_answered_by_the_owner_as_its_own(server: HopServer) -> None:
    def broken() -> Iterator[bytes]:
        yield b"par"
        raise MalformedBody("the chunked request body is malformed: bad size line")

    client = HopClient(connect_s=1, silence_s=5)
    head = RequestHead({"REQUEST_METHOD": "POST", "PATH_INFO": "/p"})
    answer, pieces = client.send(server.address, head, broken())
    assert answer.status == "400 Bad Request"
    assert b"".join(pieces) == b"the chunked request body is malformed: bad size line"
    answer, pieces = client.send(server.address, head, [b"next"])  # the connection serves on
    assert answer.status == "200 OK" and b"".join(pieces) == b"got next"
    assert len(client._idle[server.address]) == 1
    client.close()


def test_a_client_body_that_fails_to_read_is_the_clients_error_not_the_owners(server: HopServer) -> None:
    def hung_up() -> Iterator[bytes]:
        yield b"par"
        raise ConnectionResetError("the client hung up")

    client = HopClient(connect_s=1, silence_s=5)
    head = RequestHead({"REQUEST_METHOD": "POST", "PATH_INFO": "/p"})
    with pytest.raises(ConnectionResetError):  # not HopFailed: the owner did not fail (no 502)
        client.send(server.address, head, hung_up())
    assert client._idle.get(server.address, []) == []  # the cut-off request's connection is dropped
    answer, pieces = client.send(server.address, head, [b"next"])
    assert answer.status == "200 OK" and b"".join(pieces) == b"got next"
    client.close()


def test_no_socket_is_refused_and_a_silent_owner_fails(tmp_path: Path) -> None:
    client = HopClient(connect_s=1, silence_s=0.3)
    head = RequestHead({"REQUEST_METHOD": "GET", "PATH_INFO": "/"})
    with pytest.raises(HopRefused):
        client.send(str(tmp_path / "none.sock"), head, [])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "silent.sock"))
    listener.listen(1)  # takes the request, answers nothing
    with pytest.raises(HopFailed, match=r"did not answer in 0\.3 s"):
        client.send(str(tmp_path / "silent.sock"), head, [])

    listener.close()
    dying = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dying.bind(str(tmp_path / "dying.sock"))
    dying.listen(1)

    def take_then_die() -> None:
        conn, _ = dying.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=take_then_die, daemon=True).start()
    with pytest.raises(HopFailed, match="failed during the request"):
        client.send(str(tmp_path / "dying.sock"), head, [])
    dying.close()


class HopStore(FakeStore):
    """A cluster node's view with the owner's Unix socket, as a node record on this machine gives it."""

    def __init__(self, hop: str) -> None:
        super().__init__(wait_s=5, ready_at=None)
        self.hop = hop

    def hop_of(self, node: str) -> str | None:
        return self.hop


def forward(store: HopStore, request: dict[str, Any]) -> tuple[list[str], dict[str, str], bytes, Forwarding]:
    statuses: list[str] = []
    headers: dict[str, str] = {}

    def start_response(status: str, out: list[tuple[str, str]]) -> None:
        statuses.append(status)
        headers.update(out)

    def here(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        raise AssertionError("answered by the forwarder")

    forwarding = Forwarding(here, store, SUBJECTS, takeover_wait_s=store.wait_s, local_hop=True)  # type: ignore[arg-type]
    body = b"".join(forwarding(request, start_response))
    return statuses, headers, body, forwarding


def test_a_forwarded_request_goes_over_the_hop_as_a_forwarded_one(server: HopServer) -> None:
    store = HopStore(server.address)
    store.owner = ("a", "http://127.0.0.1:9")  # HTTP would be refused
    request = environ("/v1/segments/x?offset=0", "POST")
    request["wsgi.input"], request["CONTENT_LENGTH"] = io.BytesIO(b"event"), "5"
    request["REMOTE_ADDR"] = "10.1.2.3"
    statuses, headers, body, forwarding = forward(store, request)
    assert statuses == ["200 OK"] and body == b"got event"
    assert headers["Segment-Owner"] == "a" and headers["X-Path"] == "/v1/segments/x"
    assert headers["X-Remote"] == "10.1.2.3"  # the client's, not the forwarder's
    assert forwarding.transports["hop"]._value.get() == 1 and forwarding.transports["http"]._value.get() == 0
    assert forwarding.hop is not None
    forwarding.hop.close()


def test_a_socket_that_refuses_sends_the_request_over_http(tmp_path: Path) -> None:
    owner = OneAnswer()
    store = HopStore(str(tmp_path / "gone.sock"))  # a killed process's, or another machine's
    store.owner = ("a", f"http://127.0.0.1:{owner.server_address[1]}")
    request = environ("/v1/segments/x", "POST")
    request["wsgi.input"], request["CONTENT_LENGTH"] = io.BytesIO(b"event"), "5"
    statuses, headers, body, forwarding = forward(store, request)
    assert statuses == ["200 OK"] and body == b"event" and headers["Segment-Owner"] == "a"
    assert forwarding.transports["http"]._value.get() == 1 and forwarding.transports["hop"]._value.get() == 0
    owner.shutdown()
    owner.server_close()


@pytest.mark.parametrize(("method", "status"), [("GET", "200 OK"), ("POST", "502 BAD GATEWAY")])
def test_an_owner_that_fails_over_the_hop_is_given_up_on_by_the_forwardings_rules(
    server: HopServer, tmp_path: Path, method: str, status: str
) -> None:
    """A read is sent to the next owner; a write that may have been applied answers 502."""
    dying = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dying.bind(str(tmp_path / "dying.sock"))
    dying.listen(1)

    def take_then_die() -> None:
        conn, _ = dying.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=take_then_die, daemon=True).start()
    store = HopStore(str(tmp_path / "dying.sock"))
    store.owner = ("a", "http://127.0.0.1:9")

    def failed(node: str) -> None:
        store.hop, store.owner = server.address, ("b", "http://127.0.0.1:9")

    store.owner_unreachable = failed  # type: ignore[method-assign]
    request = environ("/v1/segments/x", method)
    request["wsgi.input"], request["CONTENT_LENGTH"] = io.BytesIO(b""), "0"
    statuses, headers, body, forwarding = forward(store, request)
    dying.close()
    assert statuses == [status]
    if method == "GET":
        assert body == b"got " and headers["Segment-Owner"] == "b"
    else:
        assert json.loads(body)["code"] == "OutcomeUnknown"
    assert forwarding.hop is not None
    forwarding.hop.close()


def test_a_read_over_the_hop_to_a_paused_owner_goes_to_the_next_owner_once_the_view_names_it(
    server: HopServer, tmp_path: Path
) -> None:
    """Not after the owner's silence (3 s here): its lease ran out long before."""
    paused = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    paused.bind(str(tmp_path / "paused.sock"))
    paused.listen(1)  # the kernel takes the request; nobody answers it
    store = HopStore(str(tmp_path / "paused.sock"))
    store.settings = Settings(container_count=4, tail_wait_max_s=2, lease_s=1)
    store.owner = ("a", "http://127.0.0.1:9")

    def moved() -> None:
        store.hop, store.owner = server.address, ("b", "http://127.0.0.1:9")

    mover = threading.Timer(0.4, moved)
    mover.start()
    request = environ("/v1/segments/x", "GET")
    started = time.monotonic()
    statuses, headers, body, forwarding = forward(store, request)
    took = time.monotonic() - started
    mover.join()
    paused.close()
    assert statuses == ["200 OK"] and body == b"got " and headers["Segment-Owner"] == "b"
    assert 0.4 <= took < 1.5, f"answered after {took:.2f} s"
    assert forwarding.hop is not None
    forwarding.hop.close()


@pytest.mark.parametrize(
    "sent",
    [
        struct.pack(">cI", REQUEST, HEAD_LIMIT + 1),  # an oversized head: refused before its payload
        frame(REQUEST, b"not json"),
        frame(DATA, b"x"),  # a body with no head
        frame(REQUEST, RequestHead({"REQUEST_METHOD": "POST", "PATH_INFO": "/"}).encode()[5:])[:12],  # torn
    ],
)
def test_the_owner_drops_a_connection_that_breaks_the_frames_and_serves_on(
    server: HopServer, sent: bytes
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(5)
        raw.connect(server.address)
        raw.sendall(sent)
        raw.shutdown(socket.SHUT_WR)
        assert raw.recv(65536) == b"", "the owner answered what it could not read"
    client = HopClient(connect_s=1, silence_s=5)
    answer, pieces = client.send(server.address, RequestHead({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}), [])
    assert answer.status == "200 OK" and b"".join(pieces) == b"got "
    client.close()


def test_idle_connections_to_an_owner_that_exited_are_closed(server: HopServer, tmp_path: Path) -> None:
    """A restarted owner listens on a new socket: the old one's idle connections are not kept."""
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gone.bind(str(tmp_path / "gone.sock"))
    gone.listen(1)

    def answer_once_then_exit() -> None:
        conn, _ = gone.accept()
        with conn, conn.makefile("rb") as stream:
            expect_frame(stream)
            expect_frame(stream)
            conn.sendall(AnswerHead("204 No Content", []).encode() + frame(END))
        # then the process exits, its end of the connection closed

    exiting = threading.Thread(target=answer_once_then_exit, daemon=True)
    exiting.start()
    client = HopClient(connect_s=1, silence_s=5)
    head = RequestHead({"REQUEST_METHOD": "GET", "PATH_INFO": "/"})
    answer, pieces = client.send(str(tmp_path / "gone.sock"), head, [])
    assert answer.status == "204 No Content" and b"".join(pieces) == b""
    assert str(tmp_path / "gone.sock") in client._idle
    gone.close()
    exiting.join(5)
    _, pieces = client.send(server.address, head, [])  # a new connection: the idle ones are looked at
    assert b"".join(pieces) == b"got "
    assert list(client._idle) == [server.address]
    client.close()
