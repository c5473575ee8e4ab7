"""The HTTP server's settings, beside the engine's (``engine/config.py``), from one file and one environment.

``load_server_settings`` reads ``SEGSTORE_CONFIG`` (a TOML file) and then
``SEGSTORE_<NAME>`` variables once for both: the engine's fields make its
``Settings``, the server's make an ``HttpSettings``; a key neither knows is
refused. When neither names ``bind``, a ``PORT`` variable (set by platforms
that run a Procfile, such as Heroku) makes it ``0.0.0.0:$PORT``, as
gunicorn's own default does; other nodes reach this one at
``http://<bind>`` unless ``advertise_url`` says otherwise.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine import InvalidArgument, Settings, read_settings, refuse_negative, refuse_zero, setting_kinds

# How long a server process keeps an idle keep-alive connection open, on the public port
# (gunicorn's ``keepalive``) and on its own (app/private_listener.py).
KEEPALIVE_S = 5
# The most connections a server process serves at once on each of them (gunicorn's
# ``worker_connections``); past it, new ones wait to be taken.
MAX_CONNECTIONS = 2000
# host:port (an IPv6 host in brackets), or unix:/path.
_BIND = re.compile(r"unix:.+|(?:\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):[0-9]{1,5}")
# Waits that would spin at 0: live streams' keep-alives, Durable Streams long-polls and its reaper,
# the stream keeper; rate windows of no time; stream transactions that expire as they begin.
_POSITIVE = (
    "sse_keepalive_s", "stream_long_poll_s", "stream_reap_interval_s", "stream_scale_sample_s",
    "stream_scale_window_s", "stream_transaction_timeout_s", "stream_transaction_timeout_max_s",
)


@dataclass(frozen=True)
class HttpSettings:
    """Where the server listens, who may call it, and the surfaces' waits. Durations in seconds."""

    bind: str = "127.0.0.1:8080"
    # A cluster node holds a request whose container no node serves yet (a takeover) this long
    # before it answers 503 with Retry-After.
    takeover_wait_s: float = 2.0
    # 1: a cluster node listens on a Unix socket and hands requests for an owner on this machine
    # over it (app/hop.py); 0: every forwarded request goes over HTTP.
    local_hop: int = 1
    # A live stream (SSE) sends a keep-alive after this long without data (at most tail_wait_max_s).
    sse_keepalive_s: float = 15.0
    # Durable Streams: a long-poll (and an SSE keep-alive) waits this long at the tail (at most
    # tail_wait_max_s; 20 s is what the protocol's clients and conformance suite expect);
    # expired streams are looked for every stream_reap_interval_s.
    stream_long_poll_s: float = 20.0
    stream_reap_interval_s: float = 1.0
    # Streams (app/scopes): each process samples the event and byte rates of the stream segments
    # whose record it serves every stream_scale_sample_s (and finishes what a crash left pending:
    # scales, commits, expired transactions); auto-scaling judges the rates over
    # stream_scale_window_s and leaves a segment alone for stream_scale_cooldown_s after its creation.
    stream_scale_sample_s: float = 10.0
    stream_scale_window_s: float = 300.0
    stream_scale_cooldown_s: float = 600.0
    # A stream transaction expires (is aborted) this long after it opens, unless it asks for
    # another timeout, at most stream_transaction_timeout_max_s.
    stream_transaction_timeout_s: float = 120.0
    stream_transaction_timeout_max_s: float = 600.0
    log_level: str = "info"
    # 1 writes one line per request (gunicorn's access log) to standard output.
    access_log: int = 0
    # Access control: a TOML file of bearer tokens and their grants (empty: native API open).
    auth_file: str = ""
    # S3 surface credentials, "access:secret,..." (empty: anonymous, served on loopback only).
    s3_keys: str = ""
    # 1 lets the server bind a non-loopback address with auth off.
    allow_unauthenticated: int = 0

    def __post_init__(self) -> None:
        refuse_negative(self)
        refuse_zero(self, _POSITIVE)
        if self.stream_scale_window_s < self.stream_scale_sample_s:
            raise InvalidArgument(
                "setting stream_scale_window_s must be at least stream_scale_sample_s: a rate needs "
                "two samples inside its window"
            )
        if self.stream_transaction_timeout_s > self.stream_transaction_timeout_max_s:
            raise InvalidArgument(
                "setting stream_transaction_timeout_s must not be more than stream_transaction_timeout_max_s"
            )
        if _BIND.fullmatch(self.bind) is None or (
            not self.bind.startswith("unix:") and int(self.bind.rpartition(":")[2]) > 65535
        ):
            raise InvalidArgument(
                f"setting bind={self.bind!r}: host:port expected, e.g. 127.0.0.1:8081 (or unix:/path)"
            )

    @property
    def bind_is_loopback(self) -> bool:
        """True for ``127.x.x.x:port``, ``localhost:port``, ``[::1]:port`` and unix sockets."""
        if self.bind.startswith("unix:"):
            return True
        host = self.bind.rpartition(":")[0] if self.bind.count(":") == 1 or "]" in self.bind else self.bind
        host = host.strip("[]")
        try:
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def sse_wait_s(self, settings: Settings) -> float:
        """How long a live stream waits for data before it sends a keep-alive: no tail wait is longer."""
        return min(self.sse_keepalive_s, settings.tail_wait_max_s)

    def replace(self, **changes: Any) -> HttpSettings:
        return dataclasses.replace(self, **changes)


def load_server_settings(
    environ: Mapping[str, str] | None = None, **overrides: Any
) -> tuple[Settings, HttpSettings]:
    """The engine's and the server's settings from defaults, ``SEGSTORE_CONFIG``, ``SEGSTORE_*``, ``PORT``
    and overrides."""
    env = os.environ if environ is None else environ
    engine_kinds, http_kinds = setting_kinds(Settings), setting_kinds(HttpSettings)
    values = read_settings(engine_kinds | http_kinds, env)
    port = env.get("PORT")
    if "bind" not in values and port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"PORT must be a TCP port number, got {port!r}")
        values["bind"] = f"0.0.0.0:{int(port)}"
    unknown = set(overrides) - engine_kinds.keys() - http_kinds.keys()
    if unknown:
        raise TypeError(f"unknown settings: {sorted(unknown)}")
    values.update(overrides)
    http = HttpSettings(**{k: v for k, v in values.items() if k in http_kinds})
    engine_values = {k: v for k, v in values.items() if k in engine_kinds}
    engine_values["advertise_url"] = engine_values.get("advertise_url") or f"http://{http.bind}"
    return Settings(**engine_values), http
