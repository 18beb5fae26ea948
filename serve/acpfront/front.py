"""The ACP front: acp-serve as the ACP *agent* of remote clients, over any transport.

Theory of operation
-------------------
A remote ACP client opens a connection with ``initialize`` (HTTP: ``POST /acp``;
WebSocket: the first frame; :meth:`AcpFront.initialize`). The connection owns the
sessions it created or restored (``session/new``, ``session/load``, ``session/resume``),
each a registered client of the session actor with a pump that reads the session's event
log into the session's outbox, exactly as ``GET /session/:id/events`` does. So a session
made here is an ordinary session (REST sees it, its events reach REST subscribers), and a
turn started over REST shows on the ACP stream.

The parts, one concept each:

* :mod:`.connections` — :class:`~.connections.Connection`, the table, per-address caps,
  expiry, release (the state every other part works on, :class:`~.connections.Connections`);
* :mod:`.dispatch` — the method table and one message from receipt to reply;
* :mod:`.routing` — which outbox a reply goes to (or the POST itself, for the qwen SDK),
  and eviction on overflow;
* :mod:`.links` — session links and their pumps, resume after eviction;
* :mod:`.session_methods`, :mod:`.file_methods`, :mod:`.vote_methods` (and
  :mod:`.v121`, :mod:`.fork`, :mod:`.steering`, :mod:`.workspace_methods`,
  :mod:`.elicit`) — the handlers;
* :mod:`.errors` — the front's own refusals and the one place an exception becomes a
  reply (through the error table, :mod:`serve.errors`).

The front never reads or changes a session's live state: everything is a message to an
actor, sent with ``session.call`` and answered with the typed replies of
:mod:`serve.sessions.messages`. Permission answers go to the PermissionMediator as votes
(``CastVote``) under the daemon's mediation policy, creation and restore go to the
SessionRegistry. ``fs/*`` and ``terminal/*`` requests of the child agent are served by the
daemon (the session actor and its effect gate) and never reach a remote client: only
``session/request_permission`` and ``elicitation/create`` (to clients that advertised the
mode: :mod:`.elicit`) are forwarded, their answers votes.

Bounds (units named): at most :data:`MAX_CONNECTIONS` connections
(:data:`MAX_CONNECTIONS_PER_CLIENT` per client address), :data:`MAX_SESSIONS` sessions
(admitted before a session is made or restored) and :data:`MAX_INFLIGHT` requests in
flight per connection; every outbox holds at most ``max_messages`` messages and
``max_bytes`` bytes (:mod:`.routing` says what overflow does).

Supervision: the front is built by :func:`serve.runtime.build.build_host` and runs as the
``acp-front`` child of the root supervisor, beside ``http``; :meth:`AcpFront.run` is its
target. The front knows nothing of HTTP: the transports (``serve/http/routes/acp.py``)
hand it connections and messages through :meth:`AcpFront.initialize`,
:meth:`AcpFront.submit`, :meth:`AcpFront.session_outbox` and :meth:`AcpFront.close`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from serve.acpfront import dispatch, elicit, jsonrpc, links, steering, v121
from serve.acpfront.connections import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_UNUSED_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_INFLIGHT,
    MAX_SESSIONS,
    Connection,
    Connections,
    Policy,
    SessionLink,
    Transport,
)
from serve.acpfront.errors import params_error
from serve.acpfront.fork import fork_capability
from serve.acpfront.jsonrpc import Request
from serve.acpfront.outbox import Outbox
from serve.acpfront.routing import INLINE_CLIENT, Inline

if TYPE_CHECKING:
    from serve.sessions.actor import SessionActor

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_UNUSED_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_CLIENT",
    "MAX_INFLIGHT",
    "MAX_SESSIONS",
    "PROTOCOL_VERSION",
    "AcpFront",
    "Connection",
    "Policy",
    "SessionLink",
]

PROTOCOL_VERSION = 1


class AcpFront(Connections):
    """The front the transports talk to; see the module docstring."""

    @property
    def methods(self) -> list[str]:
        return sorted(dispatch.METHODS)

    def initialize(
        self,
        transport: Transport,
        workspace: str,
        request: Request,
        *,
        loopback: bool,
        client: str = "unknown",
        owner: str = "",
    ) -> tuple[Connection, bytes]:
        """Open a connection for ``initialize``; returns it and the encoded reply.
        ``client`` is the caller's address, ``owner`` what later requests must match."""
        self.check_open()
        params = request.params
        version = params.get("protocolVersion")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise params_error("`protocolVersion` must be an integer")
        client_info = params.get("clientInfo")
        if client_info is not None and not isinstance(client_info, dict):
            raise params_error("`clientInfo` must be an object")
        # The qwen SDK's route-table transports send only {clientInfo}: they speak the
        # daemon's REST semantics over JSON-RPC (its synthesised HTTP statuses).
        dialect = "acp" if version is not None else "qwen"
        conn = self.open(
            transport, dialect, workspace, loopback=loopback, client=client, owner=owner
        )
        conn.elicitation_modes = elicit.client_modes(params.get("clientCapabilities"))
        conn.inline_replies = (
            transport == "http"
            and dialect == "qwen"
            and isinstance(client_info, dict)
            and client_info.get("name") == INLINE_CLIENT
        )
        result = {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": True, "audio": True, "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {
                    "list": {},
                    "resume": {},
                    "close": {},
                    "delete": {},
                    "additionalDirectories": {},
                }
                | fork_capability(self.host, workspace),
                "auth": {"logout": {}},
                "_meta": {
                    "qwen": {
                        "connectionId": conn.id,
                        "transport": transport,
                        "methods": self.methods,
                    }
                },
            },
            "agentInfo": {"name": "acp-serve", "title": "acp-serve", "version": self.version},
            "authMethods": v121.auth_methods(self, workspace),
            "_meta": steering.INITIALIZE_META,
        }
        return conn, jsonrpc.result_bytes(request.id, result)

    def submit(
        self,
        conn: Connection,
        message: jsonrpc.Message,
        header_session: str | None,
        inline: Inline | None = None,
    ) -> None:
        """Handle one message in the background; its reply lands in an outbox, or in
        ``inline`` (answered in the request's own POST: :class:`~.routing.Inline`)."""
        dispatch.submit(self, conn, message, header_session, inline)

    async def session_outbox(
        self,
        conn: Connection,
        session_id: str,
        *,
        last_event_id: int | None,
        epoch: str | None,
    ) -> tuple[Outbox, str] | None:
        """The outbox of an owned session's stream (None: not owned), resumed from
        ``last_event_id`` when given; returns it with the log's epoch."""
        return await links.session_outbox(
            self, conn, session_id, last_event_id=last_event_id, epoch=epoch
        )

    def cut_links(self, conn: Connection, reads: Callable[[SessionActor], bool]) -> int:
        """End the session links of ``conn`` whose session ``reads`` now refuses (its
        principal's role on it is gone: a member or a role removed); how many ended."""
        return links.cut_links(self, conn, reads)
