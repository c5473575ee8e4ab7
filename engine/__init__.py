"""segstore's storage engine: importable and testable without the HTTP layer.

``app/`` uses only the names exported here; the protocol surfaces (native, S3,
Durable Streams) live in ``app/``, each mapping its protocol onto these.
"""

from engine.attributes import ATTRIBUTES_PER_REQUEST_MAX, AttributeUpdate, AttributeUpdateType
from engine.cluster.peer_service import PeerService
from engine.cluster.peers import PEER_PATH
from engine.cluster.peers import SECRET_HEADER as PEER_SECRET_HEADER
from engine.config import Settings, load_settings
from engine.container_state import SERVING as SERVING_STATES
from engine.errors import (
    BadOffset,
    ConditionalCheckFailed,
    ContainerNotReady,
    DataCorrupted,
    InvalidArgument,
    InvalidName,
    Misconfigured,
    OutcomeUnknown,
    PayloadTooLarge,
    SegmentExists,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegmentTruncated,
    SegstoreError,
    StorageFull,
    StoreLocked,
    Throttled,
)
from engine.naming import (
    LEGACY_S3_PREFIX,
    LEGACY_STREAM_DATA_PREFIX,
    LEGACY_STREAM_META_PREFIX,
    S3_OWNER,
    STREAM_DATA_PREFIX,
    STREAM_META_PREFIX,
    STREAMS_OWNER,
    container_for,
    is_reserved,
    migrated_marker,
    s3_state_name,
    stream_data_segment,
    stream_meta_of_data_segment,
    stream_meta_segment,
    stream_of_meta_segment,
    validate_segment_name,
)
from engine.store import SegmentStore
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo

__all__ = [
    "ATTRIBUTES_PER_REQUEST_MAX",
    "LEGACY_S3_PREFIX",
    "LEGACY_STREAM_DATA_PREFIX",
    "LEGACY_STREAM_META_PREFIX",
    "PEER_PATH",
    "PEER_SECRET_HEADER",
    "S3_OWNER",
    "SERVING_STATES",
    "STREAMS_OWNER",
    "STREAM_DATA_PREFIX",
    "STREAM_META_PREFIX",
    "AppendResult",
    "AttributeUpdate",
    "AttributeUpdateType",
    "BadOffset",
    "ConditionalCheckFailed",
    "ContainerNotReady",
    "DataCorrupted",
    "InvalidArgument",
    "InvalidName",
    "MergeResult",
    "Misconfigured",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PeerService",
    "ReadResult",
    "SegmentExists",
    "SegmentInfo",
    "SegmentNotFound",
    "SegmentNotSealed",
    "SegmentSealed",
    "SegmentStore",
    "SegmentTruncated",
    "SegstoreError",
    "Settings",
    "StorageFull",
    "StoreLocked",
    "Throttled",
    "container_for",
    "is_reserved",
    "load_settings",
    "migrated_marker",
    "s3_state_name",
    "stream_data_segment",
    "stream_meta_of_data_segment",
    "stream_meta_segment",
    "stream_of_meta_segment",
    "validate_segment_name",
]
