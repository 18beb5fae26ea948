"""One ACP connection, many sessions: route what the agent sends by ``sessionId``.

Theory of operation
-------------------
ACP lets one client connection carry many sessions. :class:`SessionMux` is the connection's
single :class:`~acp.handler.ClientHandler`; each session that uses the connection registers
its own handler under its ACP ``sessionId`` with :meth:`SessionMux.bind`, and
:meth:`SessionMux.unbind` removes it. The mux then forwards:

* ``session/update`` notifications to the owning handler, synchronously and in wire order;
* agent -> client requests (``session/request_permission``, ``fs/*``, ``terminal/*``) to the
  handler named by the request's ``sessionId``; a request for a session that is not bound
  is answered the safe way (permission: ``cancelled``; fs/terminal: ``-32602`` naming the
  session), so one session can never act through another's grants or clients;
* other notifications and vendor requests by their ``params.sessionId`` when they carry one
  (else notifications are dropped and requests answer ``-32601``; the session-less
  ``elicitation/complete`` goes to every bound handler, which keep only their own ids; an
  ``elicitation/create`` naming no bound session is answered ``{action: "cancel"}``).

Updates for a ``sessionId`` nobody has bound yet are kept, in order, in a bounded buffer
(:data:`MAX_UNBOUND_UPDATES` messages for the whole connection; older ones are dropped) and
handed to the handler when it binds. That covers ``session/new``: the agent may send
updates (``available_commands_update``...) before the answer that tells us the id. (Those of
a ``session/new`` that failed stay until pushed out: other sessions' may be in the buffer.)
A session that was bound and left (:meth:`SessionMux.unbind`) is never new: its buffered
updates are dropped, and so are those that arrive until it binds again (what an agent still
sends of a turn abandoned when the session left must not reach it on its next bind).

Terminals: the connection gives the mux a :class:`~acp.terminal.TerminalManager`; every
handler bound to it that is a :class:`~acp.handler.BaseClientHandler` uses that manager
(terminal ids are the connection's, requests are still routed per session; the terminal cap
is per session). A session leaving the connection (:meth:`SessionMux.unbind`) takes its
terminals with it: they are killed and forgotten there, since the agent's own
``terminal/kill`` for them would be refused once the session is unbound.

Oversized lines: the connection drops a line over its cap before it is parsed, but reads
the ``sessionId`` its start or end names (:func:`acp.client.named_session`); the mux reports
the drop to that session only. A line that names no bound session is counted on the mux
(``unattributed_drops``, per child in ``/daemon/status``) and logged, never reported to the
co-tenants: it is not theirs, and their own prompt ids would be stamped on it.

Flow control: :meth:`flow_control` waits on the handler that received the last update (a
lagging reader of one session paces the connection only while its own updates flow).

The mux is a routing table, not an actor: ``bind``/``unbind`` are synchronous, called by
the session that owns the entry, and only ever from the trio thread.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Final

import msgspec

from acp.errors import INVALID_PARAMS, HandlerError, method_not_found
from acp.handler import BaseClientHandler, ClientHandler
from acp.schema import (
    CancelledPermissionOutcome,
    CreateTerminalParams,
    PermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    TerminalExitStatus,
    TerminalIdParams,
    TerminalOutputResult,
    WriteTextFileParams,
)

log = logging.getLogger(__name__)

#: Updates kept for sessions not bound yet, per connection (messages).
MAX_UNBOUND_UPDATES: Final = 1024
#: Notifications that name no session but belong to one: every bound handler hears them and
#: keeps only what it knows (``elicitation/complete`` names an ``elicitationId``, which only
#: the session that brokered that url elicitation has seen).
UNSCOPED_NOTIFICATIONS: Final = frozenset({"elicitation/complete"})


class _SessionRef(msgspec.Struct, frozen=True, rename="camel"):
    session_id: str | None = None


_ref_decoder: Final = msgspec.json.Decoder(_SessionRef)


def _session_of(params: msgspec.Raw) -> str | None:
    try:
        return _ref_decoder.decode(params).session_id
    except msgspec.DecodeError:
        return None


class SessionMux(BaseClientHandler):
    """The handler of one shared ACP connection (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._handlers: dict[str, ClientHandler] = {}
        self._unbound: deque[tuple[str, str, msgspec.Raw]] = deque(maxlen=MAX_UNBOUND_UPDATES)
        self._last: ClientHandler | None = None
        #: Sessions that were bound here and left (insertion-ordered, at most
        #: MAX_UNBOUND_UPDATES ids): their late updates are dropped, not kept for a bind.
        self._left: dict[str, None] = {}
        #: Oversized lines dropped that named no bound session (see on_oversized_line).
        self.unattributed_drops = 0

    # ---- the routing table -------------------------------------------------------------

    def bind(self, session_id: str, handler: ClientHandler) -> None:
        """Route ``session_id`` to ``handler``; buffered updates for it are delivered now."""
        self._handlers[session_id] = handler
        self._left.pop(session_id, None)
        if isinstance(handler, BaseClientHandler) and self.terminals is not None:
            handler.terminals = self.terminals
        if self._unbound:
            keep: deque[tuple[str, str, msgspec.Raw]] = deque(maxlen=MAX_UNBOUND_UPDATES)
            for sid, kind, update in self._unbound:
                if sid == session_id:
                    handler.on_session_update(sid, kind, update)
                else:
                    keep.append((sid, kind, update))
            self._unbound = keep

    def unbind(self, session_id: str, handler: ClientHandler | None = None) -> None:
        """Stop routing ``session_id`` (only if it still routes to ``handler``, when given)."""
        current = self._handlers.get(session_id)
        if current is not None and (handler is None or current is handler):
            del self._handlers[session_id]
            if self._last is current:
                self._last = None
            if self.terminals is not None:
                self.terminals.release_session(session_id)
            self._left[session_id] = None
            while len(self._left) > MAX_UNBOUND_UPDATES:
                del self._left[next(iter(self._left))]
            if any(sid == session_id for sid, _, _ in self._unbound):
                self._unbound = deque(
                    (u for u in self._unbound if u[0] != session_id), maxlen=MAX_UNBOUND_UPDATES
                )

    @property
    def session_ids(self) -> list[str]:
        return list(self._handlers)

    def handler_for(self, session_id: str) -> ClientHandler | None:
        return self._handlers.get(session_id)

    def _route(self, session_id: str, what: str) -> ClientHandler:
        handler = self._handlers.get(session_id)
        if handler is None:
            raise HandlerError(
                INVALID_PARAMS,
                f"{what}: no session {session_id!r} on this connection",
                {"sessionId": session_id},
            )
        return handler

    # ---- notifications -----------------------------------------------------------------

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        handler = self._handlers.get(session_id)
        if handler is None:
            if session_id in self._left:  # e.g. the rest of a turn abandoned on leaving
                log.debug("dropping a %s update for session %s, which left", kind, session_id)
            else:
                self._unbound.append((session_id, kind, update))
            return
        self._last = handler
        handler.on_session_update(session_id, kind, update)

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        sid = _session_of(params)
        handler = self._handlers.get(sid) if sid is not None else None
        if handler is not None:
            handler.on_notification(method, params)
        elif sid is None and method in UNSCOPED_NOTIFICATIONS:
            for each in list(self._handlers.values()):  # each keeps only what it knows
                each.on_notification(method, params)
        else:
            log.debug("dropping agent notification %s (no bound session)", method)

    async def flow_control(self, incoming_bytes: int = 0) -> None:
        hook = getattr(self._last, "flow_control", None)
        if hook is not None:
            await hook(incoming_bytes)

    def on_oversized_line(self, size: int, limit: int, session_id: str | None = None) -> None:
        """A dropped line goes to the bound session it names (its start or end, read by the
        connection); one that names none, or one not bound here, is only counted
        (:attr:`unattributed_drops`) and logged: telling every co-tenant would report a line
        that is not theirs, under their own prompts, and show them a neighbour's activity."""
        handler = self._handlers.get(session_id) if session_id is not None else None
        hook = getattr(handler, "on_oversized_line", None)
        if hook is not None:
            hook(size, limit, session_id)
            return
        self.unattributed_drops += 1
        log.warning(
            "dropped a %d-byte agent line over the %d-byte cap naming no bound session (%s)",
            size,
            limit,
            "no sessionId" if session_id is None else f"sessionId {session_id[:64]!r}",
        )

    # ---- requests ----------------------------------------------------------------------

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        handler = self._handlers.get(params.session_id)
        if handler is None:
            return CancelledPermissionOutcome()
        return await handler.request_permission(params, raw)

    async def read_text_file(self, params: ReadTextFileParams) -> str:
        return await self._route(params.session_id, "fs/read_text_file").read_text_file(params)

    async def write_text_file(self, params: WriteTextFileParams) -> None:
        await self._route(params.session_id, "fs/write_text_file").write_text_file(params)

    async def terminal_create(self, params: CreateTerminalParams) -> str:
        return await self._route(params.session_id, "terminal/create").terminal_create(params)

    async def terminal_output(self, params: TerminalIdParams) -> TerminalOutputResult:
        return await self._route(params.session_id, "terminal/output").terminal_output(params)

    async def terminal_wait_for_exit(self, params: TerminalIdParams) -> TerminalExitStatus:
        handler = self._route(params.session_id, "terminal/wait_for_exit")
        return await handler.terminal_wait_for_exit(params)

    async def terminal_kill(self, params: TerminalIdParams) -> None:
        await self._route(params.session_id, "terminal/kill").terminal_kill(params)

    async def terminal_release(self, params: TerminalIdParams) -> None:
        await self._route(params.session_id, "terminal/release").terminal_release(params)

    async def ext_request(self, method: str, params: msgspec.Raw) -> object:
        sid = _session_of(params)
        handler = self._handlers.get(sid) if sid is not None else None
        if handler is None:
            if method == "elicitation/create":  # request-scoped, or no session: nobody to ask
                return {"action": "cancel"}
            raise method_not_found(method)
        return await handler.ext_request(method, params)
