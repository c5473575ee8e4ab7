"""The Durable Streams protocol over HTTP (in-process app): what the conformance suite checks
and what it cannot see (segments, attributes, sharing, deletion by the engine)."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient

from app.streams.names import STREAM_DATA_PREFIX, STREAM_META_PREFIX, stream_meta_segment
from app.streams.producers import producer_keys
from app.streams.store import StreamStore
from engine import SegmentStore, Settings
from tests.polling import wait_until
from tests.streams.conftest import close_app, open_app

URL = "/v1/stream/"


def put(client: FlaskClient, name: str, body: bytes | str = b"", **headers: str) -> Any:
    return client.put(URL + name, data=body, headers=_h(headers))


def post(client: FlaskClient, name: str, body: bytes | str = b"", **headers: str) -> Any:
    return client.post(URL + name, data=body, headers=_h(headers))


def _h(headers: dict[str, str]) -> dict[str, str]:
    """Keyword arguments as headers (``Stream_TTL`` -> ``Stream-TTL``), text/plain by default."""
    return {"Content-Type": "text/plain", **{k.replace("_", "-"): v for k, v in headers.items()}}


def data_segment(streams: StreamStore, name: str) -> str:
    return streams.live(name).config.data_segment


def test_a_stream_name_with_an_emoji_part(client: FlaskClient) -> None:
    """Stream names are UTF-8; a 4-byte character is one like any other, forks and the append shortcut too."""
    name = quote("sensors/🌡", safe="/")
    created = put(client, name, b"a")
    assert created.status_code == 201 and created.headers["Location"].endswith("/v1/stream/" + name)
    assert post(client, name, b"b").status_code == 204  # a Content-Length: the WSGI shortcut
    assert post(client, name, b"c", Stream_Seq="1").status_code == 204  # through Flask
    assert client.get(URL + name + "?offset=-1").data == b"abc"
    assert put(client, "fork-" + name, Stream_Forked_From="/v1/stream/" + name).status_code == 201
    assert client.get(URL + "fork-" + name + "?offset=-1").data == b"abc"


def test_create_is_idempotent_and_conflicts_on_another_configuration(client: FlaskClient) -> None:
    first = put(client, "a")
    assert first.status_code == 201
    assert first.headers["Location"].endswith("/v1/stream/a")
    assert first.headers["Stream-Next-Offset"] == "0000000000000000_0000000000000000"
    assert put(client, "a").status_code == 200
    assert put(client, "a", Content_Type="application/json").status_code == 409
    assert put(client, "a", Stream_TTL="60").status_code == 409


def test_appends_read_back_with_offsets_etag_and_caching(client: FlaskClient) -> None:
    put(client, "s", "hello")
    r1 = post(client, "s", " world")
    assert r1.status_code == 204
    offset = r1.headers["Stream-Next-Offset"]
    r2 = post(client, "s", "!")
    assert r2.headers["Stream-Next-Offset"] > offset
    whole = client.get(URL + "s?offset=-1")
    assert whole.data == b"hello world!"
    assert whole.headers["Stream-Up-To-Date"] == "true"
    assert whole.headers["Cache-Control"] == "no-store"
    rest = client.get(URL + f"s?offset={offset}")
    assert rest.data == b"!"
    again = client.get(URL + "s?offset=-1", headers={"If-None-Match": whole.headers["ETag"]})
    assert again.status_code == 304
    assert client.get(URL + "s?offset=-1&offset=-1").status_code == 400
    assert client.get(URL + "s?offset=1,2").status_code == 400


def test_content_type_must_match_and_bodies_must_not_be_empty(client: FlaskClient) -> None:
    put(client, "ct", Content_Type="text/plain; charset=utf-8")
    assert post(client, "ct", "x", Content_Type="TEXT/PLAIN").status_code == 204
    assert post(client, "ct", "x", Content_Type="application/json").status_code == 409
    assert post(client, "ct", "").status_code == 400
    assert post(client, "missing", "x").status_code == 404


def test_json_mode_keeps_message_boundaries(client: FlaskClient, streams: StreamStore) -> None:
    assert put(client, "j", "[]", Content_Type="application/json").status_code == 201
    post(client, "j", '[{"a": 1}, {"b": 2}]', Content_Type="application/json")
    post(client, "j", '"three"', Content_Type="application/json")
    assert client.get(URL + "j?offset=-1").get_json() == [{"a": 1}, {"b": 2}, "three"]
    assert post(client, "j", "[]", Content_Type="application/json").status_code == 400
    assert post(client, "j", "{nope", Content_Type="application/json").status_code == 400
    read = streams.read("j", None)
    assert read.messages == (b'{"a":1},{"b":2}', b'"three"')


def test_json_nested_too_deeply_is_400_and_stores_nothing(client: FlaskClient) -> None:
    assert put(client, "deep", "[]", Content_Type="application/json").status_code == 201
    deep = "[" * 20_000 + "]" * 20_000  # far past Python's recursion limit, within the body limit
    for answer in (
        post(client, "deep", deep, Content_Type="application/json"),
        put(client, "deep-create", deep, Content_Type="application/json"),
    ):
        assert answer.status_code == 400, answer.data
        assert answer.get_json()["code"] == "InvalidArgument"
    assert client.get(URL + "deep?offset=-1").get_json() == []


def test_producer_state_lives_in_attributes_of_the_data_segment(
    client: FlaskClient, store: SegmentStore, streams: StreamStore
) -> None:
    put(client, "p")

    def send(epoch: int, seq: int, body: str = "m") -> Any:
        return post(client, "p", body, Producer_Id="w", Producer_Epoch=str(epoch), Producer_Seq=str(seq))

    assert send(0, 0).status_code == 200
    assert send(0, 1).status_code == 200
    dup = send(0, 0)
    assert dup.status_code == 204 and dup.headers["Producer-Seq"] == "1"
    gap = send(0, 5)
    assert gap.status_code == 409
    assert (gap.headers["Producer-Expected-Seq"], gap.headers["Producer-Received-Seq"]) == ("2", "5")
    assert send(1, 3).status_code == 400
    assert send(1, 0).status_code == 200
    stale = send(0, 2)
    assert stale.status_code == 403 and stale.headers["Producer-Epoch"] == "1"
    assert client.get(URL + "p?offset=-1").data == b"mmm"
    epoch_key, seq_key = producer_keys("w")
    assert store.get_attributes(data_segment(streams, "p"), [epoch_key, seq_key]) == {
        epoch_key: 1,
        seq_key: 0,
    }
    assert post(client, "p", "m", Producer_Id="w").status_code == 400
    assert send(2**53, 0).status_code == 400


def test_concurrent_producers_never_duplicate(client: FlaskClient) -> None:
    put(client, "race")
    statuses: list[int] = []

    def producer(pid: str) -> None:
        for seq in range(10):
            for _ in range(2):  # every append sent twice, as a retry would
                r = post(
                    client, "race", f"{pid}{seq};", Producer_Id=pid, Producer_Epoch="0", Producer_Seq=str(seq)
                )
                statuses.append(r.status_code)

    threads = [threading.Thread(target=producer, args=(p,)) for p in "ABCD"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parts = client.get(URL + "race?offset=-1").data.decode().rstrip(";").split(";")
    assert sorted(parts) == sorted(f"{p}{s}" for p in "ABCD" for s in range(10))
    assert statuses.count(200) == 40 and statuses.count(204) == 40


def test_stream_seq_must_grow(client: FlaskClient) -> None:
    put(client, "q")
    assert post(client, "q", "a", Stream_Seq="09").status_code == 204
    assert post(client, "q", "b", Stream_Seq="10").status_code == 204
    assert post(client, "q", "c", Stream_Seq="10").status_code == 409
    assert post(client, "q", "c", Stream_Seq="2").status_code == 204  # "2" > "10" as strings


def test_closing_seals_the_data_segment(
    client: FlaskClient, store: SegmentStore, streams: StreamStore
) -> None:
    put(client, "c", "x")
    closed = post(client, "c", "y", Stream_Closed="true")
    assert closed.status_code == 204 and closed.headers["Stream-Closed"] == "true"
    assert store.info(data_segment(streams, "c")).sealed
    refused = post(client, "c", "z")
    assert refused.status_code == 409
    assert refused.headers["Stream-Closed"] == "true"
    assert refused.headers["Stream-Next-Offset"] == closed.headers["Stream-Next-Offset"]
    assert post(client, "c", Stream_Closed="true").status_code == 204
    tail = client.get(URL + "c?offset=-1")
    assert tail.data == b"xy" and tail.headers["Stream-Closed"] == "true"
    poll = client.get(URL + f"c?offset={tail.headers['Stream-Next-Offset']}&live=long-poll")
    assert poll.status_code == 204 and poll.headers["Stream-Closed"] == "true"


def test_long_poll_times_out_with_a_cursor_and_wakes_on_append(client: FlaskClient, app: Any) -> None:
    tail = put(client, "lp").headers["Stream-Next-Offset"]
    started = time.monotonic()
    timeout = client.get(URL + f"lp?offset={tail}&live=long-poll")
    assert timeout.status_code == 204
    assert 0.25 < time.monotonic() - started < 3
    assert timeout.headers["Stream-Cursor"].isdigit()
    assert timeout.headers["Stream-Up-To-Date"] == "true"
    other = app.test_client()
    timer = threading.Timer(0.1, lambda: post(other, "lp", "late"))
    timer.start()
    woken = client.get(URL + f"lp?offset={tail}&live=long-poll")
    timer.join()
    assert woken.status_code == 200 and woken.data == b"late"


def _sse(client: FlaskClient, path: str, events: int) -> tuple[Any, list[tuple[str, str]]]:
    response = client.get(path, buffered=False)
    out: list[tuple[str, str]] = []
    for chunk in response.response:
        for block in chunk.decode().split("\n\n"):
            if block.strip():
                lines = block.split("\n")
                kind = lines[0].removeprefix("event: ")
                out.append((kind, "\n".join(line.removeprefix("data:") for line in lines[1:])))
        if len(out) >= events:
            break
    response.close()
    return response, out


def test_sse_binary_is_base64_and_text_keeps_lines(client: FlaskClient) -> None:
    put(client, "bin", b"\x00\xff", Content_Type="application/octet-stream")
    response, events = _sse(client, URL + "bin?offset=-1&live=sse", 2)
    assert response.headers["Content-Type"] == "text/event-stream"
    assert response.headers["Stream-SSE-Data-Encoding"] == "base64"
    assert events[0] == ("data", base64.b64encode(b"\x00\xff").decode())
    control = json.loads(events[1][1])
    assert control["upToDate"] is True and "streamCursor" in control
    put(client, "txt", "one\r\ntwo\rthree", Content_Type="text/plain")
    _, events = _sse(client, URL + "txt?offset=-1&live=sse", 1)
    assert events[0] == ("data", "one\ntwo\nthree")
    post(client, "txt", Stream_Closed="true")
    _, events = _sse(client, URL + "txt?offset=-1&live=sse", 3)
    assert json.loads(events[-1][1])["streamClosed"] is True


def test_a_fork_shares_its_sources_flushed_bytes_and_copies_only_the_unflushed(settings: Settings) -> None:
    # Tier 2 flushes only when told to here: which bytes a fork shares must not depend on timing.
    app = open_app(replace(settings, flush_threshold_ms=3_600_000))
    try:
        _fork_shares_flushed_bytes(app.test_client(), app.extensions["segstore"], app.extensions["streams"])
    finally:
        close_app(app)


def _fork_shares_flushed_bytes(client: FlaskClient, store: SegmentStore, streams: StreamStore) -> None:
    put(client, "src", "AB")
    middle = post(client, "src", "CD").headers["Stream-Next-Offset"]
    store.flush()
    post(client, "src", "EF")
    fork = put(client, "fork", Stream_Forked_From="/v1/stream/src", Stream_Fork_Offset=middle)
    assert fork.status_code == 201 and fork.headers["Stream-Next-Offset"] == middle
    source, copy = store.info(data_segment(streams, "src")), store.info(data_segment(streams, "fork"))
    assert copy.length == copy.storage_length == source.storage_length  # its Tier 2 chunks, named
    tip = put(client, "tip", Stream_Forked_From="src")
    assert tip.headers["Stream-Next-Offset"] == client.head(URL + "src").headers["Stream-Next-Offset"]
    tip_segment = store.info(data_segment(streams, "tip"))
    assert tip_segment.storage_length == source.storage_length < tip_segment.length  # "EF" copied
    assert client.get(URL + "tip?offset=-1").data == b"ABCDEF"
    post(client, "fork", "XY")
    assert client.get(URL + "fork?offset=-1").data == b"ABCDXY"
    assert client.get(URL + "src?offset=-1").data == b"ABCDEF"
    sub = put(client, "sub", Stream_Forked_From="src", Stream_Fork_Offset=middle, Stream_Fork_Sub_Offset="1")
    assert sub.status_code == 201
    assert client.get(URL + "sub?offset=-1").data == b"ABCDE"
    too_far = put(
        client, "x", Stream_Forked_From="src", Stream_Fork_Offset=middle, Stream_Fork_Sub_Offset="3"
    )
    assert too_far.status_code == 400


def test_deleted_source_is_soft_deleted_until_its_last_fork_goes(
    client: FlaskClient, store: SegmentStore, streams: StreamStore
) -> None:
    put(client, "s0", "data")
    put(client, "f0", Stream_Forked_From="s0")
    source_segment = data_segment(streams, "s0")
    assert client.delete(URL + "s0").status_code == 204
    assert client.get(URL + "s0").status_code == 410
    assert put(client, "s0").status_code == 409
    with pytest.raises(Exception, match="does not exist"):
        store.info(source_segment)  # the fork holds the chunks it shares; the rest is freed at once
    store.flush()
    assert client.get(URL + "f0?offset=-1").data == b"data"
    assert client.delete(URL + "f0").status_code == 204
    assert client.get(URL + "s0").status_code == 404
    assert store.list(STREAM_META_PREFIX)[0] == store.list(STREAM_DATA_PREFIX)[0] == []


def test_expired_streams_are_deleted_by_the_reaper(client: FlaskClient, store: SegmentStore) -> None:
    put(client, "ttl", "x", Stream_TTL="1")
    put(client, "at", "x", Stream_Expires_At="2000-01-01T00:00:00Z")
    put(client, "kept", "x")
    wait_until(lambda: len(store.list(STREAM_DATA_PREFIX)[0]) <= 1, "the reaper deletes the expired streams")
    assert [i.name.split("/")[2] for i in store.list(STREAM_DATA_PREFIX)[0]] == ["kept"]
    assert client.head(URL + "ttl").status_code == 404


def test_names_outside_segment_names_are_escaped(client: FlaskClient) -> None:
    for name in ["a:b", "100%", "x#y", "../up", "with space", "ünï/cödé"]:
        assert put(client, name, name).status_code == 201, name
        assert client.get(URL + name + "?offset=-1").data == name.encode()


def test_head_and_security_headers(client: FlaskClient) -> None:
    put(client, "h", "x", Stream_TTL="30")
    head = client.head(URL + "h")
    assert head.headers["Stream-TTL"] == "30"
    assert head.headers["Cache-Control"] == "no-store"
    assert head.headers["X-Content-Type-Options"] == "nosniff"
    missing = client.get(URL + "nothing")
    assert missing.status_code == 404
    assert missing.headers["Cross-Origin-Resource-Policy"] == "cross-origin"
    preflight = client.options(URL + "h")
    assert preflight.status_code == 204
    assert "if-none-match" in preflight.headers["Access-Control-Allow-Headers"]


def test_meta_segment_names_the_configuration(client: FlaskClient, store: SegmentStore) -> None:
    put(client, "m", Content_Type="application/json", Stream_TTL="60")
    record = json.loads(store.read(stream_meta_segment("m"), 0).data[4:])
    assert record["t"] == "config"
    assert (record["content_type"], record["ttl_s"]) == ("application/json", 60)
