"""The SessionActor: joins one prompt queue, one agent link and one EventLog.

Theory of operation
-------------------
A session is an actor under the SessionSupervisor. Its parts:

* :mod:`serve.sessions.prompt_queue` (sans-IO): admission, idempotent ``promptId``,
  deadlines, removal, exactly one terminal per admitted prompt;
* :mod:`serve.sessions.agent_link`: the agent (acquired from an ``AgentSource``), the
  handshake, load/resume, restart in place; the session's journal;
* :mod:`serve.sessions.messages`: what the actor is sent and answers (typed snapshots).

``run()`` opens a private nursery, opens the agent link and reports readiness; then three
tasks share the nursery:

* the actor loop (inbox). Every handler is quick and never awaits the agent: agent calls
  (model/mode switches, vendor extension calls, ``session/cancel``) run as tasks of the
  nursery and answer through a :class:`~actors.Reply` (:meth:`SessionActor.call` awaits
  both). Model and mode switches are serialized among themselves, each bounded by the
  caller's timeout; one that never got its turn is not sent (``ControlTimeout``). So
  cancel, close, admissions, attach/detach and metadata are never stuck behind the agent.
  "Busy" (rewind/branch) and "last client" (detach) are decided here, where the state is.
* the prompt worker: takes admitted prompts in FIFO order and runs each turn
  (``session/prompt``); an exclusive extension call (rewind, branch) holds it back;
* the child watcher: when the agent exits without being asked to, it is restarted in place
  while the restart window allows (``session_restarted``; the running prompt ends with
  ``turn_error {errorKind:"agent_restarted"}``); otherwise the running and queued prompts end
  with ``turn_error {code:"channel_closed"}``, ``session_died`` is published, the log closed
  and :class:`AgentExited` raised so the supervisor records a crash.

A cancel the agent ignores escalates: after ``--cancel-grace-ms`` the turn ends with
``turn_error {code:"cancel_timeout"}`` and the agent is restarted in place. On a shared
child (``--sessions-per-agent`` > 1) that would hit every session on it, so the child is
first probed (:meth:`AgentLink.responsive`: a request no agent implements; any answer within
:data:`PROBE_TIMEOUT_S` means it still reads and writes for everyone). Responsive: only this
session goes, as an idle release does (the turn's request abandoned, the session unbound, its
terminals killed, ``session/close`` where offered, ``agent_released {reason:
"cancel_timeout"}``; the next prompt binds it again; an agent that cannot restore it ends the
session). Unresponsive for all: the child is killed and every session on it restores itself.
An idle session restored after its shared child exited is a bystander: the restart is charged
to the child (the pool counts each exit once), not to the session's own window, while the
child's window allows.

When the link lets an agent go (idle release, a shared child left), the child watcher stops
watching that connection (``AgentLink.wait_exit`` returns None): a shared child that exits
later is no business of a session that has moved on.

The actor is also the connection's :class:`acp.handler.ClientHandler`
(:mod:`serve.sessions.agent_side`): updates relayed into the log, effects through the effect
gate, permission requests screened by the policy, then to the PermissionMediator.
The actor is its log's only writer; others send :class:`PublishEvent`.

Closing (DELETE, idle reaping, daemon shutdown) publishes terminal events for unfinished
prompts, then ``session_closed`` or ``session_died``, closes the log (SSE streams drain and
end), and stops the child. ``gone`` is set once the child is reaped and the journal closed.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio

from acp.errors import AcpError, ChannelClosed, RemoteError, RequestTimeout
from acp.process import ExitInfo
from acp.schema import (
    SessionSetup,
)
from actors import Actor, ActorError, EventKind, Reply, RestartWindow, Supervisor
from serve.events import EventLog, Subscriber
from serve.permissions.mediator import (
    CancelPromptPermissions,
    CancelSessionPermissions,
    PermissionMediator,
)
from serve.permissions.modes import (
    AgentModes,
    UnknownApprovalMode,
    advertised_modes,
    apply_mode,
    resolve_mode,
)
from serve.sessions import config_options, journal_load, turns, views
from serve.sessions.agent_link import AgentLink, AgentSource, JournalLink, SpawnAgentSource
from serve.sessions.agent_side import AgentSide
from serve.sessions.binding import (
    IDLE_EOF_GRACE_S,
    AgentBinding,
    AgentExited,
    BindingConn,
    signal_name,
)
from serve.sessions.budget import BudgetMeter, Limits, Signal
from serve.sessions.clients import ClientTable
from serve.sessions.control import AgentCalls
from serve.sessions.errors import BudgetExhausted
from serve.sessions.messages import (
    APPROVAL_MODES,
    Admission,
    AgentCall,
    AgentUnavailable,
    ApprovalModeRefused,
    Attach,
    Attached,
    CancelTurn,
    CloseSession,
    Describe,
    Detach,
    Detached,
    Heartbeat,
    KnowsClient,
    ListPending,
    MetadataSet,
    ModelSet,
    ModelSwitchFailed,
    ModeSet,
    PublishEvent,
    ReapIfIdle,
    ReleaseAgent,
    RemovePending,
    ReplacePending,
    SessionBusy,
    SessionGone,
    SessionMsg,
    SessionView,
    SetApprovalMode,
    SetBudget,
    SetConfigOption,
    SetModel,
    SteerPrompt,
    StreamEnded,
    SubmitPrompt,
    Subscribe,
    Subscription,
    Summarize,
    UpdateMetadata,
)
from serve.sessions.prompt_queue import (
    Job,
    PromptQueue,
    PromptQueueFull,
    PromptRunning,
    Terminal,
)
from serve.sessions.queue_edits import replace_pending
from serve.sessions.steering import Steering

if TYPE_CHECKING:
    from serve.journal import Journal
    from serve.mcp.pool import McpPool
    from serve.permissions.effects import EffectGate
    from serve.settings import Settings

log = logging.getLogger(__name__)

#: Bound on the answer to the liveness probe of a shared child whose session ignored a
#: cancel (seconds): no answer at all, and the child is unresponsive for every session.
PROBE_TIMEOUT_S = 2.0
#: Bound on the permission mediator's answer (an actor: quick) on cancel and close.
MEDIATOR_TIMEOUT_S = 2.0

__all__ = [  # the session's public surface (messages and errors re-exported)
    "APPROVAL_MODES",
    "AgentExited",
    "Attach",
    "CancelTurn",
    "CloseSession",
    "Heartbeat",
    "ListPending",
    "PromptQueueFull",
    "PromptRunning",
    "PublishEvent",
    "RemovePending",
    "SessionActor",
    "SessionBusy",
    "SessionGone",
    "SetApprovalMode",
    "SetModel",
    "SubmitPrompt",
    "UpdateMetadata",
]


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _now_ms() -> int:
    return int(time.time() * 1000)


#: Messages a closing session still takes (the rest get SessionGone: 404).
_HANDLED_WHILE_CLOSING = (CloseSession, Detach, StreamEnded, PublishEvent, ReapIfIdle)


class SessionActor(Actor[SessionMsg], AgentSide):
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
        source: AgentSource | None = None,
        effects: EffectGate | None = None,
        mcp_pool: McpPool | None = None,
        fork_from: str | None = None,
        additional_directories: tuple[str, ...] = (),
    ) -> None:
        Actor.__init__(self, f"session-{session_id or 'new'}", inbox_size=256)
        self._init_agent_side()
        self.settings = settings
        self.mediator = mediator
        self.workspace = workspace
        self.action = action
        self.session_id: str = session_id or ""
        self.on_gone = on_gone
        self.created_at = iso_now()
        self.created_monotonic = time.monotonic()
        self.last_seen_ms = _now_ms()
        #: When the last prompt ended (--session-prompt-settled-close-grace-ms).
        self.last_settled_ms = 0
        self.display_name: str | None = None
        #: Registered clients, expiring when idle (serve/sessions/clients.py).
        self.clients = ClientTable(settings.client_idle_timeout_ms)
        self.log = EventLog(
            self.session_id,
            ring_size=ring_size or settings.event_ring_size,
            ring_bytes=settings.event_ring_bytes,
        )
        self.prompts = PromptQueue(
            limit=settings.max_pending_prompts_per_session,
            deadline_ms=settings.prompt_deadline_ms,
        )
        self.link = AgentLink(
            source or SpawnAgentSource(settings),
            workspace=workspace,
            handler=self,
            owner=self,
            init_timeout_s=settings.initialize_timeout_ms / 1000,
            restore_timeout_s=settings.session_restore_timeout_ms / 1000,
            restarts=RestartWindow(restart_intensity, restart_period_s),
            restart_backoff_s=restart_backoff_s,
        )
        self.link.fork_from = self.fork_from = fork_from
        self.link.additional_directories = additional_directories
        self.journal_link = JournalLink(journal)
        self.current_model: str | None = None
        self.current_mode: str | None = None
        self.closing = False
        self.ended = trio.Event()
        #: Set once run() is over: the child reaped, the journal closed, the registry told.
        self.gone = trio.Event()
        self._stopping = False
        self._idle_at_close = False
        self._shutdown_close = False
        self._turn_scope: trio.CancelScope | None = None
        self._turn_usage: Any = None  # the running turn's prompt response usage, decoded
        self._nursery: trio.Nursery | None = None
        self._work = trio.Event()  # the worker's wake-up: a job was admitted or released
        self.calls = AgentCalls(session_id=lambda: self.session_id, closing=lambda: self.closing)
        #: Open SSE subscriptions and the registered client each one names (or None).
        self._streams: dict[Subscriber, str | None] = {}
        #: The workspace MCP pool (serve/mcp), or None (unit tests).
        self.mcp_pool = mcp_pool
        self.restored_from_journal = False
        #: The supervisor whose history records this session's agent restarts.
        self.supervisor: Supervisor | None = None
        #: The Host's effect gate (grants, approvals, workspace boundary), or None.
        self.effects = effects
        #: Restart in place, idle release, rebind (serve/sessions/binding.py).
        self.binding = AgentBinding(self, self.link, idle_release_ms=settings.agent_idle_release_ms)
        #: Steers of the running turn and when a steered turn is over (steering.py).
        self.steering = Steering(self, settings.turn_settle_ms)
        #: Token and cost budget (serve/sessions/budget.py), from the daemon-wide defaults.
        self.budget = BudgetMeter(
            Limits(
                max_tokens=settings.session_token_budget or None,
                max_cost=settings.session_cost_budget or None,
                currency=settings.session_budget_currency,
            )
        )

    # ---- read models (sync, for in-process status pages and metrics) -------------------

    @property
    def conn(self) -> Any:
        """The agent connection (``acp.client.AgentConnection``) or None."""
        return self.link.conn

    @property
    def setup(self) -> SessionSetup | None:
        return self.link.setup

    @property
    def restart_count(self) -> int:
        return self.link.restart_count

    @property
    def journal_writer(self) -> Any:
        return self.journal_link.writer

    @property
    def active(self) -> Job | None:
        return self.prompts.running

    @property
    def queue(self) -> tuple[Job, ...]:
        return self.prompts.queued

    @property
    def pending_count(self) -> int:
        return self.prompts.pending_count

    @property
    def has_active_prompt(self) -> bool:
        return self.prompts.running is not None

    @property
    def subscribers(self) -> int:
        """Open SSE streams on this session (ended ones are let go here)."""
        for sub in [s for s in self._streams if s.finished]:
            client_id = self._streams.pop(sub)
            if client_id is not None:  # its client's idle clock starts now
                self.clients.stream_closed(client_id)
        return len(self._streams)

    def state_snapshot(self) -> dict[str, Any]:
        return views.setup_state(self.setup)

    def summary(self) -> dict[str, Any]:
        return views.summary(self)

    def diagnostics(self) -> dict[str, Any]:
        """Operator detail for ``/daemon/status?detail=full`` (no client ids, no secrets)."""
        return views.diagnostics(self)

    def view(self) -> SessionView:
        return SessionView(
            session_id=self.session_id,
            workspace=self.workspace,
            created_at=self.created_at,
            has_active_prompt=self.has_active_prompt,
            state=self.state_snapshot(),
            last_event_id=self.log.last_id,
            epoch=self.log.epoch,
            current_model=self.current_model,
            current_mode=self.current_mode,
            forks=self.link.forks,
        )

    def knows_client(self, client_id: str) -> bool:
        return client_id in self.clients

    # ---- the public surface ------------------------------------------------------------

    async def call(self, msg: SessionMsg, *, timeout_s: float = 30.0) -> Any:
        """``ask``, then await a deferred answer (a :class:`Reply` from an agent task)."""
        answer = await self.ask(msg, timeout_s=timeout_s)
        if isinstance(answer, Reply):
            return await answer.wait()
        return answer

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[SessionMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = self.calls.nursery = self.binding.nursery = nursery
                try:
                    await self._open_agent(nursery)
                except BaseException:
                    await self.journal_link.aclose()
                    raise
                nursery.start_soon(self._prompt_worker)
                nursery.start_soon(self.binding.supervise, nursery)
                if self.settings.agent_idle_release_ms:
                    nursery.start_soon(self.binding.watch_idle)
                await Actor.run(self, task_status=task_status)
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = self.calls.nursery = self.binding.nursery = None
            if not self.ended.is_set():
                with trio.CancelScope(shield=True):
                    await self._abort_everything("channel_closed", died=True)
            if self.on_gone is not None:
                self.on_gone(self)
            self.gone.set()

    async def _open_agent(self, nursery: trio.Nursery) -> None:
        """Open the agent link; a load of a journaled session instead starts released, from
        the journal, and binds an agent on first use (serve/sessions/journal_load.py)."""
        lazy = await journal_load.read(
            self.journal_link,
            nursery,
            self.session_id,
            settings=self.settings,
            action=self.action,
            workspace=self.workspace,
            ring_size=self.log.ring_size,
            ring_bytes=self.log.ring_bytes,
        )
        if lazy is None:
            await self.link.open(nursery, self.action, self.session_id)
            self._adopt_setup(self.link.setup)
            await journal_load.remember(self.journal_link, self.settings, self.link)
            return
        self.log, self.restored_from_journal = lazy.log, True  # (journaled by now)
        self.link.setup = lazy.setup
        self._adopt_setup(lazy.setup)
        self.binding.start_released()

    def _adopt_setup(self, setup: SessionSetup | None) -> None:
        self.binding.used()
        if setup is None:
            return
        if setup.models is not None:
            self.current_model = getattr(setup.models, "current_model_id", None)
        elif (option := setup.model_option()) is not None and isinstance(option.current_value, str):
            self.current_model = option.current_value  # models only as a config option (codex)
        self.current_mode = advertised_modes(setup).current or self.current_mode

    # The link's owner side (agent_link.LinkOwner).

    async def mcp_servers(self, info: Any) -> list[Any]:
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

    async def adopt_session_id(self, session_id: str) -> None:
        self.session_id = session_id
        self.log.session_id = session_id
        self.name = f"session-{session_id}"
        self._journal_pending = True
        self.journal_link.attrs = journal_load.agent_attrs(self.settings, self.link)
        try:
            await self._open_journal(fresh=True)
        finally:
            self._journal_pending = False
        if self.fork_from is not None:  # the fork's stream starts by naming its parent
            self.log.publish(
                "session_forked", {"sessionId": session_id, "parentSessionId": self.fork_from}
            )
        self._flush_early_updates()

    async def restore_history(self) -> bool:
        """After a daemon restart: rebuild the event log from the journal and keep
        journaling; True when the journal held the history."""
        if self.journal_link.journal is None:
            return False
        restored = await self.journal_link.restore(
            self.session_id, self.log.ring_size, self.log.ring_bytes
        )
        if restored is None:
            await self._open_journal(fresh=True)
            return False
        self.log, self.restored_from_journal = restored
        await self._open_journal(fresh=False)
        return self.restored_from_journal

    async def _open_journal(self, *, fresh: bool) -> None:
        assert self._nursery is not None
        origin: Literal["new", "load", "resume"] = (
            "load" if self.action == "load" else "resume" if self.action == "resume" else "new"
        )
        await self.journal_link.open(
            self._nursery, self.log, workspace=self.workspace, origin=origin, fresh=fresh
        )

    # ---- the agent binding (serve/sessions/binding.py): the owner port ----------------

    @property
    def agent_released(self) -> bool:
        return self.binding.released

    @property
    def release_count(self) -> int:
        return self.binding.release_count

    @property
    def exit_info(self) -> ExitInfo | None:
        return self.binding.exit_info

    @property
    def releasable(self) -> bool:
        """Could let its agent go now (read model for the memory budget's LRU choice)."""
        return self.binding.idle_now()

    @property
    def last_agent_use(self) -> float:
        return self.binding.last_use

    @property
    def stopped(self) -> bool:
        return self._stopping or self.ended.is_set()

    @property
    def has_ended(self) -> bool:
        return self.ended.is_set()

    def has_running_prompt(self) -> bool:
        return self.prompts.running is not None

    def has_queued_prompts(self) -> bool:
        return bool(self.prompts.queued)

    def idle(self) -> bool:
        return (
            self.pending_count == 0
            and self.calls.exclusive is None
            and self.mediator.pending_count(self.session_id) == 0
        )

    def publish(self, event_type: str, data: dict[str, Any]) -> None:
        self.log.publish(event_type, data)

    def adopt_setup(self, setup: SessionSetup | None) -> None:
        self._adopt_setup(setup)

    def end_running_turn(self, data: dict[str, Any]) -> None:
        if self.prompts.running is not None:
            self._finish(self.prompts.running, "turn_error", data)

    def fail_waiting(self, data: dict[str, Any]) -> None:
        for terminal in self.prompts.abort_all("turn_error", data):
            self._publish_terminal(terminal)

    def cancel_turn_request(self) -> None:
        if self._turn_scope is not None:
            self._turn_scope.cancel()

    async def cancel_permissions(self) -> None:
        await self._cancel_permissions()

    async def die(self, reason: str, exit_info: ExitInfo | None = None) -> None:
        await self._abort_everything(reason, died=True, exit_info=exit_info)

    def stop(self) -> None:
        self._stopping = True
        self.close()

    async def request_release(self, reason: str) -> None:
        await self.call(ReleaseAgent(reason), timeout_s=30)

    def record_supervision(self, kind: str, reason: str, attempt: int) -> None:
        if self.supervisor is not None:
            self.supervisor.record(self.name, EventKind(kind), reason, attempt)

    async def on_stop(self) -> None:
        self._stopping = True
        with trio.move_on_after(5):
            # An agent closed while idle has nothing to finish: a short wait after stdin
            # EOF, then SIGTERM (an agent that ignores EOF must not hold up a shutdown).
            # At daemon shutdown not even that: EOF and SIGTERM together (the exit must not
            # wait on an agent that ignores EOF, as qwen-code does).
            eof_grace_s = IDLE_EOF_GRACE_S if self._idle_at_close else None
            if self._idle_at_close and self._shutdown_close:
                eof_grace_s = 0.0
            await self.link.aclose(grace_s=1.0, eof_grace_s=eof_grace_s)
        await self.journal_link.aclose()

    # ---- the actor loop ----------------------------------------------------------------

    async def handle(self, msg: SessionMsg) -> Any:
        if self.closing and not isinstance(msg, _HANDLED_WHILE_CLOSING):
            raise SessionGone(self.session_id)
        match msg:
            case SubmitPrompt():
                return self._admit(msg)
            case SteerPrompt():
                return self.steering.submit(msg)
            case ReplacePending():
                return replace_pending(self, msg)
            case SetBudget():
                return self._set_budget(msg)
            case CancelTurn(client_id=cid, prompt_id=pid):
                if pid is not None:
                    return await self._cancel_prompt(pid, cid)
                return await self._cancel_turn(cid)
            case CloseSession():
                return await self._close(msg)
            case SetModel():
                return self.calls.start_switch(
                    "model switch",
                    msg.timeout_s,
                    functools.partial(self.binding.bound_then, "model", self._set_model, msg),
                    connected=lambda: self.link.connected or self.agent_released,
                )
            case SetApprovalMode():
                self._check_approval_mode(msg.mode)
                return self.calls.start_switch(
                    "approval mode change",
                    msg.timeout_s,
                    functools.partial(
                        self.binding.bound_then, "mode", self._set_approval_mode, msg
                    ),
                    connected=lambda: self.link.connected or self.agent_released,
                )
            case SetConfigOption():
                return config_options.start(self, msg)
            case UpdateMetadata(display_name=name, client_id=cid):
                self.display_name = name
                self.log.publish(
                    "session_metadata_updated",
                    {"sessionId": self.session_id, "displayName": name, "titleSource": "manual"},
                    originator=cid,
                )
                return MetadataSet(self.session_id, name)
            case Attach(client_id=cid, peer=peer):
                return Attached(self._register_client(cid, peer), self.view())
            case Detach(client_id=cid):
                return await self._detach(cid)
            case KnowsClient(client_id=cid):
                return cid in self.clients
            case Subscribe():
                return self._subscribe(msg)
            case StreamEnded():
                self.last_seen_ms = _now_ms()
                return self.subscribers  # lets the ended stream go
            case Describe():
                return self.view()
            case Summarize():
                return self.summary()
            case AgentCall():
                if self.agent_released:  # bind an agent first, then call it
                    return self.calls.start_vendor(
                        msg, BindingConn(self.binding), busy=self.pending_count > 0
                    )
                if not self.link.connected:
                    raise AgentUnavailable(self.session_id)
                return self.calls.start_vendor(msg, self.link.conn, busy=self.pending_count > 0)
            case ReapIfIdle():
                return await self._reap_if_idle(msg)
            case ListPending():
                return views.pending_list(self)
            case RemovePending(prompt_id=pid, client_id=cid):
                return self._remove_pending(pid, cid)
            case PublishEvent(event_type=etype, data=data, prompt_id=pid, originator=orig):
                return self.log.publish(etype, data, prompt_id=pid, originator=orig)
            case ReleaseAgent(reason=reason):
                return self.binding.release(reason)
            case Heartbeat(client_id=cid):
                now = _now_ms()
                self.last_seen_ms = now
                if cid is not None:
                    self.clients.touch(cid)
                return now
        raise TypeError(f"unknown session message {type(msg).__name__}")

    # ---- clients and streams -----------------------------------------------------------

    def _register_client(self, requested: str | None, peer: str | None = None) -> str:
        """Reuse ``requested`` if already registered here, else mint a fresh id."""
        client_id = (
            requested
            if requested is not None and requested in self.clients
            else f"client_{uuid.uuid4()}"
        )
        self.clients.register(client_id, peer)
        return client_id

    async def _detach(self, client_id: str | None) -> Detached:
        if self.closing:
            return Detached(closed=False)
        if client_id is not None:
            self.clients.release(client_id)
        if not self.clients and self.subscribers == 0 and self.pending_count == 0:
            await self._close(CloseSession(reason="last_client_detached"))
            return Detached(closed=True)
        return Detached(closed=False)

    def _subscribe(self, msg: Subscribe) -> Subscription:
        snapshot = None
        if msg.snapshot:
            snapshot = {
                "sessionId": self.session_id,
                "currentModelId": self.current_model,
                "currentApprovalMode": self.current_mode,
            }
        sub = self.log.subscribe(
            last_event_id=msg.last_event_id,
            epoch=msg.epoch,
            max_queued=msg.max_queued,
            snapshot=snapshot,
        )
        # a registered client streaming its events stays active (serve/sessions/clients.py)
        named = msg.client_id
        streaming = named is not None and self.clients.stream_opened(named)
        self._streams[sub] = named if streaming else None
        return Subscription(sub, self.log.epoch)

    async def _reap_if_idle(self, msg: ReapIfIdle) -> bool:
        now = _now_ms()
        if (
            not self.closing
            and self.subscribers == 0
            and self.pending_count == 0
            and self.calls.exclusive is None
            and self.mediator.pending_count(self.session_id) == 0
            and now - self.last_seen_ms >= msg.idle_timeout_ms
            and now - self.last_settled_ms >= msg.settled_grace_ms
        ):
            log.info("reaping idle session %s", self.session_id)
            await self._close(CloseSession(reason="idle_timeout"))
            return True
        return False

    # ---- prompts -----------------------------------------------------------------------

    # ---- budget (serve/sessions/budget.py) --------------------------------------------

    def _refuse_if_exhausted(self) -> None:
        dim = self.budget.exhausted
        if dim is not None:
            limits = self.budget.limits
            spent = self.budget.tokens if dim == "tokens" else self.budget.cost or 0.0
            limit = limits.max_tokens if dim == "tokens" else limits.max_cost
            raise BudgetExhausted(self.session_id, dim, spent, float(limit or 0))

    def on_usage(self, update: msgspec.Raw) -> None:
        try:
            decoded = msgspec.json.decode(bytes(update))
        except (msgspec.DecodeError, RecursionError):
            return
        self._budget_signals(self.budget.on_usage_update(decoded))

    def _budget_signals(self, signals: list[Signal]) -> None:
        for signal in signals:
            data: dict[str, Any] = {
                "sessionId": self.session_id,
                "dimension": signal.dimension,
                "spent": signal.spent,
                "limit": signal.limit,
            }
            if signal.kind == "warn":
                data["fraction"] = signal.spent / signal.limit if signal.limit else 1.0
                self.log.publish("budget_warning", data)
                continue
            self.log.publish("budget_exhausted", data)
            job = self.prompts.running
            if job is not None and not job.done:
                self._finish(job, "turn_error", turns.budget_exhausted(self.session_id, data))
                if self._turn_scope is not None:
                    self._turn_scope.cancel()  # the FIFO moves on; the agent is asked to stop
                self._spawn(self._after_deadline)

    def _set_budget(self, msg: SetBudget) -> dict[str, Any]:
        signals = self.budget.set_limits(Limits(msg.max_tokens, msg.max_cost, msg.currency))
        snapshot = {"sessionId": self.session_id, **self.budget.snapshot()}
        self.log.publish("budget_updated", snapshot, originator=msg.client_id)
        self._budget_signals(signals)
        return snapshot

    def _admit(self, msg: SubmitPrompt, *, front: bool = False) -> Admission:
        self._refuse_if_exhausted()
        if self.agent_released and not self.binding.rebinding:
            refusal = self.link.refusal()  # e.g. 503 memory_budget_exceeded
            if refusal is not None:
                raise refusal
        admitted = self.prompts.admit(
            msg, now=trio.current_time(), queued_at=iso_now(), front=front
        )
        job: Job = admitted.job
        if not admitted.fresh:
            return job.token  # type: ignore[no-any-return]  # the same turn, not a second one
        done = trio.Event()
        job.notify = done.set
        watermark = self.log.last_id
        if job.queued:
            self.log.publish(
                "pending_prompt_added",
                {
                    "sessionId": self.session_id,
                    "promptId": job.prompt_id,
                    "text": job.text,
                    "queuedAt": iso_now(),
                },
                prompt_id=job.prompt_id,
                originator=job.client_id,
            )
        job.token = Admission(job.prompt_id, watermark, self.log.epoch, job, done)
        self._work.set()  # wake the worker
        self.binding.ensure_bound("prompt")
        return job.token  # type: ignore[no-any-return]

    def _remove_pending(self, prompt_id: str, client_id: str | None) -> bool:
        """Remove a queued prompt (True), False when unknown; running ones are refused."""
        running = self.prompts.running
        if running is not None and running.prompt_id == prompt_id:
            raise PromptRunning(prompt_id)
        if not any(j.prompt_id == prompt_id for j in self.prompts.queued):
            return False
        self.log.publish(
            "prompt_cancelled",
            {"sessionId": self.session_id, "reason": "removed_from_queue"},
            prompt_id=prompt_id,
            originator=client_id,
        )
        terminal = self.prompts.remove(
            prompt_id, {"sessionId": self.session_id, "stopReason": "cancelled"}
        )
        self._publish_terminal(terminal)
        return True

    async def _cancel_turn(self, client_id: str | None) -> None:
        active = self.prompts.running
        self.log.publish(
            "prompt_cancelled",
            {"sessionId": self.session_id, "reason": "client_cancel"},
            prompt_id=active.prompt_id if active else None,
            originator=client_id,
        )
        await self._cancel_permissions()
        self._spawn(self._send_cancel)
        if active is not None and not active.done:
            self._spawn(self._escalate_cancel, active)

    async def _cancel_prompt(self, prompt_id: str, client_id: str | None) -> None:
        """Cancel one prompt: the running one through the agent, a queued one at once."""
        running = self.prompts.running
        if running is not None and running.prompt_id == prompt_id:
            await self._cancel_turn(client_id)
            return
        if any(j.prompt_id == prompt_id for j in self.prompts.queued):
            self.log.publish(
                "prompt_cancelled",
                {"sessionId": self.session_id, "reason": "client_disconnected"},
                prompt_id=prompt_id,
                originator=client_id,
            )
            terminal = self.prompts.cancel_queued(
                prompt_id, {"sessionId": self.session_id, "stopReason": "cancelled"}
            )
            self._publish_terminal(terminal)

    async def _send_cancel(self) -> None:
        """``session/cancel`` to the agent (a notification; bounded by the link)."""
        conn = self.link.conn
        if conn is not None and not conn.closed:
            try:
                with trio.move_on_after(self.settings.initialize_timeout_ms / 1000):
                    await conn.cancel(self.session_id)
            except AcpError:
                pass

    async def _escalate_cancel(self, job: Job) -> None:
        """A cancel the agent ignores: after the grace the turn ends with ``turn_error
        {code:"cancel_timeout"}`` and the agent is restarted in place."""
        grace_ms = self.settings.cancel_grace_ms
        if not grace_ms:
            return
        await trio.sleep(grace_ms / 1000)
        if job.done or self.prompts.running is not job or self.closing:
            return
        self._finish(job, "turn_error", turns.cancel_timeout(self.session_id, grace_ms))
        if self.link.shared and await self.link.responsive(PROBE_TIMEOUT_S):
            if not self.closing and self.prompts.running is job:
                await self._leave_shared_child(grace_ms)
            return
        log.warning(
            "agent of session %s ignored session/cancel for %d ms: restarting it",
            self.session_id,
            grace_ms,
        )
        self.binding.killed_agent = True
        await self.link.kill()  # the child watcher restarts it in place

    async def _leave_shared_child(self, grace_ms: int) -> None:
        log.warning(
            "agent of session %s ignored session/cancel for %d ms: the session leaves its "
            "shared child (pid %s)",
            self.session_id,
            grace_ms,
            self.link.pid,
        )
        await self.binding.leave_shared_child()

    async def _cancel_permissions(self, *, forget: bool = False) -> None:
        try:
            with trio.move_on_after(MEDIATOR_TIMEOUT_S):
                await self.mediator.ask(
                    CancelSessionPermissions(self.session_id, "session_closed", forget=forget),
                    timeout_s=MEDIATOR_TIMEOUT_S,
                )
        except ActorError:
            pass

    # ---- agent calls off the inbox (serve/sessions/control.py) ------------------------

    def _spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.calls.spawn(fn, *args)

    async def _set_model(self, msg: SetModel, timeout_s: float) -> ModelSet:
        conn = self.link.conn
        assert conn is not None
        try:
            await conn.set_model(
                self.session_id,
                msg.model_id,
                timeout_s=min(timeout_s, self.settings.initialize_timeout_ms / 1000),
            )
        except (RemoteError, RequestTimeout) as exc:
            error = exc.message if isinstance(exc, RemoteError) else str(exc)
            self.log.publish(
                "model_switch_failed",
                {"sessionId": self.session_id, "requestedModelId": msg.model_id, "error": error},
                originator=msg.client_id,
            )
            raise ModelSwitchFailed(msg.model_id, error) from None
        self.current_model = msg.model_id
        self.log.publish(
            "model_switched",
            {"sessionId": self.session_id, "modelId": msg.model_id},
            originator=msg.client_id,
        )
        return ModelSet(msg.model_id)

    def _check_approval_mode(self, mode: str) -> str:
        """The agent's mode id for ``mode`` (its own id, or a qwen name mapped onto it)."""
        try:
            return resolve_mode(mode, self._agent_modes())
        except UnknownApprovalMode as exc:
            raise ApprovalModeRefused(str(exc), allowed=exc.allowed) from None

    async def _set_approval_mode(self, msg: SetApprovalMode, timeout_s: float) -> ModeSet:
        """Agent ids as is, qwen names mapped onto them (serve/permissions/modes.py)."""
        conn = self.link.conn
        assert conn is not None
        modes = self._agent_modes()
        mode_id = self._check_approval_mode(msg.mode)
        previous = self.current_mode
        try:
            reported = await apply_mode(
                conn,
                self.session_id,
                modes,
                mode_id,
                timeout_s=min(timeout_s, self.settings.initialize_timeout_ms / 1000),
            )
        except (RemoteError, RequestTimeout) as exc:
            error = exc.message if isinstance(exc, RemoteError) else str(exc)
            raise ApprovalModeRefused(f"Approval mode change failed: {error}") from None
        if reported is None:  # set_mode answers {}: a current_mode_update may have come
            seen = self.current_mode
            reported = seen if seen is not None and seen != previous else mode_id
        self.current_mode = reported
        event: dict[str, Any] = {"sessionId": self.session_id, "previous": previous}
        event.update(next=reported, persisted=False)
        requested = msg.mode if reported != msg.mode else None
        if requested is not None:
            event["requested"] = requested
        self.log.publish("approval_mode_changed", event, originator=msg.client_id)
        return ModeSet(self.session_id, reported, previous, False, requested)

    def _agent_modes(self) -> AgentModes:
        conn = self.link.conn
        live = conn.config_options(self.session_id) if conn is not None else None
        return advertised_modes(self.setup, live)

    # ---- turns -------------------------------------------------------------------------

    async def _prompt_worker(self) -> None:
        while True:
            await self.link.ready.wait()  # an agent restart in progress
            await self.calls.wait_not_exclusive()  # a rewind/branch runs: no turn now
            job, expired = self.prompts.take(trio.current_time())
            for terminal in expired:
                self._publish_terminal(terminal)
                await self._after_deadline()
            if job is None:
                if not expired:
                    self._work = trio.Event()
                    await self._work.wait()
                continue
            try:
                await self._run_turn(job)
            finally:
                self._publish_terminal(self.prompts.release(job))

    async def _run_turn(self, job: Job) -> None:
        conn = self.link.conn
        assert conn is not None
        sid = self.session_id
        if job.queued:
            self.log.publish(
                "pending_prompt_started",
                {"sessionId": sid, "promptId": job.prompt_id, "text": job.text},
                prompt_id=job.prompt_id,
                originator=job.client_id,
            )
        if (dim := self.budget.exhausted) is not None:  # spent while this prompt waited
            data = {"sessionId": sid, "dimension": dim}
            self._finish(job, "turn_error", turns.budget_exhausted(sid, data))
            return
        for block in turns.text_blocks(job.prompt):  # echo the prompt, as the reference does
            self._relay("user_message_chunk", turns.user_chunk(block))
        self.budget.turn_started()
        usage: Any = None
        try:
            await self._run_prompt(job, conn, sid)
        finally:
            usage = self._turn_usage
            self._turn_usage = None
            self._budget_signals(self.budget.turn_ended(usage))

    async def _run_prompt(self, job: Job, conn: Any, sid: str) -> None:
        try:
            with trio.CancelScope() as scope:
                self._turn_scope = scope
                if job.deadline is not None:
                    scope.deadline = job.deadline
                result = await conn.prompt(sid, job.prompt, extra=turns.prompt_extra(job, sid))
                await self.steering.settle(job)  # a steered turn: until the agent is quiet
            self._turn_scope = None
        except RemoteError as exc:
            self._finish(job, "turn_error", turns.remote_error(sid, exc))
        except ChannelClosed:
            # The child died: the supervising task ends this prompt (agent_restarted or,
            # when the session dies, channel_closed); wait for its decision.
            with trio.move_on_after(30):
                await job.token.done.wait()
            self._finish(job, "turn_error", turns.channel_closed(sid))
        except AcpError as exc:
            self._finish(job, "turn_error", turns.protocol_error(sid, exc))
        else:
            if not scope.cancelled_caught:
                self._turn_usage = _decoded_usage(result.usage)
                self._finish(
                    job, "turn_complete", turns.completed(sid, result.stop_reason, result.meta)
                )
            elif job.deadline is not None and trio.current_time() >= job.deadline:
                # The FIFO moves on even if the agent is wedged; ask the agent to stop.
                self._finish(job, "turn_error", turns.deadline_exceeded(sid))
                await self._after_deadline()

    async def _after_deadline(self) -> None:
        await self._cancel_permissions()
        conn = self.link.conn
        if conn is not None and not conn.closed:
            try:
                with trio.move_on_after(1):
                    await conn.cancel(self.session_id)
            except AcpError:
                pass

    def _finish(self, job: Job, event_type: str, data: dict[str, Any]) -> None:
        """End ``job`` with its one terminal event (idempotent)."""
        self._publish_terminal(self.prompts.finish(job, event_type, data))

    def _publish_terminal(self, terminal: Terminal | None) -> None:
        if terminal is None:
            return
        job: Job = terminal.job
        data = {"sessionId": self.session_id, **terminal.data}
        self.log.publish(terminal.kind, data, prompt_id=job.prompt_id, originator=job.client_id)
        self.binding.used()
        if job.queued:
            state = "completed" if terminal.started else "removed"
            self.log.publish(
                "pending_prompt_completed",
                {"sessionId": self.session_id, "promptId": job.prompt_id, "state": state},
                prompt_id=job.prompt_id,
            )
        self.last_settled_ms = _now_ms()
        if terminal.started:
            self._turn_ended(job)

    def _turn_ended(self, job: Job) -> None:
        """Withdraw the permission requests the finished turn left open (issue 16.2)."""
        try:
            self.mediator.tell_nowait(CancelPromptPermissions(self.session_id, job.prompt_id))
        except ActorError:  # full or stopped: the response timeout still applies
            log.warning("session %s: could not withdraw permissions of its turn", self.session_id)

    # ---- endings -----------------------------------------------------------------------

    async def _close(self, msg: CloseSession) -> None:
        if self.closing:
            return
        self._idle_at_close = self.prompts.pending_count == 0
        self._shutdown_close = msg.reason == "daemon_shutdown"
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
        kind, data = turns.aborted(self.session_id, reason, died=died)
        for terminal in self.prompts.abort_all(kind, data):
            self._publish_terminal(terminal)
        await self._cancel_permissions(forget=True)
        if not died and self._nursery is not None:
            self._nursery.start_soon(self._send_cancel)  # best effort; the child is stopped next
        await self._publish_queued()
        if died:
            final: dict[str, Any] = {"sessionId": self.session_id, "reason": reason}
            if exit_info is not None:
                final["exitCode"] = exit_info.exit_code
                final["signalCode"] = signal_name(exit_info.signal)
            self.log.publish("session_died", final)
        else:
            final = {"sessionId": self.session_id, "reason": reason}
            if closed_by is not None:
                final["closedBy"] = closed_by
            self.log.publish("session_closed", final, originator=closed_by)
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


def _decoded_usage(raw: Any) -> Any:
    """The prompt response's ``usage`` (ACP ``Usage``), decoded, or None."""
    data = bytes(raw) if raw else b""
    try:
        return msgspec.json.decode(data) if data else None
    except (msgspec.DecodeError, RecursionError):
        return None
