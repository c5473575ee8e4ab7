"""A node of several processes over one data folder (docs/design.md "Processes per node"), on real processes.

gunicorn runs two gevent workers sharing the public port; they split four
containers by leases kept in the data folder. Writers append with writer ids
and event numbers (resent after a 503, a 502 or a broken connection, which
deduplication makes safe), so every acknowledged event must be stored
exactly once whatever happens to a process.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

from app.s3.objects import object_name
from app.streams.names import stream_meta_segment
from bench.servers import ServerProcess, cluster_node_env, free_port
from client.segment_client import SegmentClient
from engine import container_for
from tests.s3.conftest import ACCESS_KEY, SECRET_KEY

pytestmark = pytest.mark.process

LEASE_S = 3
SEGMENTS = [f"procs/s{i}" for i in range(8)]


NODE_ENV = {
    "SEGSTORE_PROCESSES": "2", "SEGSTORE_LEASE_S": str(LEASE_S), "SEGSTORE_FLUSH_THRESHOLD_MS": "200",
    "SEGSTORE_S3_KEYS": f"{ACCESS_KEY}:{SECRET_KEY}",
}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProcess]:
    """A node of its own, holding ``SEGMENTS``, for a test that stops, pauses or kills a process."""
    with ServerProcess(tmp_path / "data", env=NODE_ENV) as running:
        wait_until(lambda: split(running) == [2, 2], 30, running)
        for name in SEGMENTS:
            assert requests.put(f"{running.url}/v1/segments/{name}", timeout=10).status_code == 201
        yield running


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One node for the tests that leave its processes alone; each works on segments of its own."""
    with ServerProcess(tmp_path_factory.mktemp("shared") / "data", env=NODE_ENV) as running:
        wait_until(lambda: split(running) == [2, 2], 30, running)
        yield running


@pytest.fixture
def segments(shared: ServerProcess, request: pytest.FixtureRequest) -> list[str]:
    """Eight new segments on the shared node, named after the test: spread over its four containers."""
    names = [f"procs/{request.node.name[5:40]}/s{i}" for i in range(8)]
    for name in names:
        assert requests.put(f"{shared.url}/v1/segments/{name}", timeout=10).status_code == 201
    return names


def cluster(server: ServerProcess) -> dict:
    return requests.get(f"{server.url}/v1/cluster", timeout=10).json()


def owners(server: ServerProcess) -> dict[int, str]:
    return {c["id"]: c["owner"] for c in cluster(server)["containers"] if c["owner"]}


def split(server: ServerProcess) -> list[int]:
    """How many containers each process serves, fewest first."""
    held = list(owners(server).values())
    return sorted(held.count(m) for m in members(server))


def members(server: ServerProcess) -> dict[str, str]:
    return {n["id"]: n["url"] for n in cluster(server)["nodes"]}


def pid_of(server: ServerProcess, member: str) -> int:
    slot = member.rpartition(".p")[2] if ".p" in member else member[1:]
    return int((server.data_dir / "processes" / f"slot-{slot}").read_text())


def wait_until(check, timeout_s: float, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (requests.RequestException, KeyError, ValueError):
            pass
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)


