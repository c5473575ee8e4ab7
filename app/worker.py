"""The gunicorn worker segstore runs: gevent's, stopping as soon as it is told to.

gunicorn's gevent worker looks at its ``alive`` flag once a second, and once
stopping, at its open connections once a second too: a graceful stop (SIGTERM,
a restart, a hand-over of a node's containers as it leaves) took one to two
seconds however idle the process. This one wakes at once when ``alive`` turns
false and exits as soon as the last connection ends, within
``graceful_timeout``: the public port's and those of the process's own
listener (app/private_listener.py). A connection answered once the stop began ends after its
answer (gunicorn's would wait for its ``keepalive``); idle keep-alive connections open before
still count as open until their ``keepalive`` runs out, as with gunicorn's own.

In a node of several processes it also moves each keep-alive connection,
after its first answer, to a process's own listener: the one its request was
forwarded to, or its own (app/handoff.py).
"""

from __future__ import annotations

import os
import socket
import time
from functools import partial
from typing import Any

from gevent.event import Event
from gevent.pool import Pool
from gevent.server import StreamServer
from gunicorn.sock import ssl_context
from gunicorn.workers.ggevent import GeventWorker

from app import handoff

# gunicorn's heartbeat: a worker that has not notified the arbiter for ``timeout`` is killed.
_NOTIFY_EVERY_S = 1.0
_DRAIN_BYTES = 8192


class Worker(GeventWorker):
    """``GeventWorker`` whose waits end when ``alive`` turns false or its last connection ends."""

    _stopping: Event | None = None

    @property
    def alive(self) -> bool:
        return self._alive

    @alive.setter
    def alive(self, value: bool) -> None:
        self._alive = value
        if not value and self._stopping is not None:
            self._stopping.set()

    def run(self) -> None:
        """Serve every listener until told to stop, then wait for the connections open at that moment."""
        self._stopping = Event()
        if not self.alive:
            self._stopping.set()
        ssl_args: dict[str, Any] = {"ssl_context": ssl_context(self.cfg)} if self.cfg.is_ssl else {}
        servers: list[StreamServer] = []
        for sock in self.sockets:
            sock.setblocking(1)
            pool = Pool(self.worker_connections)
            server = StreamServer(sock, handle=partial(self.handle, sock), spawn=pool, **ssl_args)
            if self.cfg.workers > 1:
                server.max_accept = 1
            server.start()
            servers.append(server)
        while self.alive:
            self.notify()
            self._stopping.wait(_NOTIFY_EVERY_S)
        extensions = getattr(self.wsgi, "extensions", {})
        receiver = extensions.get("segstore.handoff")
        if receiver is not None:  # no connection comes from a sibling any more
            receiver.close()
        private = extensions.get("segstore.private")
        if private is not None:  # this process's own listener: owner-aware clients, passed connections
            servers.append(private)
        for server in servers:
            server.close()
        deadline = time.monotonic() + self.cfg.graceful_timeout
        for server in servers:
            while not server.pool.join(timeout=max(0.0, min(_NOTIFY_EVERY_S, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    self.log.warning("Worker graceful timeout (pid:%s)", self.pid)
                    for each in servers:
                        each.stop(timeout=1)
                    return
                self.notify()

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> None:
        """gunicorn's; then the connection ends if the worker is stopping, else, in a node of several
        processes, moves (app/handoff.py).

        To the sibling a request on it was forwarded to, else (or if that one
        does not take it) to this process's own listener, which costs less a
        request than gunicorn's parser. gunicorn's raises StopIteration where
        the connection ends after the answer.
        """
        handoff.clear()
        super().handle_request(listener_name, req, sock, addr)
        if not self.alive:  # told to stop during the answer: no keep-alive wait holds the stop
            if _at_rest(req):  # else the next request, read already, is answered here
                raise StopIteration
            return
        target = handoff.suggested()
        own = getattr(self.wsgi, "extensions", {}).get("segstore.private")
        # Kept with TLS (its state is this process's) and with gunicorn's access log, which would
        # miss the requests the other listener answers.
        if own is None or self.cfg.is_ssl or self.cfg.accesslog or not _at_rest(req):
            return
        if target is None or not handoff.send(target, sock):
            try:
                mine = socket.socket(fileno=os.dup(sock.fileno()))
            except OSError:  # out of descriptors: it stays here
                return
            own.adopt(mine, addr)
        raise StopIteration  # gunicorn's loop ends and closes its descriptor only


def _at_rest(req: Any) -> bool:
    """Whether the connection is between two requests: the body read to its end, nothing read past it."""
    while req.body.read(_DRAIN_BYTES):  # what gunicorn's parser would read before the next request
        pass
    return not req.unreader.buf.getbuffer().nbytes
