"""Reads on OS threads while the commit path appends, merges and the cache evicts to Tier 2.

A reader that sees a length must find every byte below it in the read
index or in Tier 2: the commit puts an append's bytes (and a merge's) in
the read index before it makes the length that covers them visible.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from engine import SegmentStore, SegstoreError
from tests.conftest import random_seed
from tests.engine.conftest import Node
from tests.polling import wait_until

RUN_S = 1.5
READERS = 3


def pattern(offset: int, length: int) -> bytes:
    """The bytes the test writes at ``offset``: each one says where it is."""
    return bytes((offset + k) % 251 for k in range(length))


def write(store: SegmentStore, stop: threading.Event, rng: random.Random) -> None:
    """Appends, and now and then a transaction committed (a merge), all laid out by ``pattern``."""
    length = store.info("s").length
    while not stop.is_set():
        size = rng.randrange(1, 3000)
        if rng.random() < 0.1:
            txid = store.open_transaction("s")
            store.append_transaction("s", txid, pattern(length, size))
            length += store.commit_transaction("s", txid).length
        else:
            length = store.append("s", pattern(length, size)).info.length


def read(store: SegmentStore, stop: threading.Event, rng: random.Random, checked: list[int]) -> None:
    while not stop.is_set():
        length = store.info("s").length
        if not length:
            continue
        # Mostly the newest bytes (where a commit races the read), else anywhere (Tier 2 too).
        offset = max(0, length - rng.randrange(1, 64)) if rng.random() < 0.8 else rng.randrange(length)
        result = store.read("s", offset, rng.randrange(1, 8192))
        assert result.data == pattern(offset, len(result.data)), f"wrong bytes at {offset}"
        checked[0] += len(result.data)


@pytest.mark.slow
def test_reads_on_os_threads_never_see_a_length_before_its_bytes(make_node: Callable[..., Node]) -> None:
    seed = random_seed()
    node = make_node(cache_max_bytes=64 * 1024, storage_read_block_bytes=4096, read_ahead_bytes=0)
    store = node.store
    store.create("s")
    stop = threading.Event()
    errors: list[BaseException] = []
    checked = [0]

    def run(target: Callable[..., None], *args: object) -> None:
        try:
            target(*args)
        except (SegstoreError, AssertionError) as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(write, store, stop, random.Random(seed)))]
    threads += [
        threading.Thread(target=run, args=(read, store, stop, random.Random(seed + i), checked))
        for i in range(1, READERS + 1)
    ]
    for thread in threads:
        thread.start()
    time.sleep(RUN_S)
    # On a busy machine the threads may need longer to read something, some of it from Tier 2.
    wait_until(
        lambda: stop.is_set()
        or (checked[0] > 0 and node.metric("segstore_cache_reads_total", {"result": "miss"}) > 0),
        "the readers read bytes, some of them from Tier 2",
        timeout_s=60,
    )
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not errors, f"seed {seed}: {errors[0]!r}"
    assert checked[0] > 0
    assert node.metric("segstore_cache_reads_total", {"result": "miss"}) > 0
