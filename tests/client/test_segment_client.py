"""SegmentClient against a real server, and its retries against a scripted stub server."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from bench.servers import ServerProcess, free_port
from client import errors
from client.segment_client import SegmentClient, segment_path
from tests.client.conftest import MAX_APPEND_BYTES


def test_create_append_read_info_seal(client: SegmentClient, name: str) -> None:
    created = client.create(name)
    assert (created.name, created.length, created.sealed) == (name, 0, False)
    first = client.append(name, b"hello ")
    second = client.append(name, b"world", expected_offset=6)
    assert (first.offset, first.length, first.duplicate) == (0, 6, False)
    assert (second.offset, second.length) == (6, 11)
    read = client.read(name, 0)
    assert (read.data, read.next_offset, read.sealed, read.length) == (b"hello world", 11, False, 11)
    assert client.read(name, 6, 3).data == b"wor"
    assert client.info(name).length == 11
    assert client.seal(name).sealed is True
    at_end = client.read(name, 11, wait_s=5)
    assert (at_end.data, at_end.next_offset, at_end.at_sealed_end) == (b"", 11, True)


def test_truncate_delete_and_tail_wait(client: SegmentClient, name: str) -> None:
    client.create(name)
    client.append(name, b"0123456789")
    assert client.truncate(name, 4).start_offset == 4
    assert client.read(name).data == b"456789"
    started = time.monotonic()
    empty = client.read(name, 10, wait_s=0.3)
    assert (empty.data, empty.next_offset) == (b"", 10)
    assert time.monotonic() - started >= 0.25
    client.delete(name)
    with pytest.raises(errors.SegmentNotFound):
        client.info(name)


def test_names_with_reserved_characters_round_trip(client: SegmentClient) -> None:
    name = f"scope {uuid.uuid4().hex[:6]}/strëam+&=/0"
    assert segment_path(name).startswith("/v1/segments/scope%20")
    assert "/str%C3%ABam%2B%26%3D/0" in segment_path(name)
    client.create(name)
    client.append(name, b"x")
    assert client.info(name).name == name
    assert [info.name for info in client.list(name)] == [name]


def test_list_iterates_every_page_in_name_order(client: SegmentClient) -> None:
    prefix = f"list-{uuid.uuid4().hex[:8]}/"
    names = [f"{prefix}{i:02d}" for i in range(7)]
    for segment in reversed(names):
        client.create(segment)
    assert [info.name for info in client.list(prefix, page_size=3)] == names


def test_writer_event_numbers_deduplicate(client: SegmentClient, name: str) -> None:
    writer = uuid.uuid4()
    client.create(name)
    assert client.writer_event_number(name, writer) is None
    client.append(name, b"ab", writer_id=writer, event_number=2, event_count=2)
    again = client.append(name, b"ab", writer_id=writer, event_number=2, event_count=2)
    assert (again.duplicate, again.offset, again.event_number, again.length) == (True, None, 2, 2)
    assert client.writer_event_number(name, writer) == 2
    assert client.info(name).event_count == 2


def test_transactions_commit_abort_and_merge(client: SegmentClient, name: str) -> None:
    client.create(name)
    client.append(name, b"head|")
    committed = client.open_transaction(name)
    client.append_transaction(name, committed, b"tx1|")
    aborted = client.open_transaction(name)
    client.append_transaction(name, aborted, b"never")
    assert client.read(name).data == b"head|"
    assert client.commit_transaction(name, committed).offset == 5
    client.abort_transaction(name, aborted)
    source = name + "-source"
    client.create(source)
    client.append(source, b"merged")
    client.seal(source)
    merged = client.merge(name, source)
    assert (merged.offset, merged.length) == (9, 15)
    assert client.read(name).data == b"head|tx1|merged"
    with pytest.raises(errors.SegmentNotFound):
        client.commit_transaction(name, aborted)


def test_errors_map_to_typed_exceptions(client: SegmentClient, name: str) -> None:
    with pytest.raises(errors.SegmentNotFound) as not_found:
        client.info(name)
    assert (not_found.value.status, not_found.value.code) == (404, "SegmentNotFound")
    client.create(name)
    with pytest.raises(errors.SegmentExists):
        client.create(name)
    client.append(name, b"abc")
    with pytest.raises(errors.ConditionalCheckFailed) as conflict:
        client.append(name, b"x", expected_offset=1)
    assert conflict.value.headers["Segment-Length"] == "3"
    with pytest.raises(errors.PayloadTooLarge):
        client.append(name, b"x" * (MAX_APPEND_BYTES + 1))
    with pytest.raises(errors.OffsetOutOfRange):
        client.read(name, 4)
    with pytest.raises(errors.InvalidName):
        client.create("scope//empty-part")
    with pytest.raises(errors.InvalidArgument):
        client.append(name, b"")
    with pytest.raises(errors.InvalidHeader):
        client.append(name, b"x", writer_id="not-a-uuid", event_number=1)
    client.truncate(name, 2)
    with pytest.raises(errors.SegmentTruncated) as truncated:
        client.read(name, 0)
    assert truncated.value.headers["Segment-Start-Offset"] == "2"
    client.seal(name)
    with pytest.raises(errors.SegmentSealed) as sealed:
        client.append(name, b"x")
    assert isinstance(sealed.value, errors.SegstoreClientError)
    assert sealed.value.headers["Segment-Sealed"] == "true"
    assert "sealed" in sealed.value.detail.lower()


class _Stub(BaseHTTPRequestHandler):
    """Answers each request with the next scripted (status, headers, body); records arrivals and paths.

    A scripted ``Content-Length`` larger than the body cuts the answer short.
    """

    script: list[tuple[int, dict[str, str], bytes]] = []
    arrivals: list[float] = []
    paths: list[str] = []
    close_first: bool = False

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.arrivals.append(time.monotonic())
        self.paths.append(self.path)
        if self.close_first and len(self.arrivals) == 1:
            self.close_connection = True
            self.connection.close()
            return
        status, headers, body = self.script.pop(0)
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[tuple[str, type[_Stub]]]:
    handler = type("Handler", (_Stub,), {"script": [], "arrivals": [], "paths": [], "close_first": False})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


THROTTLED = (
    503,
    {"Retry-After": "1", "Content-Type": "application/problem+json"},
    json.dumps({"status": 503, "code": "Throttled", "detail": "busy"}).encode(),
)
INFO = {
    "name": "a/b",
    "length": 3,
    "start_offset": 0,
    "storage_length": 0,
    "sealed": False,
    "event_count": 0,
    "created": "t",
    "last_modified": "t",
}


def test_retry_after_is_honoured_on_503(stub: tuple[str, type[_Stub]]) -> None:
    url, handler = stub
    handler.script += [THROTTLED, (200, {"Content-Type": "application/json"}, json.dumps(INFO).encode())]
    with SegmentClient(url, retries=3, backoff_s=0.01) as client:
        assert client.info("a/b").length == 3
    assert len(handler.arrivals) == 2
    assert handler.arrivals[1] - handler.arrivals[0] >= 0.95


def test_throttled_after_the_last_retry_is_raised(stub: tuple[str, type[_Stub]]) -> None:
    url, handler = stub
    handler.script += [THROTTLED, THROTTLED]
    handler.script[0] = (503, {}, THROTTLED[2])  # no Retry-After: the backoff alone
    with SegmentClient(url, retries=1, backoff_s=0.01) as client, pytest.raises(errors.Throttled) as raised:
        client.info("a/b")
    assert raised.value.headers["Retry-After"] == "1"
    assert len(handler.arrivals) == 2


def test_connection_error_resends_only_safe_appends(stub: tuple[str, type[_Stub]]) -> None:
    url, handler = stub
    handler.close_first = True
    ok = (200, {"Content-Type": "application/json"}, b'{"offset": 0, "length": 1}')
    handler.script.append(ok)
    with SegmentClient(url, retries=2, backoff_s=0.01) as client:
        with pytest.raises(requests.ConnectionError):
            client.append("a/b", b"x")
        assert len(handler.arrivals) == 1
        handler.arrivals.clear()
        result = client.append("a/b", b"x", writer_id=uuid.uuid4(), event_number=1)
    assert (result.offset, result.length) == (0, 1)
    assert len(handler.arrivals) == 2


def test_an_unknown_outcome_resends_only_safe_appends(stub: tuple[str, type[_Stub]]) -> None:
    url, handler = stub
    unknown = (
        502,
        {"Content-Type": "application/problem+json"},
        json.dumps({"status": 502, "code": "OutcomeUnknown", "detail": "fenced"}).encode(),
    )
    ok = (200, {"Content-Type": "application/json"}, b'{"offset": 0, "length": 1}')
    handler.script += [unknown, unknown, ok]
    with SegmentClient(url, retries=2, backoff_s=0.01) as client:
        with pytest.raises(errors.OutcomeUnknown):
            client.append("a/b", b"x")
        assert len(handler.arrivals) == 1
        result = client.append("a/b", b"x", expected_offset=0)
    assert (result.offset, result.length) == (0, 1)
    assert len(handler.arrivals) == 3


def test_an_endpoint_that_refuses_connections_gives_way_to_the_next(server: ServerProcess, name: str) -> None:
    """A create and a plain append (never resent after a lost answer) go on: nothing was sent."""
    dead = f"http://127.0.0.1:{free_port()}"
    with SegmentClient(f"{dead}, {server.url}/", retries=2, backoff_s=0.01) as client:
        assert client.endpoints == [dead, server.url]
        client.create(name)
        assert client.endpoint == server.url
        assert client.append(name, b"abc").offset == 0
        assert client.read(name).data == b"abc"


def test_an_endpoint_list_without_a_url_is_refused() -> None:
    with pytest.raises(ValueError, match="no endpoint URL"):
        SegmentClient(" , ")


def test_proxies_named_by_the_environment_are_used(
    server: ServerProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment is read once per node, not per request, but still read: a proxy it names is used."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setenv("HTTP_PROXY", dead_proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with SegmentClient(server.url, retries=0) as proxied, pytest.raises(requests.ConnectionError):
        proxied.create(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with SegmentClient(server.url, retries=0) as direct:
        direct.create(name)
        assert direct.append(name, b"x").offset == 0


def _live(*events: tuple[str, int, bytes]) -> bytes:
    """A live stream's body: (event type, id, data) each, with a keep-alive first."""
    body = b": keepalive\n\n"
    for kind, event_id, data in events:
        body += b"event: %s\nid: %d\ndata: %s\n\n" % (kind.encode(), event_id, data)
    return body


