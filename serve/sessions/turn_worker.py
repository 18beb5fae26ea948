"""The turn: one admitted prompt, from the queue to its one terminal, and its budget.

:func:`prompt_worker` is a task of the session's nursery: it waits for the agent (a restart
or a rebind in progress: ``link.ready``) and for no exclusive extension call (rewind,
branch), takes the next admitted prompt in FIFO order (expired ones end with ``turn_error
{code:"deadline_exceeded"}`` first) and runs it (:func:`run_turn`):
``pending_prompt_started`` for a queued one, the prompt echoed as ``user_message_chunk``,
``session/prompt`` (in a cluster, ``--journal-url``, once the echo is journaled: a daemon
restoring the session after this one died knows the turn began) inside the turn's cancel
scope (its deadline, a cancel and the budget end it), a steered turn settled
(serve/sessions/steering.py), then exactly one terminal (``turn_complete`` or
``turn_error``; serve/sessions/turns.py shapes them).

The budget (serve/sessions/budget.py, sans-IO) hears of ``usage_update``\\ s and of each
turn's ``usage``; its signals publish ``budget_warning`` / ``budget_exhausted``, and an
exhausted budget ends the running turn and asks the agent to stop. After each turn and each
change of the limits the budget is kept in the journal meta (:func:`save_budget`), for a
restore (serve/sessions/recovery.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from acp import telemetry
from acp.errors import AcpError, ChannelClosed, RemoteError
from serve.sessions import turns
from serve.sessions.budget import ATTR as BUDGET_ATTR
from serve.sessions.budget import Limits
from serve.sessions.cancelling import cancel_permissions
from serve.sessions.prompt_events import finish, publish_terminal

if TYPE_CHECKING:
    from acp.client import AgentConnection
    from serve.sessions.budget import Signal
    from serve.sessions.core import SessionCore
    from serve.sessions.messages import SetBudget
    from serve.sessions.prompt_queue import Job


#: Longest a turn waits for its start to be journaled in a cluster (s); past it the turn
#: runs anyway (the journal is failing: it retries on its own).
TURN_START_FLUSH_S = 2.0


async def prompt_worker(session: SessionCore) -> None:
    while True:
        await session.link.ready.wait()  # an agent restart in progress
        await session.calls.wait_not_exclusive()  # a rewind/branch runs: no turn now
        job, expired = session.prompts.take(trio.current_time())
        for terminal in expired:
            publish_terminal(session, terminal)
            await after_deadline(session)
        if job is None:
            if not expired:
                session.work = trio.Event()
                await session.work.wait()
            continue
        try:
            await traced_turn(session, job)
        finally:
            publish_terminal(session, session.prompts.release(job))


async def traced_turn(session: SessionCore, job: Job) -> None:
    """:func:`run_turn` in its spans (tracing on): ``prompt.turn`` from its admission, with
    ``prompt.queue_wait`` until now, the parent of ``prompt.agent`` (the agent's work)."""
    if not telemetry.enabled():
        await run_turn(session, job)
        return
    attributes = {"acp_serve.session_id": session.session_id, "acp_serve.prompt_id": job.prompt_id}
    start = job.admitted_ns or None
    with telemetry.span(
        "prompt.turn", parent=job.trace, attributes=attributes, start_ns=start
    ) as turn:
        if job.admitted_ns:
            telemetry.record("prompt.queue_wait", start_ns=job.admitted_ns, end_ns=time.time_ns())
        await run_turn(session, job)
        terminal = job.terminal
        if terminal is not None:
            turn.set_attribute("acp_serve.outcome", terminal.kind)
            reason = terminal.data.get("stopReason") or terminal.data.get("code")
            if isinstance(reason, str):
                turn.set_attribute("acp_serve.reason", reason)
            if terminal.kind == "turn_error":
                turn.set_error(str(reason or "turn_error"))


async def run_turn(session: SessionCore, job: Job) -> None:
    conn = session.link.conn
    assert conn is not None
    sid = session.session_id
    if job.queued:
        session.log.publish(
            "pending_prompt_started",
            {"sessionId": sid, "promptId": job.prompt_id, "text": job.text},
            prompt_id=job.prompt_id,
            originator=job.client_id,
        )
    if (dim := session.budget.exhausted) is not None:  # spent while this prompt waited
        data = {"sessionId": sid, "dimension": dim}
        finish(session, job, "turn_error", turns.budget_exhausted(sid, data))
        return
    for block in turns.text_blocks(job.prompt):  # echo the prompt, as the reference does
        session.side.relay("user_message_chunk", turns.user_chunk(block))
    if session.settings.journal_url is not None:
        # A cluster: the turn is on record before the agent gets it, so a daemon that
        # restores the session after this one died knows the promptId (never run twice).
        with trio.move_on_after(TURN_START_FLUSH_S):
            await session.journal_link.flush()
    session.budget.turn_started()
    try:
        await _run_prompt(session, job, conn, sid)
    finally:
        usage = session.turn_usage
        session.turn_usage = None
        budget_signals(session, session.budget.turn_ended(usage))
        save_budget(session)


async def _run_prompt(session: SessionCore, job: Job, conn: AgentConnection, sid: str) -> None:
    try:
        with trio.CancelScope() as scope:
            session.turn_scope = scope
            if job.deadline is not None:
                scope.deadline = job.deadline
            with telemetry.span("prompt.agent") as work:
                job.agent_trace = work.traceparent  # the parent of its permission waits
                result = await conn.prompt(sid, job.prompt, extra=turns.prompt_extra(job, sid))
            await session.steering.settle(job)  # a steered turn: until the agent is quiet
        session.turn_scope = None
    except RemoteError as exc:
        finish(session, job, "turn_error", turns.remote_error(sid, exc))
    except ChannelClosed:
        # The child died: the supervising task ends this prompt (agent_restarted or,
        # when the session dies, channel_closed); wait for its decision.
        with trio.move_on_after(30):
            await job.token.done.wait()
        finish(session, job, "turn_error", turns.channel_closed(sid))
    except AcpError as exc:
        finish(session, job, "turn_error", turns.protocol_error(sid, exc))
    else:
        if not scope.cancelled_caught:
            session.turn_usage = _decoded_usage(result.usage)
            finish(
                session, job, "turn_complete", turns.completed(sid, result.stop_reason, result.meta)
            )
        elif job.deadline is not None and trio.current_time() >= job.deadline:
            # The FIFO moves on even if the agent is wedged; ask the agent to stop.
            finish(session, job, "turn_error", turns.deadline_exceeded(sid))
            await after_deadline(session)


async def after_deadline(session: SessionCore) -> None:
    await cancel_permissions(session)
    conn = session.link.conn
    if conn is not None and not conn.closed:
        try:
            with trio.move_on_after(1):
                await conn.cancel(session.session_id)
        except AcpError:
            pass


def _decoded_usage(raw: msgspec.Raw) -> object:
    """The prompt response's ``usage`` (ACP ``Usage``), decoded, or None."""
    data = bytes(raw) if raw else b""
    try:
        return msgspec.json.decode(data) if data else None
    except (msgspec.DecodeError, RecursionError):
        return None


# ---- budget (serve/sessions/budget.py) ----------------------------------------------------


def on_usage(session: SessionCore, update: msgspec.Raw) -> None:
    try:
        decoded = msgspec.json.decode(bytes(update))
    except (msgspec.DecodeError, RecursionError):
        return
    budget_signals(session, session.budget.on_usage_update(decoded))


def budget_signals(session: SessionCore, signals: list[Signal]) -> None:
    for signal in signals:
        data: dict[str, Any] = {
            "sessionId": session.session_id,
            "dimension": signal.dimension,
            "spent": signal.spent,
            "limit": signal.limit,
        }
        if signal.kind == "warn":
            data["fraction"] = signal.spent / signal.limit if signal.limit else 1.0
            session.log.publish("budget_warning", data)
            continue
        session.log.publish("budget_exhausted", data)
        job = session.prompts.running
        if job is not None and not job.done:
            finish(session, job, "turn_error", turns.budget_exhausted(session.session_id, data))
            if session.turn_scope is not None:
                session.turn_scope.cancel()  # the FIFO moves on; the agent is asked to stop
            session.spawn(after_deadline, session)


def set_budget(session: SessionCore, msg: SetBudget) -> dict[str, Any]:
    signals = session.budget.set_limits(Limits(msg.max_tokens, msg.max_cost, msg.currency))
    snapshot = {"sessionId": session.session_id, **session.budget.snapshot()}
    session.log.publish("budget_updated", snapshot, originator=msg.client_id)
    budget_signals(session, signals)
    save_budget(session)
    return snapshot


def save_budget(session: SessionCore) -> None:
    """Keep the budget in the journal meta for a restore (a write only when it changed,
    off the turn's path)."""
    session.journal_link.remember_soon({BUDGET_ATTR: session.budget.saved()})
