"""The processes of one node: slots held for life, a dead member's leases free at once, the folder shared.

The coordinator part runs on a fake clock over in-memory registers; the
slots on real processes, whose death is what frees a slot.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from engine import SegmentStore, Settings
from engine.cluster import processes
from engine.cluster.coordinator import Coordinator
from engine.cluster.processes import ProcessSlot, member_id, slot_free
from engine.cluster.registers import MemoryRegisters
from engine.errors import StoreLocked
from engine.naming import node_register_name
from tests.engine.cluster.test_coordinator import LEASE_S, Clock, Host


def member(registers: MemoryRegisters, clock: Clock, node: str, gone: set[str]) -> tuple[Coordinator, Host]:
    host = Host(node, registers)
    coordinator = Coordinator(
        registers, node_id=node, url=f"http://{node}", container_count=4, host=host, lease_s=LEASE_S,
        clock=clock, gone=lambda other: other == node or other in gone,
    )
    coordinator.join()
    return coordinator, host


def test_a_dead_members_leases_are_claimed_at_once_not_after_they_run_out() -> None:
    registers, clock, gone = MemoryRegisters(), Clock(), set[str]()
    p0, host0 = member(registers, clock, "p0", gone)
    p1, host1 = member(registers, clock, "p1", gone)
    for _ in range(12):  # p0 takes all first, then hands two over once they settled
        clock.now += LEASE_S / 3
        p0.tick()
        p1.tick()
    assert len(host0.running) == len(host1.running) == 2
    gone.add("p1")  # killed: the kernel dropped its slot's lock
    clock.now += 0.1
    p0.tick()
    assert host0.running == {0, 1, 2, 3}
    assert all(p0.holds(c) for c in range(4))


def test_a_restarted_member_takes_its_earlier_runs_leases_back_at_its_first_round() -> None:
    registers, clock, gone = MemoryRegisters(), Clock(), set[str]()
    p0, _ = member(registers, clock, "p0", gone)
    p1, _ = member(registers, clock, "p1", gone)
    for _ in range(12):
        clock.now += LEASE_S / 3
        p0.tick()
        p1.tick()
    held = set(p1.held())
    assert len(held) == 2
    again, host = member(registers, clock, "p1", gone)  # the same slot, so the same id; p0 has not looked yet
    clock.now += 0.1
    again.tick()
    assert host.running == held


def test_a_paused_member_keeps_its_leases_until_they_run_out() -> None:
    registers, clock, gone = MemoryRegisters(), Clock(), set[str]()
    p0, host0 = member(registers, clock, "p0", gone)
    p1, _ = member(registers, clock, "p1", gone)
    for _ in range(12):
        clock.now += LEASE_S / 3
        p0.tick()
        p1.tick()
    clock.now += 0.1
    p0.tick()  # p1 is alive (its slot is locked) but silent: nothing moves before its leases run out
    assert len(host0.running) == 2


def _hold_slot(data: str, processes: int, taken: multiprocessing.Queue) -> None:
    slot = ProcessSlot(Path(data), processes)
    try:
        slot.take()
    except StoreLocked as exc:
        taken.put(str(exc))
        return
    taken.put(slot.slot)
    signal.pause()  # held until killed


def test_slots_are_held_for_life_and_a_restarted_process_takes_the_dead_ones(tmp_path: Path) -> None:
    taken: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_hold_slot, args=(str(tmp_path), 2, taken)) for _ in range(3)]
    try:
        for proc in procs[:2]:
            proc.start()
        slots = sorted([taken.get(timeout=30), taken.get(timeout=30)])
        assert slots == [0, 1]
        assert not slot_free(tmp_path, 0) and not slot_free(tmp_path, 1)
        procs[2].start()
        assert "slots" in taken.get(timeout=30)  # a third process of a two-process server is refused
        first = int((tmp_path / "processes" / "slot-0").read_text())
        os.kill(first, signal.SIGKILL)
        next(p for p in procs if p.pid == first).join(30)
        assert slot_free(tmp_path, 0)
        again = multiprocessing.Process(target=_hold_slot, args=(str(tmp_path), 2, taken))
        procs.append(again)
        again.start()
        assert taken.get(timeout=30) == 0  # the dead one's slot, so its member id
        assert member_id(0) == "p0"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(30)


def test_another_server_is_refused_the_folder(tmp_path: Path) -> None:
    (tmp_path / "LOCK").write_text("1\n")  # a server whose pid is not our parent's
    taken: multiprocessing.Queue = multiprocessing.Queue()
    holder = multiprocessing.Process(target=_hold_slot, args=(str(tmp_path), 2, taken))
    holder.start()
    try:
        assert taken.get(timeout=30) == 0  # the folder was free: the first process records its server
        slot = ProcessSlot(tmp_path, 2)
        with pytest.raises(StoreLocked, match="another server"):
            slot.take()  # this process's parent is not the holder's
    finally:
        holder.kill()
        holder.join(30)


def test_a_sibling_holding_the_folder_alone_for_a_moment_as_it_starts_is_waited_for(tmp_path: Path) -> None:
    """flock turns an exclusive lock into a shared one by dropping it first: a sibling starting
    alongside finds it exclusive for a moment, which is not a single-process server's."""
    lock = tmp_path / "LOCK"
    lock.write_text(f"{os.getppid()}\n")  # this process's server
    sibling = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(sibling, fcntl.LOCK_EX)
        threading.Timer(0.3, fcntl.flock, (sibling, fcntl.LOCK_SH)).start()
        slot = ProcessSlot(tmp_path, 2)
        slot.take()
        assert slot.member == "p0"
        slot.close()
    finally:
        os.close(sibling)


