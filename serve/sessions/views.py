"""Read models of a session: snapshots of its state as the routes and status pages show them.

Pure functions of the session actor's state, called by the actor (answers to ``Describe``,
``Summarize``, ``ListPending``) and by in-process status pages.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from acp.schema import SessionSetup
from serve.events import EventLog
from serve.permissions.mediator import PermissionMediator
from serve.sessions.agent_link import AgentLink
from serve.sessions.budget import BudgetMeter
from serve.sessions.clients import ClientTable
from serve.sessions.journal_link import JournalLink
from serve.sessions.messages import SessionView
from serve.sessions.prompt_queue import PromptQueue


class SessionState(Protocol):
    """What the read models read of a session (the actor itself, inside its own handlers;
    a Protocol so this module does not import the actor that imports it)."""

    session_id: str
    workspace: str
    created_at: str
    display_name: str | None
    mediator: PermissionMediator
    clients: ClientTable
    link: AgentLink
    prompts: PromptQueue
    journal_link: JournalLink
    budget: BudgetMeter

    @property
    def agent_released(self) -> bool: ...

    @property
    def release_count(self) -> int: ...

    @property
    def has_active_prompt(self) -> bool: ...

    @property
    def pending_count(self) -> int: ...

    @property
    def restart_count(self) -> int: ...

    @property
    def subscribers(self) -> int: ...

    @property
    def current_model(self) -> str | None: ...

    @property
    def current_mode(self) -> str | None: ...

    @property
    def log(self) -> EventLog: ...

    @property
    def setup(self) -> SessionSetup | None: ...


def session_view(session: SessionState) -> SessionView:
    """What ``Describe`` answers: a snapshot, never live state."""
    return SessionView(
        session_id=session.session_id,
        workspace=session.workspace,
        created_at=session.created_at,
        has_active_prompt=session.has_active_prompt,
        state=setup_state(session.setup),
        last_event_id=session.log.last_id,
        epoch=session.log.epoch,
        current_model=session.current_model,
        current_mode=session.current_mode,
        forks=session.link.forks,
    )


def setup_state(setup: SessionSetup | None) -> dict[str, Any]:
    """``models``, ``modes``, ``configOptions`` and ``_meta`` of the agent's session setup."""
    state: dict[str, Any] = {}
    if setup is not None:
        raw = msgspec.json.decode(bytes(setup.raw)) if setup.raw else {}
        if isinstance(raw, dict):
            for key in ("models", "modes", "configOptions", "_meta"):
                if raw.get(key) is not None:
                    state[key] = raw[key]
    return state


def summary(session: SessionState) -> dict[str, Any]:
    pending = session.mediator.pending_count(session.session_id)
    return {
        "sessionId": session.session_id,
        "workspaceCwd": session.workspace,
        "createdAt": session.created_at,
        "displayName": session.display_name or session.session_id,
        "clientCount": len(session.clients),
        "hasActivePrompt": session.has_active_prompt,
        "activeWorkState": "prompt" if session.has_active_prompt else "idle",
        "hasRunningBackgroundTasks": False,
        "isWaitingForPermission": pending > 0,
        "isWaitingForUserQuestion": False,
        "pendingInteractionCount": pending,
        "pendingPromptCount": session.pending_count,
        "hasTurnError": False,
        "pendingInteractions": [],
    }


def diagnostics(session: SessionState) -> dict[str, Any]:
    """Operator detail for ``/daemon/status?detail=full`` (no client ids, no secrets)."""
    out: dict[str, Any] = {
        "agentPid": session.link.pid,
        "agentRestarts": session.restart_count,
        "agentReleased": session.agent_released,
        "agentReleases": session.release_count,
        "agentChild": session.link.child_id,
        "subscribers": session.subscribers,
        "queuedPrompts": len(session.prompts.queued),
        "budget": session.budget.snapshot(),
    }
    stats = session.journal_link.statistics()
    if stats is not None:
        out["journal"] = stats
    return out


def pending_list(session: SessionState) -> dict[str, Any]:
    """``GET /session/:id/pending-prompts``: the running prompt, then the queue."""
    running = session.prompts.running
    return {
        "sessionId": session.session_id,
        "pending": [
            {
                "promptId": job.prompt_id,
                "text": job.text,
                "queuedAt": job.queued_at,
                "state": "running" if job is running else "queued",
                **({"originatorClientId": job.client_id} if job.client_id else {}),
            }
            for job in session.prompts.jobs()
        ],
    }
