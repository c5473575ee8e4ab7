"""The attribute index: a copy-on-write B+Tree in an append-only attribute segment (seed 001).

Keys are 16 bytes compared as bytes, values int64. The index never writes:
``plan`` turns a batch of changes into the pages to append (children before
parents, root last, one contiguous byte string) and the root they make; the
caller appends them durably and records the root, then ``commit`` adopts it.
A plan that is never committed leaves no trace: the next plan appends at the
same recorded length.

Each batch rewrites the leaves it changes and all their ancestors. A node
that outgrows ``node_max_bytes`` splits (into even pieces, except the
rightmost node of the tree, which is cut into full pieces and a remainder so
that keys inserted in order fill whole pages); a changed node under a quarter
of its capacity merges with a neighbour, or shares evenly with it when both
do not fit in one page; the tree's rightmost node may stay under that bound
when merging it would overflow, since in-order inserts land there. A root
with a single child gives way to that child.

Progressive compaction (seed 001, "B+Trees on Append-Only Storage"): with
every batch the index also re-appends the page with the lowest offset that
the batch does not rewrite anyway, found by following the lowest
``child_min_offset`` from the root, with the ancestors the batch does not
already rewrite. The new root's ``min_offset`` is the lowest live offset:
everything below it may be head-truncated. Beyond the seed, a batch that
rewrites many pages moves more than one: the next lowest follow until the
moved bytes reach ``compaction_ratio`` (1/8) of the batch's own, which keeps
the live size down when large batches leave few pages untouched for long;
``compaction_ratio=0`` is the seed's one page a batch.

Threads: ``get`` and ``items`` may run in any number of threads while one
writer plans and commits; plans are not run concurrently with each other.
The lock guards the root and length only; page reads happen outside it.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter, le

from engine.attributes.index.draft import (
    INF,
    Draft,
    DraftBranch,
    Kid,
    Ptr,
    concat,
    draft_bytes,
    kids_of,
    lowest_kept,
)
from engine.attributes.index.leaf_edit import changed_leaf
from engine.attributes.index.node_cache import NodeCache
from engine.attributes.index.page import (
    INT64_MAX,
    INT64_MIN,
    KEY_BYTES,
    NODE_MAX_BYTES,
    Branch,
    Leaf,
    Node,
    decode,
    encode_branch,
    encode_leaf,
    index_capacity,
    leaf_capacity,
    strictly_sorted,
)
from engine.errors import DataCorrupted, InvalidArgument

# Progressive compaction moves pages until their bytes reach this share of the batch's own.
COMPACTION_RATIO = 0.125
_first = itemgetter(0)


@dataclass(frozen=True)
class RootPointer:
    """Where the root page is, and the lowest offset any live page of the tree starts at."""

    offset: int
    length: int
    min_offset: int


@dataclass(frozen=True)
class IndexUpdate:
    """The outcome of ``plan``: bytes to append at ``offset``, and the root they make.

    ``obsolete`` lists the offsets of the pages the old root reaches and the
    new one does not (an in-memory page store may drop them once committed).
    ``nodes`` holds each page of ``data``, in order, as (offset, decoded
    node): ``commit`` puts them in the cache.
    """

    offset: int
    data: bytes
    root: RootPointer | None
    obsolete: tuple[int, ...] = ()
    nodes: tuple[tuple[int, Node], ...] = field(default=(), repr=False, compare=False)


class AttributeIndex:
    """A B+Tree of 16-byte keys and int64 values over an append-only byte sequence read through ``read``."""

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        root: RootPointer | None,
        length: int,
        *,
        compaction: bool = True,
        compaction_ratio: float = COMPACTION_RATIO,
        cache: NodeCache | None = None,
        node_max_bytes: int = NODE_MAX_BYTES,
    ) -> None:
        if root is not None and not 0 <= root.min_offset <= root.offset < root.offset + root.length <= length:
            raise ValueError(f"root {root} does not lie within {length} bytes")
        if node_max_bytes > NODE_MAX_BYTES or index_capacity(node_max_bytes) < 4:
            raise ValueError(f"node_max_bytes {node_max_bytes} out of range")
        self._read = read
        self._root = root
        self._length = length
        self.compaction = compaction
        self.compaction_ratio = compaction_ratio
        self._cache = cache if cache is not None else NodeCache()
        self._namespace = object()
        self._node_max_bytes = node_max_bytes
        self._leaf_capacity = leaf_capacity(node_max_bytes)
        self._index_capacity = index_capacity(node_max_bytes)
        self._leaf_min = max(1, self._leaf_capacity // 4)
        self._index_min = max(2, self._index_capacity // 4)
        self._lock = threading.Lock()
        self.page_reads = 0

    @property
    def root(self) -> RootPointer | None:
        with self._lock:
            return self._root

    @property
    def length(self) -> int:
        with self._lock:
            return self._length

    # Reading.

    def get(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        """The values of those of ``keys`` that are present."""
        keys = list(keys)
        while True:
            with self._lock:
                root = self._root
            if root is None:
                return {}
            try:
                return self._lookup(root, keys)
            except Exception:
                # A page of a root a commit has since replaced may be gone
                # (head-truncated): look again from the new root.
                with self._lock:
                    if self._root is root:
                        raise

    def _lookup(self, root: RootPointer, keys: list[bytes]) -> dict[bytes, int]:
        found: dict[bytes, int] = {}
        fetch = self._fetch
        for key in keys:
            offset, length = root.offset, root.length
            while True:
                node = fetch(offset, length)
                node_keys = node.keys
                if type(node) is Leaf:
                    i = bisect_left(node_keys, key)
                    if i < len(node_keys) and node_keys[i] == key:
                        found[key] = node.values[i]
                    break
                c = bisect_right(node_keys, key) - 1
                if c < 0:
                    c = 0
                offset, length = node.offsets[c], node.lengths[c]
        return found

    def items(self, start: bytes | None = None) -> Iterator[tuple[bytes, int]]:
        """Every (key, value) with key >= ``start``, in key order, as of the root when called.

        Unlike ``get`` it does not move on to a newer root: pages the caller
        head-truncates while the iteration runs make it fail.
        """
        root = self.root
        if root is None:
            return iter(())
        return self._items(root.offset, root.length, start)

    def _items(self, offset: int, length: int, start: bytes | None) -> Iterator[tuple[bytes, int]]:
        node = self._fetch(offset, length)
        if type(node) is Leaf:
            i = 0 if start is None else bisect_left(node.keys, start)
            yield from zip(node.keys[i:], node.values[i:], strict=True)
            return
        c = 0 if start is None else max(bisect_right(node.keys, start) - 1, 0)
        for i in range(c, len(node.keys)):
            yield from self._items(node.offsets[i], node.lengths[i], start if i == c else None)

    def _fetch(self, offset: int, length: int) -> Node:
        node = self._cache.get(self._namespace, offset)
        if node is not None:
            return node
        assert offset + length <= self._length, f"page {offset}+{length} beyond {self._length}"
        data = self._read(offset, length)
        with self._lock:
            self.page_reads += 1
        if len(data) != length:
            raise DataCorrupted(f"attribute page at {offset}: read {len(data)} bytes of {length}")
        node = decode(bytes(data), offset)
        self._cache.put(self._namespace, offset, node)
        return node

    # Writing.

    def plan(self, changes: Mapping[bytes, int | None]) -> IndexUpdate:
        """The pages that apply ``changes`` (key -> value, None removes), without adopting them."""
        for key, value in changes.items():
            if type(key) is not bytes or len(key) != KEY_BYTES:
                raise InvalidArgument(f"an attribute key is {KEY_BYTES} bytes, not {key!r}")
            if value is not None and not (type(value) is int and INT64_MIN <= value <= INT64_MAX):
                raise InvalidArgument(f"an attribute value is an int64, not {value!r}")
        items = sorted(changes.items())
        with self._lock:
            root, base = self._root, self._length
        replaced: list[int] = []
        top: Kid | None
        if root is None:
            added = [(k, v) for k, v in items if v is not None]
            leaf = Leaf([k for k, _ in added], array("q", [v for _, v in added]))
            top = self._grow(self._split(leaf, True))
        else:
            kept: Ptr = (root.offset, root.length, root.min_offset)
            pieces = self._apply(kept, items, 0, len(items), True, replaced) if items else None
            top = kept if pieces is None else self._grow(pieces)
            top = self._collapse(top, replaced)
        if self.compaction and top is not None:
            top = self._compact(top, replaced)
        return self._emit(top, base, replaced)

    def commit(self, update: IndexUpdate) -> None:
        """Adopt ``update`` once its bytes are durably at ``update.offset``."""
        with self._lock:
            if update.offset != self._length:
                raise ValueError(f"update planned at {update.offset}, the index is at {self._length}")
        for offset, node in update.nodes:
            self._cache.put(self._namespace, offset, node)
        with self._lock:
            self._root = update.root
            self._length = update.offset + len(update.data)
        self._cache.discard(self._namespace, update.obsolete)

    def close(self) -> None:
        """Drop this index's nodes from the (possibly shared) cache."""
        self._cache.clear(self._namespace)

    def _apply(
        self, ptr: Ptr, items: list[tuple[bytes, int | None]], lo: int, hi: int, rightmost: bool,
        replaced: list[int],
    ) -> list[Draft] | None:
        """The pieces that replace the page at ``ptr`` once ``items[lo:hi]`` apply; None if unchanged."""
        node = self._fetch(ptr[0], ptr[1])
        if type(node) is Leaf:
            leaf = changed_leaf(node, items, lo, hi)
            if leaf is None:
                return None
            replaced.append(ptr[0])
            return self._split(leaf, rightmost)
        keys, count = node.keys, len(node.keys)
        results: dict[int, list[Draft]] = {}
        i = lo
        while i < hi:
            c = max(bisect_right(keys, items[i][0]) - 1, 0)
            j = bisect_left(items, keys[c + 1], i, hi, key=_first) if c + 1 < count else hi
            kid = (node.offsets[c], node.lengths[c], node.mins[c])
            pieces = self._apply(kid, items, i, j, rightmost and c == count - 1, replaced)
            if pieces is not None:
                results[c] = pieces
            i = j
        if not results:
            return None
        replaced.append(ptr[0])
        new_keys: list[bytes] = []
        kids: list[Kid] = []
        done = 0
        underfull = False
        for c, pieces in results.items():
            new_keys += keys[done:c]
            kids += zip(node.offsets[done:c], node.lengths[done:c], node.mins[done:c], strict=True)
            for n, piece in enumerate(pieces):
                # A key below every other may have entered child 0: its separator follows it down.
                new_keys.append(piece.keys[0] if n else min(keys[c], piece.keys[0]))
                kids.append(piece)
                underfull |= len(piece.keys) < self._min(piece)
            done = c + 1
        new_keys += keys[done:]
        kids += zip(node.offsets[done:], node.lengths[done:], node.mins[done:], strict=True)
        if underfull:
            self._rebalance(new_keys, kids, rightmost, replaced)
        return self._split(DraftBranch(new_keys, kids), rightmost)

    def _rebalance(self, keys: list[bytes], kids: list[Kid], rightmost: bool, replaced: list[int]) -> None:
        """Merge each changed child under its fill bound with a neighbour (or share evenly with it)."""
        p = 0
        while p < len(kids) and len(kids) > 1:
            kid = kids[p]
            if isinstance(kid, tuple) or len(kid.keys) >= self._min(kid):
                p += 1
                continue
            last = p == len(kids) - 1
            left = p - 1 if last else p
            other = kids[p - 1 if last else p + 1]
            other_node = self._fetch(other[0], other[1]) if isinstance(other, tuple) else other
            a, b = (other_node, kid) if last else (kid, other_node)
            total = len(a.keys) + len(b.keys)
            if total > self._capacity(kid) and last and rightmost:
                break
            if isinstance(other, tuple):
                replaced.append(other[0])
            merged = concat(a, b)
            if type(merged) is DraftBranch:
                # a's last child and b's first are neighbours now: either may be a changed child
                # under its bound that had no neighbour before.
                edge = rightmost and left + 2 == len(kids)
                self._rebalance(merged.keys, merged.kids, edge, replaced)
                total = len(merged.keys)
            if total <= self._capacity(kid):
                kids[left : left + 2] = [merged]
                del keys[left + 1]
                p = left
            else:
                x, y = self._pieces(merged, [total - total // 2, total // 2])
                kids[left : left + 2] = [x, y]
                keys[left + 1] = y.keys[0]
                p = left + 2

    def _split(self, draft: Draft, rightmost: bool) -> list[Draft]:
        """``draft`` cut into pieces that fit a page: even ones, or full ones at the tree's right edge."""
        count, capacity = len(draft.keys), self._capacity(draft)
        if count <= capacity:
            return [draft] if count else []
        if rightmost:
            sizes = [capacity] * (count // capacity) + ([count % capacity] if count % capacity else [])
        else:
            n = -(-count // capacity)
            sizes = [count // n + (1 if i < count % n else 0) for i in range(n)]
        return self._pieces(draft, sizes)

    @staticmethod
    def _pieces(draft: Draft, sizes: list[int]) -> list[Draft]:
        pieces: list[Draft] = []
        at = 0
        for size in sizes:
            end = at + size
            if type(draft) is Leaf:
                pieces.append(Leaf(draft.keys[at:end], draft.values[at:end]))
            else:
                pieces.append(DraftBranch(draft.keys[at:end], draft.kids[at:end]))
            at = end
        assert at == len(draft.keys) and all(pieces), "pieces must cover the node"
        return pieces

    def _grow(self, pieces: list[Draft]) -> Kid | None:
        """One root over ``pieces`` (new index levels as needed); None for no pieces."""
        while len(pieces) > 1:
            pieces = self._split(DraftBranch([p.keys[0] for p in pieces], list(pieces)), True)
        return pieces[0] if pieces else None

    def _collapse(self, top: Kid | None, replaced: list[int]) -> Kid | None:
        """The root without index levels of a single child."""
        while top is not None:
            node = self._fetch(top[0], top[1]) if isinstance(top, tuple) else top
            if type(node) is Leaf or len(node.keys) > 1:
                return top
            if isinstance(top, tuple):
                replaced.append(top[0])
            top = kids_of(node)[0]
        return None

    def _compact(self, top: Kid, replaced: list[int]) -> Kid:
        """``top`` with its lowest kept pages, and their kept ancestors, turned into drafts.

        The lowest page always moves; the next lowest follow while the bytes
        moved stay under ``compaction_ratio`` of the bytes the batch itself
        rewrites.
        """
        if isinstance(top, tuple):
            top = self._draft_of(top, replaced)
        budget = self.compaction_ratio * draft_bytes(top)
        moved = 0
        while True:
            length = self._move_lowest(top, replaced)
            moved += length
            if not length or moved >= budget:
                return top

    def _move_lowest(self, top: Draft, replaced: list[int]) -> int:
        """Turn the lowest kept page under ``top``, and its kept ancestors, into drafts.

        Returns that page's length, 0 if ``top`` keeps no page.
        """
        node = top
        while type(node) is DraftBranch:
            kids = node.kids
            lows = [kid[2] if isinstance(kid, tuple) else lowest_kept(kid) for kid in kids]
            low = min(lows)
            if low == INF:
                return 0
            best = lows.index(low)
            kid = kids[best]
            if isinstance(kid, tuple):
                ptr, kid = kid, self._draft_of(kid, replaced)
                kids[best] = kid
                if ptr[0] == ptr[2]:
                    return ptr[1]
            node = kid
        return 0

    def _draft_of(self, ptr: Ptr, replaced: list[int]) -> Draft:
        node = self._fetch(ptr[0], ptr[1])
        replaced.append(ptr[0])
        if type(node) is Leaf:
            return node
        return DraftBranch(list(node.keys), kids_of(node))

    def _emit(self, top: Kid | None, base: int, replaced: list[int]) -> IndexUpdate:
        """Serialize the drafts under ``top``, children before parents, from offset ``base``."""
        assert len(set(replaced)) == len(replaced), "a page replaced twice"
        parts: list[bytes] = []
        nodes: list[tuple[int, Node]] = []
        at = base

        def emit(kid: Kid) -> Ptr:
            nonlocal at
            if isinstance(kid, tuple):
                assert kid[2] <= kid[0] < base, f"kept page {kid} not below {base}"
                return kid
            node: Node
            if type(kid) is Leaf:
                assert 0 < len(kid.keys) <= self._leaf_capacity, f"leaf of {len(kid.keys)}"
                assert kid.encoded or strictly_sorted(kid.keys), "leaf keys out of order"
                node = kid
                data = encode_leaf(kid, at)
                ptr = (at, len(data), at)
            else:
                ptrs = [k if isinstance(k, tuple) else emit(k) for k in kid.kids]
                assert 0 < len(ptrs) == len(kid.keys) <= self._index_capacity, f"index of {len(ptrs)}"
                assert strictly_sorted(kid.keys), "index keys out of order"
                offsets, lengths, mins = zip(*ptrs, strict=True)
                assert max(offsets) < at and all(map(le, mins, offsets)), "a child pointer is not below"
                node = Branch(kid.keys, array("Q", offsets), array("I", lengths), array("Q", mins))
                data = encode_branch(node, at)
                ptr = (at, len(data), min(mins))
            assert len(data) <= self._node_max_bytes
            parts.append(data)
            nodes.append((at, node))
            at += len(data)
            return ptr

        if top is None:
            return IndexUpdate(base, b"", None, tuple(replaced))
        root = RootPointer(*emit(top))
        assert root.min_offset <= root.offset
        return IndexUpdate(base, b"".join(parts), root, tuple(replaced), tuple(nodes))

    def _capacity(self, node: Node | Draft) -> int:
        return self._leaf_capacity if type(node) is Leaf else self._index_capacity

    def _min(self, node: Node | Draft) -> int:
        return self._leaf_min if type(node) is Leaf else self._index_min
