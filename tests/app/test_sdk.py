"""A Python SDK generated from openapi.yaml drives a real server.

The client is generated offline by openapi-python-client (a test
dependency) into a temporary folder; its formatter hooks are switched off so
that generation needs nothing but the generator itself.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from types import ModuleType

import pytest

from bench.servers import ServerProcess
from tests.app.openapi_check import SPEC_FILE
from tests.processes import killed_at_exit

PACKAGE = "segstore_sdk"
NAME = "scope/stream/0"
WRITER = str(uuid.uuid4())


@pytest.fixture(scope="module")
def sdk_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModuleType]]:
    """Generate the SDK and import the modules the test uses, by short name."""
    root = tmp_path_factory.mktemp("sdk")
    config = root / "generator.yaml"
    config.write_text("post_hooks: []\n", encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "openapi_python_client",
        "generate",
        "--path",
        str(SPEC_FILE),
        "--output-path",
        str(root / PACKAGE),
        "--meta",
        "none",
        "--config",
        str(config),
        "--fail-on-warning",
    ]
    generated = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    sys.path.insert(0, str(root))
    try:
        yield {
            name.rsplit(".", 1)[-1]: importlib.import_module(f"{PACKAGE}.{name}")
            for name in [
                "client",
                "types",
                "models",
                "api.segments.create_segment",
                "api.segments.seal_segment",
                "api.data.append_segment",
                "api.data.read_segment",
                "api.data.get_writer_event_number",
                "api.transactions.open_transaction",
                "api.transactions.append_transaction",
                "api.transactions.get_transaction",
                "api.transactions.commit_transaction",
                "api.transactions.abort_transaction",
                "api.transactions.merge_segment",
                "api.streams.create_stream",
                "api.streams.append_stream",
                "api.streams.head_stream",
                "api.streams.read_stream",
            ]
        }
    finally:
        sys.path.remove(str(root))
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[module]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with killed_at_exit(ServerProcess(tmp_path / "data")) as running:
        yield running


@pytest.mark.slow
def test_generated_sdk_creates_appends_reads_and_seals(
    sdk_modules: dict[str, ModuleType], server: ServerProcess
) -> None:
    sdk = sdk_modules
    models = sdk["models"]
    with sdk["client"].Client(base_url=server.url, raise_on_unexpected_status=True) as client:
        created = sdk["create_segment"].sync_detailed(NAME, client=client)
        assert created.status_code == 201
        assert isinstance(created.parsed, models.SegmentInfo)
        assert (created.parsed.name, created.parsed.length) == (NAME, 0)

        def append(event_number: int, data: bytes) -> object:
            return sdk["append_segment"].sync(
                NAME,
                client=client,
                body=sdk["types"].File(payload=BytesIO(data)),
                writer_id=WRITER,
                event_number=event_number,
            )

        appended = append(1, b"hello world")
        assert isinstance(appended, models.Appended)
        assert (appended.offset, appended.length) == (0, 11)
        duplicate = append(1, b"hello world")
        assert isinstance(duplicate, models.DuplicateAppend)
        assert (duplicate.duplicate, duplicate.event_number, duplicate.length) == (True, 1, 11)
        writer = sdk["get_writer_event_number"].sync(NAME, WRITER, client=client)
        assert isinstance(writer, models.WriterState)
        assert writer.event_number == 1

        ranged = sdk["read_segment"].sync_detailed(NAME, client=client, range_="bytes=6-10")
        assert ranged.status_code == 206
        assert ranged.parsed.payload.read() == b"world"
        assert ranged.headers["Segment-Next-Offset"] == "11"
        head = sdk["read_segment"].sync(NAME, client=client, offset=0, length=5)
        assert head.payload.read() == b"hello"

        sealed = sdk["seal_segment"].sync(NAME, client=client)
        assert isinstance(sealed, models.SegmentInfo)
        assert (sealed.sealed, sealed.length, sealed.event_count) == (True, 11, 1)
        refused = append(2, b"late")
        assert isinstance(refused, models.Problem)
        assert (refused.status, refused.code) == (409, models.ProblemCode.SEGMENTSEALED)


@pytest.mark.slow
def test_generated_sdk_commits_aborts_and_merges(
    sdk_modules: dict[str, ModuleType], server: ServerProcess
) -> None:
    sdk = sdk_modules
    models = sdk["models"]
    with sdk["client"].Client(base_url=server.url, raise_on_unexpected_status=True) as client:
        sdk["create_segment"].sync(NAME, client=client)

        def open_with(data: bytes) -> uuid.UUID:
            opened = sdk["open_transaction"].sync_detailed(NAME, client=client)
            assert opened.status_code == 201
            txid = opened.parsed.id
            body = sdk["types"].File(payload=BytesIO(data))
            appended = sdk["append_transaction"].sync(NAME, txid, client=client, body=body)
            assert isinstance(appended, models.Appended)
            return txid

        kept, dropped = open_with(b"kept"), open_with(b"dropped")
        info = sdk["get_transaction"].sync(NAME, kept, client=client)
        assert isinstance(info, models.TransactionInfo)
        assert (info.id, info.parent, info.length) == (kept, NAME, 4)
        assert sdk["abort_transaction"].sync_detailed(NAME, dropped, client=client).status_code == 204
        committed = sdk["commit_transaction"].sync(NAME, kept, client=client)
        assert isinstance(committed, models.Merged)
        assert (committed.offset, committed.length) == (0, 4)
        gone = sdk["commit_transaction"].sync(NAME, dropped, client=client)
        assert isinstance(gone, models.Problem)
        assert (gone.status, gone.code) == (404, models.ProblemCode.SEGMENTNOTFOUND)

        source = "scope/stream/1"
        sdk["create_segment"].sync(source, client=client)
        sdk["append_segment"].sync(source, client=client, body=sdk["types"].File(payload=BytesIO(b"more")))
        request = models.MergeRequest(source=source)
        unsealed = sdk["merge_segment"].sync(NAME, client=client, body=request)
        assert isinstance(unsealed, models.Problem)
        assert unsealed.code == models.ProblemCode.SEGMENTNOTSEALED
        sdk["seal_segment"].sync(source, client=client)
        merged = sdk["merge_segment"].sync(NAME, client=client, body=request)
        assert isinstance(merged, models.Merged)
        assert (merged.offset, merged.length) == (4, 8)
        read = sdk["read_segment"].sync(NAME, client=client)
        assert read.payload.read() == b"keptmore"


@pytest.mark.slow
def test_generated_sdk_creates_a_json_stream_and_appends_json(
    sdk_modules: dict[str, ModuleType], server: ServerProcess
) -> None:
    sdk = sdk_modules
    models = sdk["models"]
    stream = "chat/room1"
    with sdk["client"].Client(base_url=server.url, raise_on_unexpected_status=True) as client:

        def append(body: object, **headers: object) -> object:
            return sdk["append_stream"].sync_detailed(stream, client=client, body=body, **headers)

        created = sdk["create_stream"].sync_detailed(
            stream, client=client, body=[{"from": "ann", "text": "hi"}], stream_ttl=3600
        )
        assert created.status_code == 201
        assert created.headers["Content-Type"] == "application/json"
        assert created.headers["Location"].endswith("/v1/stream/chat/room1")
        again = sdk["create_stream"].sync_detailed(stream, client=client, stream_ttl=3600)
        assert again.status_code == 200
        assert again.headers["Stream-Next-Offset"] == created.headers["Stream-Next-Offset"]

        bob = {"producer_id": "bob", "producer_epoch": 0, "producer_seq": 0}
        produced = append({"from": "bob", "text": "hello"}, **bob)
        assert produced.status_code == 200
        assert (produced.headers["Producer-Epoch"], produced.headers["Producer-Seq"]) == ("0", "0")
        duplicate = append({"from": "bob", "text": "hello"}, **bob)
        assert duplicate.status_code == 204
        batch = append([1, "two", None], stream_seq="0001")
        assert batch.status_code == 204
        tail = batch.headers["Stream-Next-Offset"]

        head = sdk["head_stream"].sync_detailed(stream, client=client)
        assert (head.status_code, head.headers["Stream-Next-Offset"]) == (200, tail)
        assert head.headers["Stream-TTL"] == "3600"
        read = sdk["read_stream"].sync_detailed(stream, client=client, offset="-1")
        assert read.status_code == 200
        assert json.loads(read.content) == [
            {"from": "ann", "text": "hi"},
            {"from": "bob", "text": "hello"},
            1,
            "two",
            None,
        ]
        assert (read.headers["Stream-Next-Offset"], read.headers["Stream-Up-To-Date"]) == (tail, "true")

        closed = sdk["append_stream"].sync_detailed(stream, client=client, stream_closed="true")
        assert (closed.status_code, closed.headers["Stream-Closed"]) == (204, "true")
        late = append({"from": "cy", "text": "too late"})
        assert late.status_code == 409
        assert isinstance(late.parsed, models.Problem)
        assert late.parsed.code == models.ProblemCode.STREAMCLOSED
        missing = sdk["read_stream"].sync_detailed("chat/nowhere", client=client, offset="-1")
        assert isinstance(missing.parsed, models.Problem)
        assert missing.parsed.code == models.ProblemCode.SEGMENTNOTFOUND
