"""Passing a connection to a sibling process's receiver (app/handoff.py), both ends in one process.

That a node of two processes passes its public port's connections to the
owner of their segment, on real processes, is in tests/test_processes.py.
"""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import handoff


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP connection on loopback: the client's end and the server's."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=10)
        served, _ = listener.accept()
    served.settimeout(10)
    with client, served:
        yield client, served


def test_a_passed_connection_is_the_receivers_and_the_client_sees_nothing(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, served = pair
    hop_address = str(tmp_path / "1-ab.sock")
    receiver = handoff.Receiver.bind(hop_address)
    assert receiver is not None and receiver.address == handoff.address_beside(hop_address)
    adopted: queue.Queue[tuple[socket.socket, object]] = queue.Queue()
    receiver.start(lambda conn, peer: adopted.put((conn, peer)))
    try:
        client.sendall(b"first")
        assert served.recv(5) == b"first"
        assert handoff.send(hop_address, served)
        served.close()  # the sender's descriptor only: the connection is the receiver's now
        conn, peer = adopted.get(timeout=10)
        with conn:
            assert peer == client.getsockname()
            client.sendall(b"second")
            assert conn.recv(6) == b"second"
            conn.sendall(b"answer")
            assert client.recv(6) == b"answer"
    finally:
        receiver.close()
    assert not Path(receiver.address).exists()


def test_a_connection_nobody_takes_stays_with_its_process(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, served = pair
    assert not handoff.send(str(tmp_path / "2-gone.sock"), served)  # no receiver there
    receiver = handoff.Receiver.bind(str(tmp_path / "3-cd.sock"))
    assert receiver is not None
    receiver.close()
    assert not handoff.send(str(tmp_path / "3-cd.sock"), served)  # a receiver closed takes nothing
    client.sendall(b"still")
    assert served.recv(5) == b"still"


def test_a_suggestion_is_taken_once() -> None:
    handoff.clear()
    assert handoff.suggested() is None
    handoff.suggest("/run/x.sock")
    assert handoff.suggested() == "/run/x.sock"
    assert handoff.suggested() is None


def test_a_receiver_behind_leaves_the_connection_with_its_sender_after_a_short_wait(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    _, served = pair
    hop_address = str(tmp_path / "4-ef.sock")
    receiver = handoff.Receiver.bind(hop_address)  # bound, not started: nothing takes the passes
    assert receiver is not None
    try:
        passed = 0
        began = time.monotonic()
        while handoff.send(hop_address, served):  # until its queue is full
            passed += 1
            assert passed < 10_000, "the queue never filled"
        assert passed > 0 and time.monotonic() - began < 2
    finally:
        receiver.close()
