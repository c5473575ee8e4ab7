"""Malformed ``Transfer-Encoding: chunked`` bodies against a real server, over raw sockets.

Every surface that reads a body answers 400 (problem+json natively, S3's
``IncompleteBody`` on S3), stores nothing, and the worker serves the next
request on a new connection. A chunk declaring 2**80 bytes is refused at
its size line instead of being waited for.

On one process and on two over one data folder: there a body sent to the
process that does not serve its container breaks off while it is passed
on over the local hop, and the owner answers it as its own (each malformed
body is sent until one such answer came back, naming the owner).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
import requests

from bench.servers import ServerProcess
from tests.processes import killed_at_exit

# name -> (body bytes after the headers, whether the client then half-closes)
MALFORMED = {
    "size-not-hex": (b"zz\r\nhello\r\n0\r\n\r\n", False),
    "size-past-the-data": (b"10\r\nhello", True),
    "no-last-chunk": (b"5\r\nhello\r\n", True),
    "size-2**80": (b"%x\r\nhello\r\n0\r\n\r\n" % 2**80, False),
}
ANSWER_WITHIN_S = 10
# A request the answering process passed on to its container's owner is answered naming it.
OWNER = "segment-owner"
# On a node of two processes, at most this many tries for one that is passed on (half are).
TRIES_TO_BE_FORWARDED = 30


@dataclass
class Answer:
    status: int | None  # None: the server closed without answering
    headers: dict[str, str]
    body: bytes


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-processes"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    env = {"SEGSTORE_PROCESSES": str(request.param)}
    with killed_at_exit(ServerProcess(tmp_path_factory.mktemp("chunked") / "data", env=env)) as running:
        yield running


def send_malformed(server: ServerProcess, head: str, case: str) -> list[Answer]:
    """The answers to the malformed body ``case``: on several processes, sent until one was passed on."""
    body, half_close = MALFORMED[case]
    answers = [send_chunked(server, head, body, half_close=half_close)]
    while server.processes > 1 and not any(OWNER in answer.headers for answer in answers):
        assert len(answers) < TRIES_TO_BE_FORWARDED, "no request was passed on to its container's owner"
        answers.append(send_chunked(server, head, body, half_close=half_close))
    return answers


def send_chunked(
    server: ServerProcess, head: str, body: bytes, *, half_close: bool, port: int | None = None
) -> Answer:
    """Send ``head`` (request line and headers) with a chunked body; read the answer until close.

    To ``server``'s port, or ``port`` (a process's own).
    """
    request = f"{head}\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + body
    with socket.create_connection(("127.0.0.1", port or server.port), timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + ANSWER_WITHIN_S
        while b"\r\n\r\n" not in received or not _complete(received):
            assert time.monotonic() < deadline, f"no answer within {ANSWER_WITHIN_S} s: {received!r}"
            piece = sock.recv(65536)
            if not piece:
                break
            received += piece
    if not received:
        return Answer(None, {}, b"")
    head_bytes, _, rest = received.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", len(rest)))
    return Answer(int(lines[0].split()[1]), headers, rest[:length])


def _complete(received: bytes) -> bool:
    head, _, rest = received.partition(b"\r\n\r\n")
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return len(rest) >= int(value)
    return False


def assert_problem_400(answer: Answer) -> None:
    assert answer.status == 400, answer
    assert answer.headers["content-type"] == "application/problem+json"
    problem = json.loads(answer.body)
    assert problem["code"] == "InvalidArgument" and "chunked request body" in problem["detail"]


@pytest.mark.parametrize("case", MALFORMED)
def test_native_append_is_400_and_stores_nothing(server: ServerProcess, case: str) -> None:
    url = f"{server.url}/v1/segments/chunked/append/{case}"
    assert requests.put(url, timeout=5).status_code == 201
    for answer in send_malformed(server, f"POST /v1/segments/chunked/append/{case} HTTP/1.1", case):
        assert_problem_400(answer)
    info = requests.get(url + ":info", timeout=5)  # a new connection: the worker serves on
    assert info.status_code == 200 and info.json()["length"] == 0


@pytest.mark.parametrize("server", [2], ids=["two-processes"], indirect=True)
@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_body_sent_to_each_process_at_its_own_address_is_400(
    server: ServerProcess, case: str
) -> None:
    """A process's own address (gevent's server; owner-aware clients use it): one answers, one passes on."""
    nodes = requests.get(f"{server.url}/v1/cluster", timeout=5).json()["nodes"]
    assert len(nodes) == 2
    url = f"{server.url}/v1/segments/chunked/own/{case}"
    assert requests.put(url, timeout=5).status_code == 201
    body, half_close = MALFORMED[case]
    answers = [
        send_chunked(server, f"POST /v1/segments/chunked/own/{case} HTTP/1.1", body, half_close=half_close,
                     port=urlsplit(node["url"]).port)
        for node in nodes
    ]
    for answer in answers:
        assert_problem_400(answer)
    assert sorted(OWNER in answer.headers for answer in answers) == [False, True]
    assert requests.get(url + ":info", timeout=5).json()["length"] == 0


@pytest.mark.parametrize("case", MALFORMED)
def test_native_create_with_options_is_400_and_creates_nothing(server: ServerProcess, case: str) -> None:
    for answer in send_malformed(server, f"PUT /v1/segments/chunked/create/{case} HTTP/1.1", case):
        assert_problem_400(answer)
    missing = requests.get(f"{server.url}/v1/segments/chunked/create/{case}:info", timeout=5)
    assert missing.status_code == 404


@pytest.mark.parametrize("case", MALFORMED)
def test_stream_append_is_400_and_stores_nothing(server: ServerProcess, case: str) -> None:
    url = f"{server.url}/v1/stream/chunked-{case}"
    assert requests.put(url, headers={"Content-Type": "text/plain"}, timeout=5).status_code == 201
    head = f"POST /v1/stream/chunked-{case} HTTP/1.1\r\nContent-Type: text/plain"
    for answer in send_malformed(server, head, case):
        assert_problem_400(answer)
    read = requests.get(url, params={"offset": "-1"}, timeout=5)
    assert read.status_code == 200 and read.content == b""


@pytest.mark.parametrize("case", MALFORMED)
def test_s3_put_object_is_incomplete_body_and_stores_nothing(server: ServerProcess, case: str) -> None:
    requests.put(f"{server.url}/chunked-bucket", timeout=5)
    for answer in send_malformed(server, f"PUT /chunked-bucket/{case} HTTP/1.1", case):
        assert answer.status == 400, answer
        assert b"<Code>IncompleteBody</Code>" in answer.body
    assert requests.head(f"{server.url}/chunked-bucket/{case}", timeout=5).status_code == 404
    assert requests.get(f"{server.url}/chunked-bucket?list-type=2", timeout=5).text.count("<Key>") == 0


def test_well_formed_chunked_bodies_are_served(server: ServerProcess) -> None:
    """The wrapper changes nothing for a correct body: the bytes of every chunk, on every surface."""
    body = b"5\r\nhello\r\n1;ext=1\r\n,\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    url = f"{server.url}/v1/segments/chunked/fine"
    assert requests.put(url, timeout=5).status_code == 201
    assert (
        send_chunked(server, "POST /v1/segments/chunked/fine HTTP/1.1", body, half_close=False).status == 200
    )
    assert requests.get(url, timeout=5).content == b"hello, world"
    requests.put(f"{server.url}/chunked-bucket", timeout=5)
    assert send_chunked(server, "PUT /chunked-bucket/fine HTTP/1.1", body, half_close=False).status == 200
    assert requests.get(f"{server.url}/chunked-bucket/fine", timeout=5).content == b"hello, world"


def test_a_large_chunk_within_the_bound_is_read_as_usual(server: ServerProcess) -> None:
    """The size line bound is what no request takes (5 GiB); a chunk under it is awaited, then read."""
    url = f"{server.url}/v1/segments/chunked/large"
    assert requests.put(url, timeout=5).status_code == 201
    size = 2 * 1024 * 1024
    body = b"%x\r\n" % size + b"x" * size + b"\r\n0\r\n\r\n"
    answer = send_chunked(server, "POST /v1/segments/chunked/large HTTP/1.1", body, half_close=False)
    assert answer.status == 200, answer
    assert requests.get(url + ":info", timeout=5).json()["length"] == size


@pytest.mark.parametrize("server", [1], ids=["one-process"], indirect=True)
@pytest.mark.parametrize(
    ("path", "then"), [("/v1/segments/chunked/over", ":info"), ("/v1/stream/chunked-over", "?offset=-1")]
)
def test_a_body_over_the_limit_sent_slowly_gets_its_413(server: ServerProcess, path: str, then: str) -> None:
    """The server reads a refused body before answering: a slow sender reads its 413, not a reset.

    The body takes longer than gunicorn's keep-alive timeout to arrive; the
    connection then serves the next request. On one process only: gunicorn's
    reading is what it checks, and it takes seconds.
    """
    create = requests.put(f"{server.url}{path}", headers={"Content-Type": "text/plain"}, timeout=5)
    assert create.status_code == 201
    piece, pieces = b"x" * (1024 * 1024), 9  # the limit is 8 MiB
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(f"{head}Content-Length: {len(piece) * pieces}\r\n\r\n".encode())
        for _ in range(pieces):
            sock.sendall(piece)
            time.sleep(0.7)  # past gunicorn's keep-alive timeout (5 s) in all
        assert _answer(sock).status == 413
        sock.sendall(f"GET {path}{then} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert _answer(sock).status == 200


def _answer(sock: socket.socket) -> Answer:
    """One answer with a Content-Length read from a connection that stays open."""
    received = b""
    deadline = time.monotonic() + ANSWER_WITHIN_S
    while not _complete(received):
        assert time.monotonic() < deadline, f"no answer within {ANSWER_WITHIN_S} s: {received!r}"
        piece = sock.recv(65536)
        assert piece, f"the connection closed: {received!r}"
        received += piece
    head_bytes, _, rest = received.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    return Answer(int(lines[0].split()[1]), {}, rest)
