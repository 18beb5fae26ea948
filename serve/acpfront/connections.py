"""Connections and their lifecycle: the table, per-address caps, expiry, release.

A remote ACP client's :class:`Connection` is opened by ``initialize`` (:meth:`Connections.open`
admits it under :data:`MAX_CONNECTIONS` and :data:`MAX_CONNECTIONS_PER_CLIENT`) and owns
:class:`SessionLink` records, one per session it created or restored (their pumps are
:mod:`.links`). :class:`Connections` is the state every part of the front works on: the
table, the nursery its tasks run in (:meth:`Connections.run`, a supervised child of the
daemon), the counters, the Host.

Expiry: an HTTP connection with no open stream and no request for ``idle_timeout_s``
(``unused_timeout_s`` if it never opened one nor sent a request) is closed by the reaper.
Closing a connection (DELETE, a dropped socket, expiry, an overflowing connection outbox)
ends its streams at once and releases what it held in the background: pumps stop, and
each session's client registration is let go (``Detach``), or the session is closed
(``acp_connection_closed``) when no other client is attached to it.

Cancellation: every task of the front runs in :meth:`Connections.run`'s nursery; when it
is cancelled (the daemon stops) the connections are released, shielded and bounded (5 s),
without closing their sessions (the daemon ends them itself).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import trio

from actors import ActorError
from serve.access import OPERATOR, Principal
from serve.acpfront import jsonrpc
from serve.acpfront.errors import draining, not_running
from serve.acpfront.jsonrpc import SERVER_ERROR, RpcError
from serve.acpfront.outbox import Outbox
from serve.host import Host
from serve.sessions.actor import SessionActor
from serve.sessions.messages import (
    CloseSession,
    Detach,
    KnowsClient,
    SessionGone,
    SessionView,
    Summarize,
)

__all__ = [
    "ASK_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_UNUSED_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_CLIENT",
    "MAX_INFLIGHT",
    "MAX_SERVER_REQUESTS",
    "MAX_SESSIONS",
    "PUMP_MAX_QUEUED",
    "WRITER_STALL_S",
    "Connection",
    "Connections",
    "Policy",
    "SessionLink",
]

log = logging.getLogger(__name__)

#: Connections open at once (each: two bounded outboxes per session at most).
MAX_CONNECTIONS = 256
#: Connections open at once from one client address (so one client cannot take them all).
MAX_CONNECTIONS_PER_CLIENT = 32
#: Sessions one connection may own.
MAX_SESSIONS = 64
#: Requests of one connection being handled at once.
MAX_INFLIGHT = 64
#: Permission requests remembered per connection (JSON-RPC id → vote target).
MAX_SERVER_REQUESTS = 1024
#: An HTTP connection without an open stream or a request for this long expires (seconds).
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: An HTTP connection that never opened a stream nor sent a request after ``initialize``
#: expires this soon (seconds): bare initializes cannot hold the connection slots.
DEFAULT_UNUSED_TIMEOUT_S = 10.0
#: The pump's subscriber bound (frames), as ``?maxQueued`` on the REST stream.
PUMP_MAX_QUEUED = 2048
ASK_TIMEOUT_S = 30.0
#: How long a pump waits for a stream reader that is attached but not draining (seconds).
WRITER_STALL_S = 30.0

Transport = Literal["http", "ws"]


class SessionLink:
    """One session a connection owns: its client id there, its outbox, its pump."""

    __slots__ = (
        "client_id",
        "deferred",
        "ended",
        "epoch",
        "evicted",
        "hold_end",
        "last_pushed",
        "outbox",
        "principal",
        "pump_done",
        "pump_scope",
        "pushed",
        "resume_from",
        "session",
        "session_id",
        "workspace",
    )

    def __init__(
        self,
        session: SessionActor,
        client_id: str,
        outbox: Outbox,
        view: SessionView,
        principal: str = OPERATOR.id,
    ) -> None:
        self.session = session
        #: Who registered ``client_id`` (the connection's principal's id).
        self.principal = principal
        #: The session's id and workspace, as its view answered (never read off the actor).
        self.session_id = view.session_id
        self.client_id = client_id
        self.outbox = outbox
        self.workspace = view.workspace
        #: The epoch of the session's log, as its last Subscribe answered.
        self.epoch = view.epoch
        self.pump_scope: trio.CancelScope | None = None
        self.pump_done = trio.Event()
        self.pump_done.set()
        self.last_pushed: int | None = None
        #: Set (and replaced) whenever the pump has queued a batch.
        self.pushed = trio.Event()
        self.evicted = False
        #: After an eviction: the last event id before the first dropped one.
        self.resume_from: int | None = None
        #: Replies queued before a resume, re-queued after its replay (replay_complete).
        self.deferred: list[bytes] = []
        self.ended = False
        self.hold_end = False


class Connection:
    """One remote ACP client (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        dialect: str,
        workspace: str,
        *,
        loopback: bool,
        max_messages: int,
        max_bytes: int,
        client: str = "unknown",
        owner: str = "",
    ) -> None:
        self.id = str(uuid.uuid4())
        self.transport: Transport = transport
        self.dialect = dialect  # "acp" (an ACP client) | "qwen" (the daemon-route SDK)
        self.workspace = workspace
        self.loopback = loopback
        #: The client address that opened it (MAX_CONNECTIONS_PER_CLIENT counts these).
        self.client = client
        #: Who may use it (the transport's address + credential digest): any other
        #: request naming its id is answered as for an unknown connection.
        self.owner = owner
        #: Who it acts for, fixed when it is opened (serve/acpfront/access.py).
        self.principal: Principal = OPERATOR
        #: A stream was opened or a request other than initialize was sent.
        self.used = False
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes)
        self.sessions: dict[str, SessionLink] = {}
        self.server_requests: OrderedDict[str, tuple[str, str]] = OrderedDict()
        #: Its requests are answered in their HTTP POST (the qwen SDK: routing.Inline).
        self.inline_replies = False
        #: The elicitation modes its client advertised (serve/acpfront/elicit.py).
        self.elicitation_modes: frozenset[str] = frozenset()
        self.inflight = 0
        #: session/new, load and resume calls admitted under MAX_SESSIONS, not yet owned.
        self.reserved_sessions = 0
        self.closed = False
        self.open_streams = 0
        self.last_activity = time.monotonic()
        #: Cancel scopes of this connection's running requests (cancelled on close).
        self.tasks: set[trio.CancelScope] = set()
        #: The running requests by JSON-RPC id, for ``$/cancel_request`` (at most
        #: MAX_INFLIGHT), and the ids it cancelled (answered -32800).
        self.running: dict[jsonrpc.Id, trio.CancelScope] = {}
        self.cancelled: set[jsonrpc.Id] = set()

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        self.used = True

    def session_outbox_for(self, session_id: str) -> Outbox:
        link = self.sessions.get(session_id)
        if link is None or self.transport == "ws":
            return self.outbox
        return link.outbox

    def idle_for(self, now: float) -> float:
        if self.open_streams or self.inflight:
            return 0.0
        return now - self.last_activity


