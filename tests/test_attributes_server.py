"""Attributes in a real server (gunicorn + gevent): values evicted to the index are fetched back.

On one process and on two over one data folder (the segment's container
served by one of them, the other forwarding to it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import ServerProcess
from tests.processes import killed_at_exit

KEYS = [str(uuid.UUID(int=i + 1)) for i in range(50)]


def _metric(server: ServerProcess, name: str) -> float:
    """The sum of the samples of ``name`` over their labels (a node's processes each give their own)."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


@pytest.fixture(params=[1, 2], ids=["one-process", "two-processes"])
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    env = {
        "SEGSTORE_ATTRIBUTE_CACHE_MAX_BYTES": "0",
        "SEGSTORE_FLUSH_THRESHOLD_MS": "50",
        "SEGSTORE_PROCESSES": str(request.param),
    }
    with killed_at_exit(ServerProcess(tmp_path / "data", env=env)) as running:
        yield running


def test_evicted_values_are_read_and_checked_through_the_index(server: ServerProcess) -> None:
    url = f"{server.url}/v1/segments/a/b"
    assert requests.put(url, timeout=10).status_code == 201
    updates = [{"key": k, "type": "replace", "value": i} for i, k in enumerate(KEYS)]
    assert requests.post(f"{url}:attributes", json={"updates": updates}, timeout=10).status_code == 200
    writer = str(uuid.uuid4())
    assert requests.post(url, data=b"e", headers={"Writer-Id": writer, "Event-Number": "3"}, timeout=10).ok
    deadline = time.monotonic() + 20
    while _metric(server, "segstore_attributes_evicted_total") < len(KEYS) + 1:
        assert time.monotonic() < deadline, "attribute values were not evicted"
        time.sleep(0.05)
    assert _metric(server, "segstore_attribute_index_bytes_total") > 0
    got = requests.get(f"{url}:attributes", params={"keys": ",".join(KEYS)}, timeout=10).json()
    assert got == {"attributes": {k: i for i, k in enumerate(KEYS)}}
    cas = {"updates": [{"key": KEYS[7], "type": "replace_if_equals", "value": 70, "expected": 7}]}
    assert requests.post(f"{url}:attributes", json=cas, timeout=10).json() == {"attributes": {KEYS[7]: 70}}
    again = requests.post(f"{url}:attributes", json=cas, timeout=10)
    assert again.status_code == 412 and KEYS[7] in again.json()["detail"]
    dup = requests.post(url, data=b"e", headers={"Writer-Id": writer, "Event-Number": "3"}, timeout=10)
    assert dup.headers["Segment-Duplicate"] == "true"
    assert requests.get(f"{url}:writers/{writer}", timeout=10).json()["event_number"] == 3
