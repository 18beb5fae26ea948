"""serve/api/sessions.py without a transport: the SessionService over a fake Host.

The refusals that used to be written in both fronts, checked once here: the draining
check, a gone session, the registry stopped, "agent failed to start" (and that a failure
the error table knows keeps its form), the restore the agent does not know (404), a full
prompt queue, the settings asked at creation, a vote the mediator cannot take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from acp.errors import INTERNAL_ERROR, RESOURCE_NOT_FOUND, RemoteError, RequestTimeout
from actors import ActorStopped
from serve.api import SessionService, parse_prompt
from serve.permissions.voting import NotPending
from serve.sessions.errors import (
    AgentStartFailed,
    ModelSwitchFailed,
    PromptQueueRefused,
    SessionNotFound,
    SessionsUnavailable,
    UnknownClient,
)
from serve.sessions.messages import (
    Attach,
    KnowsClient,
    PromptQueueFull,
    SessionGone,
    SetApprovalMode,
    SetModel,
    SubmitPrompt,
    Summarize,
)
from serve.sessions.registry import Pending, Ticket


class FakeSession:
    def __init__(self, session_id: str, answers: dict[type, object]) -> None:
        self.session_id = session_id
        self.answers = answers
        self.asked: list[object] = []

    async def call(self, msg: object, *, timeout_s: float = 30.0) -> object:
        self.asked.append(msg)
        answer = self.answers.get(type(msg))
        if isinstance(answer, BaseException):
            raise answer
        return answer


@dataclass
class FakeRegistry:
    sessions: dict[str, FakeSession] = field(default_factory=dict)
    outcome: object = None
    runtimes: dict[str, object] = field(default_factory=dict)

    def get(self, session_id: str) -> FakeSession | None:
        return self.sessions.get(session_id)

    def live(self, workspace: str | None = None) -> list[FakeSession]:
        return list(self.sessions.values())

    async def ask(self, msg: object, *, timeout_s: float = 30.0) -> Ticket:
        if isinstance(self.outcome, ActorStopped):
            raise self.outcome
        pending = Pending("k", "new")
        if isinstance(self.outcome, BaseException):
            pending.resolve(None, self.outcome)
        else:
            pending.resolve(self.outcome, None)
        return Ticket(pending, False)


@dataclass
class FakeMediator:
    outcome: object = NotPending("r1", None, "unknown")

    async def ask(self, msg: object, *, timeout_s: float = 30.0) -> object:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


@dataclass
class FakeHost:
    registry: Any = field(default_factory=FakeRegistry)
    mediator: Any = field(default_factory=FakeMediator)
    settings: Any = None
    draining: bool = False


def service(**kw: Any) -> tuple[SessionService, FakeHost]:
    host = FakeHost(**kw)
    return SessionService(host), host


def test_draining_is_refused_as_the_registry_refuses() -> None:
    api, host = service()
    api.check_accepting()
    host.draining = True
    with pytest.raises(SessionsUnavailable) as caught:
        api.check_accepting()
    assert caught.value.body() == {"error": "Daemon is draining", "code": "daemon_draining"}


async def test_a_gone_session_is_not_found() -> None:
    api, host = service()
    with pytest.raises(SessionNotFound):
        api.find("nope")
    session = FakeSession("s1", {Summarize: SessionGone(), KnowsClient: False})
    host.registry.sessions["s1"] = session
    assert api.find("s1").session_id == "s1"
    with pytest.raises(SessionNotFound):
        await api.ask(session, Summarize(), dict)
    assert await api.summaries(None) == []  # closed meanwhile: skipped
    with pytest.raises(UnknownClient):
        await api.check_client(session, "c1")


async def test_opening_maps_the_failures_once() -> None:
    api, host = service()
    host.registry.outcome = ActorStopped("sessions")
    with pytest.raises(SessionsUnavailable, match="shutting down"):
        await api.open_new("/w", "single")
    host.registry.outcome = RuntimeError("spawn failed")
    with pytest.raises(AgentStartFailed) as started:
        await api.open_new("/w", "single")
    assert started.value.body()["error"] == "Agent failed to start: spawn failed"
    host.registry.outcome = RequestTimeout("initialize", 1.0)  # the table knows it: 504
    with pytest.raises(RequestTimeout):
        await api.open_new("/w", "single")
    host.registry.outcome = RemoteError(RESOURCE_NOT_FOUND, "unknown session")
    with pytest.raises(SessionNotFound) as missing:
        await api.open_restored("s9", "/w", "load")
    assert missing.value.session_id == "s9"
    host.registry.outcome = RemoteError(INTERNAL_ERROR, "boom")  # not "unknown": as it is
    with pytest.raises(RemoteError):
        await api.open_restored("s9", "/w", "load")
    host.registry.outcome = RemoteError(RESOURCE_NOT_FOUND, "x")
    with pytest.raises(RemoteError):  # a new session is never re-mapped to 404
        await api.open_new("/w", "thread")


async def test_create_attaches_again_when_the_session_closes_first() -> None:
    api, host = service()
    closing = FakeSession("s1", {Attach: SessionGone()})
    host.registry.outcome = closing
    with pytest.raises(SessionNotFound):
        await api.create("/w", "single", None, None)
    assert len(closing.asked) == 3


async def test_settings_after_create_tolerate_a_refusal() -> None:
    api, _ = service()
    session = FakeSession("s1", {SetApprovalMode: object(), SetModel: ModelSwitchFailed("m", "no")})
    assert await api.apply_settings(session, "c1", "plan", "m") is False
    assert await api.apply_settings(session, "c1", None, None) is None
    session.answers[SetModel] = object()
    assert await api.apply_settings(session, "c1", None, "m") is True


async def test_a_full_queue_is_a_domain_refusal() -> None:
    api, _ = service()
    session = FakeSession("s1", {SubmitPrompt: PromptQueueFull(4, 4)})
    body = parse_prompt({"prompt": [{"type": "text", "text": "hi"}]})
    with pytest.raises(PromptQueueRefused) as caught:
        await api.submit(session, body, "c1")
    assert caught.value.body() == {
        "error": "Prompt queue is full (4)",
        "code": "prompt_queue_full",
        "sessionId": "s1",
        "limit": 4,
        "pendingCount": 4,
    }


async def test_votes() -> None:
    api, host = service()
    # The mediator answers with its domain result; the service renders it (the legacy
    # route's body without a sessionId when the vote named no session).
    vote = await api.vote("r1", None, {}, None, True)
    assert (vote.status, vote.body) == (
        404,
        {"error": "No pending permission request", "requestId": "r1"},
    )
    host.mediator.outcome = ActorStopped("mediator")
    with pytest.raises(SessionsUnavailable, match="mediator"):
        await api.vote("r1", None, {}, None, True)
