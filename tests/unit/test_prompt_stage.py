"""The EffectGate's prompt stage: a ``prompt`` verdict is asked once, shared, and remembered.

The stage is real (its cache, agent approvals, in-flight table and sweep); the clients' vote is
a scripted ``ask`` (the in-process and daemon tests in tests/serve drive the real mediator).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
import trio.testing

from serve.events.messages import PublishEvent
from serve.permissions.agent_approvals import AgentApproval
from serve.permissions.approval import Decision, Effect, classify_read, decide, policy_fingerprint
from serve.permissions.cache import ALWAYS_ALLOW_TTL_MS
from serve.permissions.config import ApprovalConfig, CapabilitiesConfig
from serve.permissions.counters import DecisionCounters
from serve.permissions.effect_session import EffectSession
from serve.permissions.grants import resolve_grants
from serve.permissions.host_request import Outcome
from serve.permissions.prompt_stage import PromptStage, Resolution

WS = "/w"
GRANTS = resolve_grants(CapabilitiesConfig())
APPROVAL = ApprovalConfig()
FP = policy_fingerprint(GRANTS, APPROVAL, "default")
SECRET = classify_read(f"{WS}/.env", [WS])  # a sensitive file: at least ``prompt``
ASK = decide(SECRET, GRANTS, APPROVAL, "default")


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    client_id: str | None


@dataclass(eq=False)
class Session:
    """A session as the stage reads it (hashable by identity, like the actor)."""

    session_id: str
    active: Prompt | None = Prompt("p1", "c-alice")
    workspace: str = WS
    current_mode: str | None = None
    agent_name: str | None = None
    client_ids: frozenset[str] = frozenset({"c-alice", "c-bob"})

    async def publish_event(self, event: PublishEvent, *, timeout_s: float) -> None:
        raise AssertionError("the prompt stage never publishes")


@dataclass
class Clients:
    """The clients' vote: each question waits for ``release`` (if held), then the next answer."""

    answers: list[Outcome]
    hold: bool = False
    release: trio.Event = field(default_factory=trio.Event)
    asked: list[tuple[str, str | None, bool]] = field(default_factory=list)

    async def __call__(
        self,
        session: EffectSession,
        effect: Effect,
        decision: Decision,
        /,
        *,
        offer_always: bool,
        content: str | None,
        cwd: str | None,
    ) -> Outcome:
        self.asked.append((session.session_id, effect.target, offer_always))
        if self.hold:
            await self.release.wait()
        return self.answers.pop(0)


def counters() -> DecisionCounters:
    return DecisionCounters()


def stage_for(
    clients: Clients,
    live: list[Session],
    now: list[int] | None = None,
    counts: DecisionCounters | None = None,
) -> PromptStage:
    clock = now if now is not None else [1_000_000]
    return PromptStage(
        clients,
        counters=counts if counts is not None else counters(),
        live_sessions=lambda: live,
        clock_ms=lambda: clock[0],
    )


async def resolve(stage: PromptStage, session: Session) -> Resolution:
    return await stage.resolve(session, SECRET, ASK, FP, paths=(SECRET.target or "",))


def test_a_sensitive_read_is_a_prompt() -> None:
    assert ASK.verdict == "prompt" and ASK.cacheable


async def test_identical_requests_in_flight_share_one_question() -> None:
    session = Session("s1")
    clients = Clients(["allow_once", "rejected"], hold=True)
    stage = stage_for(clients, [session])
    results: list[Resolution] = []

    async def one() -> None:
        results.append(await resolve(stage, session))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(one)
        await trio.testing.wait_all_tasks_blocked()
        assert len(clients.asked) == 1 and len(stage) == 1
        clients.release.set()
    assert results == ["allowed"] * 3
    assert len(stage) == 0
    # decided: allow_once is not remembered, the next identical request asks again
    assert await resolve(stage, session) == "rejected"
    assert len(clients.asked) == 2