def test_a_folder_held_alone_past_the_wait_is_a_single_process_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "SHARE_WAIT_S", 0.2)
    server = os.open(tmp_path / "LOCK", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(server, fcntl.LOCK_EX)  # as a single-process server holds it, for its lifetime
        began = time.monotonic()
        with pytest.raises(StoreLocked, match="single-process server"):
            ProcessSlot(tmp_path, 2).take()
        assert 0.2 <= time.monotonic() - began < 2
    finally:
        os.close(server)


def test_a_process_waits_for_its_siblings_before_its_first_round(tmp_path: Path) -> None:
    taken: multiprocessing.Queue = multiprocessing.Queue()
    sibling = multiprocessing.Process(target=_hold_slot, args=(str(tmp_path), 2, taken))
    sibling.start()
    try:
        assert taken.get(timeout=30) == 0
        (tmp_path / "LOCK").write_text(f"{os.getppid()}\n")  # this process joins the child's server
        slot = ProcessSlot(tmp_path, 2)
        slot.take()
        assert slot.member == "p1"
        registers = MemoryRegisters()
        registers.create(node_register_name("other"), b"{}")  # another node's record does not count
        began = time.monotonic()
        slot.wait_for_the_others(registers, timeout_s=0.5)
        assert time.monotonic() - began >= 0.5  # p0 has not announced itself
        registers.create(node_register_name("p0"), b"{}")
        began = time.monotonic()
        slot.wait_for_the_others(registers, timeout_s=5)
        assert time.monotonic() - began < 1
        slot.close()
    finally:
        sibling.kill()
        sibling.join(30)


def test_a_process_whose_container_finds_tier2_refusing_us_says_why(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """As one process does, a process of a node gives the refusal its server exits with, not a retry."""
    settings = Settings(
        data_dir=str(tmp_path), processes=2, container_count=2, lease_s=1.0,
        tier2="s3://no-such-bucket-here/data", s3_endpoint=moto_endpoint,
    )
    store = SegmentStore(settings)
    store.start()
    try:
        refused: list[str | None] = []
        waiter = threading.Thread(target=lambda: refused.append(store.wait_refusal()), daemon=True)
        waiter.start()
        waiter.join(30)
        assert refused and refused[0] is not None, "no refusal"
        assert "NoSuchBucket" in refused[0] and "cannot be used" in refused[0]
    finally:
        store.close()
