"""The ACP front: acp-serve as the ACP *agent* of remote clients, over any transport.

Theory of operation
-------------------
A remote ACP client opens a :class:`Connection` with ``initialize`` (HTTP: ``POST /acp``;
WebSocket: the first frame). The connection owns the sessions it created or restored
(``session/new``, ``session/load``, ``session/resume``) as :class:`SessionLink`\\ s: for each,
the connection is a registered client of the session actor (``Attach`` → ``Attached``) and
a *pump* task reads the session's :class:`~serve.events.EventLog` through the subscriber a
``Subscribe`` answered, exactly as ``GET /session/:id/events`` does (``StreamEnded`` when it
stops), translating every frame (:mod:`.translate`) into the session's outbox. So a session
made here is an ordinary session (REST sees it, its events reach REST subscribers), and a
turn started over REST shows on the ACP stream.

The front never reads or changes a session's live state: everything is a message to an
actor, sent with ``session.call`` and answered with the typed replies of
:mod:`serve.sessions.messages` (their errors become the REST bodies, as JSON-RPC errors, in
:func:`_rpc_from_exception`). Prompts, cancel, close, mode and model switches, metadata,
heartbeats, views (``Describe``, ``Summarize``) and releases (``Detach``) go to the session
actor (``SubmitPrompt``, ``CancelTurn``, ...),
permission answers go to the PermissionMediator as votes (``CastVote``) under the daemon's
mediation policy, creation and restore go to the SessionRegistry. ``fs/*`` and ``terminal/*``
requests of the child agent are served by the daemon (the session actor and its effect gate)
and never reach a remote client: only ``session/request_permission`` and ``elicitation/create``
(to clients that advertised the mode: :mod:`.elicit`) are forwarded, their answers votes.

Routing (the HTTP transport has one connection stream plus one stream per owned session;
the WebSocket transport has one socket for everything): replies to ``session/prompt``,
``session/set_mode``, ``session/set_model`` and ``session/set_config_option`` go to the
session's outbox; every other reply, and every ownership error, to the connection's. The
reply to ``session/close`` is delivered *before* the session stream ends (on the session
stream for ACP clients, which read it there; on the connection stream for the daemon-dialect
SDK), so no client sees its stream end with the close still unanswered.

Bounds (units named): at most :data:`MAX_CONNECTIONS` connections, :data:`MAX_SESSIONS`
sessions (admitted before a session is made or restored; one made for a call that then
cannot own it is closed again) and :data:`MAX_INFLIGHT` requests in flight per connection;
every outbox holds at most ``max_messages`` messages and ``max_bytes`` bytes. While a
reader is attached and draining, a full outbox makes the pump wait (at most
:data:`WRITER_STALL_S`); a session outbox that overflows with no reader (or a stalled one)
is *evicted*: its queued events are dropped, an id-less ``_qwen/notify client_evicted`` is
queued, and the pump stops; reopening the stream resumes from ``Last-Event-ID`` (or from
the first dropped event) through the log's ring, and replies queued meanwhile follow the
replay. A connection outbox (or a WebSocket's) that overflows ends the connection. HTTP
connections with no open stream and no request for ``idle_timeout_s`` expire. Closing a
connection (DELETE, a dropped socket, expiry) releases everything it held: pumps stop, its
client registrations are released (``Detach``), and each of its sessions to which no other
client is attached is closed (``acp_connection_closed``). A session stream that ends
otherwise (``session/close``, ``_qwen/session/detach``, the session's end) lets its
registration go with ``Detach``, which, as on REST, closes an idle session whose last
client that was.

The front knows nothing of HTTP: the transports call :meth:`AcpFront.initialize`,
:meth:`AcpFront.submit`, :meth:`AcpFront.session_outbox` and :meth:`AcpFront.close`.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import trio

from actors import ActorError, ActorStopped, InboxFull
from serve import tracecontext
from serve.acpfront import elicit, jsonrpc, steering, v121, workspace_methods
from serve.acpfront.fork import fork_capability, session_fork
from serve.acpfront.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    SERVER_ERROR,
    Notification,
    Request,
    Response,
    RpcError,
)
from serve.acpfront.outbox import Outbox
from serve.acpfront.translate import (
    PERMISSION_ID_PREFIX,
    Deferred,
    notify,
    translate_frame,
)
from serve.errors import RETRYABLE_TURN_CODES, fs_error
from serve.events import SubscriberLimitExceeded
from serve.events.messages import PublishEvent
from serve.host import Host
from serve.http.capabilities import Feature
from serve.http.daemon_status import daemon_status
from serve.http.errors import to_api_error
from serve.permissions.mediator import CastVote
from serve.sessions import turns
from serve.sessions.messages import (
    Attach,
    Attached,
    CancelTurn,
    CloseSession,
    Describe,
    Detach,
    Heartbeat,
    KnowsClient,
    MetadataSet,
    ModelSet,
    ModeSet,
    PromptQueueFull,
    SessionGone,
    SessionView,
    SetApprovalMode,
    SetModel,
    StreamEnded,
    SubmitPrompt,
    Subscribe,
    Subscription,
    Summarize,
    UpdateMetadata,
)
from serve.sessions.registry import CreateSession, RestoreSession
from serve.status.agent import context_state, supported_commands
from serve.threads import file_routes_limiter
from serve.workspace import (
    WorkspaceFsError,
    edit_text,
    glob,
    list_dir,
    read_bytes,
    read_text,
    stat,
    write_text,
)
from serve.workspace.files import (
    DEFAULT_BYTES_WINDOW,
    MAX_BYTES_WINDOW,
    MAX_READ_LINES,
    MAX_TEXT_READ_BYTES,
)
from serve.workspace.listing import DEFAULT_GLOB_RESULTS, MAX_GLOB_RESULTS

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

PROTOCOL_VERSION = 1

#: Replies routed to the session stream (the qwen SDK accepts these five only from there).
SESSION_REPLIES = frozenset(
    {
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_model",
        "session/set_config_option",
    }
)

#: The transport's gate per request: (connection, method, params) → a refusal or None.
Policy = Callable[["Connection", str, dict[str, Any]], RpcError | None]


def _rpc_from_exception(exc: BaseException, session_id: str | None = None) -> RpcError:
    """A domain or actor failure as a JSON-RPC error (``data.httpStatus`` mirrors REST)."""
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, SessionGone | ActorError):
        return _not_found(session_id or "")
    if isinstance(exc, PromptQueueFull):
        return RpcError(
            SERVER_ERROR,
            f"Prompt queue is full ({exc.limit})",
            {"httpStatus": 503, "code": "prompt_queue_full", "limit": exc.limit},
        )
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    if isinstance(status, int) and isinstance(body, dict):  # the actors' ApiError
        code = {400: INVALID_PARAMS, 404: RESOURCE_NOT_FOUND, 501: METHOD_NOT_FOUND}.get(
            status, SERVER_ERROR if status < 500 else INTERNAL_ERROR
        )
        return RpcError(code, str(body.get("error", "error")), {"httpStatus": status, **body})
    mapped = to_api_error(exc)
    if mapped is not None:
        return _rpc_from_exception(mapped, session_id)
    log.exception("ACP request failed", exc_info=exc)
    return RpcError(INTERNAL_ERROR, "Internal error", {"httpStatus": 500})


def _not_found(session_id: str) -> RpcError:
    return RpcError(
        RESOURCE_NOT_FOUND,
        f'No session with id "{session_id}"',
        {"httpStatus": 404, "code": "session_not_found", "sessionId": session_id},
    )


def _params_error(message: str, **data: Any) -> RpcError:
    return RpcError(INVALID_PARAMS, message, {"httpStatus": 400, **data} if data else None)


def _session_limit() -> RpcError:
    return RpcError(
        SERVER_ERROR,
        f"A connection may own at most {MAX_SESSIONS} sessions",
        {"httpStatus": 503, "code": "connection_session_limit", "limit": MAX_SESSIONS},
    )


class _ConnectionLevel(RpcError):
    """An error answered on the connection stream whatever the method (ownership,
    a header contradicting the params, an unknown method)."""


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
        "pump_done",
        "pump_scope",
        "pushed",
        "resume_from",
        "session",
        "workspace",
    )

    def __init__(self, session: Any, client_id: str, outbox: Outbox, view: SessionView) -> None:
        self.session = session
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

    @property
    def session_id(self) -> str:
        return str(self.session.session_id)


class Connection:
    """One remote ACP client (see the module docstring)."""

    def __init__(
        self,
        transport: str,
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
        self.transport = transport  # "http" | "ws"
        self.dialect = dialect  # "acp" (an ACP client) | "qwen" (the daemon-route SDK)
        self.workspace = workspace
        self.loopback = loopback
        #: The client address that opened it (MAX_CONNECTIONS_PER_CLIENT counts these).
        self.client = client
        #: Who may use it (the transport's address + credential digest): any other
        #: request naming its id is answered as for an unknown connection.
        self.owner = owner
        #: A stream was opened or a request other than initialize was sent.
        self.used = False
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes)
        self.sessions: dict[str, SessionLink] = {}
        self.server_requests: OrderedDict[str, tuple[str, str]] = OrderedDict()
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


Handler = Callable[[Connection, dict[str, Any]], Awaitable[Any]]


class AcpFront:
    """The table of connections and the method handlers; see the module docstring."""

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
        all_features: Sequence[Feature] = (),
    ) -> None:
        self.host = host
        #: Every feature the app serves (``_qwen/status`` reports the advertised ones).
        self.all_features = tuple(all_features)
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
        self._methods: dict[str, Handler] = {
            "session/new": self._session_new,
            "session/load": self._session_load,
            "session/resume": self._session_resume,
            "session/fork": self._session_fork,
            "session/list": self._session_list,
            "session/close": self._session_close,
            "session/prompt": self._session_prompt,
            "session/cancel": self._session_cancel,
            "_session/steering": self._session_steering,
            "session/set_mode": self._session_set_mode,
            "session/set_model": self._session_set_model,
            "session/set_config_option": self._session_set_config_option,
            "session/delete": lambda c, p: v121.session_delete(self, c, p),
            "authenticate": lambda c, p: v121.authenticate(self, c, p),
            "logout": lambda c, p: v121.logout(self, c, p),
            "session/permission": self._session_permission,
            "_qwen/health": self._health,
            "_qwen/session/heartbeat": self._heartbeat,
            "_qwen/session/update_metadata": self._update_metadata,
            "_qwen/session/detach": self._detach,
            "_qwen/session/context": self._context,
            "_qwen/session/supported_commands": self._supported_commands,
            "_qwen/status": self._status,
            "_qwen/file/read": self._file_read,
            "_qwen/file/read_bytes": self._file_read_bytes,
            "_qwen/file/stat": self._file_stat,
            "_qwen/file/list": self._file_list,
            "_qwen/file/glob": self._file_glob,
            "_qwen/file/write": self._file_write,
            "_qwen/file/edit": self._file_edit,
        }
        self._methods.update(workspace_methods.handlers(self))  # the _qwen/workspace/* reads

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
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

    def _spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is None:
            raise RpcError(SERVER_ERROR, "ACP front is not running", {"httpStatus": 503})
        self._nursery.start_soon(fn, *args)

    def _background(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start clean-up work if the front still runs (it never raises)."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    # ---- connections -------------------------------------------------------------------

    def get(self, connection_id: str) -> Connection | None:
        return self.connections.get(connection_id)

    def initialize(
        self,
        transport: str,
        workspace: str,
        request: Request,
        *,
        loopback: bool,
        client: str = "unknown",
        owner: str = "",
    ) -> tuple[Connection, bytes]:
        """Open a connection for ``initialize``; returns it and the encoded reply.
        ``client`` is the caller's address, ``owner`` what later requests must match."""
        if self._nursery is None or getattr(self.host, "draining", False):
            raise RpcError(
                SERVER_ERROR, "Daemon is draining", {"httpStatus": 503, "code": "daemon_draining"}
            )
        params = request.params
        version = params.get("protocolVersion")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise _params_error("`protocolVersion` must be an integer")
        client_info = params.get("clientInfo")
        if client_info is not None and not isinstance(client_info, dict):
            raise _params_error("`clientInfo` must be an object")
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
        # The qwen SDK's route-table transports send only {clientInfo}: they speak the
        # daemon's REST semantics over JSON-RPC (its synthesised HTTP statuses).
        dialect = "acp" if version is not None else "qwen"
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
        conn.elicitation_modes = elicit.client_modes(params.get("clientCapabilities"))
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
                    nursery.start_soon(self._let_go, link, True)

    async def _let_go(self, link: SessionLink, close_if_alone: bool) -> None:
        """Release ``link``'s client registration once its pump has stopped (its stream is
        then no longer counted); with ``close_if_alone``, close the session instead when
        no other client is attached to it. A session gone meanwhile is fine."""
        with trio.move_on_after(5):
            await link.pump_done.wait()
        session = link.session
        try:
            if close_if_alone and not await self._others_attached(link):
                await session.call(CloseSession(reason="acp_connection_closed"), timeout_s=10)
            else:
                await session.call(Detach(link.client_id), timeout_s=10)
        except (SessionGone, ActorError):
            pass
        except Exception as exc:
            log.info("ACP: releasing session %s failed: %r", link.session_id, exc)

    async def _others_attached(self, link: SessionLink) -> bool:
        summary = await link.session.call(Summarize(), timeout_s=ASK_TIMEOUT_S)
        mine = await link.session.call(KnowsClient(link.client_id), timeout_s=ASK_TIMEOUT_S)
        return int(summary.get("clientCount", 0)) - (1 if mine else 0) > 0

    # ---- incoming messages -------------------------------------------------------------

    def submit(
        self, conn: Connection, message: jsonrpc.Message, header_session: str | None
    ) -> None:
        """Handle one message in the background; its reply lands in an outbox."""
        conn.touch()
        match message:
            case Notification(method=v121.CANCEL_REQUEST):
                v121.cancel_request(conn, message.params)
            case Request() | Notification():
                if conn.inflight >= MAX_INFLIGHT:
                    if isinstance(message, Request):
                        self._reply_conn(
                            conn,
                            jsonrpc.error_bytes(
                                message.id,
                                RpcError(
                                    SERVER_ERROR,
                                    f"Too many requests in flight ({MAX_INFLIGHT})",
                                    {"httpStatus": 429, "code": "too_many_inflight"},
                                ),
                            ),
                        )
                    return
                conn.inflight += 1
                self._spawn(self._handle, conn, message, header_session)
            case Response():
                self._spawn(self._answer, conn, message)
            case jsonrpc.Invalid(id=rid, error=error):
                self._reply_conn(conn, jsonrpc.error_bytes(rid, error))
            case jsonrpc.Batch():
                self._reply_conn(
                    conn,
                    jsonrpc.error_bytes(
                        None, RpcError(jsonrpc.INVALID_REQUEST, "Batches are not supported")
                    ),
                )

    async def _handle(
        self, conn: Connection, message: Request | Notification, header_session: str | None
    ) -> None:
        rid = message.id if isinstance(message, Request) else None
        method = message.method
        params = message.params
        sid = params.get("sessionId")
        scope = trio.CancelScope()
        conn.tasks.add(scope)
        if rid is not None and rid not in conn.running:
            conn.running[rid] = scope
        trace = tracecontext.from_meta(params)
        try:
            with tracecontext.traced(trace), scope:
                if trace is not None:
                    log.info("ACP %s %s (traced)", conn.id, method)
                try:
                    if method == "initialize":
                        raise _ConnectionLevel(
                            jsonrpc.INVALID_REQUEST, "The connection is already initialized"
                        )
                    handler = self._methods.get(method)
                    if handler is None:
                        if rid is None:
                            return  # unknown notifications are ignored
                        raise _ConnectionLevel(METHOD_NOT_FOUND, f"Method not found: {method}")
                    if sid is not None and not isinstance(sid, str):
                        raise _ConnectionLevel(INVALID_PARAMS, "`sessionId` must be a string")
                    if header_session is not None and sid is not None and header_session != sid:
                        raise _ConnectionLevel(
                            INVALID_PARAMS,
                            "The Acp-Session-Id header does not match params.sessionId",
                            {"httpStatus": 400, "code": "session_mismatch"},
                        )
                    if self.policy is not None:
                        refusal = self.policy(conn, method, params)
                        if refusal is not None:
                            raise refusal
                    result = await handler(conn, params)
                except _ConnectionLevel as exc:
                    if rid is not None:
                        self._reply_conn(conn, jsonrpc.error_bytes(rid, exc))
                    return
                except Exception as exc:
                    if rid is not None:
                        error = _rpc_from_exception(exc, sid if isinstance(sid, str) else None)
                        link = conn.sessions.get(sid) if isinstance(sid, str) else None
                        if link is not None and method in SESSION_REPLIES:
                            await _caught_up_now(link)
                        self._reply(conn, method, sid, jsonrpc.error_bytes(rid, error))
                    return
                if rid is not None and not isinstance(result, _Replied):
                    link = conn.sessions.get(sid) if isinstance(sid, str) else None
                    if link is not None and method in SESSION_REPLIES:
                        # A reply follows the events its request caused (model_switched,
                        # approval_mode_changed, the turn's updates) on the stream.
                        await _caught_up_now(link)
                    self._reply(conn, method, sid, jsonrpc.result_bytes(rid, result))
                elif isinstance(result, _Replied) and rid is not None:
                    await result.deliver(rid)
        finally:
            conn.tasks.discard(scope)
            if rid is not None and conn.running.get(rid) is scope:
                del conn.running[rid]
                if rid in conn.cancelled and scope.cancelled_caught and not conn.closed:
                    self._reply(
                        conn, method, sid, jsonrpc.error_bytes(rid, v121.cancelled_error(method))
                    )
            if rid is not None:
                conn.cancelled.discard(rid)
            conn.inflight -= 1
            conn.touch()

    # ---- reply routing -----------------------------------------------------------------

    def _reply(self, conn: Connection, method: str, sid: Any, payload: bytes) -> None:
        if conn.transport == "http" and method in SESSION_REPLIES and isinstance(sid, str):
            link = conn.sessions.get(sid)
            if link is not None and not link.outbox.ended:
                self._push_session(conn, link, None, payload)
                return
        self._reply_conn(conn, payload)

    def _reply_conn(self, conn: Connection, payload: bytes) -> None:
        if not conn.outbox.push(None, payload):
            log.warning("ACP connection %s: outbox full, closing the connection", conn.id)
            self.evictions += 1
            self.close(conn)

    def _push_session(
        self, conn: Connection, link: SessionLink, event_id: int | None, payload: bytes | Deferred
    ) -> bool:
        outbox = link.outbox if conn.transport == "http" else conn.outbox
        if outbox.push(event_id, payload):
            if event_id is not None:
                link.last_pushed = event_id
            return True
        if conn.transport == "ws":
            self.evictions += 1
            self.close(conn)
            return False
        # Evict this session stream's queued events; the client resumes from the ring.
        self.evictions += 1
        dropped, lowest = outbox.drop_events()
        if event_id is not None and (lowest is None or event_id < lowest):
            lowest = event_id
        link.evicted = True
        link.resume_from = (lowest - 1) if lowest is not None else outbox.last_taken
        if link.pump_scope is not None:
            link.pump_scope.cancel()
        outbox.push(
            None,
            notify(
                "client_evicted",
                {
                    "sessionId": link.session_id,
                    "reason": "queue_overflow",
                    "droppedAfter": link.resume_from,
                    "dropped": dropped,
                    "maxQueued": outbox.max_messages,
                },
            ),
        )
        if event_id is None:
            return outbox.push(None, payload)
        return False

    # ---- session links and pumps -------------------------------------------------------

    async def _own(
        self, conn: Connection, session: Any, *, replay: bool
    ) -> tuple[SessionLink, SessionView]:
        """Make ``conn`` a client of ``session`` and start its pump (idempotent); returns
        the link and the session's view as of now."""
        sid = str(session.session_id)
        existing = conn.sessions.get(sid)
        if existing is not None and not existing.ended:
            view: SessionView = await session.call(Describe(), timeout_s=ASK_TIMEOUT_S)
            return existing, view
        # Ended links stay until their stream is drained; drop the drained ones, and past
        # twice the limit the oldest ended ones (a client that never reads them).
        for key, old in list(conn.sessions.items()):
            if old.ended and old.outbox.ended and not len(old.outbox):
                del conn.sessions[key]
        ended = [key for key, old in conn.sessions.items() if old.ended]
        while ended and len(conn.sessions) >= 2 * MAX_SESSIONS:
            del conn.sessions[ended.pop(0)]
        if sum(1 for old in conn.sessions.values() if not old.ended) >= MAX_SESSIONS:
            raise _session_limit()
        attached: Attached = await session.call(Attach(None), timeout_s=ASK_TIMEOUT_S)
        outbox = Outbox(max_messages=conn.max_messages, max_bytes=conn.max_bytes)
        link = SessionLink(session, attached.client_id, outbox, attached.view)
        conn.sessions[sid] = link
        try:
            await self._start_pump(conn, link, 0 if replay else None, None)
        except BaseException:
            # No stream for it: the registration is let go again.
            if conn.sessions.get(sid) is link:
                del conn.sessions[sid]
            link.ended = True
            link.outbox.end()
            self._background(self._let_go, link, False)
            raise
        return link, attached.view

    def _reserve(self, conn: Connection, session_id: str | None = None) -> int:
        """Admit one more owned session under :data:`MAX_SESSIONS` *before* anything is
        made or restored (1: a slot is reserved, the caller gives it back; 0: ``session_id``
        is owned already and needs none)."""
        existing = conn.sessions.get(session_id) if session_id is not None else None
        if existing is not None and not existing.ended:
            return 0
        owned = sum(1 for link in conn.sessions.values() if not link.ended)
        if owned + conn.reserved_sessions >= MAX_SESSIONS:
            raise _session_limit()
        conn.reserved_sessions += 1
        return 1

    async def _own_made(
        self, conn: Connection, session: Any, attached: bool, *, replay: bool
    ) -> tuple[SessionLink, SessionView]:
        """:meth:`_own` for a session the call made or restored (``attached`` false): if
        owning it fails, it is closed again rather than left alive without a client."""
        try:
            return await self._own(conn, session, replay=replay)
        except BaseException:
            if not attached:
                self._background(self._discard, session)
            raise

    async def _discard(self, session: Any) -> None:
        try:
            await session.call(CloseSession(reason="acp_session_refused"), timeout_s=10)
        except (SessionGone, ActorError):
            pass
        except Exception as exc:
            log.info("ACP: closing refused session %s failed: %r", session.session_id, exc)

    async def _start_pump(
        self, conn: Connection, link: SessionLink, last_event_id: int | None, epoch: str | None
    ) -> None:
        """(Re)subscribe ``link`` to its session's log and start a pump on it."""
        if link.pump_scope is not None:
            link.pump_scope.cancel()
        scope = trio.CancelScope()
        link.pump_scope = scope  # a later start supersedes this one
        try:
            subscription: Subscription = await link.session.call(
                Subscribe(
                    last_event_id=last_event_id,
                    epoch=epoch,
                    max_queued=PUMP_MAX_QUEUED,
                    client_id=link.client_id,
                ),
                timeout_s=ASK_TIMEOUT_S,
            )
        except SubscriberLimitExceeded as exc:
            raise RpcError(
                SERVER_ERROR,
                str(exc),
                {"httpStatus": 429, "code": "subscriber_limit_exceeded", "limit": exc.limit},
            ) from None
        except Exception as exc:
            raise _rpc_from_exception(exc, link.session_id) from None
        sub = subscription.subscriber
        if link.pump_scope is not scope or link.ended or conn.closed:
            sub.close()  # superseded, or released, while subscribing
            return
        link.epoch = subscription.epoch
        # What the pump will have queued once it reaches the head (for _caught_up): a
        # fresh subscriber starts after the head it saw.
        start = sub.cursor - 1 if last_event_id is None else last_event_id
        link.last_pushed = start if link.last_pushed is None else max(link.last_pushed, start)
        link.evicted = False
        link.pump_done = trio.Event()
        self._spawn(self._pump, conn, link, sub, scope, link.pump_done)

    async def _pump(
        self, conn: Connection, link: SessionLink, sub: Any, scope: trio.CancelScope, done: Any
    ) -> None:
        requests = not (conn.transport == "ws" and conn.dialect == "qwen")
        finished = False
        try:
            with scope:
                while True:
                    frames = await sub.next_frames()
                    if frames is None:
                        finished = True
                        break
                    for frame in frames:
                        # An event stays the log's frame until a writer takes it (shared
                        # by every connection, not copied into each outbox).
                        msg = translate_frame(
                            frame, requests=requests, elicitation=conn.elicitation_modes
                        )
                        if msg is None:
                            continue
                        if msg.permission is not None:
                            rid, sid, request_id = msg.permission
                            conn.server_requests[rid] = (sid, request_id)
                            while len(conn.server_requests) > MAX_SERVER_REQUESTS:
                                conn.server_requests.popitem(last=False)
                        outbox = link.outbox if conn.transport == "http" else conn.outbox
                        if not outbox.has_room(len(msg.payload)) and outbox.has_reader:
                            # A reader is draining: backpressure, not eviction (the log's
                            # own subscriber bound still evicts a pump that falls behind).
                            with trio.move_on_after(WRITER_STALL_S):
                                await outbox.wait_room(len(msg.payload))
                        if not self._push_session(conn, link, msg.event_id, msg.payload):
                            return
                        if msg.event_type == "client_evicted":
                            link.evicted = True
                            return
                        if msg.event_type == "replay_complete" and link.deferred:
                            deferred, link.deferred = link.deferred, []
                            for reply in deferred:
                                self._push_session(conn, link, None, reply)
                    link.pushed.set()
                    link.pushed = trio.Event()
        finally:
            sub.close()
            done.set()
            try:  # the session counts the stream's end as being seen
                link.session.tell_nowait(StreamEnded())
            except (InboxFull, ActorStopped):
                pass
            if finished and link.pump_scope is scope:
                self._session_ended(conn, link)

    def _session_ended(self, conn: Connection, link: SessionLink) -> None:
        """The session's log closed: its stream drains and ends; the link is released."""
        if link.hold_end:
            return
        self._finish_link(conn, link)

    def _finish_link(self, conn: Connection, link: SessionLink) -> None:
        if not link.ended:
            link.ended = True
            self._background(self._let_go, link, False)
        link.outbox.end()
        if conn.transport == "ws":
            conn.sessions.pop(link.session_id, None)

    async def session_outbox(
        self,
        conn: Connection,
        session_id: str,
        *,
        last_event_id: int | None,
        epoch: str | None,
    ) -> tuple[Outbox, str] | None:
        """The outbox of an owned session's stream (None: not owned), resumed from
        ``last_event_id`` when given (or from the last event handed out after an
        eviction). Returns it with the log's epoch."""
        link = conn.sessions.get(session_id)
        if link is None:
            return None
        if link.ended:
            if link.outbox.ended and not len(link.outbox):
                conn.sessions.pop(session_id, None)
                return None
            return link.outbox, link.epoch
        if last_event_id is None and link.evicted:
            last_event_id = link.resume_from if link.resume_from is not None else 0
        if last_event_id is not None:
            link.outbox.drop_events()
            link.deferred.extend(link.outbox.take_replies())
            await self._start_pump(conn, link, last_event_id, epoch)
        return link.outbox, link.epoch

    # ---- permission answers ------------------------------------------------------------

    async def _answer(self, conn: Connection, message: Response) -> None:
        """The client answered a request we sent it: a permission vote."""
        rid = message.id
        target = conn.server_requests.pop(rid, None) if isinstance(rid, str) else None
        if target is None:
            if isinstance(rid, str) and rid.startswith(PERMISSION_ID_PREFIX):
                log.info("ACP connection %s answered unknown request %s", conn.id, rid)
            return
        sid, request_id = target
        link = conn.sessions.get(sid)
        if rid.startswith(elicit.ID_PREFIX):  # type: ignore[union-attr]
            await elicit.answer(
                self.host.mediator,
                sid,
                request_id,
                message.result if message.error is None else None,
                link.client_id if link is not None else None,
                conn.loopback,
                timeout_s=ASK_TIMEOUT_S,
            )
            return
        body: Any = message.result if message.error is None else None
        if not isinstance(body, dict) or "outcome" not in body:
            body = {"outcome": {"outcome": "cancelled"}}
        try:
            await self.host.mediator.ask(
                CastVote(
                    request_id,
                    sid,
                    body,
                    link.client_id if link is not None else None,
                    conn.loopback,
                ),
                timeout_s=ASK_TIMEOUT_S,
            )
        except Exception as exc:
            log.info("ACP permission answer not counted: %r", exc)

    # ---- helpers -----------------------------------------------------------------------

    def _owned(self, conn: Connection, params: dict[str, Any]) -> SessionLink:
        sid = params.get("sessionId")
        if not isinstance(sid, str) or not sid:
            raise _params_error("`sessionId` must be a non-empty string")
        link = conn.sessions.get(sid)
        if link is None:
            raise _ConnectionLevel(
                INVALID_PARAMS,
                f'Session "{sid}" is not owned by this connection '
                "(session/load or session/resume it first)",
                {"httpStatus": 403, "code": "session_not_owned", "sessionId": sid},
            )
        if link.ended:
            raise _not_found(sid)
        return link

    def _workspace(self, conn: Connection, params: dict[str, Any]) -> str:
        registry = self.host.registry
        raw = params.get("cwd", params.get("workspaceCwd"))
        if raw is None:
            return conn.workspace
        if not isinstance(raw, str) or not os.path.isabs(raw):
            raise _params_error("`cwd` must be an absolute path")
        try:
            cwd = os.path.realpath(raw)
        except (OSError, ValueError):
            cwd = os.path.normpath(raw)
        if cwd in registry.runtimes:
            return cwd
        runtime = registry.by_ref(raw)
        if runtime is not None:
            return str(runtime.path)
        raise _params_error(
            f"Requested workspace {cwd} is not served by this daemon",
            code="workspace_mismatch",
            requestedWorkspace=cwd,
        )

    async def _ticket_session(self, msg: Any) -> tuple[Any, bool]:
        if getattr(self.host, "draining", False):
            raise RpcError(
                SERVER_ERROR, "Daemon is draining", {"httpStatus": 503, "code": "daemon_draining"}
            )
        ticket = await self.host.registry.ask(msg, timeout_s=ASK_TIMEOUT_S)
        try:
            session = await ticket.pending.wait()
        except RpcError:
            raise
        except Exception as exc:
            error = _rpc_from_exception(exc)
            if error.code == INTERNAL_ERROR and not isinstance(getattr(exc, "status", None), int):
                error = RpcError(
                    SERVER_ERROR,
                    f"Agent failed to start: {exc}",
                    {"httpStatus": 503, "code": "acp_channel_unavailable", "retryable": True},
                )
            raise error from None
        return session, bool(ticket.attached)

    def _session_result(
        self, view: SessionView, link: SessionLink, attached: bool
    ) -> dict[str, Any]:
        state = view.state
        out: dict[str, Any] = {
            "sessionId": view.session_id,
            **{k: state[k] for k in ("modes", "models", "configOptions") if k in state},
            "workspaceCwd": view.workspace,
            "attached": attached,
            "clientId": link.client_id,
            "createdAt": view.created_at,
        }
        return out

    # ---- session methods ---------------------------------------------------------------

    async def _session_new(self, conn: Connection, params: dict[str, Any]) -> Any:
        workspace = self._workspace(conn, params)
        dirs = await v121.additional_directories(self, params, workspace)
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        scope = meta.get("qwen-code/sessionScope", "thread") if meta else "thread"
        if scope not in ("single", "thread"):
            raise _params_error("`_meta.qwen-code/sessionScope` must be single or thread")
        if meta and meta.get("qwen-code/sessionId") is not None:
            raise _params_error(
                "`sessionId` overrides are not supported by this daemon", code="invalid_session_id"
            )
        reserved = self._reserve(conn)
        try:
            session, attached = await self._ticket_session(CreateSession(workspace, scope, dirs))
            # A session made for this call: its set-up events (available commands, ...) too.
            link, view = await self._own_made(conn, session, attached, replay=not attached)
        finally:
            conn.reserved_sessions -= reserved
        out = self._session_result(view, link, attached)
        mode = params.get("approvalMode")
        if isinstance(mode, str) and mode:
            try:
                await session.call(SetApprovalMode(mode, False, link.client_id), timeout_s=30)
            except Exception:
                pass  # as on REST: the session stands in its agent's mode
        model = params.get("modelServiceId")
        if isinstance(model, str) and model:
            try:
                await session.call(SetModel(model, link.client_id), timeout_s=60)
                out["modelApplied"] = True
            except Exception:
                out["modelApplied"] = False
        return out

    async def _restore(self, conn: Connection, params: dict[str, Any], action: str) -> Any:
        sid = params.get("sessionId")
        if not isinstance(sid, str) or not sid:
            raise _params_error("`sessionId` must be a non-empty string")
        workspace = self._workspace(conn, params)
        dirs = await v121.additional_directories(self, params, workspace)
        reserved = self._reserve(conn, sid)
        try:
            try:
                session, attached = await self._ticket_session(
                    RestoreSession(sid, workspace, action, dirs)
                )
            except RpcError as exc:
                data = exc.data if isinstance(exc.data, dict) else {}
                if data.get("httpStatus") == 500 and data.get("code") in (-32002, -32602):
                    raise _not_found(sid) from None
                raise
            link, view = await self._own_made(conn, session, attached, replay=action == "load")
        finally:
            conn.reserved_sessions -= reserved
        out = self._session_result(view, link, attached)
        out["state"] = view.state
        out["lastEventId"] = view.last_event_id
        out["eventEpoch"] = view.epoch
        return out

    async def _session_load(self, conn: Connection, params: dict[str, Any]) -> Any:
        return await self._restore(conn, params, "load")

    async def _session_resume(self, conn: Connection, params: dict[str, Any]) -> Any:
        return await self._restore(conn, params, "resume")

    async def _session_fork(self, conn: Connection, params: dict[str, Any]) -> Any:
        return await session_fork(self, conn, params)  # serve/acpfront/fork.py

    async def _session_list(self, conn: Connection, params: dict[str, Any]) -> Any:
        workspace = (
            self._workspace(conn, params)
            if params.get("cwd") is not None or params.get("workspaceCwd") is not None
            else None
        )
        sessions = []
        for session in self.host.registry.live(workspace):
            try:
                summary = dict(await session.call(Summarize(), timeout_s=ASK_TIMEOUT_S))
            except (SessionGone, ActorError):
                continue  # closed meanwhile
            summary["cwd"] = summary.get("workspaceCwd")
            summary["title"] = summary.get("displayName")
            summary["updatedAt"] = summary.get("createdAt")
            sessions.append(summary)
        return {"sessions": sessions}

    async def _session_close(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        session = link.session
        link.hold_end = True
        try:
            await session.call(
                CloseSession(reason="client_close", closed_by=link.client_id),
                timeout_s=ASK_TIMEOUT_S,
            )
            # The session's last events (session_closed) are queued before the reply.
            with trio.move_on_after(5):
                await link.pump_done.wait()
        finally:
            link.hold_end = False
        return _Replied(self, conn, link, "close")

    async def _detach(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        return _Replied(self, conn, link, "detach")

    async def _session_prompt(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        blocks, text = _validate_prompt(params.get("prompt"))
        prompt_id = params.get("promptId")
        if prompt_id is not None and (
            not isinstance(prompt_id, str) or not 0 < len(prompt_id) <= 128
        ):
            raise _params_error("`promptId` must be a non-empty string of at most 128 characters")
        deadline = params.get("deadlineMs")
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, int) or deadline <= 0
        ):
            raise _params_error("`deadlineMs` must be a positive integer")
        try:
            extra = turns.passthrough(params)  # an allow-list: `_meta` only
        except ValueError as exc:
            raise _params_error(str(exc)) from None
        session = link.session
        admission = await session.call(
            SubmitPrompt(blocks, text, link.client_id, extra or None, prompt_id, deadline),
            timeout_s=ASK_TIMEOUT_S,
        )
        try:
            await admission.done.wait()
        except trio.Cancelled:
            # The request went away (its connection closed): cancel its prompt, as on REST.
            if not admission.done.is_set():
                try:
                    session.tell_nowait(CancelTurn(link.client_id, admission.prompt_id))
                except (InboxFull, ActorStopped):
                    pass
            raise
        terminal = admission.job.terminal
        event_type, data = terminal.kind, terminal.data
        if event_type == "turn_complete":
            out: dict[str, Any] = {
                "stopReason": data["stopReason"],
                "promptId": admission.prompt_id,
                "_meta": {"qwen": {"promptId": admission.prompt_id}},
            }
            if "branchPoint" in data:
                out["branchPoint"] = data["branchPoint"]
            return out
        code = data.get("code")
        status = 402 if code == "budget_exhausted" else 503 if code in RETRYABLE_TURN_CODES else 500
        detail = {k: data[k] for k in ("code", "data", "errorKind") if k in data}
        raise RpcError(
            INTERNAL_ERROR,
            str(data.get("message", "prompt failed")),
            {"httpStatus": status, "promptId": admission.prompt_id, **detail},
        )

    async def _session_steering(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)  # serve/acpfront/steering.py
        blocks, text = _validate_prompt(params.get("prompt"))
        return await steering.steer(
            link.session, link.client_id, blocks, text, params, ASK_TIMEOUT_S
        )

    async def _session_cancel(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        await link.session.call(CancelTurn(link.client_id), timeout_s=ASK_TIMEOUT_S)
        return {}

    async def _session_set_mode(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        mode = params.get("modeId", params.get("mode"))
        if not isinstance(mode, str) or not mode:
            raise _params_error("`modeId` must be a non-empty string")
        changed: ModeSet = await link.session.call(
            SetApprovalMode(mode, False, link.client_id), timeout_s=ASK_TIMEOUT_S
        )
        out: dict[str, Any] = {
            "sessionId": changed.session_id,
            "previous": changed.previous,
            "mode": changed.mode,
            "persisted": changed.persisted,
        }
        if changed.requested is not None:
            out["requested"] = changed.requested
        return out

    async def _session_set_model(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        model = params.get("modelId")
        if not isinstance(model, str) or not model.strip():
            raise _params_error("`modelId` must be a non-empty string")
        switched: ModelSet = await link.session.call(
            SetModel(model, link.client_id, timeout_s=60.0), timeout_s=60
        )
        return {"modelId": switched.model_id}

    async def _session_set_config_option(self, conn: Connection, params: dict[str, Any]) -> Any:
        return await v121.set_config_option(self, conn, params)  # every option (ACP 1.21)

    async def _session_permission(self, conn: Connection, params: dict[str, Any]) -> Any:
        request_id = params.get("requestId")
        if not isinstance(request_id, str) or not request_id:
            raise _params_error("`requestId` must be a non-empty string")
        sid = params.get("sessionId")
        link = self._owned(conn, params) if sid is not None else None
        if link is None:
            owner = None
            for s, r in conn.server_requests.values():
                if r == request_id:
                    owner = conn.sessions.get(s)
                    break
            link = owner
        body = {k: v for k, v in params.items() if k not in ("sessionId", "requestId")}
        status, out = await self.host.mediator.ask(
            CastVote(
                request_id,
                sid if isinstance(sid, str) else None,
                body,
                link.client_id if link is not None else None,
                conn.loopback,
            ),
            timeout_s=ASK_TIMEOUT_S,
        )
        if status != 200:
            raise RpcError(
                INVALID_PARAMS
                if status == 400
                else RESOURCE_NOT_FOUND
                if status == 404
                else SERVER_ERROR,
                str(out.get("error", "vote refused")),
                {"httpStatus": status, **out},
            )
        conn.server_requests.pop(PERMISSION_ID_PREFIX + request_id, None)
        return out

    async def _context(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        session = link.session
        return {
            "v": 1,
            "sessionId": link.session_id,
            "workspaceCwd": link.workspace,
            "state": context_state(session),
        }

    async def _supported_commands(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        return {
            "v": 1,
            "sessionId": link.session_id,
            "availableCommands": supported_commands(link.session),
        }

    async def _status(self, conn: Connection, params: dict[str, Any]) -> Any:
        detail = params.get("detail", "summary")
        if detail not in ("summary", "full"):
            raise _params_error("`detail` must be one of: summary, full")
        return daemon_status(self.host, detail, self.all_features)

    # ---- files (the REST file routes' functions) ---------------------------------------

    async def _file_read(self, conn: Connection, params: dict[str, Any]) -> Any:
        path = _Files.text(params, "path")
        max_bytes = _Files.number(params, "maxBytes", 1, MAX_TEXT_READ_BYTES)
        line = _Files.number(params, "line", 1, 2**31 - 1)
        limit = _Files.number(params, "limit", 1, MAX_READ_LINES)
        ws = _Files.workspace(self, conn)
        return await _Files.run(
            lambda: read_text(ws, path, max_bytes=max_bytes, line=line, limit=limit)
        )

    async def _file_read_bytes(self, conn: Connection, params: dict[str, Any]) -> Any:
        path = _Files.text(params, "path")
        offset = _Files.number(params, "offset", 0, 2**63 - 1) or 0
        max_bytes = _Files.number(params, "maxBytes", 1, MAX_BYTES_WINDOW) or DEFAULT_BYTES_WINDOW
        ws = _Files.workspace(self, conn)
        return await _Files.run(lambda: read_bytes(ws, path, offset=offset, max_bytes=max_bytes))

    async def _file_stat(self, conn: Connection, params: dict[str, Any]) -> Any:
        path = _Files.text(params, "path")
        ws = _Files.workspace(self, conn)
        return await _Files.run(lambda: stat(ws, path))

    async def _file_list(self, conn: Connection, params: dict[str, Any]) -> Any:
        path = _Files.text(params, "path", required=False) or "."
        include_ignored = _Files.flag(params, "includeIgnored")
        ws = _Files.workspace(self, conn)
        return await _Files.run(lambda: list_dir(ws, path, include_ignored=include_ignored))

    async def _file_glob(self, conn: Connection, params: dict[str, Any]) -> Any:
        pattern = _Files.text(params, "pattern")
        cwd = _Files.text(params, "cwd", required=False)
        include_ignored = _Files.flag(params, "includeIgnored")
        max_results = (
            _Files.number(params, "maxResults", 1, MAX_GLOB_RESULTS) or DEFAULT_GLOB_RESULTS
        )
        ws = _Files.workspace(self, conn)
        return await _Files.run(
            lambda: glob(
                ws, pattern, cwd=cwd, include_ignored=include_ignored, max_results=max_results
            )
        )

    async def _publish_change(self, conn: Connection, result: Any, action: str) -> None:
        """``workspace_file_changed`` on every live session of the workspace, through the
        workspace hub (the session actors stay their logs' only writers)."""
        originator = next(
            (link.client_id for link in conn.sessions.values() if link.workspace == conn.workspace),
            None,
        )
        data = {
            "path": result.path,
            "action": action,
            "hash": result.hash,
            "size": result.size_bytes,
            "matchedIgnore": result.matched_ignore,
        }
        hub = self.host.hub
        if hub is not None:
            await hub.broadcast(conn.workspace, "workspace_file_changed", data, originator)
            return
        for session in self.host.registry.live(conn.workspace):
            try:
                session.tell_nowait(
                    PublishEvent("workspace_file_changed", data, originator=originator)
                )
            except Exception:
                pass  # a full or closed inbox: the change itself stands

    async def _file_write(self, conn: Connection, params: dict[str, Any]) -> Any:
        path = _Files.text(params, "path")
        content = params.get("content")
        if not isinstance(content, str):
            raise _params_error("`content` must be a string")
        ws = _Files.workspace(self, conn)
        result = await _Files.run(
            lambda: write_text(
                ws,
                path,
                content,
                mode=params.get("mode"),  # type: ignore[arg-type]  # checked by write_text
                expected_hash=params.get("expectedHash"),
                encoding=params.get("encoding"),
                bom=params.get("bom"),
                line_ending=params.get("lineEnding"),
            )
        )
        await self._publish_change(conn, result, "created" if result.created else "replaced")
        return result

    async def _file_edit(self, conn: Connection, params: dict[str, Any]) -> Any:
        path = _Files.text(params, "path")
        old, new = params.get("oldText"), params.get("newText")
        if not isinstance(old, str) or not isinstance(new, str):
            raise _params_error("`oldText` and `newText` must be strings")
        expected = _Files.text(params, "expectedHash")
        ws = _Files.workspace(self, conn)
        result = await _Files.run(lambda: edit_text(ws, path, old, new, expected_hash=expected))
        await self._publish_change(conn, result, "edited")
        return result

    async def _health(self, conn: Connection, params: dict[str, Any]) -> Any:
        return {"status": "ok"}

    async def _heartbeat(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        last_seen = await link.session.call(Heartbeat(link.client_id), timeout_s=ASK_TIMEOUT_S)
        return {"sessionId": link.session_id, "lastSeenAt": last_seen, "clientId": link.client_id}

    async def _update_metadata(self, conn: Connection, params: dict[str, Any]) -> Any:
        link = self._owned(conn, params)
        name = params.get("displayName")
        if not isinstance(name, str) or not name.strip() or len(name) > 256:
            raise _params_error(
                "`displayName` must be a non-empty string of at most 256 characters",
                code="invalid_metadata",
            )
        done: MetadataSet = await link.session.call(
            UpdateMetadata(name.strip(), link.client_id), timeout_s=ASK_TIMEOUT_S
        )
        return {"sessionId": done.session_id, "displayName": done.display_name}


async def _caught_up_now(link: SessionLink) -> None:
    """:func:`_caught_up` to the session log's head as of now (asked of the session)."""
    try:
        view: SessionView = await link.session.call(Describe(), timeout_s=5)
    except Exception:
        return  # gone or stuck: the reply is not held back for it
    await _caught_up(link, view.last_event_id)


async def _caught_up(link: SessionLink, event_id: int, max_wait_s: float = 1.0) -> None:
    """Wait (bounded) until the pump has queued ``event_id``: a turn's reply then follows
    its events (``turn_complete`` included) on the stream."""
    with trio.move_on_after(max_wait_s):
        while (link.last_pushed or 0) < event_id and not link.pump_done.is_set():
            await link.pushed.wait()


class _Files:
    """``_qwen/file/*``: the workspace file functions the REST file routes run, on the
    connection's workspace, in a worker thread (not abandoned on cancel)."""

    @staticmethod
    def workspace(front: AcpFront, conn: Connection) -> Any:
        untrusted = tuple(getattr(front.host.settings, "untrusted_workspaces", ()))
        return front.host.workspaces.get(conn.workspace, trusted=conn.workspace not in untrusted)

    @staticmethod
    def text(params: dict[str, Any], name: str, *, required: bool = True) -> Any:
        value = params.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or (required and not value):
            raise _params_error(f"`{name}` must be a non-empty string")
        return value

    @staticmethod
    def number(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
        value = params.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _params_error(f"`{name}` must be an integer in [{low}, {high}]")
        return value

    @staticmethod
    def flag(params: dict[str, Any], name: str) -> bool:
        value = params.get(name, False)
        if not isinstance(value, bool):
            raise _params_error(f"`{name}` must be a boolean")
        return value

    @staticmethod
    async def run(fn: Callable[[], Any]) -> Any:
        try:
            # The file routes' thread budget, not trio's shared default of 40.
            return await trio.to_thread.run_sync(fn, limiter=file_routes_limiter())
        except WorkspaceFsError as exc:
            wire = fs_error(exc)  # the one table (serve/errors)
            status = wire.status
            code = (
                INVALID_PARAMS
                if status == 400
                else (RESOURCE_NOT_FOUND if status == 404 else SERVER_ERROR)
            )
            raise RpcError(code, exc.message, {"httpStatus": status, **wire.body}) from None


class _Replied:
    """A reply that must be ordered with the end of a session stream (close, detach)."""

    def __init__(self, front: AcpFront, conn: Connection, link: SessionLink, kind: str) -> None:
        self.front = front
        self.conn = conn
        self.link = link
        self.kind = kind

    async def deliver(self, rid: jsonrpc.Id) -> None:
        conn, link = self.conn, self.link
        if conn.dialect == "qwen":
            # The qwen SDK synthesises an HTTP response from the reply, and its
            # closeSession/detachSession accept only 204 or 404 (a 204 cannot carry the
            # body it builds): the REST status it understands as "done" is 404.
            payload = jsonrpc.error_bytes(
                rid,
                RpcError(
                    RESOURCE_NOT_FOUND,
                    f"Session {link.session_id} {'closed' if self.kind == 'close' else 'detached'}",
                    {"httpStatus": 404, "sessionId": link.session_id, "done": self.kind},
                ),
            )
            self.front._reply_conn(conn, payload)
        elif conn.transport == "http" and not link.outbox.ended:
            # An ACP client reads the reply on the session stream, before it ends.
            self.front._push_session(conn, link, None, jsonrpc.result_bytes(rid, {}))
        else:
            self.front._reply_conn(conn, jsonrpc.result_bytes(rid, {}))
        if self.kind == "detach" and link.pump_scope is not None:
            link.pump_scope.cancel()
        self.front._finish_link(conn, link)


_PROMPT_ERROR = "`prompt` must be a non-empty array of content blocks"


def _validate_prompt(prompt: Any) -> tuple[msgspec.Raw, str]:
    if not isinstance(prompt, list) or not prompt:
        raise _params_error(_PROMPT_ERROR)
    texts: list[str] = []
    non_text = 0
    for block in prompt:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _params_error(_PROMPT_ERROR)
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise _params_error("text content blocks need a string `text`")
            texts.append(block["text"])
        else:
            non_text += 1
    if non_text > 256:
        raise _params_error("at most 256 non-text content blocks per prompt")
    return msgspec.Raw(msgspec.json.encode(prompt)), "\n".join(texts)
