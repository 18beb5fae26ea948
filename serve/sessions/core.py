"""What the session actor's helper modules share of it: the :class:`SessionCore` port.

The actor (:mod:`serve.sessions.actor`) composes its parts and runs its inbox; the work
itself lives in modules that take the session through this Protocol instead of importing
the actor (which imports them): :mod:`.prompt_events` (admission, removal, terminals),
:mod:`.turn_worker` (one admitted prompt to its terminal, and the budget it spends),
:mod:`.cancelling` (cancel and its escalation), :mod:`.switches` (model and approval-mode
changes), :mod:`.attachments` (clients and streams), :mod:`.link_port` (the session's side
of its agent link), :mod:`.binding_port` (what the agent binding asks of it) and
:mod:`.endings` (the final event). Every member is the actor's own state, read and written
from its inbox or its nursery's tasks (one trio thread).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import trio

    from acp.schema import SessionSetup
    from actors import Supervisor
    from serve.events import EventLog, Subscriber
    from serve.events.log import Tap
    from serve.permissions.mediator import PermissionMediator
    from serve.permissions.modes import AgentModes
    from serve.sessions.agent_link import AgentLink
    from serve.sessions.agent_side import AgentSide
    from serve.sessions.binding import AgentBinding
    from serve.sessions.budget import BudgetMeter
    from serve.sessions.clients import ClientTable
    from serve.sessions.control import AgentCalls
    from serve.sessions.journal_link import JournalLink
    from serve.sessions.messages import CloseSession, SessionMsg
    from serve.sessions.prompt_queue import PromptQueue
    from serve.sessions.steering import Steering
    from serve.settings import Settings


class SessionCore(Protocol):
    """The session actor, as its helper modules see it."""

    session_id: str
    settings: Settings
    mediator: PermissionMediator
    link: AgentLink
    binding: AgentBinding
    #: The connection's ClientHandler (its relay writes agent updates into the log).
    side: AgentSide
    prompts: PromptQueue
    budget: BudgetMeter
    steering: Steering
    calls: AgentCalls
    log: EventLog
    event_tap: Tap | None
    #: The session's journal (its meta keeps what a restore needs, e.g. the budget).
    journal_link: JournalLink
    clients: ClientTable
    #: Open SSE subscriptions and the registered client each one names (or None).
    streams: dict[Subscriber, str | None]
    last_seen_ms: int
    last_settled_ms: int
    closing: bool
    #: Stopping on purpose: an agent exit is no crash now.
    stopping: bool
    name: str
    supervisor: Supervisor | None
    #: Set once the session's final event is out.
    ended: trio.Event
    current_model: str | None
    current_mode: str | None
    #: The running turn's cancel scope (a cancel, the budget or the deadline end it).
    turn_scope: trio.CancelScope | None
    #: The running turn's prompt response ``usage``, decoded (for the budget).
    turn_usage: object
    #: The prompt worker's wake-up: a job was admitted or released.
    work: trio.Event

    @property
    def setup(self) -> SessionSetup | None: ...

    @property
    def subscribers(self) -> int: ...

    @property
    def pending_count(self) -> int: ...

    async def close_session(self, msg: CloseSession) -> None: ...

    def close(self) -> None: ...

    async def call(self, msg: SessionMsg, *, timeout_s: float = 30.0) -> Any: ...

    async def drain_inbox(self) -> None: ...

    def spawn[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None: ...

    def agent_modes(self) -> AgentModes: ...
