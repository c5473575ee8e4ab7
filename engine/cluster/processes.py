"""The processes of one node: each is a cluster member named after a slot it holds in the data folder.

docs/design.md "Processes per node": with local Tier 1 and Tier 2, a node runs
``processes`` server processes over one data folder, and they split its
containers with the cluster's lease rules, the registers kept as files in
``<data>/cluster`` (``FolderRegisters``). Each process holds a POSIX lock on
``<data>/processes/slot-<i>`` for as long as it lives, the first slot free
when it started; its member id is ``p<i>``, so a process the server starts
in place of a dead one takes the dead one's slot and id. The kernel drops
the lock when its holder dies, whatever way it dies, so another process
tells a dead member from a live or paused one at once (``member_gone``):
a dead member's leases are free without waiting for them to run out, and
a restarted process takes its earlier run's leases back at its first round.

The data folder's ``LOCK`` is shared by the processes of one server: the
first records its server's pid (the processes' parent), the others check
it, and a process of another server is refused (``StoreLocked``).
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.blocking import run_blocking
from engine.errors import StoreLocked
from engine.naming import FOLDER_LOCK_NAME, node_prefix, parse_node_register_name

if TYPE_CHECKING:  # registers.py imports boto3, which gunicorn's arbiter must not load (see tiers.py)
    from engine.cluster.registers import Registers

SLOTS = "processes"
REGISTERS = "cluster"
_MEMBER_PREFIX = "p"
# The longest a starting process waits for the folder's lock to be shared before it takes the
# exclusive holder for a single-process server.
SHARE_WAIT_S = 3.0
# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (and padding to 32 bytes).
_FLOCK = "hhqqi4x"


def member_id(slot: int, node: str = "") -> str:
    """The member id of slot ``slot``: ``p<i>``, or ``<node>.p<i>`` for a cluster node's processes."""
    return f"{node}.{_MEMBER_PREFIX}{slot}" if node else f"{_MEMBER_PREFIX}{slot}"


def slot_of(member: str, node: str = "") -> int | None:
    """The slot of ``member`` if it is one of ``node``'s processes (``member_id``'s inverse), else None."""
    head = f"{node}.{_MEMBER_PREFIX}" if node else _MEMBER_PREFIX
    rest = member[len(head):]
    return int(rest) if member.startswith(head) and rest.isdigit() else None


def _slot_path(data: Path, slot: int) -> Path:
    return data / SLOTS / f"slot-{slot}"


class ProcessSlot:
    """This process's slot, held until ``close`` or death, and the folder's shared lock."""

    def __init__(self, data: Path, processes: int, node: str = "") -> None:
        assert processes >= 2
        self.data = Path(data)
        self.processes = processes
        self.node = node  # a cluster node's id (Tier 1 on S3), or "" for the only node of its machine
        self.slot = -1
        self._slot_fd: int | None = None
        self._folder_fd: int | None = None

    @property
    def member(self) -> str:
        return member_id(self.slot, self.node)

    def sibling(self, member: str) -> bool:
        """Whether ``member`` is another process of this node."""
        return member != self.member and slot_of(member, self.node) is not None

    def take(self) -> None:
        """Share the folder with this server's other processes, and hold the first free slot.

        StoreLocked when another server holds the folder, or every slot is
        held (more processes than ``processes`` run on it). A sibling holds
        the folder's lock exclusively for a moment as it starts (its pid
        written, then the lock converted to shared, which flock does not do
        atomically): only a lock held so for ``SHARE_WAIT_S`` is a
        single-process server's.
        """
        deadline = time.monotonic() + SHARE_WAIT_S
        while True:
            try:
                run_blocking(self._take)
                return
            except _HeldExclusively:
                if time.monotonic() >= deadline:
                    why = f"a single-process server owns the data directory {self.data}"
                    raise StoreLocked(why) from None
                time.sleep(0.01)

    def _take(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self._share_folder()
        (self.data / SLOTS).mkdir(exist_ok=True)
        for slot in range(self.processes):
            fd = os.open(_slot_path(self.data, slot), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self.slot, self._slot_fd = slot, fd
            return
        self.close()
        raise StoreLocked(
            f"all {self.processes} process slots of {self.data} are held: is another server on it?"
        )

    def _share_folder(self) -> None:
        """Hold ``LOCK`` shared; the first process of a server writes the server's pid into it."""
        server = os.getppid()
        fd = os.open(self.data / FOLDER_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # held by this server's other processes, or by another server
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{server}\n".encode(), 0)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # from exclusive: converted
            except BlockingIOError:
                raise _HeldExclusively from None
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            if holder != str(server):
                raise StoreLocked(
                    f"another server (pid {holder or 'unknown'}) owns the data directory {self.data}: "
                    "stop it, or set SEGSTORE_DATA_DIR to another folder"
                )
        except BaseException:
            os.close(fd)
            raise
        self._folder_fd = fd

    def member_gone(self, member: str) -> bool:
        """Whether no process runs as ``member`` now but, perhaps, this one (its slot is not locked).

        A paused process still holds its lock: only death frees it.
        """
        if member == self.member:
            return True  # this process holds the slot: an earlier run under this id is dead
        slot = slot_of(member, self.node)
        return slot is not None and run_blocking(slot_free, self.data, slot)

    def wait_for_the_others(self, registers: Registers, timeout_s: float) -> None:
        """Wait until every slot is held and the other members announced themselves, or ``timeout_s``.

        The server starts its processes together: a process whose first round
        saw itself alone would claim every container, and hand half of them
        over only once they settled (three leases later).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            others_slots = [s for s in range(self.processes) if s != self.slot]  # (closing our own drops it)
            slots_held = not any(run_blocking(slot_free, self.data, s) for s in others_slots)
            names = (parse_node_register_name(name) for name in registers.names(node_prefix()))
            siblings = [member for member in names if member is not None and self.sibling(member)]
            if slots_held and len(siblings) >= self.processes - 1:
                return
            time.sleep(0.02)

    def close(self) -> None:
        for fd in (self._slot_fd, self._folder_fd):
            if fd is not None:
                os.close(fd)
        self._slot_fd = self._folder_fd = None


class _HeldExclusively(Exception):
    """The folder's lock is held exclusively: by a single-process server, or a sibling starting."""


def slot_free(data: Path, slot: int) -> bool:
    """Whether no process holds slot ``slot``'s lock (asked with F_GETLK: nothing is taken).

    Never for the caller's own slot: closing the file there would drop its lock (POSIX locks).
    """
    try:
        fd = os.open(_slot_path(data, slot), os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        asked = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, asked)
    finally:
        os.close(fd)
    return struct.unpack(_FLOCK, answer)[0] == fcntl.F_UNLCK
