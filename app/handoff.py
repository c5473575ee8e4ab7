"""Handing a keep-alive connection to the process that serves its requests (docs/design.md).

A client that does not know owners sends to the node's public port, and the
process that accepted its connection passes every request for a container of
a sibling process over the local hop (app/hop.py): two processes' work for
one request. Once such a request is answered, the connection itself is
passed to that sibling, between two requests: the file descriptor goes over
a Unix datagram socket (``SCM_RIGHTS``) beside the sibling's hop socket, and
the sibling serves what follows on the connection on its own listener
(app/private_listener.py ``adopt``), so a client that sends on to the same
segment is served by its owner alone. A connection whose first request was
answered where it was accepted moves to that process's own listener (a
duplicate of its descriptor): its parser costs less a request than the
public port's. The client sees nothing: the TCP connection is the same.

A connection moves at most once: only the public port's worker
(app/worker.py) passes one, and a process's own listener does not. It stays
where it is when it cannot move without loss: bytes of a next request
already read, a TLS connection, and while gunicorn writes an access log (the
other listener writes none); a sibling that does not take it (gone, or its
queue still full after a short wait) leaves it to the accepting process's own
listener.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable

from engine import run_blocking

log = logging.getLogger(__name__)

# In the environ of a request on a connection passed here: its answer names this process
# (``Segment-Owner``), since its client sent it to the public port and cannot tell who answers.
ADOPTED = "segstore.adopted"
# The sibling a request of this connection was forwarded to: greenlet-local under gevent.
_marks = threading.local()
_SUFFIX = ".conn.sock"
_NOTE = b"c"
_QUEUE_BYTES = 64 * 1024
# The longest a connection waits for room in its receiver's queue (a few passes: net.unix.max_dgram_qlen).
_SEND_WAIT_S = 0.05


def address_beside(hop_address: str) -> str:
    """Where the process with the hop socket ``hop_address`` takes connections."""
    return hop_address.removesuffix(".sock") + _SUFFIX


def suggest(hop_address: str) -> None:
    """Say that this connection's request was answered by the process with this hop socket."""
    _marks.target = hop_address


def clear() -> None:
    """Forget what an earlier request of this connection suggested."""
    _marks.target = None


def suggested() -> str | None:
    """The hop socket the last request suggested passing this connection to, if any (and forget it)."""
    target: str | None = getattr(_marks, "target", None)
    _marks.target = None
    return target


def send(hop_address: str, conn: socket.socket) -> bool:
    """Pass ``conn`` to the process with hop socket ``hop_address``; False if it did not take it.

    Waits at most ``_SEND_WAIT_S`` for room in the receiver's queue (a burst
    of new connections): a sibling that is gone, not taking connections or
    behind leaves the connection here. Once this returns True the connection
    is the sibling's: close this process's descriptor without shutting it down.
    """
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [conn.fileno()]))]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.settimeout(_SEND_WAIT_S)
        try:  # connected: a wait for room is a wait for the receiver's queue, not this socket's
            out.connect(address_beside(hop_address))
            sent = out.sendmsg([_NOTE], rights)
        except OSError as exc:
            log.debug("connection kept: %s does not take it (%s)", hop_address, exc)
            return False
    return sent == len(_NOTE)  # gevent's sendmsg answers 0 for a queue still full after its wait


class Receiver:
    """A process's datagram socket that takes connections passed by its siblings."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self._sock = sock
        self.address = address

    @classmethod
    def bind(cls, hop_address: str) -> Receiver | None:
        """A socket beside the hop socket ``hop_address`` (same folder and rights), or None if unusable."""
        address = address_beside(hop_address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            run_blocking(_bind, sock, address)
        except OSError as exc:
            sock.close()
            log.warning("connections are not passed to this process: cannot bind %s (%s)", address, exc)
            return None
        return cls(sock, address)

    def start(self, adopt: Callable[[socket.socket, object], None]) -> None:
        """Serve each connection passed here with ``adopt(conn, client_address)``."""
        threading.Thread(target=self._receive, args=(adopt,), name="handoff", daemon=True).start()

    def close(self) -> None:
        """Take no more connections (one passed meanwhile is closed: its client connects again)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(OSError):
            run_blocking(os.unlink, self.address)

    def _receive(self, adopt: Callable[[socket.socket, object], None]) -> None:
        while True:
            try:
                note, fds, _, _ = socket.recv_fds(self._sock, len(_NOTE), 1)
            except OSError:
                return  # closed
            if not note and not fds:
                return  # shut down
            for fd in fds:
                conn = socket.socket(fileno=fd)
                try:
                    peer = conn.getpeername()
                except OSError:  # the client went meanwhile
                    conn.close()
                    continue
                adopt(conn, peer)


def _bind(sock: socket.socket, address: str) -> None:
    """Bind in the hop socket's folder (0700; a killed process's socket is removed as its hop socket is)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _QUEUE_BYTES)
    sock.bind(address)
    os.chmod(address, 0o600)