#: The transport's gate per request: (connection, method, params) → a refusal or None.
Policy = Callable[[Connection, str, dict[str, Any]], RpcError | None]


class Connections:
    """The table of connections, its tasks and counters; see the module docstring."""

    def __init__(
        self,
        host: Host,
        *,
        policy: Policy | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        unused_timeout_s: float = DEFAULT_UNUSED_TIMEOUT_S,
        max_messages: int = 2048,
        max_bytes: int = 8 * 1024 * 1024,
        version: str = "0",
        daemon_status: Callable[[Literal["summary", "full"]], dict[str, Any]] | None = None,
    ) -> None:
        self.host = host
        #: ``_qwen/status``'s body at a detail level: the daemon's status read model, given
        #: by whoever builds the front (``serve/http/routes/acp.py``; None: not offered).
        self.daemon_status = daemon_status
        self.policy = policy
        self.idle_timeout_s = idle_timeout_s
        self.unused_timeout_s = min(unused_timeout_s, idle_timeout_s)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.version = version
        self.connections: dict[str, Connection] = {}
        self._nursery: trio.Nursery | None = None
        self.expired = 0
        self.evictions = 0

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the front's tasks until cancelled; ready once requests can be taken."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reaper)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                for conn in list(self.connections.values()):
                    await self._release(conn, close_sessions=False)

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def _reaper(self) -> None:
        interval = max(0.05, min(30.0, self.unused_timeout_s / 4))
        while True:
            await trio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections.values()):
                limit = self.idle_timeout_s if conn.used else self.unused_timeout_s
                if conn.transport == "http" and conn.idle_for(now) >= limit:
                    log.info("ACP connection %s expired (idle)", conn.id)
                    self.expired += 1
                    self.close(conn)

    def spawn[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        """Start a request's task (refused when the front is not running)."""
        if self._nursery is None:
            raise not_running()
        self._nursery.start_soon(fn, *args)

    def background[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        """Start clean-up work if the front still runs (it never raises)."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    # ---- connections -------------------------------------------------------------------

    def get(self, connection_id: str) -> Connection | None:
        return self.connections.get(connection_id)

    def open(
        self,
        transport: Transport,
        dialect: str,
        workspace: str,
        *,
        loopback: bool,
        client: str,
        owner: str,
    ) -> Connection:
        """Admit a new connection under the caps (total, per client address)."""
        if len(self.connections) >= MAX_CONNECTIONS:
            raise RpcError(
                SERVER_ERROR,
                f"ACP connection limit reached ({MAX_CONNECTIONS})",
                {"httpStatus": 503, "code": "connection_limit_exceeded", "limit": MAX_CONNECTIONS},
            )
        mine = sum(1 for c in self.connections.values() if c.client == client)
        if mine >= MAX_CONNECTIONS_PER_CLIENT:
            raise RpcError(
                SERVER_ERROR,
                f"ACP connection limit per client reached ({MAX_CONNECTIONS_PER_CLIENT})",
                {
                    "httpStatus": 503,
                    "code": "client_connection_limit_exceeded",
                    "limit": MAX_CONNECTIONS_PER_CLIENT,
                },
            )
        conn = Connection(
            transport,
            dialect,
            workspace,
            loopback=loopback,
            max_messages=self.max_messages,
            max_bytes=self.max_bytes,
            client=client,
            owner=owner,
        )
        self.connections[conn.id] = conn
        return conn

    def check_open(self) -> None:
        """Refuse a new connection while the front is not running or the daemon drains."""
        if self._nursery is None or self.host.draining:
            raise draining()

    def close(self, conn: Connection) -> None:
        """End a connection (DELETE, dropped socket, expiry): streams end at once, and what
        it held is released in the background."""
        if conn.closed:
            return
        conn.closed = True
        self.connections.pop(conn.id, None)
        conn.outbox.end()
        for link in conn.sessions.values():
            link.outbox.end()
        for scope in list(conn.tasks):
            scope.cancel()
        if self._nursery is not None:
            self._nursery.start_soon(self._release, conn, True)

    async def end_streams(self, timeout_s: float) -> None:
        """The daemon is stopping and its sessions have ended: let every pump relay what
        its session published last (``session_died``), up to ``timeout_s``, then end every
        stream (each reader drains its outbox, then its SSE response or WebSocket closes),
        so the HTTP listener has nothing left to wait for."""
        with trio.move_on_after(timeout_s):
            for conn in list(self.connections.values()):
                for link in list(conn.sessions.values()):
                    await link.pump_done.wait()
        for conn in list(self.connections.values()):
            conn.outbox.end()
            for link in conn.sessions.values():
                link.outbox.end()

    async def _release(self, conn: Connection, close_sessions: bool) -> None:
        conn.closed = True
        self.connections.pop(conn.id, None)
        links = list(conn.sessions.values())
        conn.sessions.clear()
        for link in links:
            if link.pump_scope is not None:
                link.pump_scope.cancel()
            link.outbox.end()
        if not close_sessions:
            return  # the daemon is stopping: its sessions end with it
        async with trio.open_nursery() as nursery:
            for link in links:
                if not link.ended:
                    link.ended = True
                    nursery.start_soon(let_go, link, True)


async def let_go(link: SessionLink, close_if_alone: bool) -> None:
    """Release ``link``'s client registration once its pump has stopped (its stream is
    then no longer counted); with ``close_if_alone``, close the session instead when
    no other client is attached to it. A session gone meanwhile is fine."""
    with trio.move_on_after(5):
        await link.pump_done.wait()
    session = link.session
    try:
        if close_if_alone and not await _others_attached(link):
            await session.call(CloseSession(reason="acp_connection_closed"), timeout_s=10)
        else:
            await session.call(Detach(link.client_id), timeout_s=10)
    except (SessionGone, ActorError):
        pass
    except Exception as exc:
        log.info("ACP: releasing session %s failed: %r", link.session_id, exc)


async def _others_attached(link: SessionLink) -> bool:
    summary = await link.session.call(Summarize(), timeout_s=ASK_TIMEOUT_S)
    mine = await link.session.call(
        KnowsClient(link.client_id, link.principal), timeout_s=ASK_TIMEOUT_S
    )
    return int(summary.get("clientCount", 0)) - (1 if mine else 0) > 0
