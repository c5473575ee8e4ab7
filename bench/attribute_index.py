"""Attribute index benchmark: seed 001's Table 1 and Table 2, and warm lookups.

``python -m bench.attribute_index [--quick] [--repeat N] [--json PATH]`` drives
``engine.attributes.index.AttributeIndex`` (32 KiB nodes) over an in-memory
attribute segment and prints, beside the seed's figures:

- Table 1: 1,000,000 attributes inserted in sorted key order (random 16-byte
  keys, sorted), in batches of 10, 100 and 1,000, three ways: without
  compaction; with seed 001's progressive compaction, one page a batch
  (``compaction_ratio=0``); and with the index's default, which moves more
  pages while their bytes stay under 1/8 of the batch's own.
- Table 2: 1,000,000 attributes bulk-loaded in sorted order in batches of
  100,000 (with the same compaction setting as the run), then every one of
  them updated once, in random order, in batches of 10, 100 and 1,000.

"Index size" is the attribute segment's length less the new root's
``min_offset``: what is left once the segment is head-truncated to the
lowest live page. MB are 10^6 bytes. The segment keeps only the pages the
current root still reaches (each update's ``obsolete`` pages are dropped) and
counts every byte ever appended, so a run that appends tens of GB needs
only the live pages in memory.

Then lookups on a warm index of 1,000,000 keys (the Table 2 tree): random
present keys, one ``get`` per key, with a node cache of 1 MiB (the root and
index pages stay, leaves come and go: at most one page read per lookup) and
with a cache that holds the whole tree. Each figure is min / median / max over
``--repeat`` runs with different keys (the seed's sizes come from one run).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import Spread
from engine.attributes.index import AttributeIndex, NodeCache
from engine.attributes.index.memory import LivePageStore
from engine.attributes.index.tree import COMPACTION_RATIO

MB = 1_000_000
MiB = 1024 * 1024
BATCHES = (10, 100, 1000)
BULK_BATCH = 100_000
# Seed 001, index size in MB: (without compaction, with progressive compaction).
# The runs of a row: no compaction, the seed's one page a batch, the index's default.
MODES: dict[str, float | None] = {"off": None, "one page": 0.0, "default": COMPACTION_RATIO}
SEED_TABLE1 = {10: (3_991, 115), 100: (416, 97), 1000: (60, 54)}
SEED_TABLE2 = {10: (32_990, 72), 100: (29_402, 103), 1000: (17_083, 91)}
SMALL_CACHE_BYTES = 1 * MiB
BIG_CACHE_BYTES = 512 * MiB
TREE_CACHE_BYTES = 256 * MiB


@dataclass
class SizeRun:
    table: int
    batch: int
    compaction: str
    index_mb: float
    appended_mb: float
    live_mb: float
    seconds: float
    changes_per_s: float



def _batches(keys: Sequence[bytes], size: int, value: Callable[[int], int]) -> Any:
    for at in range(0, len(keys), size):
        yield {k: value(at + i) for i, k in enumerate(keys[at : at + size])}


def _size_run(table: int, keys: list[bytes], batch: int, compaction: str, seed: int) -> tuple[SizeRun, Any]:
    store = LivePageStore()
    ratio = MODES[compaction]
    index = AttributeIndex(store.read, None, 0, compaction=ratio is not None, compaction_ratio=ratio or 0.0,
                           cache=NodeCache(BIG_CACHE_BYTES))
    start = time.perf_counter()
    if table == 1:
        for changes in _batches(keys, batch, lambda i: i):
            store.apply(index, changes)
        changed = len(keys)
    else:
        for changes in _batches(keys, BULK_BATCH, lambda i: i):
            store.apply(index, changes)
        start = time.perf_counter()
        appended_before = store.length
        shuffled = list(keys)
        random.Random(seed).shuffle(shuffled)
        for changes in _batches(shuffled, batch, lambda i: -i):
            store.apply(index, changes)
        changed = len(keys)
        assert store.length > appended_before
    seconds = time.perf_counter() - start
    root = index.root
    assert root is not None
    live = sum(len(p) for p in store.pages.values())
    run = SizeRun(
        table, batch, compaction,
        index_mb=(index.length - root.min_offset) / MB,
        appended_mb=index.length / MB,
        live_mb=live / MB,
        seconds=seconds,
        changes_per_s=changed / seconds,
    )
    return run, (store, index)


def _keys(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    keys = {rng.randbytes(16) for _ in range(count)}
    while len(keys) < count:
        keys.add(rng.randbytes(16))
    return sorted(keys)


@dataclass
class LookupRun:
    cache: str
    lookups_per_s: float
    reads_per_lookup: float
    max_reads_per_lookup: int


def _lookups(store: LivePageStore, index: AttributeIndex, keys: list[bytes], count: int, cache_bytes: int,
             label: str, seed: int) -> LookupRun:
    """Random present keys, one get each, on a reopened index warmed with as many lookups first."""
    root = index.root
    assert root is not None
    warm = AttributeIndex(store.read, root, index.length, cache=NodeCache(cache_bytes))
    rng = random.Random(seed)
    for key in rng.choices(keys, k=count):
        warm.get([key])
    sample = rng.choices(keys, k=count)
    reads_before = warm.page_reads
    most = 0
    start = time.perf_counter()
    for key in sample:
        before = warm.page_reads
        found = warm.get([key])
        most = max(most, warm.page_reads - before)
        assert key in found
    seconds = time.perf_counter() - start
    return LookupRun(label, count / seconds, (warm.page_reads - reads_before) / count, most)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _size_table(runs: list[SizeRun], table: int, seed_figures: dict[int, tuple[int, int]]) -> None:
    title = ("Table 1: insert in sorted order" if table == 1
             else "Table 2: bulk-load, then update all in random order")
    print(f"\n{title}")
    print(f"{'':>5} | {'no compaction':^48} | {'progressive compaction':^60} |")
    print(f"{'batch':>5} | {'appended':>20} {'seed':>6} {'truncated':>20} "
          f"| {'one page a batch':>20} {'default':>20} {'seed':>6} {'ratio':>5} "
          f"| {'changes/s: off / one page / default':>35}")
    for batch in BATCHES:
        off, one, on = ([r for r in runs if (r.table, r.batch, r.compaction) == (table, batch, mode)]
                        for mode in MODES)
        s_off, s_on = seed_figures[batch]
        worst = max(r.index_mb for r in on)
        rates = " / ".join(f"{statistics.median(r.changes_per_s for r in rs):,.0f}" for rs in (off, one, on))
        print(f"{batch:>5} | {_cell([r.appended_mb for r in off]):>20} {s_off:>6,} "
              f"{_cell([r.index_mb for r in off]):>20} "
              f"| {_cell([r.index_mb for r in one]):>20} {_cell([r.index_mb for r in on]):>20} {s_on:>6,} "
              f"{worst / s_on:>5.2f} | {rates:>35}")


def _cell(values: list[float]) -> str:
    """One figure, or min / median / max when runs differ."""
    spread = Spread.of(values)
    if spread.min == spread.max:
        return f"{spread.median:,.1f}"
    return spread.show("{:,.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 attributes instead of 1,000,000")
    parser.add_argument("--size-runs", type=int, default=1, help="runs of each table row (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="lookup runs (default 3)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    count = 100_000 if args.quick else 1_000_000
    lookups = 20_000 if args.quick else 100_000
    runs: list[SizeRun] = []
    tree = None
    for rep in range(args.size_runs):
        keys = _keys(count, seed=rep)
        for table in (1, 2):
            for batch in BATCHES:
                for compaction in MODES:
                    run, state = _size_run(table, keys, batch, compaction, seed=rep * 1000 + batch)
                    runs.append(run)
                    if rep == 0 and table == 2 and batch == BATCHES[-1] and compaction == "default":
                        tree = state, keys
                    progress(f"run {rep + 1}, table {table}, batch {batch}, compaction {compaction}: "
                              f"{run.index_mb:,.1f} MB after truncation, {run.appended_mb:,.1f} MB appended, "
                              f"{run.seconds:.1f} s")

    print(f"attribute index, {count:,} attributes, 32 KiB nodes, {args.size_runs} run(s) a row. "
          "MB = 10^6 bytes.\n'appended': every byte the runs appended (the segment never truncated); "
          "'truncated' and compaction:\nthe segment length less the root's min_offset, i.e. "
          "the size once head-truncated to the lowest live page.\n'ratio': default (max) / seed.")
    _size_table(runs, 1, SEED_TABLE1)
    _size_table(runs, 2, SEED_TABLE2)
    print(f"(Table 2 bulk-loads in sorted batches of {BULK_BATCH:,}; "
          "its sizes and rates are those of the updates.)")
    if args.quick:
        print("(--quick: 1/10 of the attributes; the seed's figures are for 1,000,000)")

    assert tree is not None
    (store, index), keys = tree
    labels = ("1 MiB cache", "whole tree cached")
    lookup_runs: dict[str, list[LookupRun]] = {label: [] for label in labels}
    for rep in range(args.repeat):
        for label, cache_bytes in zip(labels, (SMALL_CACHE_BYTES, TREE_CACHE_BYTES), strict=True):
            lookup_runs[label].append(_lookups(store, index, keys, lookups, cache_bytes, label, seed=rep))
    print(f"\nwarm lookups on {count:,} keys, one get per key, {lookups:,} a run after as many to warm, "
          f"min / median / max of {args.repeat} runs")
    summary: dict[str, Any] = {}
    for label, lruns in lookup_runs.items():
        rate = Spread.of([r.lookups_per_s for r in lruns])
        reads = Spread.of([r.reads_per_lookup for r in lruns])
        most = max(r.max_reads_per_lookup for r in lruns)
        summary[label] = {"lookups_per_s": asdict(rate), "reads_per_lookup": asdict(reads), "max_reads": most}
        print(f"  {label:>18}: {rate.show()} lookups/s, page reads a lookup {reads.show('{:.3f}')} "
              f"(at most {most} in one lookup)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"python": platform.python_version(), "count": count,
                       "sizes": [asdict(r) for r in runs], "lookups": summary}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