def test_follow_opens_the_stream_again_where_it_stopped(stub: tuple[str, type[_Stub]]) -> None:
    """A stream that ends early, cleanly or cut off, is resumed at the last event's id; seal ends it."""
    url, handler = stub
    sse = {"Content-Type": "text/event-stream"}
    cut = _live(("data", 5, base64.b64encode(b"67890")))
    handler.script = [
        (200, sse, _live(("data", 3, base64.b64encode(b"abc")))),  # ends: the server drained
        (200, {**sse, "Content-Length": str(len(cut) + 100)}, cut),  # cut off mid-stream
        (200, sse, _live(("data", 7, base64.b64encode(b"xy")), ("sealed", 7, b'{"length": 7}'))),
    ]
    with SegmentClient(url, retries=2, backoff_s=0.01) as client:
        live = list(client.follow("a/b"))
    assert [(r.data, r.next_offset) for r in live] == [(b"abc", 3), (b"67890", 5), (b"xy", 7)]
    assert handler.paths == ["/v1/segments/a/b", "/v1/segments/a/b?offset=3", "/v1/segments/a/b?offset=5"]


def test_follow_gives_up_once_the_retries_bring_nothing(stub: tuple[str, type[_Stub]]) -> None:
    """Each event delivered starts the count again; streams cut before any event use the retries up."""
    url, handler = stub
    cut = _live(("data", 1, base64.b64encode(b"a")))
    empty = b": keepalive\n\n"
    handler.script = [
        (200, {"Content-Length": str(len(cut) + 1)}, cut),
        (200, {"Content-Length": str(len(empty) + 1)}, empty),
        (200, {"Content-Length": str(len(cut) + 1)}, cut),
    ]
    with SegmentClient(url, retries=1, backoff_s=0.01) as client:
        follow = client.follow("a/b", 0)
        assert next(follow).data == b"a"
        with pytest.raises(requests.ConnectionError, match="broke off"):
            next(follow)
    assert len(handler.paths) == 2


def test_follow_streams_appends_live_and_ends_at_the_seal(client: SegmentClient, name: str) -> None:
    client.create(name)
    client.append(name, b"old")
    got: list[tuple[bytes, int]] = []
    live = client.follow(name, 3)
    reader = threading.Thread(target=lambda: got.extend((r.data, r.next_offset) for r in live))
    reader.start()
    time.sleep(0.2)
    client.append(name, b"new")
    client.append(name, b"er")
    client.seal(name)
    reader.join(10)
    assert not reader.is_alive()
    assert b"".join(data for data, _ in got) == b"newer" and got[-1][1] == 8
    with pytest.raises(errors.SegmentNotFound):
        next(client.follow(name + "-missing"))
