"""ACP itself for remote clients: connections, their sessions, bounded outboxes, routing.

Transport-independent; the HTTP + SSE and WebSocket glue is :mod:`serve.http.routes.acp`.
"""

from serve.acpfront.front import AcpFront, Connection, SessionLink
from serve.acpfront.outbox import Outbox

__all__ = ["AcpFront", "Connection", "Outbox", "SessionLink"]
