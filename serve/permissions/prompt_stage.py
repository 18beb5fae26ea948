"""The EffectGate's prompt stage: a ``prompt`` verdict becomes run or refused, never asked twice.

The seam
--------
The :class:`~serve.permissions.effects.EffectGate` decides an effect from the effect and the
config in force (classify, then grants × ``approval:`` × mode → ``auto``/``prompt``/``deny``):
that has no memory. What a ``prompt`` verdict turns into depends on *history*: what the
agent's own permission requests and the clients' earlier answers already allowed, and which
identical question is being asked right now. That history is this module's state, with its
own lifetime (per session incarnation, dropped when the session is gone; entries with TTLs
and bounds) and its own reason to change (the rules for not asking twice and for sharing a
question). The gate keeps the policy, the refusal (``effect_denied``) and the file boundary;
the question itself (the synthetic tool call, the mediator, the answer) is
:mod:`serve.permissions.host_request`, handed in as ``ask``.

:meth:`PromptStage.resolve`, in order, the first that applies:

a. *already approved by the agent's own question* (:class:`~serve.permissions.
   agent_approvals.AgentApprovals`, fed by the gate's ``note_agent_permission``): allowed;
b. a live ``always_allow_for_session`` entry (:class:`~serve.permissions.cache.
   ApprovalCache`) for (session incarnation, principal, policy fingerprint, rule): allowed;
c. otherwise ``ask`` the clients (``allow_always`` offered only when the answer may be
   cached; an ``allow_always`` answer is remembered). Concurrent identical requests (same
   session, principal, policy and effect) share one question
   (:class:`~serve.permissions.cache.InflightTable`); if the leader is cancelled (the agent
   withdrew its request) the next waiter asks again.

The answer is ``allowed``, ``rejected`` (a client said no) or ``cancelled`` (timeout, session
cancel/close, mediator unavailable, the in-flight table full).

The principal
-------------
A cached ``allow_always`` is bound to the *prompt originator's* client id (the
``X-Qwen-Client-Id`` that submitted the running prompt): only later effects of prompts by
the same client in the same session incarnation reuse it. An anonymous prompt has no
principal and is never cached (its requests do not offer ``allow_always``). The session
part of the key is a per-actor token (:meth:`PromptStage.session_key`), so a session replaced
under the same id (load after close) never inherits entries; entries, agent approvals and
tool calls of sessions that are no longer live are dropped on the next resolve
(:meth:`PromptStage.sweep`). ``secret.bind`` decisions are never cached
(``approval.decide`` marks them non-cacheable, and ``ApprovalCache`` refuses them). Entries
expire after 8 hours.

Ownership: all state is touched only from the trio thread and never across an ``await``, so
the handler tasks of every session share one stage (the gate's).
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, Protocol

import trio

from serve.permissions.agent_approvals import AgentApprovals, ToolCallLog
from serve.permissions.approval import Decision, Effect, effect_fingerprint
from serve.permissions.cache import (
    ApprovalCache,
    CacheKey,
    DecisionKey,
    Existing,
    Full,
    InflightTable,
    Leader,
    cache_key,
)
from serve.permissions.counters import DecisionCounters
from serve.permissions.effect_session import EffectSession
from serve.permissions.host_request import Outcome

__all__ = ["Ask", "PromptStage", "Resolution", "originator"]

#: What :meth:`PromptStage.resolve` answers: run it, or refuse it and why.
Resolution = Literal["allowed", "rejected", "cancelled"]


class Ask(Protocol):
    """Ask the session's clients about an effect (``host_request.ask_clients``, bound to the
    daemon's mediator); never raises for an unavailable mediator (``cancelled``)."""

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
    ) -> Outcome: ...


class _Shared:
    """The in-flight decision the leader makes for every identical request."""

    __slots__ = ("done", "outcome")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.outcome: Outcome | None = None  # None: the leader gave up, ask again


