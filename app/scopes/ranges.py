"""Key ranges ``[lo, hi)`` of the key space [0, 1): the checks a scale and a stream cut must pass.

Ranges are floats compared exactly: the bounds a scale records are the ones
it was given (JSON numbers round-trip), and ``split`` ends its last part on
the range's own ``hi``, so neighbouring ranges meet exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from engine import InvalidArgument

Range = tuple[float, float]


def overlaps(a: Range, b: Range) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def contiguous(ranges: Sequence[Range]) -> Range | None:
    """The span of ``ranges`` if, sorted, each starts where the one before ends; else None."""
    ordered = sorted(ranges)
    if not ordered or any(a[1] != b[0] for a, b in itertools.pairwise(ordered)):
        return None
    return ordered[0][0], ordered[-1][1]


def check_ranges(ranges: Sequence[Range], what: str) -> None:
    """Each range lies in [0, 1) and is not empty."""
    for lo, hi in ranges:
        if not 0.0 <= lo < hi <= 1.0:
            raise InvalidArgument(f"{what}: a key range [lo, hi) needs 0 <= lo < hi <= 1, got [{lo}, {hi})")


def check_partition(ranges: Sequence[Range], what: str) -> None:
    """``ranges`` cover [0, 1) exactly: no gap, no overlap."""
    check_ranges(ranges, what)
    if contiguous(ranges) != (0.0, 1.0):
        raise InvalidArgument(f"{what}: the key ranges must cover [0, 1) exactly, without gap or overlap")


def check_replacement(sealed: Sequence[Range], new: Sequence[Range]) -> None:
    """A scale's new ranges cover exactly the keys of the segments it seals (seed 004)."""
    check_ranges(new, "ranges")
    span = contiguous(sealed)
    if span is None:
        raise InvalidArgument("the segments a scale seals must have neighbouring key ranges")
    if contiguous(new) != span:
        raise InvalidArgument(
            f"the new ranges must cover exactly the sealed segments' keys [{span[0]}, {span[1]}), "
            "without gap or overlap"
        )


def split(lo: float, hi: float, parts: int) -> list[Range]:
    """``[lo, hi)`` cut into ``parts`` ranges of equal width (the last ends exactly on ``hi``)."""
    assert parts >= 1 and lo < hi
    bounds = [lo + (hi - lo) * i / parts for i in range(parts)] + [hi]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]
