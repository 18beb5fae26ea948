"""Python client of the acp-serve / ``qwen serve`` v1 HTTP+SSE protocol, and its CLI.

Public surface (everything else is private):

* :class:`AcpServeClient` — async (anyio: runs under trio or asyncio); one method per
  route, typed answers (:mod:`serve.client.types`, frozen msgspec Structs), typed errors
  (:mod:`serve.client.errors`).
* :class:`SyncAcpServeClient` — the same methods, blocking (a private trio loop in a
  background thread drives the async client).
* :class:`EventStream` / :class:`SyncEventStream` — a session's events, resumable:
  reconnects with ``Last-Event-ID`` on transport errors and evictions with bounded
  backoff, skips heartbeats, delivers ``state_resync_required``, ends after
  ``session_closed`` / ``session_died``.
* ``serve.client.cli:main`` — the ``acp-serve-client`` command line.

Layering: ``_sse`` (sans-IO SSE parser) and ``_cursor`` (sans-IO resume state and
backoff) know nothing of HTTP; ``_events`` and ``_async`` do the I/O with httpx;
``_sync`` wraps ``_async``; ``cli``/``_render``/``_chat`` use only the public surface.
The client imports nothing from the daemon: it speaks the wire protocol only.
"""

from serve.client._async import DEFAULT_URL, AcpServeClient, PromptInput
from serve.client._cursor import Backoff
from serve.client._events import EventStream, EventStreamStats
from serve.client._sync import SyncAcpServeClient, SyncEventStream
from serve.client.errors import (
    AcpServeClientError,
    BadRequestError,
    ConflictError,
    DaemonHttpError,
    DaemonUnreachableError,
    EventStreamLostError,
    ForbiddenError,
    MissingCapabilityError,
    NotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    RateLimitedError,
    ServerError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from serve.client.types import (
    Capabilities,
    DaemonStatus,
    Event,
    FileContent,
    FileEditResult,
    FileWriteResult,
    Health,
    PermissionRequest,
    PromptAccepted,
    PromptResult,
    RestoredSession,
    Session,
    SessionList,
    SessionSummary,
    SessionUpdate,
    StateResyncRequired,
    TurnComplete,
    TurnError,
)

__all__ = [
    "DEFAULT_URL",
    "AcpServeClient",
    "AcpServeClientError",
    "Backoff",
    "BadRequestError",
    "Capabilities",
    "ConflictError",
    "DaemonHttpError",
    "DaemonStatus",
    "DaemonUnreachableError",
    "Event",
    "EventStream",
    "EventStreamLostError",
    "EventStreamStats",
    "FileContent",
    "FileEditResult",
    "FileWriteResult",
    "ForbiddenError",
    "Health",
    "MissingCapabilityError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionRequest",
    "PromptAccepted",
    "PromptInput",
    "PromptResult",
    "ProtocolError",
    "RateLimitedError",
    "RestoredSession",
    "ServerError",
    "ServiceUnavailableError",
    "Session",
    "SessionList",
    "SessionSummary",
    "SessionUpdate",
    "StateResyncRequired",
    "SyncAcpServeClient",
    "SyncEventStream",
    "TurnComplete",
    "TurnError",
    "UnauthorizedError",
]
