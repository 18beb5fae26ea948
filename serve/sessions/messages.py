"""What a session actor is sent and what it answers (typed), and the errors it raises.

Every party outside the session (routes, the registry, the mediator, the MCP pool, ...)
reaches it with these messages only; answers are snapshots (frozen structs), never live
state. Agent calls never run in the actor's inbox: a message that needs the agent (a model
or mode switch, an extension call) is answered with a :class:`~actors.Reply` the caller
awaits (:func:`serve.sessions.actor.SessionActor.call` does both steps).
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from actors.actor import Request
from serve.access.roles import SessionAccess
from serve.events import Subscriber
from serve.events.messages import PublishEvent
from serve.permissions.modes import APPROVAL_MODES  # qwen serve's five names
from serve.sessions.clients import OPERATOR_ID
from serve.sessions.errors import (  # re-exported: the errors a session call raises
    AgentUnavailable,
    ApprovalModeRefused,
    ControlTimeout,
    ModelSwitchFailed,
    SessionBusy,
)
from serve.sessions.prompt_queue import Job, PromptQueueFull, PromptRequest, PromptRunning

# ---- errors -------------------------------------------------------------------------------


class SessionGone(Exception):
    """The session is closing or closed; maps to 404."""


# ---- messages -----------------------------------------------------------------------------

#: A prompt as submitted (the queue's request type).
SubmitPrompt = PromptRequest


class ListPending(msgspec.Struct, frozen=True):
    pass


class RemovePending(msgspec.Struct, Request[bool], frozen=True):
    prompt_id: str
    client_id: str | None


class ReplacePending(msgspec.Struct, frozen=True):
    """Give a queued prompt new content before it starts (the editable queue)."""

    prompt_id: str
    request: PromptRequest


class SteerPrompt(msgspec.Struct, frozen=True):
    """Steer the running turn with ``request`` (serve/sessions/steering.py); answered with a
    :class:`Steered`, maybe deferred (a Reply) while the agent is asked."""

    request: PromptRequest
    #: With no running turn: ``prompt`` (run it as the next prompt) or ``refuse``
    #: (``steering.NoRunningTurn``: the caller keeps it, ACP's ``idleBehavior:
    #: "promptRequired"``).
    when_idle: str = "prompt"


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
    timeout_s: float = 60.0  # the whole exchange, waiting behind earlier switches included


class SetApprovalMode(msgspec.Struct, frozen=True):
    mode: str
    persist: bool
    client_id: str | None
    timeout_s: float = 30.0


class SetConfigOption(msgspec.Struct, frozen=True):
    """Any of the agent's config options (serve/sessions/config_options.py)."""

    config_id: str
    value: str | bool
    client_id: str | None
    timeout_s: float = 30.0


class UpdateMetadata(msgspec.Struct, Request["MetadataSet"], frozen=True):
    display_name: str
    client_id: str | None


class SetBudget(msgspec.Struct, frozen=True):
    """``PATCH /session/:id/budget``: the new limits (``None``: no limit); answers the
    budget snapshot (serve/sessions/budget.py)."""

    max_tokens: int | None
    max_cost: float | None
    currency: str
    client_id: str | None


class SetAccess(msgspec.Struct, frozen=True):
    """Replace the session's access record (``PUT /session/:id/members``, the owner's
    edit); answers the record (serve/sessions/ownership.py)."""

    access: SessionAccess


class Attach(msgspec.Struct, Request["Attached"], frozen=True):
    client_id: str | None
    #: The attaching peer's address (bounds the clients one peer holds), None if unknown.
    peer: str | None = None
    #: Whether its votes count (multi-user: a principal with at least collaborator; an
    #: observer's client is no part of a consensus electorate).
    voter: bool = True
    #: Who attaches: a known ``client_id`` is reused only for the principal that
    #: registered it (serve/sessions/clients.py).
    principal: str = OPERATOR_ID


class Detach(msgspec.Struct, Request["Detached"], frozen=True):
    """A client leaves; the last one to leave an idle session closes it."""

    client_id: str | None


class KnowsClient(msgspec.Struct, Request[bool], frozen=True):
    """Whether ``client_id`` is registered on the session by ``principal``."""

    client_id: str
    principal: str = OPERATOR_ID


class Heartbeat(msgspec.Struct, Request[int], frozen=True):
    client_id: str | None


class Subscribe(msgspec.Struct, Request["Subscription"], frozen=True):
    """Open an SSE subscription on the session's log (``snapshot``: lead with the state)."""

    last_event_id: int | None
    epoch: str | None
    max_queued: int
    snapshot: bool = False
    client_id: str | None = None  # a registered client streaming stays active
    principal: str = OPERATOR_ID  # (only when it registered that client)


