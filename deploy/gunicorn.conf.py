"""gunicorn settings for segstore: ``processes`` gevent workers share the data directory.

One worker owns it alone when ``processes`` is 1; with more, the workers
share the public port (gunicorn's listening socket, inherited by every
worker) and split the containers by leases (docs/design.md "Processes per node").

The engine is built in the worker by ``create_app()`` (``preload_app`` stays
off, so the arbiter never opens the data directory) and closed when the
worker exits. SIGTERM drains requests for up to ``graceful_timeout`` seconds.

A store that must not start is refused with one log line and an exit
status: 3 for a misconfiguration (its record names another Tier 2, its
Tier 2 refuses us), which a restart would only meet again; 4 when what it
needs may come (another server holds the folder, an S3 Tier 1 does not
answer), which a service manager may start again. The arbiter runs the
store's early checks before it starts a worker, so one line says it however
many workers the server runs; what only a worker meets (an S3 Tier 1 that
answers late) exits that worker with the status, which stops the arbiter too
instead of starting worker after worker. The engine's
and the app's log lines go where gunicorn's own go, in its format.
"""

import errno
import logging
import os
import select
import signal
import socket
import sys

from app.settings import KEEPALIVE_S, MAX_CONNECTIONS, HttpSettings, load_server_settings
from engine import SegstoreError, StoreLocked, Throttled

# Worker exit statuses on which the arbiter stops (gunicorn's WORKER_BOOT_ERROR, APP_LOAD_ERROR).
MISCONFIGURED = 3
NOT_YET = 4
# The longest the arbiter waits for the store's early checks before it starts the workers anyway.
PREFLIGHT_S = 15.0


def unauthenticated_bind_refusal(settings: HttpSettings) -> str | None:
    """Why the server must not start (an open bind with auth off), or None when it may.

    With no ``auth_file`` anyone who reaches the port may read, write and
    delete every segment; that is only allowed on loopback unless
    ``allow_unauthenticated=1`` says the network in front is trusted.
    """
    if settings.auth_file or settings.allow_unauthenticated or settings.bind_is_loopback:
        return None
    return (
        f"refusing to bind {settings.bind} with auth off: set SEGSTORE_AUTH_FILE, bind to loopback, "
        "or set SEGSTORE_ALLOW_UNAUTHENTICATED=1"
    )


try:
    _engine_settings, _settings = load_server_settings()
except SegstoreError as _bad:  # a setting out of its range: one line naming it, no traceback
    raise SystemExit(f"segstore will not start: {_bad.detail}") from None
_refusal = unauthenticated_bind_refusal(_settings)
if _refusal is not None:
    raise SystemExit(_refusal)

bind = [_settings.bind]
# One worker per core by default (the setting's 0); the workers read the count the arbiter chose
# from their environment, which gunicorn sets from raw_env when it starts (not on import).
workers = _engine_settings.processes_to_start(os.cpu_count() or 1)
raw_env = [f"SEGSTORE_PROCESSES={workers}"]
worker_class = "app.worker.Worker"
worker_connections = MAX_CONNECTIONS
preload_app = False
graceful_timeout = 30
# Long-poll reads park for up to tail_wait_max_s; the gevent worker's
# heartbeat is independent of request time, so this only bounds a stuck worker.
timeout = 120
# Idle keep-alive connections count as busy during a graceful shutdown.
keepalive = KEEPALIVE_S
loglevel = _settings.log_level
# SEGSTORE_ACCESS_LOG=1: one line per request on standard output, with its duration in microseconds.
accesslog = "-" if _settings.access_log else None
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(D)sus "%(a)s"'
# gunicorn's control socket sits at one fixed path per user, which two
# servers on one machine (tests, benchmarks) would contend for.
control_socket_disable = True


