"""Steering a running turn, and when a turn is over.

Theory of operation
-------------------
A *steer* is a prompt meant for the turn that is running now, not for the back of the
queue (``POST /session/:id/prompt {"steer": true}``). :class:`Steering` is the session
actor's helper for it (like :class:`~serve.sessions.control.AgentCalls`: the inbox decides,
agent calls run as tasks of the session's nursery and answer through a Reply):

* **No turn runs** (or the running one already has its terminal): the steer is an ordinary
  prompt put *ahead* of the queue (``via: "prompt"``, ``reason: "no_running_turn"``).
* **The agent advertises steering** (``InitializeResponse._meta.steering.supported: true``,
  as codex-acp and claude-agent-acp do): ``_session/steering {sessionId, prompt, _meta:
  {steering: {idleBehavior: "promptRequired"}}}``. ``injected`` (and ``startedNewTurn``, or
  any answer we do not know: the message is the agent's now and is never sent twice) joins
  the running turn (``via: "native"``): its text is echoed as ``user_message_chunk`` in that
  turn and the turn ends when the agent is done with both. ``promptRequired`` (the turn
  settled under us) makes it an ordinary prompt ahead of the queue; an error or ``failed``
  falls back as below.
* **Otherwise: cancel and re-prompt.** The steer is admitted ahead of the queue, then the
  running turn is cancelled (``prompt_cancelled {reason: "steered"}``; it ends with its own
  ``turn_complete {stopReason: "cancelled"}``), so the steer's text is the very next prompt
  (``via: "cancel"``, ``cancelledPromptId``). Only the steer's text is sent: the agent keeps
  the cancelled turn in its history, as it does for any cancel.

Every steer publishes ``prompt_steered {sessionId, promptId, via, text, outcome?, reason?,
cancelledPromptId?}`` (``promptId``: the turn it went into).

**When a turn is over.** ACP's prompt response normally ends a turn, but an agent may answer
``end_turn`` while work a steer started still streams. A turn that was steered natively is
therefore over only when its prompt response arrived *and* the agent has stopped streaming
for it: no steering request of ours is unanswered and no ``session/update`` came from the
agent for ``--turn-settle-ms`` (:meth:`Steering.settle`, inside the turn's cancel scope, so
its deadline, a cancel and the budget still end it). Updates in that window belong to the
turn (stamped with its ``promptId``); its ``turn_complete`` comes after them and the next
queued prompt starts only then. Turns never steered end at their prompt response, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
import trio

from acp.errors import AcpError
from actors import Reply
from serve.events import EventLog
from serve.sessions import turns
from serve.sessions.messages import Admission, SessionGone, Steered, SteerPrompt
from serve.sessions.prompt_queue import MAX_REMEMBERED_PROMPTS, Job, PromptQueue, PromptRequest

if TYPE_CHECKING:
    from serve.sessions.agent_link import AgentLink
    from serve.sessions.agent_side import AgentSide
    from serve.settings import Settings

#: ACP's de-facto steering method (codex-acp, claude-agent-acp).
STEERING_METHOD: Final = "_session/steering"
#: Answers meaning the running turn took the message.
JOINED: Final = frozenset({"injected", "startedNewTurn"})


def advertises_steering(conn: object) -> bool:
    """Whether the agent behind ``conn`` advertised ``_meta.steering.supported: true``."""
    info = getattr(conn, "info", None)
    raw = bytes(getattr(info, "meta", b"") or b"")
    if not raw:
        return False
    try:
        meta = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return False
    steering = meta.get("steering") if isinstance(meta, dict) else None
    return isinstance(steering, dict) and steering.get("supported") is True


def steering_params(session_id: str, request: PromptRequest) -> dict[str, Any]:
    """``_session/steering`` params: the caller's ``_meta`` kept, ours for ``steering``."""
    meta = dict((request.extra or {}).get("_meta") or {})
    own = meta.get("steering")
    meta["steering"] = {**(own if isinstance(own, dict) else {}), "idleBehavior": "promptRequired"}
    return {"sessionId": session_id, "prompt": request.prompt, "_meta": meta}


def outcome_of(raw: bytes) -> str:
    """The agent's answer; unknown shapes read as ``startedNewTurn`` (never resent)."""
    try:
        decoded = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return "startedNewTurn"
    outcome = decoded.get("outcome") if isinstance(decoded, dict) else None
    return outcome if isinstance(outcome, str) and outcome else "startedNewTurn"


