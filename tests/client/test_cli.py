"""The segstore command against a real server, through ``main([...])`` with captured stdio.

Every test runs against a server of one process and one of two over one
data folder (a request reaching the process that does not serve its
segment's container is forwarded to the one that does).
"""

from __future__ import annotations

import io
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.servers import ServerProcess
from client.cli import _put, main
from client.errors import SegmentNotFound
from client.results import AppendResult
from client.segment_client import SegmentClient
from tests.client.conftest import MAX_APPEND_BYTES
from tests.processes import killed_at_exit

PROCESSES = [pytest.param(1, id="one-process"), pytest.param(2, id="two-processes")]


@pytest.fixture(scope="module", params=PROCESSES)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server of ``request.param`` processes, the module's own (asking for the package's too would
    start that one again at each switch of the parameter)."""
    data_dir = tmp_path_factory.mktemp("cli-server") / "data"
    env = {"SEGSTORE_MAX_APPEND_BYTES": str(MAX_APPEND_BYTES), "SEGSTORE_PROCESSES": str(request.param)}
    with killed_at_exit(ServerProcess(data_dir, env=env)) as running:
        yield running


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_put_cat_ls_info_round_trip(
    server: ServerProcess,
    client: SegmentClient,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    data = os.urandom(3 * MAX_APPEND_BYTES + 123)
    _stdin(monkeypatch, data)
    endpoint = ["--endpoint", server.url]
    assert main([*endpoint, "put", name, "--piece-bytes", str(MAX_APPEND_BYTES)]) == 0
    # A piece over the server's max_append_bytes would have failed with 413.
    assert client.info(name).length == len(data)
    capsysbinary.readouterr()

    assert main([*endpoint, "cat", name]) == 0
    assert capsysbinary.readouterr().out == data

    _stdin(monkeypatch, b"tail")
    assert main([*endpoint, "put", name]) == 0
    assert client.read(name, len(data)).data == b"tail"
    capsysbinary.readouterr()

    prefix = name.rsplit("/", 1)[0] + "/"
    assert main([*endpoint, "ls", prefix]) == 0
    assert capsysbinary.readouterr().out.decode() == f"{name}\t{len(data) + 4}\topen\n"

    assert main([*endpoint, "info", name]) == 0
    info = json.loads(capsysbinary.readouterr().out)
    assert (info["name"], info["length"], info["sealed"]) == (name, len(data) + 4, False)


def test_endpoint_from_environment_and_errors_exit_1(
    server: ServerProcess,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    monkeypatch.setenv("SEGSTORE_ENDPOINT", server.url)
    assert main(["info", name]) == 1
    assert b"SegmentNotFound" in capsysbinary.readouterr().err


def test_tail_follow_prints_new_bytes_until_sealed(
    server: ServerProcess,
    client: SegmentClient,
    name: str,
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client.create(name)
    client.append(name, b"old-old-old|")
    reading = threading.Event()
    read = SegmentClient.read

    def first_read_seen(self: SegmentClient, *args: Any, **kwargs: Any) -> Any:
        reading.set()
        return read(self, *args, **kwargs)

    monkeypatch.setattr(SegmentClient, "read", first_read_seen)

    def later() -> None:  # once the command knows where the last 4 bytes start, however slow its start
        assert reading.wait(30)
        client.append(name, b"new|")
        client.seal(name)

    writer = threading.Thread(target=later)
    writer.start()
    assert main(["--endpoint", server.url, "tail", "-f", "-c", "4", name]) == 0
    writer.join()
    assert capsysbinary.readouterr().out == b"old|new|"


class _LostAnswerClient(SegmentClient):
    """Applies each append, then resends it as if the first answer had been lost."""

    def append(self, name: str, data: bytes, **kwargs: Any) -> AppendResult:
        super().append(name, data, **kwargs)
        return super().append(name, data, **kwargs)


def test_put_confirms_a_piece_whose_answer_was_lost(server: ServerProcess, name: str) -> None:
    data = b"0123456789" * 10
    with _LostAnswerClient(server.url) as lossy:
        _put(lossy, name, io.BytesIO(data), piece_bytes=30)
        assert lossy.read(name).data == data


def test_create_seal_truncate_rm(
    server: ServerProcess, client: SegmentClient, name: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    endpoint = ["--endpoint", server.url]
    assert main([*endpoint, "create", name, "--rollover-bytes", "1048576"]) == 0
    assert json.loads(capsysbinary.readouterr().out)["length"] == 0
    client.append(name, b"0123456789")
    assert main([*endpoint, "truncate", name, "4"]) == 0
    assert json.loads(capsysbinary.readouterr().out)["start_offset"] == 4
    assert main([*endpoint, "seal", name]) == 0
    assert json.loads(capsysbinary.readouterr().out)["sealed"] is True
    assert client.info(name).sealed
    assert main([*endpoint, "rm", name]) == 0
    capsysbinary.readouterr()
    assert main([*endpoint, "info", name]) == 1
    assert capsysbinary.readouterr().err.decode().startswith("segstore: ")


def test_an_unreachable_server_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--endpoint", "http://127.0.0.1:9", "ls"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach http://127.0.0.1:9" in err
    assert "Traceback" not in err


def test_health_and_cluster_say_how_the_node_is_laid_out(
    server: ServerProcess, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """One process serves every container and is no cluster member; of two, each is a member serving
    its share: health lists the answering one's, cluster all members."""
    assert main(["--endpoint", server.url, "health"]) == 0
    lines = capsysbinary.readouterr().out.decode().splitlines()
    if server.processes == 1:
        assert lines == [f"container {c}\trunning" for c in range(4)] + ["ok"]
        assert main(["--endpoint", server.url, "cluster"]) == 0
        assert capsysbinary.readouterr().out.decode() == "a single node with 4 containers\n"
        return
    assert lines[-1] == "ok" and lines[:-1]
    assert all(line in {f"container {c}\trunning" for c in range(4)} for line in lines[:-1])
    assert main(["--endpoint", server.url, "cluster"]) == 0
    lines = capsysbinary.readouterr().out.decode().splitlines()
    assert lines[0] in {"answered by node p0", "answered by node p1"}
    assert [line.partition("\t")[0] for line in lines[1:3]] == ["node p0", "node p1"]
    owners = dict(line.split("\t") for line in lines[3:])
    assert list(owners) == [f"container {c}" for c in range(4)]
    assert sorted(owners.values()) == ["p0", "p0", "p1", "p1"]  # their counts differ by at most one


