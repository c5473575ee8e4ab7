"""The register contract on memory, in a folder and on S3 (moto): create if absent, replace if unchanged.

moto checks conditions without a lock, so races run on memory, and on a
folder between processes.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from engine.cluster.registers import (
    FolderRegisters,
    MemoryRegisters,
    Register,
    RegisterConflict,
    Registers,
    S3Registers,
)


@pytest.fixture(params=["memory", "folder", pytest.param("s3", marks=pytest.mark.process)])
def registers(request: pytest.FixtureRequest, tmp_path: Path) -> Registers:
    if request.param == "memory":
        return MemoryRegisters()
    if request.param == "folder":
        return FolderRegisters(tmp_path / "registers")
    bucket = request.getfixturevalue("s3_bucket")
    client = request.getfixturevalue("s3_client")
    return S3Registers(bucket, f"cluster-{uuid.uuid4().hex[:8]}", client=client)


def test_create_once_then_conflict(registers: Registers) -> None:
    assert registers.read("a/x") is None
    version = registers.create("a/x", b"one")
    assert registers.read("a/x") == Register(b"one", version)
    with pytest.raises(RegisterConflict):
        registers.create("a/x", b"two")
    assert registers.read("a/x").data == b"one"


def test_replace_only_the_version_read(registers: Registers) -> None:
    first = registers.create("a/x", b"one")
    second = registers.replace("a/x", b"two", first)
    assert second != first
    with pytest.raises(RegisterConflict):
        registers.replace("a/x", b"three", first)  # a stale version loses
    assert registers.read("a/x").data == b"two"
    assert registers.replace("a/x", b"three", second)
    assert registers.read("a/x").data == b"three"


def test_replace_of_a_missing_register_conflicts(registers: Registers) -> None:
    with pytest.raises(RegisterConflict):
        registers.replace("a/none", b"x", '"0123"')
    assert registers.read("a/none") is None


def test_names_under_a_prefix_sorted(registers: Registers) -> None:
    for name in ("leases/00002", "leases/00000", "nodes/b", "nodes/a"):
        registers.create(name, name.encode())
    assert registers.names("leases/") == ["leases/00000", "leases/00002"]
    assert registers.names("nodes/") == ["nodes/a", "nodes/b"]
    assert registers.names("other/") == []


def _race(attempt: Callable[[int], Any], racers: int) -> list[int]:
    """Run ``attempt(i)`` in ``racers`` threads released together; the indexes that did not conflict."""
    start = threading.Barrier(racers)
    won: list[int] = []

    def run(i: int) -> None:
        start.wait()
        try:
            attempt(i)
        except RegisterConflict:
            return
        won.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won


def test_racing_creates_and_replaces_have_one_winner_in_memory() -> None:
    registers = MemoryRegisters()
    won = _race(lambda i: registers.create("lease", f"{i}".encode()), 16)
    assert len(won) == 1 and registers.read("lease").data == f"{won[0]}".encode()
    version = registers.read("lease").version
    won = _race(lambda i: registers.replace("lease", f"r{i}".encode(), version), 16)
    assert len(won) == 1 and registers.read("lease").data == f"r{won[0]}".encode()


def _bump_counter(root: str, rounds: int, start: Any, out: Any) -> None:
    """Add one to the counter register ``rounds`` times by read and compare-and-set."""
    registers = FolderRegisters(Path(root))
    start.wait()
    for _ in range(rounds):
        while True:
            current = registers.read("counter")
            assert current is not None
            try:
                registers.replace("counter", str(int(current.data) + 1).encode(), current.version)
                break
            except RegisterConflict:
                continue
    out.put(True)


def test_racing_replaces_in_processes_lose_no_update_in_a_folder(tmp_path: Path) -> None:
    registers = FolderRegisters(tmp_path)
    registers.create("counter", b"0")
    start, out = multiprocessing.Event(), multiprocessing.Queue()
    args = (str(tmp_path), 40, start, out)
    procs = [multiprocessing.Process(target=_bump_counter, args=args) for _ in range(4)]
    for proc in procs:
        proc.start()
    start.set()
    for _ in procs:
        out.get(timeout=120)
    for proc in procs:
        proc.join(30)
    assert registers.read("counter").data == b"160"
    assert registers.names("") == ["counter"]  # no temporary file is left or listed


def test_racing_creates_and_replaces_have_one_winner_in_a_folder(tmp_path: Path) -> None:
    registers = FolderRegisters(tmp_path)
    won = _race(lambda i: registers.create("leases/00001", f"{i}".encode()), 16)
    assert len(won) == 1 and registers.read("leases/00001").data == f"{won[0]}".encode()
    version = registers.read("leases/00001").version
    won = _race(lambda i: registers.replace("leases/00001", f"r{i}".encode(), version), 16)
    assert len(won) == 1 and registers.read("leases/00001").data == f"r{won[0]}".encode()


class _RetriedAfterLanding:
    """An S3 client whose PutObject lands, then answers 412 as botocore's retry of it would."""

    def __init__(self, client: Any, fail_with_other_bytes: bool = False) -> None:
        self._client = client
        self._other = fail_with_other_bytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **params: Any) -> Any:
        if self._other:
            params = dict(params, Body=b"somebody else")
        params.pop("IfNoneMatch", None)
        self._client.put_object(**params)
        meta = {"HTTPStatusCode": 412, "RetryAttempts": 1}
        raise ClientError({"Error": {"Code": "PreconditionFailed"}, "ResponseMetadata": meta}, "PutObject")


def test_a_retried_write_that_landed_counts_as_won(s3_bucket: str, s3_client: Any) -> None:
    registers = S3Registers(s3_bucket, "retried", client=_RetriedAfterLanding(s3_client))
    version = registers.create("x", b"mine")
    assert registers.read("x") == Register(b"mine", version)


def test_a_retried_write_that_finds_other_bytes_lost(s3_bucket: str, s3_client: Any) -> None:
    client = _RetriedAfterLanding(s3_client, fail_with_other_bytes=True)
    registers = S3Registers(s3_bucket, "retried", client=client)
    with pytest.raises(RegisterConflict):
        registers.create("x", b"mine")
