"""Concurrent appends to one segment never interleave, leave gaps or overlap.

32 clients append distinct payloads of varied sizes (a few up to ~200 KiB) to
one segment of a real server at the same time; afterwards the segment's bytes
must split exactly into the acknowledged appends at their acknowledged offsets.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import requests

from bench.servers import ServerProcess
from tests.processes import killed_at_exit

CLIENTS = 32
APPENDS_PER_CLIENT = 20
SEGMENT = "interleave/one"
TIMEOUT_S = 30


def _payload(rng: random.Random, client: int, seq: int) -> bytes:
    """A recognizable payload: a header naming its author, random bytes, a closing mark."""
    size = rng.randint(100_000, 200 * 1024) if rng.random() < 0.15 else rng.randint(32, 4096)
    head = b"[%02d:%03d:%06d|" % (client, seq, size)
    return head + rng.randbytes(size - len(head) - 1) + b"]"


def _client(
    url: str,
    client: int,
    start: threading.Barrier,
    acks: list[tuple[int, bytes]],
    failures: list[str],
) -> None:
    rng = random.Random(client)
    with requests.Session() as http:
        start.wait(TIMEOUT_S)
        for seq in range(APPENDS_PER_CLIENT):
            payload = _payload(rng, client, seq)
            response = http.post(f"{url}/v1/segments/{SEGMENT}", data=payload, timeout=TIMEOUT_S)
            if response.status_code != 200 or response.json().get("duplicate"):
                failures.append(f"client {client} append {seq}: {response.status_code} {response.text}")
                return
            offset = response.json()["offset"]
            if (
                int(response.headers["Segment-Offset"]) != offset
                or response.json()["length"] < offset + len(payload)
                or int(response.headers["Segment-Length"]) < offset + len(payload)
            ):
                failures.append(f"client {client} append {seq}: {response.headers} {response.text}")
            acks.append((offset, payload))


def _read_all(url: str, name: str) -> bytes:
    length = requests.get(f"{url}/v1/segments/{name}:info", timeout=TIMEOUT_S).json()["length"]
    data = bytearray()
    while len(data) < length:
        response = requests.get(f"{url}/v1/segments/{name}", params={"offset": len(data)}, timeout=TIMEOUT_S)
        assert response.status_code == 200, response.text
        assert response.content, f"empty read at {len(data)} of {length}"
        data += response.content
        assert int(response.headers["Segment-Next-Offset"]) == len(data)
    return bytes(data)


@pytest.mark.process
def test_concurrent_appends_split_exactly_into_acknowledged_appends(tmp_path: Path) -> None:
    with killed_at_exit(ServerProcess(tmp_path / "data")) as server:
        assert requests.put(f"{server.url}/v1/segments/{SEGMENT}", timeout=10).status_code == 201
        start = threading.Barrier(CLIENTS)
        acks: list[tuple[int, bytes]] = []
        failures: list[str] = []
        threads = [
            threading.Thread(target=_client, args=(server.url, c, start, acks, failures))
            for c in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S * 2)
        assert not failures, failures
        assert len(acks) == CLIENTS * APPENDS_PER_CLIENT
        data = _read_all(server.url, SEGMENT)

    assert any(len(p) > 100_000 for _, p in acks)
    position = 0
    for offset, payload in sorted(acks, key=lambda a: a[0]):
        assert offset == position, f"gap or overlap at {position}: next append acked at {offset}"
        assert data[offset : offset + len(payload)] == payload, f"bytes differ at {offset}"
        position += len(payload)
    assert position == len(data), f"segment is {len(data)} bytes, appends cover {position}"
