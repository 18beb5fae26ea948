"""The SessionActor: one ACP agent child, one prompt FIFO, one EventLog.

Theory of operation
-------------------
A session is an actor under the SessionSupervisor. ``run()`` opens a private nursery,
spawns the agent child (:class:`acp.client.AgentConnection`), performs the handshake
(``initialize`` then ``session/new``, ``session/load`` or ``session/resume``) and reports
readiness; then three tasks share the nursery:

* the actor loop (inbox): admissions, cancel, close, model/mode switches, metadata,
  client registration. Every handler is quick; nothing waits for a turn here, so a cancel
  is never stuck behind a running prompt;
* the prompt worker: takes admitted prompts in FIFO order and runs each turn
  (``session/prompt``); every admitted prompt ends with exactly one ``turn_complete`` or
  ``turn_error`` event (:meth:`_finish` is idempotent);
* the child watcher: when the agent exits without being asked to, the running and queued
  prompts end with ``turn_error {code:"channel_closed"}``, pending permissions resolve
  cancelled, ``session_died {reason:"channel_closed", exitCode, signalCode}`` is published,
  the log is closed and :class:`AgentExited` is raised so the supervisor records a crash.

The actor is also the connection's :class:`acp.handler.ClientHandler`: ``session/update``
notifications are relayed untouched into the log as ``session_update`` events
(``{sessionId, update}``), stamped with the running prompt's id and originator; permission
requests go to the PermissionMediator actor and wait for its answer.

Closing (DELETE, idle reaping, daemon shutdown) publishes terminal events for unfinished
prompts, then ``session_closed`` or ``session_died``, closes the log (SSE streams drain and
end), and stops the child by escalation.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from acp.client import AgentConnection
from acp.errors import AcpError, ChannelClosed, RemoteError, RequestTimeout
from acp.handler import BaseClientHandler
from acp.process import ExitInfo, scrub_env
from acp.schema import (
    CancelledPermissionOutcome,
    CreateTerminalParams,
    PermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    SelectedPermissionOutcome,
    SessionSetup,
    WriteTextFileParams,
)
from actors import Actor, ActorError, EventKind, RestartWindow, Supervisor
from serve.events import EventLog, RawParts
from serve.events.messages import PublishEvent
from serve.journal import Journal, JournalError, JournalMeta, JournalNotFound, SessionJournal
from serve.permissions.mediator import (
    CancelPromptPermissions,
    CancelSessionPermissions,
    OpenPermission,
    PermissionMediator,
    request_decision,
)
from serve.permissions.voting import PermissionOption
from serve.sessions.clients import DEFAULT_CLIENT_IDLE_TIMEOUT_MS, ClientTable
from serve.sessions.errors import AgentRefusedError, NotSupportedByAgent, SessionRequestError
from serve.sessions.modes import APPROVAL_MODES as MODES_OF_QWEN
from serve.sessions.modes import (
    AgentModes,
    UnknownApprovalMode,
    advertised_modes,
    apply_mode,
    resolve_mode,
)

if TYPE_CHECKING:
    from serve.mcp.pool import McpPool
    from serve.permissions.effects import EffectGate
    from serve.settings import Settings

log = logging.getLogger(__name__)

APPROVAL_MODES = MODES_OF_QWEN  # qwen serve's five names (serve/sessions/modes.py)
#: Client-chosen prompt ids remembered for idempotent re-submission.
MAX_REMEMBERED_PROMPTS = 256
#: Seconds an agent closed while idle gets after stdin EOF before SIGTERM.
IDLE_EOF_GRACE_S = 0.2
_encoder = msgspec.json.Encoder()


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AgentExited(Exception):
    """The session's agent child exited without being asked to (a crash for the supervisor)."""

    def __init__(self, exit_info: ExitInfo) -> None:
        super().__init__(f"agent exited (code {exit_info.exit_code}, signal {exit_info.signal})")
        self.exit_info = exit_info


class SessionGone(Exception):
    """The session is closing or closed; maps to 404."""


class PromptRunning(Exception):
    """The prompt is running; it can be cancelled, not removed from the queue."""


class PromptQueueFull(Exception):
    def __init__(self, limit: int, pending: int) -> None:
        super().__init__(f"prompt queue full ({pending}/{limit})")
        self.limit = limit
        self.pending = pending


# ---- messages ---------------------------------------------------------------------------


class SubmitPrompt(msgspec.Struct, frozen=True):
    prompt: msgspec.Raw
    text: str
    client_id: str | None
    extra: dict[str, Any] | None = None
    prompt_id: str | None = None
    deadline_ms: int | None = None  # per-request; can only shorten the daemon's


class ListPending(msgspec.Struct, frozen=True):
    pass


class RemovePending(msgspec.Struct, frozen=True):
    prompt_id: str
    client_id: str | None


class CancelTurn(msgspec.Struct, frozen=True):
    client_id: str | None
    prompt_id: str | None = None  # only this prompt (its blocking caller went away)


class CloseSession(msgspec.Struct, frozen=True):
    reason: str = "client_close"
    closed_by: str | None = None
    died: bool = False  # daemon shutdown: session_died instead of session_closed


class SetModel(msgspec.Struct, frozen=True):
    model_id: str
    client_id: str | None


class SetApprovalMode(msgspec.Struct, frozen=True):
    mode: str
    persist: bool
    client_id: str | None


