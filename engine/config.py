"""The one settings object: defaults, then a TOML file, then the environment.

Every limit of the engine and the server is a field here, units last in the
name. ``load_settings`` reads ``SEGSTORE_CONFIG`` (a TOML file whose keys are
the field names) and then ``SEGSTORE_<FIELD>`` variables, e.g.
``SEGSTORE_DATA_DIR`` or ``SEGSTORE_FLUSH_THRESHOLD_BYTES``. When neither
names ``bind``, a ``PORT`` variable (set by platforms that run a Procfile,
such as Heroku) makes it ``0.0.0.0:$PORT``, as gunicorn's own default does.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.durable_log.object_log import REACH as TIER1_WRITES_IN_FLIGHT_MAX
from engine.errors import InvalidArgument
from engine.naming import validate_node_id

MiB = 1024 * 1024


# Settings with no meaning at 0: chunks, appends, reads or cache blocks of no bytes; no room for
# acknowledged bytes (every append refused); waits that spin (live streams' keep-alives, the
# Durable Streams reaper) or transactions that expire as they begin.
_POSITIVE = (
    "rollover_bytes", "max_append_bytes", "max_read_bytes", "tier1_backlog_max_bytes", "cache_block_bytes",
    "storage_read_block_bytes", "tail_wait_max_s", "sse_keepalive_s", "transaction_timeout_s",
    "stream_long_poll_s", "stream_reap_interval_s", "stream_scale_sample_s", "stream_scale_window_s",
    "stream_transaction_timeout_s", "stream_transaction_timeout_max_s",
)


@dataclass(frozen=True)
class Settings:
    """Limits and locations. Sizes in bytes, durations in seconds unless named _ms."""

    data_dir: str = "./data"
    bind: str = "127.0.0.1:8080"
    # Tier 1 location: "" (files under <data_dir>/tier1) or s3://bucket/prefix (fenced by epoch).
    tier1: str = ""
    # Tier 1 on S3: PutObjects in flight per container (local files: one write at a time).
    tier1_writes_in_flight: int = 4
    # A cluster node (docs/cluster.md): its id (empty: a single node), the URL other nodes and
    # clients reach it at (default: http://<bind>), and how long a container lease lasts.
    node_id: str = ""
    advertise_url: str = ""
    lease_s: float = 10.0
    # A cluster node holds a request whose container no node serves yet (a takeover) this long
    # before it answers 503 with Retry-After.
    takeover_wait_s: float = 2.0
    # Tier 2 location: a folder (default: <data_dir>/tier2) or s3://bucket/prefix.
    tier2: str = ""
    # S3 endpoint for non-AWS services (MinIO, moto, ...); credentials come from AWS_* variables.
    s3_endpoint: str = ""
    # A segment's Tier 2 chunk rolls over at this size (per segment: PUT {"rollover_bytes": n}).
    rollover_bytes: int = 128 * MiB
    # Runs of at least defrag_min_chunks chunks smaller than defrag_small_bytes are joined.
    defrag_min_chunks: int = 8
    defrag_small_bytes: int = 8 * MiB
    container_count: int = 4
    max_append_bytes: int = 8 * MiB
    max_read_bytes: int = 8 * MiB
    # Tier 1: data frames are at most this large; log files roll past tier1_file_bytes.
    max_frame_bytes: int = 1 * MiB
    tier1_file_bytes: int = 64 * MiB
    # A metadata checkpoint is written after this many Tier 1 bytes (and at every start).
    checkpoint_every_bytes: int = 16 * MiB
    # Storage writer: flush a segment's appends to Tier 2 at this size or age.
    flush_threshold_bytes: int = 4 * MiB
    flush_threshold_ms: int = 1000
    # Appends answer 503 once this many acknowledged bytes wait for Tier 2.
    tier1_backlog_max_bytes: int = 1024 * MiB
    # Read cache: flushed blocks are evicted past this size; appends fill blocks of cache_block_bytes.
    cache_max_bytes: int = 256 * MiB
    cache_block_bytes: int = 1 * MiB
    # Cache misses read Tier 2 in aligned blocks; sequential readers get read_ahead_bytes more.
    storage_read_block_bytes: int = 1 * MiB
    read_ahead_bytes: int = 8 * MiB
    # Tail reads: the longest `wait` a client may ask for (and any wait at the tail); SSE keep-alive period.
    tail_wait_max_s: float = 60.0
    sse_keepalive_s: float = 15.0
    # Attributes (seed 001): values held in memory past this are evicted once they are in
    # the attribute index; index pages are cached up to attribute_index_cache_bytes.
    attribute_cache_max_bytes: int = 64 * MiB
    attribute_index_cache_bytes: int = 64 * MiB
    # Transactions with no append, commit or abort for this long are aborted.
    transaction_timeout_s: float = 600.0
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
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and value < 0:
                raise InvalidArgument(f"setting {f.name} must not be negative, got {value}")
        if self.container_count < 1:
            raise InvalidArgument("setting container_count must be at least 1")
        if self.max_frame_bytes < 4096:
            raise InvalidArgument("setting max_frame_bytes must be at least 4096")
        if not 1 <= self.tier1_writes_in_flight <= TIER1_WRITES_IN_FLIGHT_MAX:
            raise InvalidArgument(
                f"setting tier1_writes_in_flight must lie in [1, {TIER1_WRITES_IN_FLIGHT_MAX}], "
                f"got {self.tier1_writes_in_flight}"
            )
        if self.tier1 and self.tier1_s3 is None:
            raise InvalidArgument(f"setting tier1={self.tier1!r}: Tier 1 is local files or s3://bucket/prefix")
        if self.tier1_s3 is not None and self.tier2_s3 is None:
            raise InvalidArgument(
                "setting tier1 is on S3 but tier2 is a local folder: a lost node would lose what is in "
                "Tier 2; set tier2 to s3://bucket/prefix too"
            )
        if self.node_id:
            try:
                validate_node_id(self.node_id)
            except ValueError as exc:
                raise InvalidArgument(f"setting node_id: {exc}") from None
            if self.tier1_s3 is None:
                raise InvalidArgument("setting node_id makes a cluster node, which needs tier1 on S3")
        if self.lease_s < 1:
            raise InvalidArgument(f"setting lease_s must be at least 1 second, got {self.lease_s}")
        if self.takeover_wait_s < 0:
            raise InvalidArgument(f"setting takeover_wait_s must not be negative, got {self.takeover_wait_s}")
        for name in _POSITIVE:
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"setting {name} must be more than 0, got {getattr(self, name)}")
        if self.stream_scale_window_s < self.stream_scale_sample_s:
            raise InvalidArgument(
                "setting stream_scale_window_s must be at least stream_scale_sample_s: a rate needs "
                "two samples inside its window"
            )
        if self.stream_transaction_timeout_s > self.stream_transaction_timeout_max_s:
            raise InvalidArgument(
                "setting stream_transaction_timeout_s must not be more than stream_transaction_timeout_max_s"
            )
        one, two = self.tier1_s3 or ("", ""), self.tier2_s3 or ("", "")
        if one[0] and one[0] == two[0] and (one[1].startswith(two[1]) or two[1].startswith(one[1])):
            raise InvalidArgument(
                "settings tier1 and tier2 share a bucket, so they need prefixes of their own "
                "(neither inside the other), e.g. s3://bucket/tier1 and s3://bucket/tier2"
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

    @property
    def sse_wait_s(self) -> float:
        """How long a live stream waits for data before it sends a keep-alive: no tail wait is longer."""
        return min(self.sse_keepalive_s, self.tail_wait_max_s)

    @property
    def node_url(self) -> str:
        """Where other nodes and clients reach this node."""
        return self.advertise_url.rstrip("/") or f"http://{self.bind}"

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def tier2_path(self) -> Path:
        """The Tier 2 folder (when Tier 2 is not S3)."""
        return Path(self.tier2) if self.tier2 else self.data_path / "tier2"

    @property
    def tier1_s3(self) -> tuple[str, str] | None:
        """(bucket, prefix) when Tier 1 is ``s3://bucket/prefix``, else None (local files)."""
        return _s3_location("tier1", self.tier1)

    @property
    def tier2_s3(self) -> tuple[str, str] | None:
        """(bucket, prefix) when Tier 2 is ``s3://bucket/prefix``, else None."""
        return _s3_location("tier2", self.tier2)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _s3_location(setting: str, value: str) -> tuple[str, str] | None:
    if not value.startswith("s3://"):
        return None
    bucket, _, prefix = value.removeprefix("s3://").partition("/")
    if not bucket:
        raise InvalidArgument(f"setting {setting}={value!r} names no bucket")
    return bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""


