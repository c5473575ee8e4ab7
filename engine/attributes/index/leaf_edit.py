"""Applying a sorted run of changes to one B+Tree leaf, copying only what changes.

The attribute index (``engine.attributes.index.tree``) calls this for every
leaf a batch of attribute changes touches; a leaf the changes leave as it
was is not rewritten.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import islice

from engine.attributes.index.page import Leaf

# Above this many changes to one leaf, rebuild it from a dict instead of inserting one by one.
_REBUILD_CHANGES = 64


def changed_leaf(node: Leaf, items: list[tuple[bytes, int | None]], lo: int, hi: int) -> Leaf | None:
    """``node`` with ``items[lo:hi]`` applied, or None when they change nothing."""
    keys, values = node.keys, node.values
    if hi - lo > _REBUILD_CHANGES:
        merged = dict(zip(keys, values, strict=True))
        changed = False
        for key, value in islice(items, lo, hi):
            if value is None:
                changed |= merged.pop(key, None) is not None
            elif merged.get(key) != value:
                merged[key] = value
                changed = True
        if not changed:
            return None
        new_keys = sorted(merged)
        return Leaf(new_keys, array("q", map(merged.__getitem__, new_keys)))
    count = len(keys)
    updates: list[tuple[int, int]] = []
    edits: list[tuple] = []
    at = 0
    for key, value in islice(items, lo, hi):
        at = bisect_left(keys, key, at)
        if at < count and keys[at] == key:
            if value is None:
                edits.append((at, 1))
            elif values[at] != value:
                updates.append((at, value))
        elif value is not None:
            edits.append((at, 0, key, value))
    if not updates and not edits:
        return None
    new_values = values[:]
    for at, value in updates:
        new_values[at] = value
    if not edits:
        return Leaf(keys, new_values, node.key_bytes)
    new_keys = keys[:]
    # Last position first, so earlier positions stay valid; at one position
    # the removal goes before the inserts, and larger inserted keys before smaller.
    for edit in reversed(edits):
        if edit[1]:
            del new_keys[edit[0]]
            del new_values[edit[0]]
        else:
            new_keys.insert(edit[0], edit[2])
            new_values.insert(edit[0], edit[3])
    return Leaf(new_keys, new_values)