def test_attributes_and_writers(
    server: ServerProcess, client: SegmentClient, name: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    writer, unset = uuid.uuid4(), uuid.uuid4()
    client.create(name)
    client.append(name, b"x", writer_id=writer, event_number=7)
    endpoint = ["--endpoint", server.url]
    assert main([*endpoint, "writer", name, str(writer)]) == 0
    assert json.loads(capsysbinary.readouterr().out) == 7
    assert main([*endpoint, "attributes", name, str(writer), str(unset)]) == 0
    assert json.loads(capsysbinary.readouterr().out) == {str(writer): 7, str(unset): None}


def test_transactions_open_append_info_commit_and_abort(
    server: ServerProcess,
    client: SegmentClient,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    client.create(name)
    endpoint = ["--endpoint", server.url]
    assert main([*endpoint, "tx", "open", name]) == 0
    txid = capsysbinary.readouterr().out.decode().strip()
    _stdin(monkeypatch, b"all at once")
    assert main([*endpoint, "tx", "append", name, txid]) == 0
    assert json.loads(capsysbinary.readouterr().out) == {"offset": 0, "length": 11}
    assert main([*endpoint, "tx", "info", name, txid]) == 0
    assert json.loads(capsysbinary.readouterr().out)["parent"] == name
    assert client.info(name).length == 0  # not readable through the parent before the commit
    assert main([*endpoint, "tx", "commit", name, txid]) == 0
    assert json.loads(capsysbinary.readouterr().out) == {"offset": 0, "length": 11}
    assert client.read(name).data == b"all at once"
    assert main([*endpoint, "tx", "open", name]) == 0
    dropped = capsysbinary.readouterr().out.decode().strip()
    assert main([*endpoint, "tx", "abort", name, dropped]) == 0
    assert main([*endpoint, "tx", "info", name, dropped]) == 1
    assert b"SegmentNotFound" in capsysbinary.readouterr().err


@pytest.fixture
def run(server: ServerProcess, capsysbinary: pytest.CaptureFixture[bytes]) -> Callable[..., str]:
    """The command against ``server``: it must succeed; what it printed."""

    def run(*args: str) -> str:
        assert main(["--endpoint", server.url, *args]) == 0
        return capsysbinary.readouterr().out.decode()

    return run


@pytest.fixture
def stream(run: Callable[..., str]) -> str:
    """A fresh stream name of scope ``cli``, which exists."""
    run("scope", "create", "cli")
    return f"cli/{uuid.uuid4().hex[:8]}"


def test_scope_and_stream_verbs(
    server: ServerProcess,
    client: SegmentClient,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
    run: Callable[..., str],
    stream: str,
) -> None:
    assert "cli\n" in run("scope", "ls")
    policy = ["--policy", "events_per_s", "--target", "9"]
    made = json.loads(run("stream", "create", stream, "--segments", "2", *policy))
    assert made["config"]["scaling"]["type"] == "events_per_s" and made["epoch"] == 0
    assert stream.split("/")[1] + "\n" in run("stream", "ls", "cli")
    assert json.loads(run("stream", "info", stream))["config"]["segments"] == 2
    _stdin(monkeypatch, b"one\ntwo\nthree\n")
    run("stream", "write", stream, "--key", "k")
    assert run("stream", "scale", stream, "--seal", "0,1", "--ranges", "0:1").startswith("epoch 1\n2\t")
    events = b"".join(client.read(f"{stream}/{i}").data for i in (0, 1))
    assert events.count(b"\x00\x00\x00") == 3  # three framed events, all with one key
    assert run("stream", "segments", stream, "--epoch", "0").startswith("epoch 0\n0\t")
    assert run("stream", "successors", stream, "1").endswith("\tafter 0,1\n")
    cut = run("stream", "cut", stream)
    assert json.loads(cut) == {"epoch": 1, "positions": {"2": 0}}
    assert json.loads(run("stream", "truncate", stream, cut))["positions"] == {"2": 0}
    for i in (0, 1):  # wholly before the cut: deleted
        with pytest.raises(SegmentNotFound):
            client.info(f"{stream}/{i}")
    assert json.loads(run("stream", "seal", stream))["state"] == "sealed"
    run("stream", "rm", stream)
    assert main(["--endpoint", server.url, "stream", "info", stream]) == 1
    assert b"SegmentNotFound" in capsysbinary.readouterr().err
    with pytest.raises(SystemExit):  # argparse: a usage error
        main(["--endpoint", server.url, "stream", "info", "no-slash"])


def test_group_verbs(
    server: ServerProcess,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
    run: Callable[..., str],
    stream: str,
) -> None:
    group = f"cli/g{uuid.uuid4().hex[:8]}"
    run("stream", "create", stream, "--segments", "2")
    _stdin(monkeypatch, b"one\ntwo\nthree\n")
    run("stream", "write", stream)
    made = json.loads(run("group", "create", group, "--streams", stream.split("/")[1], "--lease", "5"))
    assert made["lease_s"] == 5.0 and len(made["unassigned"]) == 2
    read = run("group", "read", group, "--reader", "r", "--wait", "0.2")
    assert sorted(read.split()) == ["one", "three", "two"]
    assert json.loads(run("group", "info", group))["unassigned"] != {}  # r left: its segments wait
    run("group", "reset", group, "head")
    assert len(run("group", "read", group, "--reader", "r", "--count", "2").split()) == 2
    run("group", "rm", group)
    assert main(["--endpoint", server.url, "group", "info", group]) == 1
    assert b"SegmentNotFound" in capsysbinary.readouterr().err