def _convert(name: str, kind: str, raw: Any) -> Any:
    if isinstance(raw, bool) or (kind == "int" and isinstance(raw, float)):
        raise InvalidArgument(f"setting {name} must be {kind}, got {raw!r}")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise InvalidArgument(f"setting {name} must be {kind}, got {raw!r}") from None


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the settings from defaults, ``SEGSTORE_CONFIG``, ``SEGSTORE_*`` and overrides."""
    env = os.environ if environ is None else environ
    kinds = {f.name: str(f.type) for f in fields(Settings)}
    values: dict[str, Any] = {}
    config_file = env.get("SEGSTORE_CONFIG")
    if config_file:
        with open(config_file, "rb") as fh:
            for key, raw in tomllib.load(fh).items():
                if key not in kinds:
                    raise InvalidArgument(f"unknown setting {key!r} in {config_file}")
                values[key] = _convert(key, kinds[key], raw)
    for name, kind in kinds.items():
        raw = env.get("SEGSTORE_" + name.upper())
        if raw is not None:
            values[name] = _convert(name, kind, raw)
    port = env.get("PORT")
    if "bind" not in values and port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"PORT must be a TCP port number, got {port!r}")
        values["bind"] = f"0.0.0.0:{int(port)}"
    values.update(overrides)
    return Settings(**values)
