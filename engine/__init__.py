"""segstore's storage engine: importable and testable without the HTTP layer.

``app/`` uses only the names exported here; the protocol surfaces (native, S3,
Durable Streams) live in ``app/``, each mapping its protocol onto these.
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
from engine.naming import (
    STREAM_DATA_PREFIX,
    STREAM_META_PREFIX,
    stream_data_segment,
    stream_meta_segment,
    stream_of_meta_segment,
    validate_segment_name,
)
from engine.store import SegmentStore
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo

__all__ = [
    "ATTRIBUTES_PER_REQUEST_MAX",
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
    "PayloadTooLarge",
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
    "load_settings",
    "stream_data_segment",
    "stream_meta_segment",
    "stream_of_meta_segment",
    "validate_segment_name",
]
