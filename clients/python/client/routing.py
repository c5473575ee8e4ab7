"""Routing keys onto a stream's key space [0, 1): the one hash the server and the Python client share.

``key_hash(key)`` is the top 53 bits of BLAKE2b-64 of the key's UTF-8
bytes (big-endian), divided by 2^53: a float in [0, 1) that every Python
(and any language with BLAKE2b and doubles) computes alike, and that a
double holds exactly. A segment covers ``[key_lo, key_hi)``; the segments of
an epoch partition [0, 1), so each hash falls in exactly one
(``KeyRanges.find``). The server imports this module (docs/design.md
"Streams (seed 004; the `scopes` surface, the role of Pravega's Controller)").

A ``Routing-Key`` header carries the key percent-encoded as UTF-8
(``header_value``: printable ASCII); ``header_key`` is the reverse (a
``%XX`` sequence that is not UTF-8 decodes to U+FFFD).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote

_BITS = 53
_SCALE = float(1 << _BITS)


def key_hash(key: str) -> float:
    """Where ``key`` falls in [0, 1): top 53 bits of its BLAKE2b-64 (big-endian) over 2^53."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> (64 - _BITS)) / _SCALE


def header_value(key: str) -> str:
    """A routing key as a ``Routing-Key`` header sends it: UTF-8, percent-encoded."""
    return quote(key, safe="")


def header_key(value: str) -> str:
    """The routing key a ``Routing-Key`` header value names (``%XX`` decoded as UTF-8)."""
    return unquote(value, encoding="utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class KeyRange:
    """A segment's share of the key space, ``[lo, hi)``, and whatever names the segment."""

    lo: float
    hi: float
    segment: int


class KeyRanges:
    """The segments of one epoch by key range: a sorted lookup from a hash to the segment covering it."""

    def __init__(self, ranges: Iterable[KeyRange]) -> None:
        self.ranges = sorted(ranges, key=lambda r: r.lo)
        assert self.ranges and self.ranges[0].lo == 0.0 and self.ranges[-1].hi == 1.0, self.ranges
        assert all(a.hi == b.lo for a, b in itertools.pairwise(self.ranges)), self.ranges
        self._los = [r.lo for r in self.ranges]

    def find(self, point: float) -> KeyRange:
        """The range covering ``point`` (in [0, 1))."""
        return self.ranges[bisect.bisect_right(self._los, point) - 1]

    def route(self, key: str) -> int:
        """The segment ``key`` goes to."""
        return self.find(key_hash(key)).segment
