"""ACP itself for remote clients: connections, their sessions, bounded outboxes, routing.

Transport-independent; the HTTP + SSE and WebSocket glue is :mod:`serve.http.routes.acp`.
The parts are listed in :mod:`.front`'s docstring.
"""

from serve.acpfront.connections import Connection, SessionLink
from serve.acpfront.front import AcpFront
from serve.acpfront.outbox import Outbox

__all__ = ["AcpFront", "Connection", "Outbox", "SessionLink"]
