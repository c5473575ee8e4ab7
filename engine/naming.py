"""Every name the engine gives or accepts: segment names, containers, files, keys.

- User segment names follow docs/api.md "Names"; ``validate_segment_name`` is the
  check, ``validate_name`` the engine's (user names and reserved names).
- ``container_for`` maps a name to a container with a stable hash (BLAKE2b),
  never Python's salted ``hash()``.
- Tier 1 log files are ``<data>/tier1/c<container>/<first frame seq>.log``.
  On an object store a container's log is ``c<container>/wal/<write number>``
  (20 digits), its writers' epochs ``c<container>/epochs/<epoch>`` and the
  write it starts at after truncation ``c<container>/start/<write number>``.
- A cluster keeps ``cluster.json``, ``nodes/<node id>`` and
  ``leases/<container, 5 digits>`` under its prefix (docs/cluster.md).
- Tier 2 chunks are ``c<container>/<escaped name>.<segment id>/e<epoch>-o<offset>-<nonce>``:
  unique, and carrying the container and the epoch that created them, so no
  epoch ever writes to a chunk another epoch created (seed 002 "Segment
  Store Failover"). A segment name too long for a file name is replaced by
  its SHA-256. No name becomes a path unescaped.
- Exported layouts are ``layouts/<escaped name>.json``.
- ``#`` is forbidden in user names, so names that carry it are the engine's
  and the surfaces' own, out of every user's reach:

  - **internal segments** carry ``#`` after their parent's name:
    transactions ``<parent>#transaction.<id>``, merge staging
    ``<target>#merge.<nonce>``. They live in their parent's container and
    are aborted when idle or orphaned. A segment's attribute index is stored
    in chunks named for ``<name>#attributes`` (not a segment of its own).
  - **reserved names** start with ``#``: ``#<owner>/<kind>/<rest>``, where
    ``rest`` is a valid user name, hold a protocol surface's internal state.
    A surface claims its owner once (``reserve``) and builds its names from
    what that returns; the engine knows no surface. They are top-level
    segments, never reaped, hashed by their subject (``subject_of``) so that
    they share a container with what they are about. The native API refuses
    them and listings show them only to a prefix that is itself reserved.
  - ``#<owner>/migrated`` marks that the owner's state was moved out of the
    ordinary names it used to have.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from engine.errors import InvalidName

MAX_NAME_BYTES = 1024
RESERVED_MARK = "#"
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f:#?\\%]")
_LOG_FILE = re.compile(r"^(\d{20})\.log$")
_MAX_KEY_PART = 180
_CHUNK = re.compile(r"^c(\d+)/[^/]+\.(\d+)/e(\d{10})-o(\d{20})-[0-9a-f]{8}$")


@functools.lru_cache(maxsize=65536)
def validate_segment_name(name: str) -> str:
    """Return ``name`` if it is a valid segment name, else raise InvalidName saying why."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_NAME_BYTES:
        raise InvalidName(f"a segment name is 1 to {MAX_NAME_BYTES} bytes, got {size}")
    bad = _FORBIDDEN.search(name)
    if bad:
        raise InvalidName(f"segment name contains a forbidden character {bad.group()!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName("segment name is not valid UTF-8") from None
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise InvalidName(f"segment name part {part!r} is empty, '.' or '..'")
    return name


@functools.lru_cache(maxsize=65536)
def validate_name(name: str) -> str:
    """Return ``name`` if the engine takes it: a user name, or a reserved ``#<owner>/<rest>`` one."""
    if not name.startswith(RESERVED_MARK):
        return validate_segment_name(name)
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES or "/" not in name:
        raise InvalidName(f"a reserved name is #<owner>/<name> of at most {MAX_NAME_BYTES} bytes")
    validate_segment_name(name[1:])
    return name


@functools.lru_cache(maxsize=65536)
def container_for(name: str, container_count: int) -> int:
    """The container that owns ``name``: stable across processes and versions.

    It hashes ``subject_of(name)``: an internal segment lives beside its
    parent (seed 000: a transaction is mapped into its parent's container),
    and a surface's state beside what it is about, so one request of a
    surface touches one container (one node of a cluster).
    """
    digest = hashlib.blake2b(subject_of(name).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % container_count


def subject_of(name: str) -> str:
    """The name ``name`` is hashed by: what it belongs to or is about.

    An internal segment's parent; for a reserved ``#<owner>/<kind>/<rest>``,
    ``rest``: a surface's record ``#<owner>/records/<name>`` about segment
    ``<name>`` goes with that segment. A surface that needs a fresh name
    beside another one draws random ids until one hashes there. Any other
    name is its own subject.
    """
    name = parent_of(name)
    if not name.startswith(RESERVED_MARK):
        return name
    _, slash, subject = name.partition("/")[2].partition("/")
    return subject if slash else name


def transaction_name(parent: str, txid: uuid.UUID) -> str:
    """The segment of transaction ``txid`` of ``parent``; ``#`` keeps it out of user names."""
    return f"{parent}#transaction.{txid}"


def staging_name(target: str, nonce: uuid.UUID) -> str:
    """A segment in ``target``'s container that a merge from another container copies into."""
    return f"{target}#merge.{nonce}"


def attribute_segment_name(name: str) -> str:
    """The name the chunks of a segment's attribute index (seed 001) are stored under."""
    return f"{name}#attributes"


def parent_of(name: str) -> str:
    """The segment an internal segment belongs to (user and reserved names are their own parents)."""
    cut = name.find(RESERVED_MARK, 1)
    return name if cut < 0 else name[:cut]


def is_internal(name: str) -> bool:
    """True for transactions and merge staging segments (``#`` after their parent's name)."""
    return name.find(RESERVED_MARK, 1) >= 0


def is_reserved(name: str) -> bool:
    """True for a surface's internal state (``#<owner>/...``) and that state's internal segments."""
    return name.startswith(RESERVED_MARK)


def hidden_from(prefix: str, name: str) -> bool:
    """True when a listing of ``prefix`` must not show ``name``.

    Internal segments never show; reserved names show only to a prefix that
    is itself reserved (a surface listing its own state).
    """
    return RESERVED_MARK in name[len(prefix) :]


_OWNER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_reserved_owners: set[str] = set()
_reserving = threading.Lock()


@dataclass(frozen=True, slots=True)
class ReservedNames:
    """The reserved names of one surface's state: ``#<owner>/<kind>/<rest>`` (see ``reserve``)."""

    owner: str

    def prefix(self, kind: str = "") -> str:
        """Where the state of ``kind`` lives: ``#<owner>/<kind>/`` (``#<owner>/`` for all of it)."""
        return f"{RESERVED_MARK}{self.owner}/{kind}/" if kind else f"{RESERVED_MARK}{self.owner}/"

    def name(self, kind: str, rest: str) -> str:
        """The reserved name ``#<owner>/<kind>/<rest>`` (``rest``: a user-style name, its subject)."""
        return self.prefix(kind) + rest

    @property
    def migrated(self) -> str:
        """The segment whose existence says the owner's state no longer lives under ordinary names."""
        return f"{RESERVED_MARK}{self.owner}/migrated"


def reserve(owner: str) -> ReservedNames:
    """Claim the reserved names ``#<owner>/...`` for a surface's state; each owner is claimed once.

    ``owner`` is 1 to 32 of ``[a-z0-9_-]``, a letter first; ValueError for
    any other, and for one claimed already (two surfaces must not share
    their state's names).
    """
    if not _OWNER.match(owner):
        raise ValueError(f"a reserved names' owner is 1 to 32 of [a-z0-9_-], a letter first: {owner!r}")
    with _reserving:
        if owner in _reserved_owners:
            raise ValueError(f"the reserved names of {owner!r} are claimed already")
        _reserved_owners.add(owner)
    return ReservedNames(owner)


def is_transaction(name: str) -> bool:
    """True for the segment of an open transaction (``transaction_name``)."""
    return "#transaction." in name


# The store record (engine/store/record.py): in the data folder, or beside an S3 Tier 1's log.
STORE_RECORD_NAME = "store.json"
# The data folder's lock: one server's, held by its one process or shared by its processes.
FOLDER_LOCK_NAME = "LOCK"


def tier1_dir(data_dir: Path, container_id: int) -> Path:
    return data_dir / "tier1" / f"c{container_id}"


def wal_prefix(container_id: int) -> str:
    """Where container ``container_id``'s Tier 1 objects live when Tier 1 is an object store."""
    return f"c{container_id}/wal/"


def wal_object_name(container_id: int, write_number: int) -> str:
    return f"{wal_prefix(container_id)}{write_number:020d}"


def parse_wal_object_name(container_id: int, name: str) -> int | None:
    """The write number of a Tier 1 object of the container, or None."""
    return _numbered(wal_prefix(container_id), name)


def _numbered(prefix: str, name: str) -> int | None:
    """The 20-digit number after ``prefix`` that ``name`` is, or None."""
    rest = name.removeprefix(prefix)
    return int(rest) if rest != name and len(rest) == 20 and rest.isdigit() else None


def wal_start_prefix(container_id: int) -> str:
    """Where an object-store Tier 1 log records the write it starts at (written before a truncation)."""
    return f"c{container_id}/start/"


def wal_start_name(container_id: int, write_number: int) -> str:
    return f"{wal_start_prefix(container_id)}{write_number:020d}"


def parse_wal_start_name(container_id: int, name: str) -> int | None:
    return _numbered(wal_start_prefix(container_id), name)


def epoch_prefix(container_id: int) -> str:
    """Where the writers of an object-store Tier 1 log claim their epochs (put-if-absent)."""
    return f"c{container_id}/epochs/"


def epoch_name(container_id: int, epoch: int) -> str:
    return f"{epoch_prefix(container_id)}{epoch:020d}"


def parse_epoch_name(container_id: int, name: str) -> int | None:
    return _numbered(epoch_prefix(container_id), name)


def wal_closed_prefix(container_id: int) -> str:
    """Where a writer of an object-store Tier 1 log records that it closed its log cleanly."""
    return f"c{container_id}/closed/"


def wal_closed_name(container_id: int, epoch: int, next_write: int) -> str:
    """The record that the writer of ``epoch`` closed its log with every write below ``next_write`` done."""
    return f"{wal_closed_prefix(container_id)}{epoch:020d}/{next_write:020d}"


def parse_wal_closed_name(container_id: int, name: str) -> tuple[int, int] | None:
    """(epoch, next write) of a clean-close record of the container, or None."""
    epoch, _, next_write = name.removeprefix(wal_closed_prefix(container_id)).partition("/")
    prefix = wal_closed_prefix(container_id)
    parsed = _numbered(prefix, prefix + epoch), _numbered(prefix, prefix + next_write)
    if not name.startswith(prefix) or parsed[0] is None or parsed[1] is None:
        return None
    return parsed[0], parsed[1]


CLUSTER_RECORD = "cluster.json"
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def validate_node_id(node_id: str) -> str:
    """Return ``node_id`` if it can name a cluster node (it becomes an object name), else ValueError."""
    if not _NODE_ID.match(node_id):
        raise ValueError(f"a node id is 1 to 63 of [A-Za-z0-9_.-], first a letter or digit: {node_id!r}")
    return node_id


def node_prefix() -> str:
    """Where cluster nodes announce themselves (a register per node)."""
    return "nodes/"


def node_register_name(node_id: str) -> str:
    return f"{node_prefix()}{validate_node_id(node_id)}"


def parse_node_register_name(name: str) -> str | None:
    rest = name.removeprefix(node_prefix())
    return rest if rest != name and _NODE_ID.match(rest) else None


def lease_prefix() -> str:
    """Where the leases of a cluster's containers live (a register per container)."""
    return "leases/"


def lease_register_name(container_id: int) -> str:
    return f"{lease_prefix()}{container_id:05d}"


def parse_lease_register_name(name: str) -> int | None:
    rest = name.removeprefix(lease_prefix())
    return int(rest) if rest != name and len(rest) == 5 and rest.isdigit() else None


def log_file_name(first_frame_seq: int) -> str:
    return f"{first_frame_seq:020d}.log"


def parse_log_file_name(file_name: str) -> int | None:
    """The first frame sequence number of a log file, or None if it is not one."""
    match = _LOG_FILE.match(file_name)
    return int(match.group(1)) if match else None


def _escaped(name: str) -> str:
    escaped = quote(name, safe="")
    if len(escaped) > _MAX_KEY_PART:
        escaped = "~" + hashlib.sha256(name.encode("utf-8")).hexdigest()
    return escaped


def container_chunk_prefix(container_id: int) -> str:
    """Every chunk of a container starts with this."""
    return f"c{container_id}/"


def chunk_name(container_id: int, segment_name: str, segment_id: int, epoch: int, offset: int) -> str:
    """A new, unique chunk name for bytes of a segment starting at ``offset``."""
    return (
        f"{container_chunk_prefix(container_id)}{_escaped(segment_name)}.{segment_id}/"
        f"e{epoch:010d}-o{offset:020d}-{secrets.token_hex(4)}"
    )


@dataclass(frozen=True, slots=True)
class ChunkNameParts:
    container_id: int
    segment_id: int
    epoch: int
    offset: int


def parse_chunk_name(name: str) -> ChunkNameParts | None:
    """The parts of a chunk name, or None if ``name`` is not one."""
    match = _CHUNK.match(name)
    if match is None:
        return None
    return ChunkNameParts(*(int(g) for g in match.groups()))


def layout_key(segment_name: str) -> str:
    """Where a segment's exported layout is kept in Tier 2."""
    return f"layouts/{_escaped(segment_name)}.json"