class PromptStage:
    """What the Host remembers of earlier answers, and the questions in flight (module doc).

    ``counters`` is the gate's decision table (this stage counts ``allowedByAgentApproval``,
    ``allowedByCache`` and ``prompted`` in it); ``live_sessions`` lists the live sessions
    (the sweep keeps only theirs); ``clock_ms`` is wall milliseconds.
    """

    def __init__(
        self,
        ask: Ask,
        *,
        counters: DecisionCounters,
        live_sessions: Callable[[], Sequence[EffectSession]],
        clock_ms: Callable[[], int],
        agent_approvals: AgentApprovals | None = None,
        cache: ApprovalCache | None = None,
    ) -> None:
        self._ask = ask
        self._counters = counters
        self._live = live_sessions
        self._clock = clock_ms
        self.cache = cache or ApprovalCache()
        self.agent_approvals = agent_approvals or AgentApprovals()
        self.tool_calls = ToolCallLog()
        self._inflight: InflightTable[DecisionKey, _Shared] = InflightTable()
        self._tokens: weakref.WeakKeyDictionary[EffectSession, str] = weakref.WeakKeyDictionary()
        self._cached_sessions: set[str] = set()

    def __len__(self) -> int:
        """Questions in flight (distinct effects being asked about now)."""
        return len(self._inflight)

    def session_key(self, session: EffectSession) -> str:
        """The session incarnation's token (a session replaced under its id gets a new one)."""
        key = self._tokens.get(session)
        if key is None:
            key = f"{session.session_id}#{uuid.uuid4().hex[:12]}"
            self._tokens[session] = key
        return key

    def remember(self, key: CacheKey | None, *, now_ms: int) -> None:
        """Cache an ``allow_always`` (refused for a None key: anonymous, not cacheable)."""
        if self.cache.remember(key, now_ms=now_ms) and key is not None:
            self._cached_sessions.add(key.session_id)

    async def resolve(
        self,
        session: EffectSession,
        effect: Effect,
        decision: Decision,
        fingerprint: str,
        *,
        paths: Iterable[str] = (),
        commands: Iterable[str] = (),
        content: str | None = None,
        cwd: str | None = None,
    ) -> Resolution:
        """Resolve a ``prompt`` ``decision`` on ``effect`` under the policy ``fingerprint``
        (``approval.policy_fingerprint``): ``paths`` (as the agent spelled them, and
        canonical) and ``commands`` are what an agent approval may name; ``content`` and
        ``cwd`` go into the question."""
        now = self._clock()
        self.sweep(now)
        skey = self.session_key(session)
        active = session.active
        prompt_id = active.prompt_id if active is not None else None
        if (
            self.agent_approvals.match(
                skey,
                prompt_id,
                effect.capability,
                paths=paths,
                commands=commands,
                now_ms=now,
            )
            is not None
        ):
            self._counters.count(session.session_id, "allowedByAgentApproval")
            return "allowed"
        principal = originator(session)
        key = cache_key(skey, principal, fingerprint, decision)
        if self.cache.allowed(key, now_ms=now):
            self._counters.count(session.session_id, "allowedByCache")
            return "allowed"
        outcome = await self._shared_decision(
            session,
            DecisionKey(skey, principal, fingerprint, effect_fingerprint(effect)),
            effect,
            decision,
            key,
            content=content,
            cwd=cwd,
        )
        if outcome in ("allow_once", "allow_always"):
            return "allowed"
        return "rejected" if outcome == "rejected" else "cancelled"

    async def _shared_decision(
        self,
        session: EffectSession,
        dkey: DecisionKey,
        effect: Effect,
        decision: Decision,
        key: CacheKey | None,
        *,
        content: str | None,
        cwd: str | None,
    ) -> Outcome:
        while True:
            mine = _Shared()
            joined = self._inflight.lookup_or_join(dkey, mine)
            if isinstance(joined, Full):
                return "cancelled"
            if isinstance(joined, Existing):
                leader = self._inflight.leader_of(dkey)
                try:
                    if leader is None:  # pragma: no cover - a joined key always has a leader
                        continue
                    await leader.done.wait()
                finally:
                    self._inflight.leave(dkey, mine)
                if leader.outcome is not None:
                    return leader.outcome
                continue  # the leader gave up: ask again
            assert isinstance(joined, Leader)
            try:
                mine.outcome = await self._ask_clients(
                    session, effect, decision, key, content=content, cwd=cwd
                )
                return mine.outcome
            finally:
                self._inflight.finish(dkey)
                mine.done.set()

    async def _ask_clients(
        self,
        session: EffectSession,
        effect: Effect,
        decision: Decision,
        key: CacheKey | None,
        *,
        content: str | None,
        cwd: str | None,
    ) -> Outcome:
        self._counters.count(session.session_id, "prompted")
        outcome = await self._ask(
            session, effect, decision, offer_always=key is not None, content=content, cwd=cwd
        )
        if outcome == "allow_always":
            self.remember(key, now_ms=self._clock())
        return outcome

    def sweep(self, now: int) -> None:
        """Drop cache entries and agent approvals of sessions that are no longer live."""
        self.cache.expire(now)
        live = {self._tokens[s] for s in self._live() if s in self._tokens}
        for skey in [k for k in self._cached_sessions if k not in live]:
            self.cache.invalidate_session(skey)
            self._cached_sessions.discard(skey)
        for skey in self.agent_approvals.sessions():
            if skey not in live:
                self.agent_approvals.forget(skey)
        for skey in self.tool_calls.sessions():
            if skey not in live:
                self.tool_calls.forget(skey)


def originator(session: EffectSession) -> str | None:
    """The principal of an ``allow_always``: the running prompt's client id, if any."""
    active = session.active
    cid = active.client_id if active is not None else None
    return cid if isinstance(cid, str) and cid else None