class UpdateMetadata(msgspec.Struct, frozen=True):
    display_name: str
    client_id: str | None


class Attach(msgspec.Struct, frozen=True):
    client_id: str | None


class Heartbeat(msgspec.Struct, frozen=True):
    client_id: str | None


SessionMsg = (
    SubmitPrompt
    | CancelTurn
    | CloseSession
    | SetModel
    | SetApprovalMode
    | UpdateMetadata
    | Attach
    | Heartbeat
    | ListPending
    | RemovePending
    | PublishEvent
)


class PromptJob:
    """One admitted prompt; ``done`` fires once its terminal event is published."""

    __slots__ = (
        "admission",
        "client_id",
        "deadline",
        "done",
        "extra",
        "prompt",
        "prompt_id",
        "queued",
        "queued_at",
        "result",
        "started",
        "text",
    )

    def __init__(self, msg: SubmitPrompt, prompt_id: str, queued: bool) -> None:
        self.prompt_id = prompt_id
        self.prompt = msg.prompt
        self.text = msg.text
        self.client_id = msg.client_id
        self.extra = msg.extra
        self.queued = queued
        self.queued_at = iso_now()
        self.admission: Admission | None = None
        self.deadline: float | None = None  # trio clock
        self.started = False
        self.done = trio.Event()
        self.result: tuple[str, dict[str, Any]] | None = None


class Admission(msgspec.Struct, frozen=True):
    prompt_id: str
    last_event_id: int
    epoch: str
    job: Any  # PromptJob


class _PermissionHead(msgspec.Struct, frozen=True, rename="camel"):
    tool_call: msgspec.Raw
    options: msgspec.Raw


_permission_head = msgspec.json.Decoder(_PermissionHead)


