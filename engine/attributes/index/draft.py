"""Drafts: the nodes of an attribute index update being planned, before they are pages.

A draft is a ``Leaf`` or a ``DraftBranch`` whose children are kept pages
(``Ptr``: not rewritten by the plan) or drafts; ``AttributeIndex.plan``
(``tree.py``) builds, splits and joins them, then writes them out.
"""

from __future__ import annotations

from typing import final

from engine.attributes.index.page import (
    INDEX_ENTRY_BYTES,
    LEAF_ENTRY_BYTES,
    OVERHEAD_BYTES,
    Branch,
    Leaf,
    Node,
)

# A child not rewritten by the plan: (page offset, page length, lowest offset in its subtree).
Ptr = tuple[int, int, int]
INF = float("inf")


@final
class DraftBranch:
    """An index node being planned: its children are either kept pages (Ptr) or drafts."""

    __slots__ = ("keys", "kids")

    def __init__(self, keys: list[bytes], kids: list[Ptr | Leaf | DraftBranch]) -> None:
        self.keys = keys
        self.kids = kids


Draft = Leaf | DraftBranch
Kid = Ptr | Leaf | DraftBranch


def kids_of(node: Branch | DraftBranch) -> list[Kid]:
    if type(node) is DraftBranch:
        return list(node.kids)
    return list(zip(node.offsets, node.lengths, node.mins, strict=True))


def concat(a: Node | Draft, b: Node | Draft) -> Draft:
    """One draft holding the entries of ``a`` then those of ``b``, its right neighbour."""
    assert a.keys[-1] < b.keys[0], "merged nodes overlap"
    if type(a) is Leaf and type(b) is Leaf:
        return Leaf(a.keys + b.keys, a.values + b.values)
    assert type(a) is not Leaf and type(b) is not Leaf, "merged nodes of two kinds"
    return DraftBranch(a.keys + b.keys, kids_of(a) + kids_of(b))


def draft_bytes(draft: Draft) -> int:
    """The bytes the pages of ``draft`` and the drafts under it will take."""
    if type(draft) is Leaf:
        return OVERHEAD_BYTES + len(draft.keys) * LEAF_ENTRY_BYTES
    below = sum(draft_bytes(kid) for kid in draft.kids if not isinstance(kid, tuple))
    return OVERHEAD_BYTES + len(draft.kids) * INDEX_ENTRY_BYTES + below


def lowest_kept(draft: Draft) -> float:
    """The lowest offset of a kept page under ``draft`` (infinity if it keeps none)."""
    if type(draft) is Leaf:
        return INF
    return min(kid[2] if isinstance(kid, tuple) else lowest_kept(kid) for kid in draft.kids)
