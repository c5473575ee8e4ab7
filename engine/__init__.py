"""segstore's storage engine: importable and testable without the HTTP layer.

``app/`` uses only the names exported here.
"""

from engine.attributes import ATTRIBUTES_PER_REQUEST_MAX, AttributeUpdate, AttributeUpdateType
from engine.config import Settings, load_settings
from engine.errors import (
    BadOffset,
    ConditionalCheckFailed,
    ContainerNotReady,
    DataCorrupted,
    InvalidArgument,
    InvalidName,
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
from engine.naming import validate_segment_name
from engine.store import SegmentStore
from engine.streams import (
    MAX_PRODUCER_EPOCH,
    MAX_PRODUCER_SEQ,
    AppendOutcome,
    Producer,
    StreamClosed,
    StreamConflict,
    StreamGone,
    StreamInfo,
    StreamNotFound,
    StreamRead,
    StreamStore,
    is_json,
    normalize_content_type,
    validate_expires_at,
)
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo

__all__ = [
    "ATTRIBUTES_PER_REQUEST_MAX",
    "MAX_PRODUCER_EPOCH",
    "MAX_PRODUCER_SEQ",
    "AppendOutcome",
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
    "PayloadTooLarge",
    "Producer",
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
    "StreamClosed",
    "StreamConflict",
    "StreamGone",
    "StreamInfo",
    "StreamNotFound",
    "StreamRead",
    "StreamStore",
    "Throttled",
    "is_json",
    "load_settings",
    "normalize_content_type",
    "validate_expires_at",
    "validate_segment_name",
]
