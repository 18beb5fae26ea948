"""Per-session event logs and their SSE encoding."""

from serve.events.log import (
    DEFAULT_MAX_QUEUED,
    HEARTBEAT_FRAME,
    MAX_MAX_QUEUED,
    MIN_MAX_QUEUED,
    RETRY_FRAME,
    EventLog,
    RawParts,
    Subscriber,
    SubscriberLimitExceeded,
    synthetic,
)

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "HEARTBEAT_FRAME",
    "MAX_MAX_QUEUED",
    "MIN_MAX_QUEUED",
    "RETRY_FRAME",
    "EventLog",
    "RawParts",
    "Subscriber",
    "SubscriberLimitExceeded",
    "synthetic",
]