class Writers:
    """One writer per segment, each appending numbered events through ``url`` until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: dict[str, list[bytes]] = {name: [] for name in SEGMENTS}
        self.refused: dict[str, int] = {name: 0 for name in SEGMENTS}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write, args=(name,), daemon=True) for name in SEGMENTS]

    def __enter__(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _write(self, name: str) -> None:
        writer, session = str(uuid.uuid4()), requests.Session()
        number = 0
        while not self._stop.is_set():
            number += 1
            event = f"{name}:{number:08d};".encode()
            headers = {"Writer-Id": writer, "Event-Number": str(number)}
            while not self._stop.is_set():  # the same event until it is acknowledged
                try:
                    url = f"{self.url}/v1/segments/{name}"
                    answer = session.post(url, data=event, headers=headers, timeout=30)
                except requests.RequestException:
                    session = requests.Session()
                    self.refused[name] += 1
                    time.sleep(0.05)
                    continue
                if answer.status_code == 200:
                    self.acked[name].append(event)
                    break
                assert answer.status_code in (502, 503), answer.text
                self.refused[name] += 1
                time.sleep(0.05)

    def count(self) -> int:
        return sum(len(events) for events in self.acked.values())


def check_stored_once(server: ServerProcess, writers: Writers) -> None:
    """Every acknowledged event is stored, once, in order; nothing unacknowledged but a last resend."""
    for name, acked in writers.acked.items():
        data = requests.get(f"{server.url}/v1/segments/{name}", timeout=30).content
        stored = [event + b";" for event in data.split(b";") if event]
        assert len(stored) == len(set(stored)), f"{name}: an event stored twice"
        assert stored[: len(acked)] == acked, f"{name}: an acknowledged event is missing or out of order"
        assert len(stored) - len(acked) <= 1  # the last event, sent when the writers stopped


def test_two_processes_split_the_containers_and_answer_for_each_other(
    shared: ServerProcess, segments: list[str]
) -> None:
    urls = members(shared)
    for name in segments:
        for url in urls.values():  # each process answers for every segment, forwarding to its owner
            answer = requests.post(f"{url}/v1/segments/{name}", data=b"x;", timeout=10)
            assert answer.status_code == 200, answer.text
            assert answer.headers.get("Segment-Owner") in (None, *urls)


def hops_forwarded(server: ServerProcess) -> float:
    """Requests the node's processes passed on to each other over the local hop, so far."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    prefix = "segstore_forwarded_requests_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix) and 'transport="hop"' in line)


def test_a_connection_to_the_public_port_moves_to_the_owner_of_its_segment(
    shared: ServerProcess, segments: list[str]
) -> None:
    """After a request forwarded to its owner, the connection itself is the owner's (app/handoff.py):
    one forward per connection at most, not one per request (half the requests of a connection that
    the other process accepted)."""
    moved = []
    by_owner = owners(shared)
    for name in segments:
        before = hops_forwarded(shared)
        conn = http.client.HTTPConnection("127.0.0.1", shared.port, timeout=10)
        named = []
        for i in range(10):
            conn.request("POST", f"/v1/segments/{name}", body=f"{i};".encode())
            answer = conn.getresponse()
            assert answer.status == 200, answer.read()
            answer.read()
            named.append(answer.getheader("Segment-Owner"))
        conn.close()
        forwarded = hops_forwarded(shared) - before
        assert forwarded <= 1, f"{name}: {forwarded} requests of one connection forwarded"
        moved.append(forwarded)
        # The first answered where the connection was accepted names the owner only if forwarded; then
        # the connection is the owner's own listener's, whose answers name it, which an owner-aware
        # client learns (it cannot tell who answers on the public port).
        owner = by_owner[container_for(name, 4)]
        assert named == [owner if forwarded else None] + [owner] * 9, named
        stored = requests.get(f"{shared.url}/v1/segments/{name}", timeout=10).content
        assert stored == b"".join(f"{i};".encode() for i in range(10))
    assert 0 < sum(moved) < len(segments)  # each process accepted some (eight coins: all alike 1 in 128)