class _Session(Protocol):  # the part of the SessionActor a steer uses
    session_id: str
    prompts: PromptQueue
    log: EventLog
    link: AgentLink
    settings: Settings
    closing: bool
    side: AgentSide  # its update count: a steered turn is over once it stops growing

    def _admit(self, msg: PromptRequest, *, front: bool = False) -> Admission: ...
    def spawn[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None: ...
    async def _cancel_permissions(self, *, forget: bool = False) -> None: ...
    async def _send_cancel(self) -> None: ...
    async def _escalate_cancel(self, job: Job) -> None: ...


class NoRunningTurn(Exception):
    """A steer asked not to become a prompt (``when_idle="refuse"``) found no turn to join."""


class Steering:
    """One session's steers and the settling of steered turns (see the module docstring)."""

    def __init__(self, session: _Session, settle_ms: int) -> None:
        self.s = session
        self.settle_s = settle_ms / 1000
        self._steered: Job | None = None  # the turn a native steer was sent for
        self._joined: Job | None = None  # the turn a native steer went into
        self._in_flight = 0
        self._answered = trio.Event()
        #: Steers by client ``promptId`` (the last MAX_REMEMBERED_PROMPTS): a re-sent steer
        #: is the same steer, never a second injection or a second cancel.
        self._seen: OrderedDict[str, Steered] = OrderedDict()

    # ---- the inbox's part --------------------------------------------------------------

    def submit(self, msg: SteerPrompt) -> Steered | Reply[Steered]:
        pid = msg.request.prompt_id
        if pid is not None:
            if (seen := self._seen.get(pid)) is not None:
                return seen
            if (known := self.s.prompts.known(pid)) is not None:  # sent as a prompt before
                return Steered("prompt", known.token, reason="known_prompt_id")
        job = self.s.prompts.running
        if job is None or job.done:
            if msg.when_idle == "refuse":
                raise NoRunningTurn()
            return self._as_prompt(msg.request, "no_running_turn")
        if advertises_steering(self.s.link.conn):
            reply: Reply[Steered] = Reply()
            self._in_flight += 1
            self._steered = job
            self.s.spawn(self._native, reply, job, msg)
            return reply
        return self._cancel_and_reprompt(job, msg.request, "not_supported_by_agent")

    def _remember(self, request: PromptRequest, steered: Steered) -> Steered:
        if request.prompt_id is not None:
            self._seen[request.prompt_id] = steered
            while len(self._seen) > MAX_REMEMBERED_PROMPTS:
                self._seen.popitem(last=False)
        return steered

    def _as_prompt(self, request: PromptRequest, reason: str) -> Steered:
        admission: Admission = self.s._admit(request, front=True)
        self._published(admission.prompt_id, "prompt", request, reason=reason)
        return self._remember(request, Steered("prompt", admission, reason=reason))

    def _cancel_and_reprompt(self, job: Job, request: PromptRequest, reason: str) -> Steered:
        admission: Admission = self.s._admit(request, front=True)  # next, whatever waits
        self._published(
            admission.prompt_id, "cancel", request, reason=reason, cancelled=job.prompt_id
        )
        self.s.log.publish(
            "prompt_cancelled",
            {"sessionId": self.s.session_id, "reason": "steered"},
            prompt_id=job.prompt_id,
            originator=request.client_id,
        )
        self.s.spawn(self._cancel, job)
        steered = Steered("cancel", admission, reason=reason, cancelled_prompt_id=job.prompt_id)
        return self._remember(request, steered)

    async def _cancel(self, job: Job) -> None:
        s = self.s
        if s.prompts.running is not job or job.done:
            return  # it ended meanwhile: the steer simply runs next
        await s._cancel_permissions()
        if s.prompts.running is job and not job.done:
            await s._send_cancel()
            await s._escalate_cancel(job)

    def _published(
        self,
        prompt_id: str,
        via: str,
        request: PromptRequest,
        *,
        outcome: str | None = None,
        reason: str | None = None,
        cancelled: str | None = None,
    ) -> None:
        data: dict[str, Any] = {
            "sessionId": self.s.session_id,
            "promptId": prompt_id,
            "via": via,
            "text": request.text,
        }
        if outcome is not None:
            data["outcome"] = outcome
        if reason is not None:
            data["reason"] = reason
        if cancelled is not None:
            data["cancelledPromptId"] = cancelled
        self.s.log.publish(
            "prompt_steered", data, prompt_id=prompt_id, originator=request.client_id
        )

    # ---- the agent's part (a task of the session) --------------------------------------

    async def _native(self, reply: Reply[Steered], job: Job, msg: SteerPrompt) -> None:
        s, request = self.s, msg.request
        try:
            outcome = await self._ask_agent(request)
        finally:
            self._in_flight -= 1
            self._answered.set()
            self._answered = trio.Event()
        try:
            if s.closing:
                raise SessionGone(s.session_id)
            running = s.prompts.running is job and not job.done
            if outcome == "failed" and running:
                reply.set(self._cancel_and_reprompt(job, request, "steering_failed"))
            elif outcome in ("promptRequired", "failed"):
                if msg.when_idle == "refuse":
                    raise NoRunningTurn()
                reason = "prompt_required" if outcome == "promptRequired" else "steering_failed"
                reply.set(self._as_prompt(request, reason))
            else:  # injected, startedNewTurn, or an answer we do not know: the agent has it
                if s.prompts.running is job:
                    for block in turns.text_blocks(request.prompt):
                        s.side.relay("user_message_chunk", turns.user_chunk(block))
                self._joined = job
                self._published(job.prompt_id, "native", request, outcome=outcome)
                reply.set(self._remember(request, Steered("native", job.token, outcome=outcome)))
        except Exception as exc:  # e.g. the queue is full for a steer that became a prompt
            reply.fail(exc)
        finally:
            reply.fail(SessionGone(s.session_id))  # cancelled: the session closed

    async def _ask_agent(self, request: PromptRequest) -> str:
        conn = self.s.link.conn
        if conn is None or conn.closed:
            return "failed"
        params = steering_params(self.s.session_id, request)
        timeout_s = self.s.settings.initialize_timeout_ms / 1000
        try:
            return outcome_of(bytes(await conn.request(STEERING_METHOD, params, timeout_s)))
        except AcpError:
            return "failed"

    # ---- when a turn is over -----------------------------------------------------------

    async def settle(self, job: Job) -> None:
        """``job``'s prompt response arrived: return once the turn is over (see above)."""
        while self._in_flight and self._steered is job:  # the agent's answers decide
            await self._answered.wait()
        if self._joined is not job:  # no steer went into it (or it answered promptRequired)
            return
        try:
            while True:
                while self._in_flight:
                    await self._answered.wait()
                seen = self.s.side.agent_updates
                await trio.sleep(self.settle_s)
                if not self._in_flight and self.s.side.agent_updates == seen:
                    return
        finally:
            if self._steered is job:
                self._steered = None
            if self._joined is job:
                self._joined = None
