"""The cluster's records (cluster.json, nodes, leases) and how a node judges them alive.

Each record is one register (``engine.cluster.registers``) holding one JSON
object with a fresh ``write`` id, so no two writes ever hold the same bytes.

Liveness is judged by observation, never by comparing clocks across machines:
a node or lease record is stale once its version has stayed the same for
``lease_s`` of the observer's own monotonic clock. Its writer renews it every
third of ``lease_s``, and a lease holder gives its containers up before
``lease_s`` minus a margin has passed since the start of its last successful
renewal; the observer can only have seen that renewal after it landed, so
it waits longer than the holder could still be acting (docs/cluster.md).
"""

from __future__ import annotations

import json
import math
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.errors import DataCorrupted


def _write_id() -> str:
    return uuid.uuid4().hex


def _decode(name: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise DataCorrupted(f"cluster record {name!r} is not JSON") from None
    if not isinstance(doc, dict):
        raise DataCorrupted(f"cluster record {name!r} is not a JSON object")
    return doc


def _encode(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True, separators=(",", ":")).encode()


def new_secret() -> str:
    """A fresh peer secret: 256 random bits, hex."""
    return secrets.token_hex(32)


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """``cluster.json``: what every node of the cluster must agree on, written once.

    ``secret`` authenticates node-to-node calls (``engine/cluster/peers.py``):
    only readers of the bucket know it. A record written before it existed
    has none (``""``) and gets one by a compare-and-set.
    """

    containers: int
    secret: str = field(default_factory=new_secret)
    write: str = field(default_factory=_write_id)

    def encode(self) -> bytes:
        return _encode(self)

    def with_secret(self) -> ClusterRecord:
        return ClusterRecord(self.containers)

    @classmethod
    def decode(cls, name: str, data: bytes) -> ClusterRecord:
        doc = _decode(name, data)
        containers = doc.get("containers")
        if not isinstance(containers, int) or containers < 1:
            raise DataCorrupted(f"cluster record {name!r}: bad container count {containers!r}")
        return cls(containers, str(doc.get("secret", "")), str(doc.get("write", "")))


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """``nodes/<id>``: a node's advertised URL; renewed as its heartbeat, ``leaving`` on a clean stop.

    ``hop`` is the node's Unix socket and ``machine`` what identifies its
    machine (app/hop.py): a node on the same machine sends requests there
    instead of to ``url``. Records written before them have neither (``""``).
    """

    node: str
    url: str
    beat: int = 0
    leaving: bool = False
    write: str = field(default_factory=_write_id)
    hop: str = ""
    machine: str = ""

    def encode(self) -> bytes:
        return _encode(self)

    def next_beat(self, *, leaving: bool = False) -> NodeRecord:
        return NodeRecord(self.node, self.url, self.beat + 1, leaving, hop=self.hop, machine=self.machine)

    def hop_from(self, machine: str) -> str:
        """The socket to reach this node by from ``machine``: its own if it runs there, else ``""``."""
        return self.hop if machine and self.machine == machine else ""

    @classmethod
    def decode(cls, name: str, data: bytes) -> NodeRecord:
        doc = _decode(name, data)
        node, url = doc.get("node"), doc.get("url")
        if not isinstance(node, str) or not isinstance(url, str):
            raise DataCorrupted(f"node record {name!r} lacks its node id or URL")
        beat, leaving = int(doc.get("beat", 0)), bool(doc.get("leaving", False))
        hop, machine = str(doc.get("hop", "")), str(doc.get("machine", ""))
        return cls(node, url, beat, leaving, str(doc.get("write", "")), hop=hop, machine=machine)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """``leases/<container>``: who owns the container; ``epoch`` grows with every change of owner."""

    container: int
    owner: str | None
    epoch: int
    write: str = field(default_factory=_write_id)

    def encode(self) -> bytes:
        return _encode(self)

    def renewed(self) -> LeaseRecord:
        return LeaseRecord(self.container, self.owner, self.epoch)

    def claimed_by(self, node: str) -> LeaseRecord:
        return LeaseRecord(self.container, node, self.epoch + 1)

    def released(self) -> LeaseRecord:
        return LeaseRecord(self.container, None, self.epoch)

    @classmethod
    def decode(cls, name: str, data: bytes) -> LeaseRecord:
        doc = _decode(name, data)
        container, owner, epoch = doc.get("container"), doc.get("owner"), doc.get("epoch")
        if not isinstance(container, int) or not isinstance(epoch, int) or epoch < 0:
            raise DataCorrupted(f"lease record {name!r}: bad container or epoch")
        if owner is not None and not isinstance(owner, str):
            raise DataCorrupted(f"lease record {name!r}: bad owner {owner!r}")
        return cls(container, owner, epoch, str(doc.get("write", "")))


@dataclass(frozen=True, slots=True)
class Offer:
    """A container handed over to one node (``to``): the released lease's epoch and register version.

    The taker claims it with a compare-and-set on that version at the start
    of its next round, before it reads the cluster; if anything wrote the
    lease since, the claim fails and the round decides as usual.
    """

    container: int
    to: str
    epoch: int
    version: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Offer:
        return cls(int(doc["container"]), str(doc["to"]), int(doc["epoch"]), str(doc["version"]))


class Observer:
    """Remembers when this node first saw each version of each record, to judge staleness."""

    def __init__(self, lease_s: float) -> None:
        assert lease_s > 0, lease_s
        self.lease_s = lease_s
        self._seen: dict[str, tuple[str, float]] = {}

    def saw(self, name: str, version: str, now: float) -> None:
        """Record that ``name`` has ``version`` at ``now`` (monotonic seconds)."""
        known = self._seen.get(name)
        if known is None or known[0] != version:
            self._seen[name] = (version, now)

    def stale(self, name: str, now: float) -> bool:
        """Whether ``name``'s version has not changed for ``lease_s`` since this node first saw it."""
        age = self.age(name, now)
        return age is not None and age >= self.lease_s

    def age(self, name: str, now: float) -> float | None:
        """How long ``name`` has kept its version as this node saw it (None if never seen)."""
        known = self._seen.get(name)
        return None if known is None else now - known[1]

    def next_stale(self, names: Iterable[str], now: float) -> float:
        """When the first of ``names`` that is not stale yet turns stale (just after); inf if none will."""
        soonest = math.inf
        for name in names:
            age = self.age(name, now)
            if age is not None and age < self.lease_s:
                soonest = min(soonest, now - age + self.lease_s + 0.01)
        return soonest

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of records that no longer exist."""
        for name in set(self._seen) - keep:
            del self._seen[name]