def test_requests_sent_ahead_on_a_connection_are_answered_in_order(
    shared: ServerProcess, segments: list[str]
) -> None:
    """A connection with the next request already read is not passed (its bytes would be lost)."""
    for name in segments:
        ahead = b"".join(
            f"POST /v1/segments/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{i};".encode()
            for i in range(5)
        )
        with socket.create_connection(("127.0.0.1", shared.port), timeout=10) as conn:
            conn.sendall(ahead)
            conn.sendall(f"GET /v1/segments/{name} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            got = b""
            while chunk := conn.recv(65536):
                got += chunk
        assert got.count(b"HTTP/1.1 200") == 6, got
        assert got.endswith(b"0;1;2;3;4;"), got


def test_connections_moved_to_the_processes_and_left_idle_do_not_hold_a_graceful_stop(
    node: ServerProcess,
) -> None:
    with contextlib.ExitStack() as idle:
        for name in SEGMENTS:  # each moves to a process's own listener (gunicorn's would hold the stop 5 s)
            conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
            idle.callback(conn.close)
            conn.request("POST", f"/v1/segments/{name}", body=b"x;")
            assert conn.getresponse().read() is not None
        began = time.monotonic()
        assert node.stop(40) == 0
        assert time.monotonic() - began < 4, "the passed connections held the stop"


def test_with_the_access_log_on_every_request_of_a_connection_is_logged(tmp_path: Path) -> None:
    """The owner's own listener writes no access log: no connection moves while it is on."""
    env = {"SEGSTORE_PROCESSES": "2", "SEGSTORE_ACCESS_LOG": "1"}
    with ServerProcess(tmp_path / "data", env=env) as server:
        wait_until(lambda: split(server) == [2, 2], 30, server)
        for name in SEGMENTS:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("PUT", f"/v1/segments/{name}")
            assert conn.getresponse().read() is not None
            for _ in range(5):
                conn.request("POST", f"/v1/segments/{name}", body=b"x;")
                answer = conn.getresponse()
                assert answer.status == 200, answer.read()
                answer.read()
            conn.close()
    logged = server.log_path.read_text()  # once stopped: a line is written after its answer
    for name in SEGMENTS:
        assert logged.count(f'"POST /v1/segments/{name} HTTP/1.1" 200') == 5, name


def test_one_scrape_shows_every_process_and_healthz_the_whole_node(shared: ServerProcess) -> None:
    for url in [shared.url, *members(shared).values()]:
        text = requests.get(f"{url}/metrics", timeout=10).text
        for member in ("p0", "p1"):
            assert f'segstore_cluster_leases_held{{process="{member}"}} 2.0' in text
        health = requests.get(f"{url}/healthz", timeout=10)
        assert health.status_code == 200, health.text
        containers = health.json()["containers"]  # every container of the shared, from its process
        assert [c["id"] for c in containers] == [0, 1, 2, 3], containers
        assert {c["process"]: c["state"] for c in containers} == {"p0": "running", "p1": "running"}
        assert requests.get(f"{url}/readyz", timeout=10).status_code == 200
    here = {"Segstore-Process-Here": "1"}
    alone = requests.get(f"{shared.url}/metrics", headers=here, timeout=10).text
    assert alone.count("segstore_cluster_leases_held 2.0") == 1 and 'process="' not in alone
    for member, url in members(shared).items():  # each process's own containers
        own = requests.get(f"{url}/healthz", headers=here, timeout=10).json()["containers"]
        assert sorted(c["id"] for c in own) == sorted(c for c, o in owners(shared).items() if o == member)


def test_a_node_whose_process_is_paused_is_not_healthy_until_its_containers_serve_again(
    node: ServerProcess,
) -> None:
    urls = members(node)
    survivor, stopped = sorted(urls)
    lost = {c for c, o in owners(node).items() if o == stopped}
    pid = pid_of(node, stopped)
    os.kill(pid, signal.SIGSTOP)  # it answers nothing: the node does not serve its containers
    try:
        with ThreadPoolExecutor(2) as pool:  # both asked while its leases still run
            health, ready = pool.map(lambda path: requests.get(f"{urls[survivor]}{path}", timeout=30),
                                     ["/healthz", "/readyz"])
        assert health.status_code == 503 and ready.status_code == 503, (health.text, ready.text)
        assert {c["id"] for c in health.json()["containers"] if c["state"] != "running"} >= lost
        # Its leases run out, the survivor takes its containers: the node is well again.
        wait_until(lambda: requests.get(f"{urls[survivor]}/readyz", timeout=30).status_code == 200, 30, node)
        health = requests.get(f"{urls[survivor]}/healthz", timeout=30)
        assert health.status_code == 200 and {c["process"] for c in health.json()["containers"]} == {survivor}
    finally:
        os.kill(pid, signal.SIGCONT)


def forwarded(server: ServerProcess) -> float:
    """Requests the node's processes passed on to another, from one scrape."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("segstore_http_requests_total{") and 'route="forwarded"' in line)


def test_the_python_client_learns_each_segments_process_and_goes_straight_to_it(
    shared: ServerProcess, segments: list[str]
) -> None:
    with SegmentClient(shared.url) as client:
        for name in segments:  # a forwarded answer names the process serving the segment
            client.append(name, b"first;")
        before = forwarded(shared)
        for _ in range(5):
            for name in segments:
                client.append(name, b"next;")
        assert forwarded(shared) == before  # every append went straight to its process
        assert all(client.read(name).data == b"first;" + b"next;" * 5 for name in segments)


def test_a_listing_from_either_process_shows_every_container(
    shared: ServerProcess, segments: list[str]
) -> None:
    for url in members(shared).values():
        prefix = segments[0].rpartition("/")[0] + "/"
        listed = requests.get(f"{url}/v1/segments", params={"prefix": prefix}, timeout=10).json()
        assert sorted(s["name"] for s in listed["segments"]) == sorted(segments)


def test_a_merge_across_processes_copies_the_source_into_the_target(
    shared: ServerProcess, segments: list[str]
) -> None:
    held = owners(shared)
    target = next(n for n in segments if held[container_for(n, 4)] == "p0")
    source = next(n for n in segments if held[container_for(n, 4)] == "p1")
    urls = members(shared)
    assert requests.post(f"{shared.url}/v1/segments/{source}", data=b"from the source;", timeout=10).ok
    assert requests.post(f"{shared.url}/v1/segments/{source}:seal", timeout=10).ok
    merged = requests.post(f"{urls['p0']}/v1/segments/{target}:merge", json={"source": source}, timeout=30)
    assert merged.status_code == 200, merged.text
    assert requests.get(f"{shared.url}/v1/segments/{target}", timeout=10).content == b"from the source;"
    assert requests.get(f"{shared.url}/v1/segments/{source}:info", timeout=10).status_code == 404


def s3_client(url: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1", config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


def test_a_multipart_upload_whose_parts_land_on_different_processes_completes(shared: ServerProcess) -> None:
    urls = list(members(shared).values())
    clients = [s3_client(url) for url in urls]
    clients[0].create_bucket(Bucket="procs")
    upload = clients[0].create_multipart_upload(Bucket="procs", Key="big")["UploadId"]
    parts = [os.urandom(5 << 20), os.urandom(5 << 20), os.urandom(1234)]
    etags = [
        clients[n % 2].upload_part(
            Bucket="procs", Key="big", UploadId=upload, PartNumber=n + 1, Body=part
        )["ETag"]
        for n, part in enumerate(parts)
    ]
    clients[1].complete_multipart_upload(
        Bucket="procs", Key="big", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]},
    )
    assert s3_client(shared.url).get_object(Bucket="procs", Key="big")["Body"].read() == b"".join(parts)


def test_an_upload_id_sent_with_a_key_another_process_serves_is_no_such_upload(shared: ServerProcess) -> None:
    """An upload's state lives in its object's container: with another key, wherever it lives, 404 not 503."""
    by_owner = owners(shared)
    client = s3_client(shared.url)
    client.create_bucket(Bucket="ids")
    upload = client.create_multipart_upload(Bucket="ids", Key="mine")["UploadId"]
    home = by_owner[container_for(object_name("ids", "mine"), 4)]
    other = next(
        key for key in (f"other-{i}" for i in range(1000))
        if by_owner[container_for(object_name("ids", key), 4)] != home
    )
    part = client.upload_part(Bucket="ids", Key="mine", UploadId=upload, PartNumber=1, Body=b"x")["ETag"]
    for call in (
        lambda: client.upload_part(Bucket="ids", Key=other, UploadId=upload, PartNumber=2, Body=b"y"),
        lambda: client.list_parts(Bucket="ids", Key=other, UploadId=upload),
        lambda: client.complete_multipart_upload(
            Bucket="ids", Key=other, UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]},
        ),
        lambda: client.abort_multipart_upload(Bucket="ids", Key=other, UploadId=upload),
    ):
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.response["Error"]["Code"] == "NoSuchUpload"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_a_long_poll_on_one_process_is_woken_by_an_append_served_by_another(
    shared: ServerProcess, segments: list[str]
) -> None:
    by_owner = owners(shared)
    urls = members(shared)
    name = segments[0]
    owner = requests.post(f"{shared.url}/v1/segments/{name}", data=b"a;", timeout=10)
    assert owner.status_code == 200
    served_by = owner.headers.get("Segment-Owner")
    holder = served_by or next(m for m in urls if m in by_owner.values())
    other = next(m for m in urls if m != holder)
    got: list[requests.Response] = []
    poll = threading.Thread(
        target=lambda: got.append(
            requests.get(f"{urls[other]}/v1/segments/{name}", params={"offset": 2, "wait": 20}, timeout=30)
        )
    )
    poll.start()
    time.sleep(0.5)
    assert not got  # it waits at the tail
    began = time.monotonic()
    assert requests.post(f"{urls[holder]}/v1/segments/{name}", data=b"b;", timeout=10).status_code == 200
    poll.join(30)
    assert got and got[0].status_code == 200 and got[0].content == b"b;"
    assert time.monotonic() - began < 5


def test_kill_9_of_one_process_under_writers_loses_and_duplicates_nothing(node: ServerProcess) -> None:
    with Writers(node.url) as writers:
        wait_until(lambda: writers.count() > 100, 30, node)
        victim = "p1"
        pid = pid_of(node, victim)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(lambda: pid_of(node, victim) != pid, 30, node)  # gunicorn started another
        wait_until(lambda: len(owners(node)) == 4 and victim in members(node), 30, node)
        before = {name: len(events) for name, events in writers.acked.items()}
        # every segment takes appends again soon after the kill
        wait_until(lambda: all(len(writers.acked[n]) > before[n] for n in SEGMENTS), 30, node)
        back_in_s = time.monotonic() - killed_at
    check_stored_once(node, writers)
    assert back_in_s < 20, back_in_s


def test_a_paused_process_acknowledges_nothing_for_the_containers_it_lost(node: ServerProcess) -> None:
    urls = members(node)
    paused, live = "p1", "p0"
    lost = sorted(c for c, m in owners(node).items() if m == paused)
    with Writers(urls[live]) as writers:
        wait_until(lambda: writers.count() > 50, 30, node)
        os.kill(pid_of(node, paused), signal.SIGSTOP)
        try:
            # appends sent to the paused process wait in its queue; it must not acknowledge them
            # for containers it lost, so each is refused (503), forwarded to the new owner, or stored.
            late: list[tuple[str, requests.Response | None]] = []

            def send_late(name: str) -> None:
                try:
                    late.append((name, requests.post(f"{urls[paused]}/v1/segments/{name}",
                                                     data=b"late;", timeout=60)))
                except requests.RequestException:
                    late.append((name, None))

            senders = [threading.Thread(target=send_late, args=(name,)) for name in SEGMENTS]
            for sender in senders:
                sender.start()
            wait_until(lambda: all(owners(node).get(c) == live for c in lost), 30, node)
            time.sleep(LEASE_S)
        finally:
            os.kill(pid_of(node, paused), signal.SIGCONT)
        for sender in senders:
            sender.join(90)
        wait_until(lambda: writers.count() > 0 and len(owners(node)) == 4, 30, node)
    for name, answer in late:
        data = requests.get(f"{node.url}/v1/segments/{name}", timeout=30).content
        if answer is not None and answer.status_code == 200:
            assert b"late;" in data, f"{name}: acknowledged by the paused process but not stored"
    # drop the late events from the check: they carry no writer id
    for name in SEGMENTS:
        data = requests.get(f"{node.url}/v1/segments/{name}", timeout=30).content
        stored = [e + b";" for e in data.split(b";") if e and e != b"late"]
        acked = writers.acked[name]
        assert len(stored) == len(set(stored)) and stored[: len(acked)] == acked
        assert len(stored) - len(acked) <= 1


def test_a_graceful_stop_under_writers_loses_nothing_and_the_node_starts_again(node: ServerProcess) -> None:
    with Writers(node.url) as writers:
        wait_until(lambda: writers.count() > 100, 30, node)
        began = time.monotonic()
        assert node.stop(40) == 0
        stopped_in = time.monotonic() - began
    again = ServerProcess(node.data_dir, port=node.port, env=node.env)
    with again:
        wait_until(lambda: split(again) == [2, 2], 30, again)
        check_stored_once(again, writers)
    assert stopped_in < 30, stopped_in  # within gunicorn's graceful_timeout


def test_with_tier1_on_s3_each_process_is_a_cluster_member(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    port = free_port()
    env = cluster_node_env("a", port, moto_endpoint, s3_bucket, lease_s=LEASE_S) | {"SEGSTORE_PROCESSES": "2"}
    with ServerProcess(tmp_path / "a", port=port, env=env) as server:
        wait_until(lambda: sorted(owners(server).values()) == ["a.p0", "a.p0", "a.p1", "a.p1"], 30, server)
        for name in SEGMENTS:
            assert requests.put(f"{server.url}/v1/segments/{name}", timeout=10).status_code == 201
        with Writers(server.url) as writers:
            wait_until(lambda: writers.count() > 50, 30, server)
            victim = pid_of(server, "a.p1")
            os.kill(victim, signal.SIGKILL)  # its containers move at once: its slot's lock is gone
            before = {name: len(events) for name, events in writers.acked.items()}
            wait_until(lambda: all(len(writers.acked[n]) > before[n] for n in SEGMENTS), 30, server)
        check_stored_once(server, writers)


def test_a_fork_on_another_process_keeps_its_source_soft_deleted_till_it_goes(shared: ServerProcess) -> None:
    held = owners(shared)

    def on(member: str, prefix: str) -> str:
        return next(
            n for n in (f"{prefix}{i}" for i in range(200))
            if held[container_for(stream_meta_segment(n), 4)] == member
        )

    source, fork, leaf = on("p0", "src"), on("p1", "fork"), on("p0", "leaf")
    streams = f"{shared.url}/v1/stream/"
    text = {"Content-Type": "text/plain"}
    assert requests.put(streams + source, headers=text, data=b"a", timeout=10).status_code == 201
    made = requests.put(streams + fork, headers={"Stream-Forked-From": source}, timeout=10)
    assert made.status_code == 201, made.text
    assert requests.put(streams + leaf, headers={"Stream-Forked-From": fork}, timeout=10).status_code == 201
    assert requests.delete(streams + source, timeout=10).status_code == 204
    assert requests.get(streams + source, timeout=10).status_code == 410
    assert requests.post(streams + source, headers=text, data=b"b", timeout=10).status_code == 410
    assert requests.put(streams + source, headers=text, timeout=10).status_code == 409
    again = requests.put(streams + "other", headers={"Stream-Forked-From": source}, timeout=10)
    assert again.status_code == 409
    assert requests.get(streams + fork, timeout=10).content == b"a"
    assert requests.delete(streams + fork, timeout=10).status_code == 204
    assert requests.get(streams + fork, timeout=10).status_code == 410
    assert requests.get(streams + source, timeout=10).status_code == 410
    assert requests.delete(streams + leaf, timeout=10).status_code == 204
    for name in (leaf, fork, source):
        assert requests.get(streams + name, timeout=10).status_code == 404, name
    assert requests.put(streams + source, headers=text, timeout=10).status_code == 201


def test_a_data_folder_changes_hands_between_one_process_and_two_after_kill_9(tmp_path: Path) -> None:
    """A folder one process served serves on two (a node given more processes), and back on one."""
    env = {"SEGSTORE_LEASE_S": str(LEASE_S), "SEGSTORE_FLUSH_THRESHOLD_MS": "600000"}  # all in Tier 1
    written: dict[str, bytes] = {name: b"" for name in SEGMENTS}
    for processes in (1, 2, 1):
        server = ServerProcess(tmp_path / "data", env=env, processes=processes).start()
        try:
            wait_until(lambda s=server: len(owners(s)) == 4 or s.processes == 1, 30, server)
            for name in SEGMENTS:
                url = f"{server.url}/v1/segments/{name}"
                if written[name]:
                    assert requests.get(url, timeout=10).content == written[name]
                else:
                    assert requests.put(f"{server.url}/v1/segments/{name}", timeout=10).status_code == 201
                event = f"{name} on {processes};".encode()
                assert requests.post(f"{server.url}/v1/segments/{name}", data=event, timeout=10).ok
                written[name] += event
        finally:
            server.kill()
