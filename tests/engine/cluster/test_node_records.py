"""Node records with the local hop: its socket and machine published, older records still read.

A node names its Unix socket and its machine in its record (app/hop.py); a
node's view holds the socket of each live node on its own machine only.
"""

from __future__ import annotations

import json

from engine.cluster.coordinator import Coordinator
from engine.cluster.records import NodeRecord
from engine.cluster.registers import MemoryRegisters
from tests.engine.cluster.test_coordinator import Host


def test_a_record_from_before_the_hop_still_reads() -> None:
    old = json.dumps({"node": "a", "url": "http://a", "beat": 3, "leaving": False, "write": "w"}).encode()
    record = NodeRecord.decode("nodes/a", old)
    assert (record.node, record.url, record.beat, record.hop, record.machine) == ("a", "http://a", 3, "", "")
    assert record.hop_from("m1") == ""


def test_the_socket_and_machine_are_kept_by_every_heartbeat() -> None:
    record = NodeRecord("a", "http://a", hop="/run/segstore/1-x.sock", machine="m1")
    beat = NodeRecord.decode("nodes/a", record.next_beat().encode())
    assert (beat.beat, beat.hop, beat.machine) == (1, "/run/segstore/1-x.sock", "m1")
    assert beat.hop_from("m1") == "/run/segstore/1-x.sock"
    assert beat.hop_from("m2") == "" and beat.hop_from("") == ""


def test_a_view_holds_the_sockets_of_the_live_nodes_on_its_machine_only() -> None:
    registers = MemoryRegisters()
    published = {
        "a": ("/s/a.sock", "m1"),
        "b": ("/s/b.sock", "m1"),  # same machine: reached over its socket
        "c": ("/s/c.sock", "m2"),  # another machine: HTTP
        "d": ("", "m1"),  # no socket (local_hop=0, or an older version): HTTP
    }
    nodes = {}
    for node, (hop, machine) in published.items():
        nodes[node] = Coordinator(
            registers, node_id=node, url=f"http://{node}", container_count=4, host=Host(node, registers),
            lease_s=9.0, hop=hop, machine=machine,
        )
        nodes[node].join()
    for coordinator in nodes.values():
        coordinator.tick()
    view = nodes["a"].view()
    assert set(view.nodes) == {"a", "b", "c", "d"}
    assert view.hops == {"a": "/s/a.sock", "b": "/s/b.sock"}
    assert nodes["c"].view().hops == {"c": "/s/c.sock"}
