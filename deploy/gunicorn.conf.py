"""gunicorn settings for segstore: one gevent worker owns the data directory.

The engine is built in the worker by ``create_app()`` (``preload_app`` stays
off, so the arbiter never opens the data directory) and closed when the
worker exits. SIGTERM drains requests for up to ``graceful_timeout`` seconds.
"""

from engine import Settings, load_settings


def unauthenticated_bind_refusal(settings: Settings) -> str | None:
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


_settings = load_settings()
_refusal = unauthenticated_bind_refusal(_settings)
if _refusal is not None:
    raise SystemExit(_refusal)

bind = [_settings.bind]
workers = 1
worker_class = "gevent"
worker_connections = 2000
preload_app = False
graceful_timeout = 30
# Long-poll reads park for up to tail_wait_max_s; the gevent worker's
# heartbeat is independent of request time, so this only bounds a stuck worker.
timeout = 120
# Idle keep-alive connections count as busy during a graceful shutdown.
keepalive = 5
loglevel = _settings.log_level
accesslog = None
# gunicorn's control socket sits at one fixed path per user, which two
# servers on one machine (tests, benchmarks) would contend for.
control_socket_disable = True


def post_worker_init(worker):
    """On SIGTERM, end parked tails at once instead of letting them hold the shutdown."""
    import signal

    import gevent

    handle_exit = worker.handle_exit

    def drain_then_exit(sig, frame):
        handle_exit(sig, frame)
        store = worker.wsgi.extensions.get("segstore")
        if store is not None:
            gevent.spawn(store.drain)  # not in the signal handler itself: it takes locks

    signal.signal(signal.SIGTERM, drain_then_exit)


def worker_exit(server, worker):
    """Close the engine so Tier 1 is released cleanly on shutdown."""
    app = getattr(worker, "wsgi", None)
    store = getattr(app, "extensions", {}).get("segstore") if app is not None else None
    if store is not None:
        store.close()