def bind_in_use(bind: str) -> bool:
    """Whether another process listens on ``bind`` (host:port) already; unix sockets aside."""
    if bind.startswith("unix:"):
        return False
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def on_starting(server):
    """Refuse at once, in one line that says what to do, a bind another process holds, or a store
    that must not start (before any worker boots, however many the server runs).

    gunicorn would retry a bind in use five times and exit with "Connection in
    use". A restart that inherits its sockets (systemd, gunicorn's USR2) is
    not checked: the server it replaces holds both still.
    """
    if "LISTEN_FDS" in os.environ or "GUNICORN_FD" in os.environ:
        return
    if bind_in_use(_settings.bind):
        raise SystemExit(
            f"segstore will not start: {_settings.bind} is in use (another server? stop it, "
            "or set SEGSTORE_BIND to another host:port)"
        )
    refused = preflight_refusal()
    if refused is not None:
        why, status = refused
        server.log.error("segstore cannot start: %s", why)
        sys.stderr.flush()
        sys.exit(status)


def refusal_status(exc):
    """The exit status of a refused start: ``NOT_YET`` if what it needs may come, else ``MISCONFIGURED``."""
    return NOT_YET if isinstance(exc, StoreLocked | Throttled) else MISCONFIGURED


def preflight_refusal():
    """The store's early checks (engine/store/preflight.py): (why, status) if it must not start, else None.

    They run in a child process: S3's client must not be loaded in the arbiter,
    whose workers patch ssl and sockets for gevent only after they fork. A
    check that fails otherwise, or takes longer than ``PREFLIGHT_S``, lets the
    start go on: each worker checks again, and waits out an outage.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        status, why = 0, b""
        try:
            from engine.store import preflight

            preflight.check(_engine_settings)
        except SegstoreError as exc:
            status, why = refusal_status(exc), exc.detail.encode()
        except BaseException:  # not a refusal: the workers meet it, and say what it is
            pass
        os.write(write_end, why)
        os._exit(status)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], PREFLIGHT_S)
        why = os.read(read_end, 65536).decode(errors="replace") if ready else ""
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, wait_status = os.waitpid(pid, 0)
    finally:
        os.close(read_end)
    status = os.waitstatus_to_exitcode(wait_status)
    return (why, status) if status in (MISCONFIGURED, NOT_YET) and why else None


def post_fork(server, worker):
    """Route the engine's log to gunicorn's; turn a refused start into one line and an exit."""
    for name in ("engine", "app"):
        logger = logging.getLogger(name)
        logger.handlers = list(worker.log.error_log.handlers)
        logger.setLevel(worker.log.error_log.level)
        logger.propagate = False
    load_wsgi = worker.load_wsgi

    def load_or_refuse():
        try:
            load_wsgi()
        except SegstoreError as exc:  # a refused start: no traceback, and no worker after this one
            refuse(worker, exc.detail, refusal_status(exc))

    worker.load_wsgi = load_or_refuse


def refuse(worker, why, status):
    """Log why the store cannot start, and stop the whole server with ``status``."""
    worker.log.error("segstore cannot start: %s", why)
    sys.stderr.flush()
    os._exit(status)


def post_worker_init(worker):
    """On SIGTERM, end parked tails at once; exit if a container finds the store misconfigured."""
    import gevent

    handle_exit = worker.handle_exit
    store = worker.wsgi.extensions.get("segstore")

    def drain_then_exit(sig, frame):
        handle_exit(sig, frame)
        if store is not None:
            gevent.spawn(store.drain)  # not in the signal handler itself: it takes locks

    signal.signal(signal.SIGTERM, drain_then_exit)

    def refuse_if_misconfigured():
        why = store.wait_refusal()
        if why is not None:
            store.close()
            refuse(worker, why, MISCONFIGURED)

    if store is not None:
        gevent.spawn(refuse_if_misconfigured)


def worker_exit(server, worker):
    """Close the engine so Tier 1 is released cleanly on shutdown."""
    app = getattr(worker, "wsgi", None)
    store = getattr(app, "extensions", {}).get("segstore") if app is not None else None
    hop = getattr(app, "extensions", {}).get("segstore.hop") if app is not None else None
    receiver = getattr(app, "extensions", {}).get("segstore.handoff") if app is not None else None
    if receiver is not None:
        receiver.close()
    if hop is not None:  # no request comes over the Unix socket once the store closes
        hop.close()
    if store is not None:
        store.close()