class StreamEnded(msgspec.Struct, frozen=True):
    """An SSE stream of this session ended (counts as the session being seen)."""


class Describe(msgspec.Struct, Request["SessionView"], frozen=True):
    """The session's :class:`SessionView`."""


class Summarize(msgspec.Struct, Request["dict[str, Any]"], frozen=True):
    """The session's list entry (``GET /workspace/:ws/sessions``)."""


class AgentCall(msgspec.Struct, frozen=True):
    """Call a vendor method of the agent (``params`` get the session id).

    ``exclusive`` (e.g. ``"rewind"``): refused with :class:`SessionBusy` while a prompt
    runs or waits, and no prompt starts until the call returns."""

    method: str
    params: dict[str, Any]
    timeout_s: float
    exclusive: str | None = None


class ReapIfIdle(msgspec.Struct, Request[bool], frozen=True):
    """From the registry's reaper: close with ``idle_timeout`` if idle that long."""

    idle_timeout_ms: int
    settled_grace_ms: int


class ReleaseAgent(msgspec.Struct, frozen=True):
    """Let the agent go while the session is idle (``--agent-idle-release-ms``, the agent
    pool's memory budget). Answered False when busy, already released, or when its agent
    cannot load or resume; else a Reply that resolves to True once the agent is given back
    (``SessionActor.call`` awaits it; the inbox is not held while the agent stops). The next
    prompt, model or mode change (or extension call) binds an agent again."""

    reason: str = "idle"


class HandOver(msgspec.Struct, Request[bool], frozen=True):
    """Leave this daemon for another one (a cluster's drain, serve/sessions/endings.py):
    no final event; the journal is closed cleanly once the actor is gone, which releases
    its lease. Answered False (nothing done) while a prompt runs or waits."""


SessionMsg = (
    PromptRequest
    | CancelTurn
    | CloseSession
    | SetModel
    | SetApprovalMode
    | UpdateMetadata
    | Attach
    | Detach
    | KnowsClient
    | Heartbeat
    | Subscribe
    | StreamEnded
    | Describe
    | Summarize
    | AgentCall
    | ReapIfIdle
    | ListPending
    | RemovePending
    | ReplacePending
    | SteerPrompt
    | PublishEvent
    | ReleaseAgent
    | SetBudget
    | SetConfigOption
    | SetAccess
    | HandOver
)

# ---- typed replies ------------------------------------------------------------------------


class Admission(msgspec.Struct, frozen=True):
    prompt_id: str
    last_event_id: int
    epoch: str
    job: Job
    done: trio.Event  # set once the job's terminal is published


class Steered(msgspec.Struct, frozen=True):
    """Where a steer went. ``via``: ``native`` (the agent's ``_session/steering`` took it
    into the running turn: ``admission`` is that turn's), ``cancel`` (the running turn was
    cancelled and the steer is the next prompt) or ``prompt`` (no turn took it: it is the
    next prompt, ``reason`` says why); ``admission`` is then its own."""

    via: str
    admission: Admission
    outcome: str | None = None  # the agent's answer to _session/steering
    reason: str | None = None
    cancelled_prompt_id: str | None = None


class PendingReplaced(msgspec.Struct, frozen=True):
    prompt_id: str
    text: str
    queued_at: str


class SessionView(msgspec.Struct, frozen=True):
    """A snapshot of what the session routes answer about a session."""

    session_id: str
    workspace: str
    created_at: str
    has_active_prompt: bool
    state: dict[str, Any]
    last_event_id: int
    epoch: str
    current_model: str | None = None
    current_mode: str | None = None
    #: Whether the bound agent advertises ``sessionCapabilities.fork`` (None: none bound).
    forks: bool | None = None


class Attached(msgspec.Struct, frozen=True):
    client_id: str
    view: SessionView


class Detached(msgspec.Struct, frozen=True):
    closed: bool


class Subscription(msgspec.Struct, frozen=True):
    subscriber: Subscriber
    epoch: str


class ModelSet(msgspec.Struct, frozen=True):
    model_id: str


class ModeSet(msgspec.Struct, frozen=True):
    session_id: str
    mode: str  # what the agent reports now
    previous: str | None
    persisted: bool
    requested: str | None = None  # set when the agent's mode differs from the request


class MetadataSet(msgspec.Struct, frozen=True):
    session_id: str
    display_name: str


__all__ = [
    "APPROVAL_MODES",
    "AgentUnavailable",
    "ApprovalModeRefused",
    "ControlTimeout",
    "ModelSwitchFailed",
    "PromptQueueFull",
    "PromptRunning",
    "PublishEvent",
    "SessionBusy",
]
