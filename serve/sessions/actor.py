"""The SessionActor: joins one prompt queue, one agent binding and one EventLog.

Theory of operation
-------------------
A session is an actor under the SessionSupervisor. It composes its parts and runs its
inbox; the work lives in one module per concept, which takes the session through a port
(:class:`~serve.sessions.core.SessionCore`, :class:`~serve.sessions.binding.BindingOwner`)
and never imports this one:

* :mod:`.prompt_queue` (sans-IO): admission, idempotent ``promptId``, deadlines, removal,
  exactly one terminal per admitted prompt; :mod:`.prompt_events` publishes those
  decisions (admitted, removed, ended); :mod:`.turn_worker` runs each turn and keeps the
  budget; :mod:`.cancelling` cancels and escalates an ignored cancel;
* :mod:`.agent_link`: the agent (acquired from an ``AgentSource``), the handshake,
  load/resume; :mod:`.link_port`: the session's side of it (opening from the agent or the
  journal, the setup and session id it adopts); :mod:`.journal_link`: the session's journal;
* :mod:`.binding`: **where restart in place, idle release and rebind happen**
  (:class:`~serve.sessions.binding.AgentBinding`: bound, restarting, released, rebinding,
  failed);
* :mod:`.switches`, :mod:`.config_options`, :mod:`.control`: model/mode/option changes and
  vendor calls, run off the inbox; :mod:`.steering`: steers of the running turn;
* :mod:`.agent_side`: the connection's :class:`acp.handler.ClientHandler` (updates relayed
  into the log, effects through the effect gate, permission requests screened by the
  policy, then to the PermissionMediator);
* :mod:`.messages`: what the actor is sent and answers (typed snapshots).

``run()`` opens a private nursery, opens the agent link (or, for a load served from the
journal, starts released: :func:`~serve.sessions.link_port.open_agent`) and reports
readiness; then the actor loop (inbox), the prompt
worker, the child watcher and, with ``--agent-idle-release-ms``, the idle watch share the
nursery. Every handler is quick and never awaits the agent: agent calls (switches, vendor
calls, ``session/cancel``) run as tasks of the nursery and answer through a
:class:`~actors.Reply` (:meth:`SessionActor.call` awaits both). So cancel, close,
admissions, attach/detach and metadata are never stuck behind the agent. "Busy"
(rewind/branch) and "last client" (detach) are decided here, where the state is. The actor
is its log's only writer; others send :class:`PublishEvent`.

Closing (DELETE, idle reaping, daemon shutdown) publishes terminal events for unfinished
prompts, then ``session_closed`` or ``session_died``, closes the log (SSE streams drain and
end), and stops the child. ``gone`` is set once the child is reaped and the journal closed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from acp.process import ExitInfo
from acp.schema import SessionSetup
from actors import Actor, ActorStopped, InboxFull, Reply, RestartWindow, Supervisor
from serve.access.roles import SessionAccess
from serve.events import EventLog, Subscriber
from serve.events.log import Tap
from serve.permissions.mediator import PermissionMediator
from serve.permissions.modes import (
    AgentModes,
    advertised_modes,
)
from serve.sessions import (
    attachments,
    cancelling,
    config_options,
    endings,
    link_port,
    ownership,
    prompt_events,
    switches,
    turn_worker,
    views,
)
from serve.sessions.agent_link import AgentLink, AgentSource, SpawnAgentSource
from serve.sessions.agent_side import AgentSide
from serve.sessions.attachments import iso_now, now_ms
from serve.sessions.binding import IDLE_EOF_GRACE_S, AgentBinding, AgentExited, BindingConn
from serve.sessions.binding_port import SessionBindingPort
from serve.sessions.budget import BudgetMeter, Limits
from serve.sessions.clients import ClientTable
from serve.sessions.control import AgentCalls
from serve.sessions.journal_link import JournalLink
from serve.sessions.link_port import SessionLinkPort
from serve.sessions.messages import (
    APPROVAL_MODES,
    Admission,
    AgentCall,
    AgentUnavailable,
    Attach,
    Attached,
    CancelTurn,
    CloseSession,
    Describe,
    Detach,
    HandOver,
    Heartbeat,
    KnowsClient,
    ListPending,
    MetadataSet,
    PublishEvent,
    ReapIfIdle,
    ReleaseAgent,
    RemovePending,
    ReplacePending,
    SessionBusy,
    SessionGone,
    SessionMsg,
    SessionView,
    SetAccess,
    SetApprovalMode,
    SetBudget,
    SetConfigOption,
    SetModel,
    SteerPrompt,
    StreamEnded,
    SubmitPrompt,
    Subscribe,
    Summarize,
    UpdateMetadata,
)
from serve.sessions.prompt_queue import Job, PromptQueue, PromptQueueFull, PromptRunning
from serve.sessions.queue_edits import replace_pending
from serve.sessions.steering import Steering

if TYPE_CHECKING:
    from acp.client import AgentConnection
    from serve.journal import JournalBackend
    from serve.mcp.pool import McpPool
    from serve.permissions.effects import EffectGate
    from serve.settings import Settings

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


#: Messages a closing session still takes (the rest get SessionGone: 404).
_HANDLED_WHILE_CLOSING = (CloseSession, Detach, StreamEnded, PublishEvent, ReapIfIdle)


class SessionActor(Actor[SessionMsg]):
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
        journal: JournalBackend | None = None,
        source: AgentSource | None = None,
        effects: EffectGate | None = None,
        mcp_pool: McpPool | None = None,
        fork_from: str | None = None,
        additional_directories: tuple[str, ...] = (),
        access: SessionAccess | None = None,
        event_tap: Tap | None = None,
    ) -> None:
        Actor.__init__(self, f"session-{session_id or 'new'}", inbox_size=256)
        self.access = access or SessionAccess()  # owner and members (ownership.py)
        #: The connection's ClientHandler (serve/sessions/agent_side.py), behind SidePort.
        self.side = AgentSide(self)
        self.settings = settings
        self.mediator = mediator
        self.workspace = workspace
        self.action = action
        self.session_id: str = session_id or ""
        self.on_gone = on_gone
        self.created_at = iso_now()
        self.created_monotonic = time.monotonic()
        self.last_seen_ms = now_ms()
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
        #: The webhooks tap, set on every log this session uses (link_port.py swaps it).
        self.event_tap = event_tap
        self.log.tap = event_tap
        self.prompts = PromptQueue(
            limit=settings.max_pending_prompts_per_session,
            deadline_ms=settings.prompt_deadline_ms,
        )
        self.link = AgentLink(
            source or SpawnAgentSource(settings),
            workspace=workspace,
            handler=self.side,
            owner=SessionLinkPort(self, self),
            init_timeout_s=settings.initialize_timeout_ms / 1000,
            restore_timeout_s=settings.session_restore_timeout_ms / 1000,
            restarts=RestartWindow(restart_intensity, restart_period_s),
            restart_backoff_s=restart_backoff_s,
            tenant=lambda: self.access.owner,  # a child serves its one principal
        )
        self.link.fork_from = self.fork_from = fork_from
        self.link.additional_directories = additional_directories
        self.journal_link = JournalLink(journal)
        self.journal_link.on_lost = self._lease_lost
        self.current_model: str | None = None
        self.current_mode: str | None = None
        self.closing = False
        self.ended = trio.Event()
        #: Set once run() is over: the child reaped, the journal closed, the registry told.
        self.gone = trio.Event()
        self.stopping = False
        self._idle_at_close = False
        self._shutdown_close = False
        self.turn_scope: trio.CancelScope | None = None
        self.turn_usage: object = None  # the running turn's prompt response usage, decoded
        self.work = trio.Event()  # the worker's wake-up: a job was admitted or released
        self.calls = AgentCalls(session_id=lambda: self.session_id, closing=lambda: self.closing)
        #: Open SSE subscriptions and the registered client each one names (or None).
        self.streams: dict[Subscriber, str | None] = {}
        #: The workspace MCP pool (serve/mcp), or None (unit tests).
        self.mcp_pool = mcp_pool
        self.restored_from_journal = False
        #: The supervisor whose history records this session's agent restarts.
        self.supervisor: Supervisor | None = None
        #: The Host's effect gate (grants, approvals, workspace boundary), or None.
        self.effects = effects
        #: Restart in place, idle release, rebind (serve/sessions/binding.py).
        self.binding = AgentBinding(
            SessionBindingPort(self), self.link, idle_release_ms=settings.agent_idle_release_ms
        )
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
    def conn(self) -> AgentConnection | None:
        return self.link.conn

    @property
    def agent_name(self) -> str | None:
        return self.link.agent_name

    @property
    def client_ids(self) -> frozenset[str]:
        return frozenset(self.clients)

    @property
    def active(self) -> Job | None:
        return self.prompts.running

    @property
    def available_commands(self) -> msgspec.Raw | None:
        return self.side.available_commands

    async def publish_event(self, event: PublishEvent, *, timeout_s: float) -> None:
        await self.ask(event, timeout_s=timeout_s)  # the gate's effect_denied, in order

    @property
    def setup(self) -> SessionSetup | None:
        return self.link.setup

    @property
    def restart_count(self) -> int:
        return self.link.restart_count

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
        for sub in [s for s in self.streams if s.finished]:
            client_id = self.streams.pop(sub)
            if client_id is not None:  # its client's idle clock starts now
                self.clients.stream_closed(client_id)
        return len(self.streams)

    def state_snapshot(self) -> dict[str, Any]:
        return views.setup_state(self.setup)

    def summary(self) -> dict[str, Any]:
        return views.summary(self)

    def diagnostics(self) -> dict[str, Any]:
        """Operator detail for ``/daemon/status?detail=full`` (no client ids, no secrets)."""
        return views.diagnostics(self)

    def view(self) -> SessionView:
        return views.session_view(self)

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
                self.calls.nursery = self.binding.nursery = nursery
                try:
                    await link_port.open_agent(self, nursery)
                except BaseException:
                    await self.journal_link.aclose()
                    raise
                nursery.start_soon(turn_worker.prompt_worker, self)
                nursery.start_soon(self.binding.supervise, nursery)
                if self.settings.agent_idle_release_ms:
                    nursery.start_soon(self.binding.watch_idle)
                await Actor.run(self, task_status=task_status)
                nursery.cancel_scope.cancel()
        finally:
            self.calls.nursery = self.binding.nursery = None
            if not self.ended.is_set():
                with trio.CancelScope(shield=True):
                    await endings.abort_everything(self, "channel_closed", died=True)
            if self.on_gone is not None:
                self.on_gone(self)
            self.gone.set()

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

    def on_usage(self, update: msgspec.Raw) -> None:
        turn_worker.on_usage(self, update)

    async def on_stop(self) -> None:
        self.stopping = True
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
                return turn_worker.set_budget(self, msg)
            case SetAccess():
                return await ownership.set_access(self, msg)
            case CancelTurn(client_id=cid, prompt_id=pid):
                if pid is not None:
                    return await cancelling.cancel_prompt(self, pid, cid)
                return await cancelling.cancel_turn(self, cid)
            case CloseSession():
                return await self.close_session(msg)
            case HandOver():
                return await self.hand_over()
            case SetModel():
                return switches.start_model_switch(self, msg)
            case SetApprovalMode():
                return switches.start_mode_change(self, msg)
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
            case Attach(client_id=cid, peer=peer, voter=voter, principal=who):
                client = await attachments.register_client(self, cid, peer, voter, who)
                return Attached(client, self.view())
            case Detach(client_id=cid):
                return await attachments.detach(self, cid)
            case KnowsClient(client_id=cid, principal=who):
                return self.clients.owned_by(cid, who)
            case Subscribe():
                return attachments.subscribe(self, msg)
            case StreamEnded():
                self.last_seen_ms = now_ms()
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
                if not self.link.connected or (conn := self.link.conn) is None:
                    raise AgentUnavailable(self.session_id)
                return self.calls.start_vendor(msg, conn, busy=self.pending_count > 0)
            case ReapIfIdle():
                return await attachments.reap_if_idle(self, msg)
            case ListPending():
                return views.pending_list(self)
            case RemovePending(prompt_id=pid, client_id=cid):
                return prompt_events.remove_pending(self, pid, cid)
            case PublishEvent(event_type=etype, data=data, prompt_id=pid, originator=orig):
                return self.log.publish(etype, data, prompt_id=pid, originator=orig)
            case ReleaseAgent(reason=reason):
                return self.binding.release(reason)
            case Heartbeat(client_id=cid):
                now = now_ms()
                self.last_seen_ms = now
                if cid is not None:
                    self.clients.touch(cid)
                return now
        raise TypeError(f"unknown session message {type(msg).__name__}")

    # ---- steering's port: admission (prompt_events.py) and cancel (cancelling.py) -----

    def _admit(self, msg: SubmitPrompt, *, front: bool = False) -> Admission:
        return prompt_events.admit(self, msg, front=front)

    async def _cancel_permissions(self, *, forget: bool = False) -> None:
        await cancelling.cancel_permissions(self, forget=forget)

    async def _send_cancel(self) -> None:
        await cancelling.send_cancel(self)

    async def _escalate_cancel(self, job: Job) -> None:
        await cancelling.escalate_cancel(self, job)

    # ---- agent calls off the inbox (serve/sessions/control.py) ------------------------

    def spawn[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        self.calls.spawn(fn, *args)

    def agent_modes(self) -> AgentModes:
        conn = self.link.conn
        live = conn.config_options(self.session_id) if conn is not None else None
        return advertised_modes(self.setup, live)

    # ---- endings -----------------------------------------------------------------------

    def _lease_lost(self) -> bool:
        """Another daemon took this session over (a shared journal fenced its writer): it
        ends here as a death nothing journals (``session_died {reason: "lease_lost"}`` to
        the streams open here), so the next request finds the new owner. False: the inbox
        is full (told again at the next renewal)."""
        try:
            self.tell_nowait(CloseSession(reason="lease_lost", died=True))
        except InboxFull:
            return False
        except ActorStopped:
            pass
        return True

    async def close_session(self, msg: CloseSession) -> None:
        if self.closing:
            return
        self._idle_at_close = self.prompts.pending_count == 0
        self._shutdown_close = msg.reason == "daemon_shutdown"
        await endings.abort_everything(
            self, msg.reason, died=msg.died, closed_by=None if msg.died else msg.closed_by
        )
        self.stopping = True
        self.close()  # ends the actor loop; run() then stops the child

    async def hand_over(self) -> bool:
        """Leave this daemon for another (endings.hand_over); False while busy."""
        if not await endings.hand_over(self):
            return False
        self._idle_at_close = True  # the agent gets the short stop of an idle close
        self.stopping = True
        self.close()  # ends the actor loop; run() stops the agent and closes the journal
        return True

    async def drain_inbox(self) -> None:
        """Before the final event: handle what is already in the inbox (the mediator's
        ``permission_resolved`` events for our cancel), so those events are not lost."""
        while True:
            try:
                envelope = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            await self._dispatch(envelope)
