"""GroupSync: one sync round covers the Tier 1 writes of every container, and none returns early."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine import Settings
from engine.naming import container_for
from engine.store.segment_store import SegmentStore
from engine.tier1.file_log import FileDataLog
from engine.tier1.group_sync import GroupSync, sync_files


class SlowSync:
    """A sync that takes a while and records what each round made durable."""

    def __init__(self, written: set[int], seconds: float = 0.005) -> None:
        self.written = written
        self.durable: set[int] = set()
        self.seconds = seconds
        self.fail_round: int | None = None
        self.rounds = 0

    def __call__(self, fds: Sequence[int]) -> int:
        covered = set(self.written)  # what was written before this round began
        time.sleep(self.seconds)
        self.rounds += 1
        if self.rounds == self.fail_round:
            raise OSError(errno.EIO, "injected")
        self.durable |= covered
        return 1


def test_a_caller_returns_only_after_a_sync_that_began_after_its_write() -> None:
    written: set[int] = set()
    fake = SlowSync(written)
    group = GroupSync(fake)
    early: list[int] = []

    def writer(i: int) -> None:
        for n in range(20):
            key = i * 1000 + n
            group.write(lambda key=key, i=i: (written.add(key), i)[1], lambda: None)
            if key not in fake.durable:
                early.append(key)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    group.close()
    assert early == []
    assert group.writes == 160
    assert group.rounds == fake.rounds
    assert group.rounds < group.writes / 2  # the writers of eight "containers" shared rounds


def test_a_round_waits_for_the_writers_of_the_previous_one() -> None:
    """Two containers woken by one round come back at different times: the next round takes both."""

    def slow_sync(fds: Sequence[int]) -> int:
        time.sleep(0.003)
        return 1

    group = GroupSync(slow_sync)

    def writer(delay: float, fd: int) -> None:
        for _ in range(30):
            time.sleep(delay)  # the container's own work between two writes
            group.write(lambda: fd, lambda: None, writer=fd)

    threads = [threading.Thread(target=writer, args=args) for args in ((0.0, 1), (0.001, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    group.close()
    assert group.writes == 60
    assert group.rounds <= 40  # alone, the quick writer would start every round without the slow one


def test_only_steady_writers_are_waited_for() -> None:
    """A writer seen in one round (a container's occasional bookkeeping) does not hold the next ones."""
    group = GroupSync(lambda fds: 1)
    group.write(lambda: 1, lambda: None, writer="steady")
    group.write(lambda: 2, lambda: None, writer="once")
    group.write(lambda: 1, lambda: None, writer="steady")
    assert group._expected == {id("steady")}  # the next round waits for it alone
    group.write(lambda: 2, lambda: None, writer="once")
    group.write(lambda: 2, lambda: None, writer="once")
    assert group._expected == {id("once")}  # two of the last three rounds: steady now
    group.close()


def test_a_failed_round_fails_every_write_it_covered_and_the_next_round_works() -> None:
    fake = SlowSync(set(), seconds=0.05)
    fake.fail_round = 1
    group = GroupSync(fake)
    outcomes: list[str] = []
    undone: list[int] = []
    lock = threading.Lock()

    def writer(fd: int) -> None:
        try:
            group.write(lambda: fd, lambda: undone.append(fd))
            result = "ok"
        except OSError as exc:
            result = f"error {exc.errno}"
        with lock:
            outcomes.append(result)

    first = threading.Thread(target=writer, args=(1,))
    first.start()
    while group.writes == 0:
        time.sleep(0.001)
    first.join(10)
    assert outcomes == [f"error {errno.EIO}"]
    assert undone == [1]  # cut off on the round thread
    group.write(lambda: 2, lambda: undone.append(2))  # the next round works
    assert undone == [1]
    group.close()
    with pytest.raises(OSError):
        group.write(lambda: 3, lambda: None)


def test_a_write_that_fails_fails_alone_and_is_cut_off() -> None:
    syncs: list[list[int]] = []
    group = GroupSync(lambda fds: syncs.append(list(fds)) or 1)
    undone: list[int] = []
    errors: list[int] = []
    ready = threading.Barrier(3)

    def failing() -> int:
        raise OSError(errno.ENOSPC, "full")

    def writer(fd: int) -> None:
        ready.wait()
        try:
            group.write(failing if fd == 7 else (lambda: fd), lambda: undone.append(fd))
        except OSError as exc:
            errors.append(exc.errno)

    threads = [threading.Thread(target=writer, args=(fd,)) for fd in (5, 6, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    group.close()
    assert errors == [errno.ENOSPC]
    assert undone == [7]
    assert sorted(fd for fds in syncs for fd in fds) == [5, 6]


def test_sync_files_makes_writes_durable_with_one_call_for_a_file_system(tmp_path: Path) -> None:
    fds = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT) for i in range(3)]
    try:
        for fd in fds:
            os.write(fd, b"x")
        assert sync_files(fds) in (1, 3)  # syncfs where it reports errors, else one fdatasync each
    finally:
        for fd in fds:
            os.close(fd)


def test_a_file_log_write_whose_sync_fails_is_cut_off(tmp_path: Path) -> None:
    group = GroupSync(lambda fds: (_ for _ in ()).throw(OSError(errno.EIO, "injected")))
    data_log = FileDataLog(tmp_path / "c0", file_bytes=1 << 20, group=group)
    list(data_log.recover())
    with pytest.raises(OSError):
        data_log.append(b"lost")
    data_log.close()
    group.close()
    assert [f.stat().st_size for f in (tmp_path / "c0").iterdir()] == [0]
    again = FileDataLog(tmp_path / "c0", file_bytes=1 << 20)
    assert list(again.recover()) == []
    again.close()


def test_appends_to_every_container_share_sync_rounds(tmp_path: Path) -> None:
    store = SegmentStore(Settings(data_dir=str(tmp_path), container_count=4))
    store.start(wait=True)
    try:
        names = [f"s{i}" for i in range(40)]
        by_container: dict[int, str] = {}
        for name in names:
            by_container.setdefault(container_for(name, 4), name)
        assert len(by_container) == 4
        for name in by_container.values():
            store.create(name)
        before = store._tiers.file_syncs.writes

        def writer(name: str) -> None:
            for _ in range(50):
                store.append(name, b"x" * 100)

        threads = [threading.Thread(target=writer, args=(n,)) for n in by_container.values() for _ in "abcd"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        group = store._tiers.file_syncs
        assert group.writes - before >= 4
        assert group.rounds < group.writes  # rounds covered writes of several containers
        for name in by_container.values():
            assert store.info(name).length == 4 * 50 * 100
        text = store.registry.get_sample_value("segstore_tier1_synced_writes_total")
        assert text == group.writes
    finally:
        store.close()
    reopened = SegmentStore(Settings(data_dir=str(tmp_path), container_count=4))
    reopened.start(wait=True)
    try:
        for name in by_container.values():
            assert reopened.read(name, 0, 1 << 20).data == b"x" * 20000
    finally:
        reopened.close()
