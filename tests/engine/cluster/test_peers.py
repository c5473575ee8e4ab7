"""The peer protocol's pieces: the cluster's secret, errors across the wire, the service's refusals."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from engine import ContainerNotReady, PeerService, SegmentNotFound, SegmentStore
from engine.cluster.coordinator import Coordinator
from engine.cluster.peers import PeerClient, error_from_json, error_to_json, refuses_connections
from engine.cluster.records import ClusterRecord
from engine.cluster.registers import MemoryRegisters
from engine.naming import CLUSTER_RECORD
from engine.types import SegmentInfo
from tests.engine.conftest import small_settings


class _Host:
    def start_container(self, container: int) -> None:
        pass

    def stop_container(self, container: int) -> None:
        pass

    def failed(self, container: int) -> bool:
        return False


def _coordinator(node: str, registers: MemoryRegisters) -> Coordinator:
    return Coordinator(registers, node_id=node, url=f"http://{node}", container_count=4, host=_Host())


def test_the_first_node_writes_a_secret_and_the_others_learn_it() -> None:
    registers = MemoryRegisters()
    a, b = _coordinator("a", registers), _coordinator("b", registers)
    a.join()
    b.join()
    assert len(a.secret) == 64 and a.secret == b.secret


def test_a_record_written_before_secrets_gets_one_by_compare_and_set() -> None:
    registers = MemoryRegisters()
    old = json.dumps({"containers": 4, "write": "w0"}).encode()  # as nodes without secrets wrote it
    registers.create(CLUSTER_RECORD, old)
    a, b = _coordinator("a", registers), _coordinator("b", registers)
    a.join()
    b.join()
    assert a.secret and a.secret == b.secret
    stored = ClusterRecord.decode(CLUSTER_RECORD, registers.read(CLUSTER_RECORD).data)  # type: ignore[union-attr]
    assert (stored.containers, stored.secret) == (4, a.secret)


def test_an_engine_error_crosses_to_the_caller_as_the_same_exception() -> None:
    info = SegmentInfo("s", 7, 3, 0, 0, False, 1, 1.0, 2.0)
    again = error_from_json(
        json.loads(json.dumps(error_to_json(ContainerNotReady("moving", retry_after_s=2.5))))
    )
    assert type(again) is ContainerNotReady and again.retry_after_s == 2.5 and again.detail == "moving"
    gone = error_from_json(json.loads(json.dumps(error_to_json(SegmentNotFound("no s", segment=info)))))
    assert type(gone) is SegmentNotFound and gone.segment == info


def test_an_unreachable_node_is_a_container_not_ready() -> None:
    class Down:
        def post(self, *args: object) -> tuple[int, dict]:
            raise OSError("connection refused")

    client = PeerClient(Down(), lambda: "secret")
    try:
        client.list("b", "http://b", [1], "", None, 10)
    except ContainerNotReady as exc:
        assert "node b cannot be reached" in exc.detail
    else:
        raise AssertionError("an unreachable node must refuse")


def test_a_single_node_takes_no_peer_calls(tmp_path: Path) -> None:
    store = SegmentStore(small_settings(tmp_path, container_count=2))
    store.start(wait=True)
    try:
        service = PeerService(store)
        assert not service.enabled and not service.admits("") and not service.admits("anything")
        assert service.knows("list") and not service.knows("append")
        status, body = service.answer("list", b"[]")
        assert status == 400 and json.loads(body)["error"] == "InvalidArgument"
    finally:
        store.close()


def test_only_a_refused_connection_says_nothing_listens_at_a_node_url() -> None:
    """A closed port refuses; a listening socket whose process never accepts (a paused node: the
    kernel queues the connection) does not; neither does a name that does not resolve."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert refuses_connections(f"http://127.0.0.1:{port}")
    with socket.socket() as paused:
        paused.bind(("127.0.0.1", 0))
        paused.listen(8)
        assert not refuses_connections(f"http://127.0.0.1:{paused.getsockname()[1]}")
    assert not refuses_connections("http://no-such-host.invalid:8080", timeout_s=0.2)
    assert not refuses_connections("not a url")
