"""The local hop: a request handed to its container's owner on the same machine over a Unix socket.

Each cluster node also listens on a Unix socket in its run folder and
publishes its path in its node record with what identifies its machine
(docs/cluster.md "The local hop"). A node that forwards a request to an
owner on the same machine sends it there (``HopClient``, used by
``app/forwarding.py``) as frames (``app/hop_frames.py``): the request's WSGI
variables as its own server parsed them, then its body, and gets the answer
back piece by piece as the owner's app yields it. The owner (``HopServer``)
runs the request through its WSGI app directly, one thread per connection
(a greenlet under gunicorn's gevent worker), so no HTTP is parsed twice.
Connections stay open for the next request.

The socket's folder is ``$RUNTIME_DIRECTORY`` (systemd's ``RuntimeDirectory=``)
or ``<temp dir>/segstore-<uid>``: on the machine's own file system, with a
short path (a Unix socket's is at most 107 bytes), made 0700 and refused
unless this user owns it; the socket itself is 0600. Its name holds the
process id, so processes on one machine never share one, and a socket left
by a killed process is removed by the next one to start.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import socket
import stat
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from app.errors import MalformedBody
from app.hop_frames import (
    ANSWER,
    BROKEN,
    DATA,
    END,
    REQUEST,
    AnswerHead,
    FrameError,
    RequestHead,
    broken_frame,
    data_frames,
    expect_frame,
    frame,
    read_frame,
)
from engine import run_blocking

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_BACKLOG = 128
# Idle connections a forwarder keeps per owner; more are closed after their exchange.
_IDLE_PER_OWNER = 64
_END = frame(END)


def this_machine() -> str:
    """What tells this machine from another: host name and boot id ("" where there is no boot id).

    Two nodes that publish the same value reach each other's run folder.
    The boot id changes at every boot; the host name tells containers on
    one kernel apart, which share its boot id but not their file systems.
    """
    try:
        boot_id = run_blocking(_BOOT_ID.read_text).strip()
    except OSError:
        return ""
    return f"{socket.gethostname()} {boot_id}" if boot_id else ""


def run_folder() -> Path:
    """Where this server's Unix socket goes: systemd's runtime directory, else one in the temp dir."""
    given = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(given) if given else Path(tempfile.gettempdir()) / f"segstore-{os.getuid()}"


class HopServer:
    """A node's Unix socket: runs each request that comes over it through ``app``."""

    def __init__(self, listener: socket.socket, address: str) -> None:
        self._listener = listener
        self.address = address
        self._app: WsgiApp | None = None

    @classmethod
    def bind(cls, folder: Path | None = None) -> HopServer | None:
        """A socket bound and listening in ``folder`` (default ``run_folder()``), or None if unusable."""
        folder = folder or run_folder()
        path = str(folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.sock")
        # Made here, not in run_blocking's thread: under gevent a socket waits on its maker's hub.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            run_blocking(_bind, listener, folder, path)
        except OSError as exc:
            listener.close()
            log.warning("no local hop: cannot listen in %s (%s); requests come over HTTP", folder, exc)
            return None
        listener.listen(_BACKLOG)
        return cls(listener, path)

    def start(self, app: WsgiApp) -> None:
        """Serve requests that come over the socket with ``app`` (the node's whole WSGI stack)."""
        self._app = app
        threading.Thread(target=self._accept, name="hop", daemon=True).start()

    def close(self) -> None:
        """Stop taking connections and remove the socket (exchanges under way go on)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with contextlib.suppress(OSError):
            run_blocking(os.unlink, self.address)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="hop-exchange", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            try:
                while self._exchange(conn, stream):
                    pass
            except (FrameError, OSError) as exc:
                log.debug("local hop connection dropped: %s", exc)
            except Exception:  # the app failed while its answer streamed: the forwarder's is cut off
                log.exception("a request that came over the local hop failed during its answer")

    def _exchange(self, conn: socket.socket, stream: BinaryIO) -> bool:
        """Answer one request; False once the forwarder closed the connection between requests."""
        found = read_frame(stream)
        if found is None:
            return False
        kind, payload = found
        if kind != REQUEST:
            raise FrameError(f"a {kind!r} frame where a request head was due")
        head = RequestHead.decode(payload)
        body = FramedInput(stream)
        answer = _Answer(conn)
        assert self._app is not None
        try:
            result = self._app(_environ(head, body), answer.start_response)
        except Exception:
            if answer.started:
                raise
            log.exception("a request that came over the local hop failed")
            answer.start_response("500 Internal Server Error", [("Content-Length", "0")])
            result = []
        try:
            for piece in result:
                answer.write(piece)
            answer.write(b"")
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        body.drain()  # a body the app left unread, up to its end frame
        conn.sendall(_END)
        return True


def _bind(listener: socket.socket, folder: Path, path: str) -> None:
    """Bind ``listener`` to ``path`` in ``folder``, which must be this user's alone; the socket 0600."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} must be a folder of this user's alone (0700)")
    _remove_stale(folder)
    listener.bind(path)
    os.chmod(path, 0o600)  # only this user connects (none other reaches it meanwhile: the folder is 0700)


def _remove_stale(folder: Path) -> None:
    """Remove the sockets of processes that are gone (killed: nothing removed theirs)."""
    for path in folder.glob("*.sock"):
        pid = path.name.partition("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.unlink()
        except PermissionError:
            pass  # another user's process, alive


def _environ(head: RequestHead, body: FramedInput) -> dict[str, Any]:
    """The WSGI environ of a request that came over the hop, as its forwarder's server built it."""
    environ: dict[str, Any] = {
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_PROTOCOL": "HTTP/1.1",
        **head.variables,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": head.scheme,
        "wsgi.input": body,
        "wsgi.input_terminated": True,  # the end frame ends it, whether a length was given or not
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    return environ


class _Answer:
    """The owner's side of an answer: its head is sent with its first piece (or at its end)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._head: AnswerHead | None = None
        self.started = False

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[..., Any]:
        if exc_info is not None and self.started:
            raise exc_info[1].with_traceback(exc_info[2])
        self._head = AnswerHead(status, [(name, value) for name, value in headers])
        return self.write

    def write(self, piece: bytes) -> None:
        """Send ``piece`` now (the head first, once): a long-poll's or an SSE stream's pieces as they come."""
        out = b"".join(data_frames(piece))
        if not self.started:
            assert self._head is not None, "a WSGI app yields its body after start_response"
            self.started = True
            out = self._head.encode() + out
        if out:
            self._conn.sendall(out)


class FramedInput(io.RawIOBase):
    """``wsgi.input`` of a request that came over the hop: its data frames, up to its end frame."""

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self._stream = stream
        self._piece = memoryview(b"")
        self._ended = False
        self._broken: str | None = None  # why the body broke off at the forwarder's client

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._piece and not self._next():
            return 0
        count = min(len(buffer), len(self._piece))
        buffer[:count] = self._piece[:count]
        self._piece = self._piece[count:]
        return count

    def read(self, size: int | None = -1) -> bytes:
        """``size`` bytes (all that is left if negative), fewer only at the body's end, as gunicorn's."""
        pieces: list[bytes] = []
        left = -1 if size is None or size < 0 else size
        while left != 0 and (self._piece or self._next()):
            take = len(self._piece) if left < 0 else min(left, len(self._piece))
            pieces.append(bytes(self._piece[:take]))
            self._piece = self._piece[take:]
            left -= take if left > 0 else 0
        return b"".join(pieces)

    def drain(self) -> None:
        """Read past what is left of the body (raises FrameError or OSError as the connection fails)."""
        while self._next(mapped=False):
            self._piece = memoryview(b"")

    def _next(self, *, mapped: bool = True) -> bool:
        """Take the next data frame; False at the end frame, MalformedBody at a broken body's."""
        if self._broken is not None and mapped:
            raise MalformedBody(self._broken)
        if self._ended:
            return False
        try:
            kind, payload = expect_frame(self._stream)
            if kind not in (DATA, END, BROKEN):
                raise FrameError(f"a {kind!r} frame inside a request body")
        except (FrameError, OSError) as exc:
            if not mapped:
                raise
            raise MalformedBody(f"the request body broke off: the forwarding node failed ({exc})") from exc
        if kind == BROKEN:  # the client's body was malformed: fail as a body read here would
            self._ended, self._broken = True, payload.decode(errors="replace")
            return self._next(mapped=mapped)
        self._ended = kind == END
        self._piece = memoryview(payload)
        return not self._ended


class HopRefused(Exception):
    """The owner's socket could not be connected to: nothing of the request was sent."""


class HopFailed(Exception):
    """The owner failed during the request or went silent: it may have acted on it."""


class HopBroken(Exception):
    """The owner's answer broke off after it began: the client's connection is cut, as over HTTP."""


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stream = sock.makefile("rb")

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def _send_body(conn: _Connection, body: Iterable[bytes]) -> Exception | None:
    """Send ``body`` as data frames and its end (a broken body frame for a ``MalformedBody``).

    An error reading ``body`` (the client's own connection) is returned, not
    raised, so the caller tells it from the owner's failures: errors sending
    to the owner are raised.
    """
    pieces = iter(body)
    while True:
        try:
            piece = next(pieces)
        except StopIteration:
            conn.sock.sendall(_END)
            return None
        except MalformedBody as broken:
            conn.sock.sendall(broken_frame(broken.detail))
            return None
        except Exception as exc:  # any failure of the client's body is the client's
            return exc
        for data in data_frames(piece):
            conn.sock.sendall(data)


class AnswerBody:
    """An answer's body as it comes; closed before it was read, its connection is closed too."""

    def __init__(self, pieces: Generator[bytes, None, None], conn: _Connection) -> None:
        self._pieces = pieces
        self._conn = conn
        self._begun = False

    def __iter__(self) -> Iterator[bytes]:
        self._begun = True
        return self._pieces

    def close(self) -> None:
        if not self._begun:  # the reader's cleanup never ran: no answer is left half read on it
            self._conn.close()
        self._pieces.close()


class HopClient:
    """A forwarder's connections to owners' sockets, kept open between requests."""

    def __init__(self, *, connect_s: float, silence_s: float) -> None:
        self.connect_s = connect_s
        self.silence_s = silence_s
        self._idle: dict[str, list[_Connection]] = {}

    def send(
        self, address: str, head: RequestHead, body: Iterable[bytes]
    ) -> tuple[AnswerHead, AnswerBody]:
        """Send a request; its answer's head, and its body as it comes.

        HopRefused if nothing was sent; HopFailed if the owner failed or went
        silent (``silence_s`` without a frame) before the answer's head. A
        ``MalformedBody`` of ``body`` (the client's own broke off while it
        was read) ends the body with a broken body frame, and the owner
        answers it as it would a body of its own; another error of ``body``
        is raised as it is.
        """
        conn = self._connection(address)
        try:
            conn.sock.sendall(head.encode())
            body_error = _send_body(conn, body)
            if body_error is None:
                kind, payload = expect_frame(conn.stream)
                if kind != ANSWER:
                    raise FrameError(f"a {kind!r} frame where an answer head was due")
                answer = AnswerHead.decode(payload)
        except TimeoutError as exc:
            conn.close()
            raise HopFailed(f"did not answer in {self.silence_s:g} s") from exc
        except (FrameError, OSError) as exc:
            conn.close()
            raise HopFailed(f"failed during the request ({exc})") from exc
        except BaseException:
            conn.close()
            raise
        if body_error is not None:  # the client's body failed, not the owner: its request is cut off
            conn.close()
            raise body_error
        return answer, AnswerBody(self._pieces(address, conn), conn)

    def close(self) -> None:
        """Close the idle connections."""
        for idle in self._idle.values():
            while idle:
                idle.pop().close()

    def _connection(self, address: str) -> _Connection:
        idle = self._idle.get(address, [])
        while True:
            try:
                conn = idle.pop()
            except IndexError:  # none idle (another thread may have taken the last)
                break
            if not _closed(conn):
                return conn
            conn.close()
        self._sweep()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.connect_s)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            raise HopRefused(str(exc)) from exc
        sock.settimeout(self.silence_s)
        return _Connection(sock)

    def _sweep(self) -> None:
        """Close the idle connections whose owner exited (a restarted owner has a new socket).

        Run when a connection is made, which is rare: the sockets of owners
        gone are never asked for again, and would keep their connections.
        """
        for address, idle in list(self._idle.items()):
            for conn in [conn for conn in idle if _closed(conn)]:
                with contextlib.suppress(ValueError):  # taken meanwhile by another thread
                    idle.remove(conn)
                conn.close()
            if not idle:
                self._idle.pop(address, None)

    def _pieces(self, address: str, conn: _Connection) -> Generator[bytes, None, None]:
        ended = False
        try:
            while True:
                kind, payload = expect_frame(conn.stream)
                if kind == END:
                    ended = True
                    return
                if kind != DATA:
                    raise FrameError(f"a {kind!r} frame inside an answer")
                yield payload
        except (FrameError, OSError) as exc:
            raise HopBroken(f"the owner's answer broke off: {exc}") from exc
        finally:
            idle = self._idle.setdefault(address, [])
            if ended and len(idle) < _IDLE_PER_OWNER:
                idle.append(conn)
            else:
                conn.close()


def _closed(conn: _Connection) -> bool:
    """Whether an idle connection was closed by its owner (readable while idle: its end, as it exited)."""
    return bool(select.select([conn.sock], [], [], 0)[0])