async def test_a_withdrawn_question_is_asked_again_by_the_next_waiter() -> None:
    session = Session("s1")
    clients = Clients(["rejected"], hold=True)
    stage = stage_for(clients, [session])
    results: list[Resolution] = []
    leader = trio.CancelScope()

    async def lead() -> None:
        with leader:
            await resolve(stage, session)

    async def wait() -> None:
        results.append(await resolve(stage, session))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lead)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert len(clients.asked) == 1  # the waiter joined the leader's question
        leader.cancel()  # the agent withdrew the leader's request
        await trio.testing.wait_all_tasks_blocked()
        assert len(clients.asked) == 2  # so the waiter asks for itself
        clients.release.set()
    assert results == ["rejected"]
    assert len(stage) == 0


async def test_allow_always_is_the_originators_and_expires() -> None:
    session = Session("s1")
    now = [1_000_000]
    clients = Clients(["allow_always", "rejected", "allow_once", "allow_always"])
    counts = counters()
    stage = stage_for(clients, [session], now, counts)
    assert await resolve(stage, session) == "allowed"
    assert clients.asked == [("s1", SECRET.target, True)] and len(stage.cache) == 1
    assert await resolve(stage, session) == "allowed"  # alice again: not asked
    assert len(clients.asked) == 1 and counts["allowedByCache"] == 1
    session.active = Prompt("p2", "c-bob")  # another client's prompt: asked
    assert await resolve(stage, session) == "rejected"
    session.active = Prompt("p3", None)  # an anonymous prompt: no allow_always on offer
    assert await resolve(stage, session) == "allowed"
    assert clients.asked[-1] == ("s1", SECRET.target, False) and len(stage.cache) == 1
    session.active = Prompt("p4", "c-alice")
    now[0] += ALWAYS_ALLOW_TTL_MS  # eight hours later alice is asked again
    assert await resolve(stage, session) == "allowed"
    assert len(clients.asked) == 4 and counts["prompted"] == 4


async def test_the_answer_of_a_question_refuses_or_cancels() -> None:
    session = Session("s1")
    clients = Clients(["rejected", "cancelled"])
    counts = counters()
    stage = stage_for(clients, [session], counts=counts)
    assert await resolve(stage, session) == "rejected"
    assert await resolve(stage, session) == "cancelled"
    assert len(stage.cache) == 0 and counts["prompted"] == 2


async def test_a_replaced_session_inherits_nothing_and_a_gone_one_is_swept() -> None:
    first = Session("s1")
    live = [first]
    clients = Clients(["allow_always", "rejected"])
    stage = stage_for(clients, live)
    assert await resolve(stage, first) == "allowed"
    assert len(stage.cache) == 1
    second = Session("s1")  # loaded again under the same id after a close
    live[:] = [second]
    assert stage.session_key(second) != stage.session_key(first)
    assert await resolve(stage, second) == "rejected"  # asked: nothing inherited
    assert len(stage.cache) == 0  # and the gone incarnation's entry was dropped
    assert len(clients.asked) == 2


async def test_an_agent_approval_covers_its_prompts_matching_effect() -> None:
    session = Session("s1")
    now = [1_000_000]
    clients = Clients(["rejected"])
    counts = counters()
    stage = stage_for(clients, [session], now, counts)
    approval = AgentApproval(
        tool_call_id="t1",
        prompt_id="p1",
        capabilities=frozenset({"fs.read"}),
        paths=frozenset({SECRET.target or ""}),
        commands=frozenset(),
        always=False,
    )
    stage.agent_approvals.note(stage.session_key(session), approval, now_ms=now[0])
    assert await resolve(stage, session) == "allowed"
    assert clients.asked == [] and counts["allowedByAgentApproval"] == 1
    session.active = Prompt("p2", "c-alice")  # the next prompt: its own question
    assert await resolve(stage, session) == "rejected"
    assert len(clients.asked) == 1