class SessionActor(Actor[SessionMsg], BaseClientHandler):
    """One session; see the module docstring."""

    def __init__(
        self,
        *,
        settings: Settings,
        mediator: PermissionMediator,
        workspace: str,
        action: str = "new",
        session_id: str | None = None,
        on_gone: Callable[[SessionActor], None] | None = None,
        ring_size: int | None = None,
        restart_intensity: int = 3,
        restart_period_s: float = 60.0,
        restart_backoff_s: float = 0.1,
        journal: Journal | None = None,
        effects: EffectGate | None = None,
        mcp_pool: McpPool | None = None,
    ) -> None:
        Actor.__init__(self, f"session-{session_id or 'new'}", inbox_size=256)
        BaseClientHandler.__init__(self)
        self.settings = settings
        self.mediator = mediator
        self.workspace = workspace
        self.action = action
        self.session_id: str = session_id or ""
        self.on_gone = on_gone
        self.created_at = iso_now()
        self.created_monotonic = time.monotonic()
        self.last_seen_ms = int(time.time() * 1000)
        #: When the last prompt ended (--session-prompt-settled-close-grace-ms).
        self.last_settled_ms = 0
        self.display_name: str | None = None
        #: Registered clients, expiring when idle (serve/sessions/clients.py).
        self.clients = ClientTable(
            getattr(settings, "client_idle_timeout_ms", DEFAULT_CLIENT_IDLE_TIMEOUT_MS)
        )
        self.log = EventLog(
            self.session_id,
            ring_size=ring_size or settings.event_ring_size,
            ring_bytes=settings.event_ring_bytes,
        )
        self._early: list[tuple[str, msgspec.Raw]] = []
        #: The journal of a new session is being opened: updates wait in ``_early`` (else
        #: the first ones, e.g. available_commands_update, could miss the journal).
        self._journal_pending = False
        self.conn: AgentConnection | None = None
        self.setup: SessionSetup | None = None
        self.current_model: str | None = None
        self.current_mode: str | None = None
        self.available_commands: msgspec.Raw | None = None
        self._send_job, self._recv_job = trio.open_memory_channel[PromptJob](10_000)
        self.queue: deque[PromptJob] = deque()
        self.active: PromptJob | None = None
        self.closing = False
        self.ended = trio.Event()
        self._stopping = False
        self._idle_at_close = False
        self._worker_scope: trio.CancelScope | None = None
        self._turn_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self.exit_info: ExitInfo | None = None
        self.subscribers = 0
        self._drop_updates = False
        self._update_head: bytes | None = None
        self.journal = journal
        #: The workspace MCP pool (serve/mcp), or None (unit tests).
        self.mcp_pool = mcp_pool
        self.journal_writer: SessionJournal | None = None
        self.restored_from_journal = False
        self._admitted: dict[str, PromptJob] = {}
        self._conn_ready = trio.Event()
        self._restarts = RestartWindow(restart_intensity, restart_period_s)
        self.restart_backoff_s = restart_backoff_s
        self.restart_count = 0
        #: The supervisor whose history records this session's agent restarts.
        self.supervisor: Supervisor | None = None
        #: The Host's effect gate (grants, approvals, workspace boundary), or None.
        self.effects = effects

    # ---- read models -------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return len(self.queue) + (1 if self.active is not None else 0)

    @property
    def has_active_prompt(self) -> bool:
        return self.active is not None

    def state_snapshot(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.setup is not None:
            raw = msgspec.json.decode(bytes(self.setup.raw)) if self.setup.raw else {}
            if isinstance(raw, dict):
                for key in ("models", "modes", "configOptions", "_meta"):
                    if raw.get(key) is not None:
                        state[key] = raw[key]
        return state

    def summary(self) -> dict[str, Any]:
        pending = self.mediator.pending_count(self.session_id)
        out: dict[str, Any] = {
            "sessionId": self.session_id,
            "workspaceCwd": self.workspace,
            "createdAt": self.created_at,
            "displayName": self.display_name or self.session_id,
            "clientCount": len(self.clients),
            "hasActivePrompt": self.has_active_prompt,
            "activeWorkState": "prompt" if self.has_active_prompt else "idle",
            "hasRunningBackgroundTasks": False,
            "isWaitingForPermission": pending > 0,
            "isWaitingForUserQuestion": False,
            "pendingInteractionCount": pending,
            "pendingPromptCount": self.pending_count,
            "hasTurnError": False,
            "pendingInteractions": [],
        }
        return out

    def diagnostics(self) -> dict[str, Any]:
        """Operator detail for ``/daemon/status?detail=full`` (no client ids, no secrets)."""
        conn = self.conn
        out: dict[str, Any] = {
            "agentPid": conn.process.pid if conn is not None and not conn.closed else None,
            "agentRestarts": self.restart_count,
            "subscribers": self.subscribers,
            "queuedPrompts": len(self.queue),
        }
        if self.journal_writer is not None:
            out["journal"] = self.journal_writer.statistics()
        return out

    def knows_client(self, client_id: str) -> bool:
        return client_id in self.clients

    def register_client(self, requested: str | None) -> str:
        """Reuse ``requested`` if already registered here, else mint a fresh id."""
        client_id = (
            requested
            if requested is not None and requested in self.clients
            else f"client_{uuid.uuid4()}"
        )
        self.clients.register(client_id)
        return client_id

    def release_client(self, client_id: str) -> None:
        self.clients.release(client_id)

    # ---- lifecycle ---------------------------------------------------------------------

    def _agent_env(self) -> dict[str, str]:
        import os

        env = scrub_env(os.environ)
        if self.settings.agent_is_default:
            env["ACP_SCRIPTED_STATE_DIR"] = os.path.join(self.settings.state_dir, "scripted")
            env["ACP_SCRIPTED_RETENTION_MS"] = str(self.settings.journal_retention_ms)
        env["QWEN_CODE_NO_RELAUNCH"] = "true"
        if self.settings.mcp_client_budget is not None:
            env["QWEN_SERVE_MCP_CLIENT_BUDGET"] = str(self.settings.mcp_client_budget)
            env["QWEN_SERVE_MCP_BUDGET_MODE"] = self.settings.mcp_budget_mode
        return env

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[SessionMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._start_agent(nursery, self.action)
                except BaseException:
                    if self.journal_writer is not None:
                        with trio.CancelScope(shield=True), trio.move_on_after(5):
                            await self.journal_writer.aclose()
                    raise
                nursery.start_soon(self._prompt_worker)
                nursery.start_soon(self._supervise_child, nursery)
                await Actor.run(self, task_status=task_status)
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            if not self.ended.is_set():
                with trio.CancelScope(shield=True):
                    await self._abort_everything("channel_closed", died=True)
            if self.on_gone is not None:
                self.on_gone(self)

    async def _start_agent(self, nursery: trio.Nursery, action: str) -> None:
        """Spawn the child and open (new), restore (load/resume) or re-attach the session.

        ``action`` ``restart`` re-attaches to our own ACP session after the child died:
        ``session/resume`` when offered (no replay), else ``session/load`` with the
        replayed history dropped (the log already holds it).
        """
        settings = self.settings
        init_timeout = settings.initialize_timeout_ms / 1000
        conn = await AgentConnection.spawn(
            nursery,
            settings.agent_argv,
            cwd=self.workspace,
            env=self._agent_env(),
            handler=self,
            request_timeout_s=init_timeout,
            max_line_bytes=settings.max_agent_line_bytes,
        )
        self.conn = conn
        try:
            await conn.initialize(timeout_s=init_timeout)
            info = conn.info
            restore_timeout = settings.session_restore_timeout_ms / 1000
            mcp_servers = await self._mcp_servers(info)
            if action == "new":
                setup = await conn.new_session(self.workspace, mcp_servers, timeout_s=init_timeout)
                self.session_id = setup.session_id
                self.log.session_id = setup.session_id
                self.name = f"session-{setup.session_id}"
                self._journal_pending = True
                try:
                    await self._open_journal(nursery, fresh=True)
                finally:
                    self._journal_pending = False
                for kind, update in self._early:
                    self._relay(kind, update)
                self._early.clear()
            elif action == "load" or (action == "restart" and not _can_resume(info)):
                if info is None or not info.load_session:
                    raise NotSupportedByAgent(
                        "The agent does not support session/load", "not_supported_by_agent"
                    )
                if action == "load":
                    await self._restore_from_journal(nursery)
                # After a restart, or when the journal already holds the history, the
                # agent's replay of it would duplicate events: drop it.
                self._drop_updates = action == "restart" or self.restored_from_journal
                try:
                    setup = await conn.load_session(
                        self.session_id, self.workspace, mcp_servers, timeout_s=restore_timeout
                    )
                finally:
                    self._drop_updates = False
            else:
                if action == "resume":
                    await self._restore_from_journal(nursery)
                setup = await conn.resume_session(
                    self.session_id, self.workspace, mcp_servers, timeout_s=restore_timeout
                )
        except BaseException:
            with trio.CancelScope(shield=True):
                await conn.aclose(grace_s=1.0)
            raise
        if action != "restart" or self.setup is None:
            self.setup = setup
        if setup.models is not None:
            self.current_model = getattr(setup.models, "current_model_id", None)
        elif (option := setup.model_option()) is not None and isinstance(option.current_value, str):
            self.current_model = option.current_value  # models only as a config option (codex)
        self.current_mode = advertised_modes(setup).current or self.current_mode
        self._conn_ready.set()

    async def _mcp_servers(self, info: Any) -> list[Any]:
        """The workspace's MCP servers for the agent (pooled stdio servers are reached
        through the pool's bridge; transports the agent did not advertise are left out)."""
        if self.mcp_pool is None:
            return []
        caps = info.agent_capabilities.mcp_capabilities if info is not None else None
        servers: list[Any] = await self.mcp_pool.acp_servers_for(
            self.workspace,
            requester=self,
            http=bool(caps and caps.http),
            sse=bool(caps and caps.sse),
        )
        return servers

    # ---- the durable journal -----------------------------------------------------------

    async def _open_journal(self, nursery: trio.Nursery, *, fresh: bool) -> None:
        """Journal this session's events (``--no-journal`` or an I/O error: no journal)."""
        if self.journal is None or self.journal_writer is not None:
            return
        meta = JournalMeta(
            session_id=self.session_id,
            epoch=self.log.epoch,
            workspace=self.workspace,
            acp_session_id=self.session_id,
            origin="load"
            if self.action == "load"
            else "resume"
            if self.action == "resume"
            else "new",
            created_at_ms=int(time.time() * 1000),
        )
        try:
            writer = await self.journal.open_writer(meta, fresh=fresh)
        except JournalError as exc:
            log.warning("session %s runs without a journal: %s", self.session_id, exc)
            return
        self.journal_writer = writer
        self.log.sink = writer.sink
        await nursery.start(writer.run)

    async def _restore_from_journal(self, nursery: trio.Nursery) -> None:
        """After a daemon restart: rebuild the event log from the journal (same ids; the
        same epoch when the journal was closed cleanly) and keep journaling."""
        if self.journal is None:
            return
        try:
            replay = await self.journal.read(self.session_id, tail=self.log.ring_size)
        except JournalNotFound:
            await self._open_journal(nursery, fresh=True)
            return
        except JournalError as exc:
            log.warning("journal of session %s unreadable: %s", self.session_id, exc)
            await self._open_journal(nursery, fresh=True)
            return
        epoch = replay.meta.epoch if replay.clean else None
        first = replay.records[0].event_id if replay.records else replay.next_id
        restored = EventLog(
            self.session_id,
            ring_size=self.log.ring_size,
            ring_bytes=self.log.ring_bytes,
            epoch=epoch,
            next_id=first,
        )
        for event_id, _type, frame in replay:
            restored.restore(event_id, frame)
        self.log = restored
        self.restored_from_journal = bool(replay.records)
        await self._open_journal(nursery, fresh=False)

    def _restorable(self) -> bool:
        info = self.conn.info if self.conn is not None else None
        return info is not None and (info.load_session or _can_resume(info))

    async def _supervise_child(self, nursery: trio.Nursery) -> None:
        """Watch the agent child; restart it in place while the intensity allows.

        A restart keeps the session id, the event log (ids continue), the clients and
        the queued prompts; the prompt that was running ends with ``turn_error
        {errorKind: "agent_restarted"}`` and ``session_restarted`` tells clients what
        happened. Without load/resume support, or past the intensity, the session dies.
        """
        while True:
            assert self.conn is not None
            exit_info = await self.conn.wait_closed()
            if self._stopping or self.ended.is_set():
                return
            self.exit_info = exit_info
            self._conn_ready = trio.Event()
            log.warning(
                "agent of session %s exited (code %s, signal %s)",
                self.session_id,
                exit_info.exit_code,
                exit_info.signal,
            )
            if not (self._restorable() and self._restarts.intensity and self._restarts.allows()):
                await self._abort_everything("channel_closed", died=True, exit_info=exit_info)
                raise AgentExited(exit_info)
            self._restarts.count()
            self.restart_count += 1
            attempt = self.restart_count
            reason = f"agent exited (code {exit_info.exit_code}, signal {exit_info.signal})"
            self._record_supervision("crash", reason, attempt)
            if self.active is not None:
                self._finish(
                    self.active,
                    "turn_error",
                    {
                        "sessionId": self.session_id,
                        "message": "the agent exited during the prompt and was restarted",
                        "code": "agent_restarted",
                        "errorKind": "agent_restarted",
                    },
                )
            try:
                await self.mediator.ask(
                    CancelSessionPermissions(self.session_id, "session_closed"), timeout_s=2
                )
            except ActorError:
                pass
            await trio.sleep(min(5.0, self.restart_backoff_s * 2 ** (attempt - 1)))
            try:
                await self._start_agent(nursery, "restart")
            except Exception as exc:
                log.warning("restarting the agent of session %s failed: %r", self.session_id, exc)
                await self._abort_everything("channel_closed", died=True, exit_info=exit_info)
                raise AgentExited(exit_info) from exc
            self._record_supervision("restart", f"attempt {attempt}", attempt)
            self.log.publish(
                "session_restarted",
                {
                    "sessionId": self.session_id,
                    "attempt": attempt,
                    "exitCode": exit_info.exit_code,
                    "signal": _signal_name(exit_info.signal),
                },
            )

    def _record_supervision(self, kind: str, reason: str, attempt: int) -> None:
        if self.supervisor is not None:
            self.supervisor.record(self.name, EventKind(kind), reason, attempt)

    async def on_stop(self) -> None:
        self._stopping = True
        if self.conn is not None and not self.conn.closed:
            # An agent closed while idle has nothing to finish: a short wait after stdin
            # EOF, then SIGTERM (an agent that ignores EOF must not hold up a shutdown).
            eof_grace_s = IDLE_EOF_GRACE_S if self._idle_at_close else None
            with trio.move_on_after(5):
                await self.conn.aclose(grace_s=1.0, eof_grace_s=eof_grace_s)
        if self.journal_writer is not None:
            with trio.move_on_after(5):
                await self.journal_writer.aclose()

    # ---- the ClientHandler side --------------------------------------------------------

    async def flow_control(self, incoming_bytes: int = 0) -> None:
        """Between chunks read from the agent: let lagging SSE writers catch up."""
        await self.log.wait_drained(incoming_bytes=incoming_bytes)

    def on_oversized_line(self, size: int, limit: int) -> None:
        """The agent wrote a line over ``--max-agent-line-bytes``: it was dropped, say so."""
        active = self.active
        self.log.publish(
            "agent_output_dropped",
            {
                "sessionId": self.session_id,
                "reason": "line_too_long",
                "sizeBytes": size,
                "maxBytes": limit,
            },
            prompt_id=active.prompt_id if active else None,
            originator=active.client_id if active else None,
        )

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        if self._drop_updates:
            return  # history replayed by session/load after a restart: already in the log
        if not self.session_id:
            self._early.append((kind, update))
            return
        if session_id != self.session_id:
            return
        if self._journal_pending:
            self._early.append((kind, update))
            return
        self._relay(kind, update)

    def _relay(self, kind: str, update: msgspec.Raw) -> None:
        if kind == "available_commands_update":
            self.available_commands = update
        elif kind == "current_mode_update":
            try:
                self.current_mode = msgspec.json.decode(bytes(update)).get("currentModeId")
            except (msgspec.DecodeError, AttributeError):
                pass
        elif kind == "config_option_update":  # a mode option the agent changed itself
            modes = self._agent_modes()
            if modes.source == "config" and modes.current is not None:
                self.current_mode = modes.current
        elif kind in ("tool_call", "tool_call_update") and self.effects is not None:
            self.effects.note_tool_call(self, update)  # paths an approval may name by id
        head = self._update_head
        if head is None:  # encoded once: the session id never changes after set-up
            head = self._update_head = b'{"sessionId":' + _encoder.encode(self.session_id)
        data = RawParts((head, b',"update":', update, b"}"))  # joined once, into the frame
        active = self.active
        self.log.publish(
            "session_update",
            data,
            prompt_id=active.prompt_id if active else None,
            originator=active.client_id if active else None,
        )

    # Effects the agent asks of the Host go through the daemon's EffectGate (grants,
    # approval policy, the workspace boundary) when one is installed.

    async def read_text_file(self, params: ReadTextFileParams) -> str:
        gate = _effect_gate(self)
        if gate is None:
            return await BaseClientHandler.read_text_file(self, params)
        return await gate.read_text_file(self, params)  # type: ignore[no-any-return]

    async def write_text_file(self, params: WriteTextFileParams) -> None:
        gate = _effect_gate(self)
        if gate is None:
            return await BaseClientHandler.write_text_file(self, params)
        await gate.write_text_file(self, params)

    async def terminal_create(self, params: CreateTerminalParams) -> str:
        gate = _effect_gate(self)
        if gate is not None:
            await gate.check_terminal(self, params)
        return await BaseClientHandler.terminal_create(self, params)

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        if params.session_id != self.session_id or self.closing:
            return CancelledPermissionOutcome()
        gate = _effect_gate(self)
        if gate is not None:  # the approval policy first: deny/auto answer without asking
            screened = await gate.screen_agent_permission(self, params)
            if screened is not None:
                return screened  # type: ignore[no-any-return]
        head = _permission_head.decode(bytes(raw))
        active = self.active
        options = tuple(
            PermissionOption(option_id=o.option_id, kind=o.kind, name=o.name)
            for o in params.options
        )
        try:
            response = await request_decision(
                self.mediator,
                OpenPermission(
                    session_id=self.session_id,
                    session=self,
                    tool_call=head.tool_call,
                    options=head.options,
                    option_list=options,
                    prompt_id=active.prompt_id if active else None,
                    originator=active.client_id if active else None,
                    session_clients=frozenset(self.clients),
                ),
                timeout_s=10,
            )
        except ActorError:
            return CancelledPermissionOutcome()
        outcome = response.get("outcome", {})
        if outcome.get("outcome") == "selected":
            selected = SelectedPermissionOutcome(option_id=outcome["optionId"])
            if gate is not None:  # an allowed tool call's own fs/terminal effect: ask once
                gate.note_agent_permission(self, params, selected)
            return selected
        return CancelledPermissionOutcome()

    # ---- the actor loop ----------------------------------------------------------------

    async def handle(self, msg: SessionMsg) -> Any:
        if self.closing and not isinstance(msg, CloseSession | PublishEvent):
            raise SessionGone(self.session_id)  # PublishEvent: until the log closes
        match msg:
            case SubmitPrompt():
                return self._admit(msg)
            case CancelTurn(client_id=cid, prompt_id=pid):
                if pid is not None:
                    return await self._cancel_prompt(pid, cid)
                return await self._cancel_turn(cid)
            case CloseSession():
                return await self._close(msg)
            case SetModel():
                return await self._set_model(msg)
            case SetApprovalMode():
                return await self._set_approval_mode(msg)
            case UpdateMetadata(display_name=name, client_id=cid):
                self.display_name = name
                self.log.publish(
                    "session_metadata_updated",
                    {"sessionId": self.session_id, "displayName": name, "titleSource": "manual"},
                    originator=cid,
                )
                return {"sessionId": self.session_id, "displayName": name}
            case Attach(client_id=cid):
                return self.register_client(cid)
            case ListPending():
                return self._pending_list()
            case RemovePending(prompt_id=pid, client_id=cid):
                return self._remove_pending(pid, cid)
            case PublishEvent(event_type=etype, data=data, prompt_id=pid, originator=orig):
                return self.log.publish(etype, data, prompt_id=pid, originator=orig)
            case Heartbeat(client_id=cid):
                now = int(time.time() * 1000)
                self.last_seen_ms = now
                if cid is not None:
                    self.clients.touch(cid)
                return now

    def _admit(self, msg: SubmitPrompt) -> Admission:
        if msg.prompt_id is not None:
            earlier = self._admitted.get(msg.prompt_id)
            if earlier is not None and earlier.admission is not None:
                return earlier.admission  # idempotent: the same turn, not a second one
        limit = self.settings.max_pending_prompts_per_session
        if limit and self.pending_count >= limit:
            raise PromptQueueFull(limit, self.pending_count)
        prompt_id = msg.prompt_id or str(uuid.uuid4())
        queued = self.pending_count > 0
        job = PromptJob(msg, prompt_id, queued)
        deadline_ms = self.settings.prompt_deadline_ms
        if deadline_ms is not None and msg.deadline_ms is not None:
            deadline_ms = min(deadline_ms, msg.deadline_ms)
        if deadline_ms is not None:
            # An absolute deadline: queueing time counts.
            job.deadline = trio.current_time() + deadline_ms / 1000
        watermark = self.log.last_id
        if queued:
            self.log.publish(
                "pending_prompt_added",
                {
                    "sessionId": self.session_id,
                    "promptId": prompt_id,
                    "text": msg.text,
                    "queuedAt": iso_now(),
                },
                prompt_id=prompt_id,
                originator=msg.client_id,
            )
        self.queue.append(job)
        self._send_job.send_nowait(job)
        job.admission = Admission(prompt_id, watermark, self.log.epoch, job)
        self._admitted[prompt_id] = job
        while len(self._admitted) > MAX_REMEMBERED_PROMPTS:
            self._admitted.pop(next(iter(self._admitted)))
        return job.admission

    def _pending_list(self) -> dict[str, Any]:
        jobs = ([self.active] if self.active is not None else []) + list(self.queue)
        return {
            "sessionId": self.session_id,
            "pending": [
                {
                    "promptId": job.prompt_id,
                    "text": job.text,
                    "queuedAt": job.queued_at,
                    "state": "running" if job is self.active else "queued",
                    **({"originatorClientId": job.client_id} if job.client_id else {}),
                }
                for job in jobs
            ],
        }

    def _remove_pending(self, prompt_id: str, client_id: str | None) -> bool:
        """Remove a queued prompt (True), False when unknown; running ones are refused."""
        if self.active is not None and self.active.prompt_id == prompt_id:
            raise PromptRunning(prompt_id)
        for job in self.queue:
            if job.prompt_id == prompt_id:
                self.queue.remove(job)
                self.log.publish(
                    "prompt_cancelled",
                    {"sessionId": self.session_id, "reason": "removed_from_queue"},
                    prompt_id=prompt_id,
                    originator=client_id,
                )
                self._finish(
                    job, "turn_complete", {"sessionId": self.session_id, "stopReason": "cancelled"}
                )
                return True
        return False

    async def _cancel_turn(self, client_id: str | None) -> None:
        active = self.active
        self.log.publish(
            "prompt_cancelled",
            {"sessionId": self.session_id, "reason": "client_cancel"},
            prompt_id=active.prompt_id if active else None,
            originator=client_id,
        )
        await self.mediator.ask(CancelSessionPermissions(self.session_id, "session_closed"))
        if self.conn is not None and not self.conn.closed:
            try:
                await self.conn.cancel(self.session_id)
            except AcpError:
                pass

    async def _cancel_prompt(self, prompt_id: str, client_id: str | None) -> None:
        """Cancel one prompt: the running one through the agent, a queued one at once."""
        if self.active is not None and self.active.prompt_id == prompt_id:
            await self._cancel_turn(client_id)
            return
        for job in self.queue:
            if job.prompt_id == prompt_id and not job.started:
                self.log.publish(
                    "prompt_cancelled",
                    {"sessionId": self.session_id, "reason": "client_disconnected"},
                    prompt_id=prompt_id,
                    originator=client_id,
                )
                self.queue.remove(job)
                self._finish(
                    job,
                    "turn_complete",
                    {"sessionId": self.session_id, "stopReason": "cancelled"},
                )
                return

    async def _set_model(self, msg: SetModel) -> dict[str, Any]:
        assert self.conn is not None
        try:
            await self.conn.set_model(self.session_id, msg.model_id)
        except (RemoteError, RequestTimeout) as exc:
            error = exc.message if isinstance(exc, RemoteError) else str(exc)
            self.log.publish(
                "model_switch_failed",
                {"sessionId": self.session_id, "requestedModelId": msg.model_id, "error": error},
                originator=msg.client_id,
            )
            raise AgentRefusedError(
                f"Model switch failed: {error}",
                "model_switch_failed",
                requestedModelId=msg.model_id,
            ) from None
        self.current_model = msg.model_id
        self.log.publish(
            "model_switched",
            {"sessionId": self.session_id, "modelId": msg.model_id},
            originator=msg.client_id,
        )
        return {"modelId": msg.model_id}

    async def _set_approval_mode(self, msg: SetApprovalMode) -> dict[str, Any]:
        """Agent ids as is, qwen names mapped onto them (serve/sessions/modes.py)."""
        assert self.conn is not None
        modes = self._agent_modes()
        try:
            mode_id = resolve_mode(msg.mode, modes)
        except UnknownApprovalMode as exc:
            raise SessionRequestError(
                str(exc), "invalid_approval_mode", allowed=exc.allowed
            ) from None
        previous = self.current_mode
        try:
            reported = await apply_mode(self.conn, self.session_id, modes, mode_id)
        except (RemoteError, RequestTimeout) as exc:
            error = exc.message if isinstance(exc, RemoteError) else str(exc)
            raise AgentRefusedError(f"Approval mode change failed: {error}", "approval_mode_failed")
        if reported is None:  # set_mode answers {}: a current_mode_update may have come
            seen = self.current_mode
            reported = seen if seen is not None and seen != previous else mode_id
        self.current_mode = reported
        event: dict[str, Any] = {"sessionId": self.session_id, "previous": previous}
        event.update(next=reported, persisted=False)
        if reported != msg.mode:
            event["requested"] = msg.mode
        self.log.publish("approval_mode_changed", event, originator=msg.client_id)
        return {("mode" if k == "next" else k): v for k, v in event.items()}

    def _agent_modes(self) -> AgentModes:
        conn = self.conn
        live = conn.config_options(self.session_id) if conn is not None else None
        return advertised_modes(self.setup, live)

    # ---- turns -------------------------------------------------------------------------

    async def _prompt_worker(self) -> None:
        async for job in self._recv_job:
            if job.done.is_set():
                continue  # removed or aborted before it started
            await self._conn_ready.wait()  # an agent restart in progress
            if job.done.is_set():
                continue
            if job.deadline is not None and trio.current_time() >= job.deadline:
                if job in self.queue:
                    self.queue.remove(job)
                await self._deadline_exceeded(job)
                continue
            if job in self.queue:
                self.queue.remove(job)
            self.active = job
            job.started = True
            try:
                await self._run_turn(job)
            finally:
                self.active = None

    async def _run_turn(self, job: PromptJob) -> None:
        assert self.conn is not None
        if job.queued:
            self.log.publish(
                "pending_prompt_started",
                {"sessionId": self.session_id, "promptId": job.prompt_id, "text": job.text},
                prompt_id=job.prompt_id,
                originator=job.client_id,
            )
        # Echo the submitted prompt onto the log, as the reference does.
        for block in _text_blocks(job.prompt):
            self._relay(
                "user_message_chunk",
                msgspec.Raw(b'{"sessionUpdate":"user_message_chunk","content":' + block + b"}"),
            )
        extra = dict(job.extra or {})
        meta = dict(extra.pop("_meta", None) or {})
        meta["qwen.daemon.invocation"] = {
            "version": 1,
            "sessionId": self.session_id,
            "promptId": job.prompt_id,
            **({"originatorClientId": job.client_id} if job.client_id else {}),
        }
        extra["_meta"] = meta
        try:
            with trio.CancelScope() as scope:
                self._turn_scope = scope
                if job.deadline is not None:
                    scope.deadline = job.deadline
                result = await self.conn.prompt(self.session_id, job.prompt, extra=extra)
            self._turn_scope = None
            if scope.cancelled_caught:
                if job.deadline is not None and trio.current_time() >= job.deadline:
                    await self._deadline_exceeded(job)
                return
        except RemoteError as exc:
            data: dict[str, Any] = {
                "sessionId": self.session_id,
                "message": exc.message,
                "code": exc.code,
            }
            if exc.data is not None:
                data["data"] = exc.data
            self._finish(job, "turn_error", data)
            return
        except ChannelClosed:
            # The child died: the supervising task ends this prompt (agent_restarted or,
            # when the session dies, channel_closed); wait for its decision.
            with trio.move_on_after(30):
                await job.done.wait()
            self._finish(job, "turn_error", _channel_closed_error(self.session_id))
            return
        except AcpError as exc:
            self._finish(
                job,
                "turn_error",
                {"sessionId": self.session_id, "message": str(exc), "code": "protocol_error"},
            )
            return
        data = {"sessionId": self.session_id, "stopReason": result.stop_reason}
        meta_raw = result.meta
        if meta_raw:
            try:
                decoded = msgspec.json.decode(bytes(meta_raw))
            except msgspec.DecodeError:
                decoded = None
            if isinstance(decoded, dict) and "qwen.branchPoint" in decoded:
                data["branchPoint"] = decoded["qwen.branchPoint"]
        self._finish(job, "turn_complete", data)

    async def _deadline_exceeded(self, job: PromptJob) -> None:
        """The absolute deadline fired: end the turn now (the FIFO moves on even if the
        agent is wedged) and ask the agent to stop."""
        self._finish(
            job,
            "turn_error",
            {
                "sessionId": self.session_id,
                "message": "the prompt exceeded its deadline",
                "code": "prompt_deadline_exceeded",
                "errorKind": "prompt_deadline_exceeded",
            },
        )
        try:
            await self.mediator.ask(
                CancelSessionPermissions(self.session_id, "session_closed"), timeout_s=2
            )
        except ActorError:
            pass
        if self.conn is not None and not self.conn.closed:
            try:
                with trio.move_on_after(1):
                    await self.conn.cancel(self.session_id)
            except AcpError:
                pass

    def _finish(self, job: PromptJob, event_type: str, data: dict[str, Any]) -> None:
        """Publish the one terminal event of ``job`` (idempotent)."""
        if job.done.is_set():
            return
        data.setdefault("promptId", job.prompt_id)
        self.log.publish(event_type, data, prompt_id=job.prompt_id, originator=job.client_id)
        if job.queued:
            state = "completed" if job.started else "removed"
            self.log.publish(
                "pending_prompt_completed",
                {"sessionId": self.session_id, "promptId": job.prompt_id, "state": state},
                prompt_id=job.prompt_id,
            )
        job.result = (event_type, data)
        job.done.set()
        self.last_settled_ms = int(time.time() * 1000)
        self._turn_ended(job)

    def _turn_ended(self, job: PromptJob) -> None:
        """Withdraw the permission requests the finished turn left open (issue 16.2)."""
        if job.started:
            try:
                self.mediator.tell_nowait(CancelPromptPermissions(self.session_id, job.prompt_id))
            except ActorError:  # full or stopped: the response timeout still applies
                log.warning(
                    "session %s: could not withdraw permissions of its turn", self.session_id
                )

    # ---- endings -----------------------------------------------------------------------

    async def _close(self, msg: CloseSession) -> None:
        if self.closing:
            return
        self._idle_at_close = self.active is None and not self.queue
        if msg.died:
            await self._abort_everything(msg.reason, died=True)
        else:
            await self._abort_everything(msg.reason, died=False, closed_by=msg.closed_by)
        self._stopping = True
        self.close()  # ends the actor loop; run() then stops the child

    async def _abort_everything(
        self,
        reason: str,
        *,
        died: bool,
        exit_info: ExitInfo | None = None,
        closed_by: str | None = None,
    ) -> None:
        """Terminal events for every unfinished prompt, cancel permissions, final event."""
        if self.ended.is_set():
            return
        self.closing = True
        if self._turn_scope is not None:
            self._turn_scope.cancel()
        if died and reason == "channel_closed":
            terminal: tuple[str, dict[str, Any]] = (
                "turn_error",
                _channel_closed_error(self.session_id),
            )
        elif died:
            terminal = (
                "turn_error",
                {"sessionId": self.session_id, "message": "daemon shutting down", "code": reason},
            )
        else:
            terminal = (
                "turn_complete",
                {"sessionId": self.session_id, "stopReason": "cancelled", "promptCancelled": True},
            )
        jobs = ([self.active] if self.active is not None else []) + list(self.queue)
        for job in jobs:
            self._finish(job, terminal[0], dict(terminal[1]))
        try:
            with trio.move_on_after(2):
                await self.mediator.ask(
                    CancelSessionPermissions(self.session_id, "session_closed", forget=True),
                    timeout_s=2,
                )
        except ActorError:
            pass
        if self.conn is not None and not self.conn.closed and not died:
            try:
                with trio.move_on_after(1):
                    await self.conn.cancel(self.session_id)
            except AcpError:
                pass
        await self._publish_queued()
        if died:
            data: dict[str, Any] = {"sessionId": self.session_id, "reason": reason}
            if exit_info is not None:
                data["exitCode"] = exit_info.exit_code
                data["signalCode"] = _signal_name(exit_info.signal)
            self.log.publish("session_died", data)
        else:
            data = {"sessionId": self.session_id, "reason": reason}
            if closed_by is not None:
                data["closedBy"] = closed_by
            self.log.publish("session_closed", data, originator=closed_by)
        self.log.close()
        self.ended.set()

    async def _publish_queued(self) -> None:
        """Before the final event: handle what is already in the inbox (the mediator's
        ``permission_resolved`` events for our cancel), so those events are not lost."""
        while True:
            try:
                envelope = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            await self._dispatch(envelope)


def _can_resume(info: Any) -> bool:
    return info is not None and bool(getattr(info, "supports_resume", False))


def _effect_gate(session: SessionActor) -> Any:
    """The daemon's EffectGate (``serve/permissions/effects.py``), when installed."""
    return getattr(session, "effects", None)


def _channel_closed_error(session_id: str) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "message": "agent channel exited before the prompt completed",
        "code": "channel_closed",
    }


def _signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _text_blocks(prompt: msgspec.Raw) -> list[bytes]:
    """The raw JSON of each content block (echoed as user_message_chunk updates)."""
    try:
        blocks = msgspec.json.decode(bytes(prompt), type=list[msgspec.Raw])
    except msgspec.DecodeError:
        return []
    return [bytes(b) for b in blocks]
