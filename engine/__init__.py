"""segstore's storage engine: importable and testable without the HTTP layer.

``app/`` uses only the names exported here; the protocol surfaces (native, S3,
Durable Streams) live in ``app/``, each mapping its protocol onto these.
"""

from engine.blocking import run_blocking
from engine.cluster.peer_service import PeerService
from engine.cluster.peers import PEER_PATH
from engine.cluster.peers import SECRET_HEADER as PEER_SECRET_HEADER
from engine.config import Settings, load_settings, read_settings, refuse_negative, refuse_zero, setting_kinds
from engine.container.composite import (
    AppendStep,
    CreateStep,
    DeleteStep,
    MergeStep,
    SealStep,
    Step,
    StepResult,
    TruncateStep,
    UpdateAttributesStep,
)
from engine.container.state import RECOVERED as RECOVERED_STATES
from engine.container.state import RECOVERING
from engine.container.state import SERVING as SERVING_STATES
from engine.errors import (
    BadOffset,
    ConditionalCheckFailed,
    ContainerNotReady,
    DataCorrupted,
    EventNumberMismatch,
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
from engine.metadata.attribute_updates import ATTRIBUTES_PER_REQUEST_MAX, AttributeUpdate, AttributeUpdateType
from engine.naming import (
    ReservedNames,
    container_for,
    is_reserved,
    reserve,
    transaction_name,
    validate_segment_name,
)
from engine.store.segment_store import SegmentStore
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo

__all__ = [
    "ATTRIBUTES_PER_REQUEST_MAX",
    "PEER_PATH",
    "PEER_SECRET_HEADER",
    "RECOVERED_STATES",
    "RECOVERING",
    "SERVING_STATES",
    "AppendResult",
    "AppendStep",
    "AttributeUpdate",
    "AttributeUpdateType",
    "BadOffset",
    "ConditionalCheckFailed",
    "ContainerNotReady",
    "CreateStep",
    "DataCorrupted",
    "DeleteStep",
    "EventNumberMismatch",
    "InvalidArgument",
    "InvalidName",
    "MergeResult",
    "MergeStep",
    "Misconfigured",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PeerService",
    "ReadResult",
    "ReservedNames",
    "SealStep",
    "SegmentExists",
    "SegmentInfo",
    "SegmentNotFound",
    "SegmentNotSealed",
    "SegmentSealed",
    "SegmentStore",
    "SegmentTruncated",
    "SegstoreError",
    "Settings",
    "Step",
    "StepResult",
    "StorageFull",
    "StoreLocked",
    "Throttled",
    "TruncateStep",
    "UpdateAttributesStep",
    "container_for",
    "is_reserved",
    "load_settings",
    "read_settings",
    "refuse_negative",
    "refuse_zero",
    "reserve",
    "run_blocking",
    "setting_kinds",
    "transaction_name",
    "validate_segment_name",
]
