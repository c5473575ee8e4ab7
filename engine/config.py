"""The engine's settings: defaults, then a TOML file, then the environment.

Every limit of the engine is a field here, units last in the name (the HTTP
server's own settings are ``app/settings.py``'s, read from the same file and
environment). ``load_settings`` reads ``SEGSTORE_CONFIG`` (a TOML file whose
keys are the field names) and then ``SEGSTORE_<FIELD>`` variables, e.g.
``SEGSTORE_DATA_DIR`` or ``SEGSTORE_FLUSH_THRESHOLD_BYTES``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.errors import InvalidArgument
from engine.naming import validate_node_id

MiB = 1024 * 1024
# Tier 1 on S3: the most writes a container's log may have in flight (its fence covers as many names).
TIER1_WRITES_IN_FLIGHT_MAX = 8


# Settings with no meaning at 0: chunks, appends, reads or cache blocks of no bytes; no room for
# acknowledged bytes (every append refused); tail waits that spin or transactions that expire as
# they begin.
_POSITIVE = (
    "rollover_bytes", "max_append_bytes", "max_read_bytes", "tier1_backlog_max_bytes", "cache_block_bytes",
    "storage_read_block_bytes", "tail_wait_max_s", "transaction_timeout_s",
)


@dataclass(frozen=True)
class Settings:
    """Limits and locations. Sizes in bytes, durations in seconds unless named _ms."""

    data_dir: str = "./data"
    # Tier 1 location: "" (files under <data_dir>/tier1) or s3://bucket/prefix (fenced by epoch).
    tier1: str = ""
    # Tier 1 on S3: PutObjects in flight per container (local files: one write at a time).
    tier1_writes_in_flight: int = 4
    # A cluster node (docs/cluster.md): its id (empty: a single node), the URL other nodes and
    # clients reach it at (the server's default: http://<bind>), and how long a container lease lasts.
    node_id: str = ""
    advertise_url: str = ""
    lease_s: float = 10.0
    # Server processes over one data folder, splitting the containers by leases (docs/design.md
    # "Processes per node"); 1: one process (no leases with local Tier 1); 0: where the server starts
    # its processes (gunicorn, `make run`), one per core up to container_count with local Tier 1, else 1.
    # Elsewhere (an engine in a test or a tool) 0 is one process.
    processes: int = 0
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
    # A metadata checkpoint is written at every start and after this many Tier 1 bytes, operations
    # or seconds, whichever comes first: a recovery replays the log from the checkpoint before the
    # oldest operation not yet in Tier 2, so these bound its length whatever the container's age.
    checkpoint_every_bytes: int = 16 * MiB
    checkpoint_every_operations: int = 10_000
    checkpoint_every_s: float = 2.0
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
    # Tail reads: the longest `wait` a client may ask for (and any wait at the tail).
    tail_wait_max_s: float = 60.0
    # Attributes (seed 001): values held in memory past this are evicted once they are in
    # the attribute index; index pages are cached up to attribute_index_cache_bytes.
    attribute_cache_max_bytes: int = 64 * MiB
    attribute_index_cache_bytes: int = 64 * MiB
    # Transactions with no append, commit or abort for this long are aborted.
    transaction_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        refuse_negative(self)
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
            if not self.advertise_url:
                raise InvalidArgument("setting node_id makes a cluster node, which needs its advertise_url")
        if self.processes > self.container_count:
            raise InvalidArgument(
                f"setting processes={self.processes} exceeds container_count={self.container_count}: "
                "a process would serve nothing"
            )
        if self.processes > 1 and self.tier1_s3 is not None and not self.node_id:
            raise InvalidArgument(
                "setting processes > 1 with Tier 1 on S3 makes each process a cluster member: set node_id"
            )
        if self.lease_s < 1:
            raise InvalidArgument(f"setting lease_s must be at least 1 second, got {self.lease_s}")
        refuse_zero(self, _POSITIVE)
        one, two = self.tier1_s3 or ("", ""), self.tier2_s3 or ("", "")
        if one[0] and one[0] == two[0] and (one[1].startswith(two[1]) or two[1].startswith(one[1])):
            raise InvalidArgument(
                "settings tier1 and tier2 share a bucket, so they need prefixes of their own "
                "(neither inside the other), e.g. s3://bucket/tier1 and s3://bucket/tier2"
            )

    @property
    def node_url(self) -> str:
        """Where other nodes and clients reach this node."""
        return self.advertise_url.rstrip("/")

    @property
    def local_members(self) -> bool:
        """Whether this process is one of several over the data folder, each a cluster member."""
        return self.processes > 1

    def processes_to_start(self, cores: int) -> int:
        """How many server processes to start on ``cores`` cores (``processes``, or 0's default)."""
        if self.processes:
            return self.processes
        return 1 if self.tier1_s3 is not None else max(1, min(cores, self.container_count))

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


# Tier 1 on local files, and Tier 2 in the data folder's own "tier2" folder (the defaults):
# recorded relative to the data folder, which may move.
LOCAL_TIER1 = "<data folder>/tier1"
LOCAL_TIER2 = "<data folder>/tier2"


def tier1_location(settings: Settings) -> str:
    location = settings.tier1_s3
    return LOCAL_TIER1 if location is None else f"s3://{location[0]}/{location[1]}"


def tier2_location(settings: Settings) -> str:
    """``s3://bucket/prefix/``, the data folder's own tier2 folder, or another folder's absolute path."""
    location = settings.tier2_s3
    if location is not None:
        return f"s3://{location[0]}/{location[1]}"
    folder = settings.tier2_path.absolute()
    if folder == (settings.data_path / "tier2").absolute():
        return LOCAL_TIER2
    return str(folder)


def _s3_location(setting: str, value: str) -> tuple[str, str] | None:
    if not value.startswith("s3://"):
        return None
    bucket, _, prefix = value.removeprefix("s3://").partition("/")
    if not bucket:
        raise InvalidArgument(f"setting {setting}={value!r} names no bucket")
    return bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""


_SIZE = re.compile(r"\s*([0-9]+)\s*(B|KiB|MiB|GiB|TiB)?\s*")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# host:port (an IPv6 host in brackets), or a unix socket.


def parse_bytes(name: str, raw: Any) -> int:
    """A ``_bytes`` setting: a whole number of bytes, or one as the settings table writes it (``8 MiB``)."""
    if isinstance(raw, int):
        return raw
    match = _SIZE.fullmatch(raw) if isinstance(raw, str) else None
    if match is None:
        raise InvalidArgument(
            f"setting {name} is a size: bytes, or a number with B, KiB, MiB, GiB or TiB "
            f"(e.g. 8 MiB, 8388608), got {raw!r}"
        )
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def _convert(name: str, kind: str, raw: Any) -> Any:
    if isinstance(raw, bool) or (kind == "int" and isinstance(raw, float)):
        raise InvalidArgument(f"setting {name} must be {kind}, got {raw!r}")
    if kind == "int" and name.endswith("_bytes"):
        return parse_bytes(name, raw)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise InvalidArgument(f"setting {name} must be {kind}, got {raw!r}") from None


def refuse_negative(settings: Any) -> None:
    """InvalidArgument naming the first numeric field of a settings dataclass that is negative."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.type in ("int", "float") and value < 0:
            raise InvalidArgument(f"setting {f.name} must not be negative, got {value}")


def refuse_zero(settings: Any, names: Iterable[str]) -> None:
    """InvalidArgument naming the first of ``names`` that is not more than 0."""
    for name in names:
        if getattr(settings, name) <= 0:
            raise InvalidArgument(f"setting {name} must be more than 0, got {getattr(settings, name)}")


def setting_kinds(settings_class: type) -> dict[str, str]:
    """Each field of a settings dataclass and its kind: ``int``, ``float`` or ``str``."""
    return {f.name: str(f.type) for f in fields(settings_class)}


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the settings from defaults, ``SEGSTORE_CONFIG``, ``SEGSTORE_*`` and overrides."""
    env = os.environ if environ is None else environ
    values = read_settings(setting_kinds(Settings), env)
    values.update(overrides)
    return Settings(**values)


def read_settings(kinds: Mapping[str, str], env: Mapping[str, str]) -> dict[str, Any]:
    """The values ``SEGSTORE_CONFIG`` and then ``SEGSTORE_<NAME>`` give the settings of ``kinds``.

    A key of the file that ``kinds`` does not name is refused.
    """
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
    return values
