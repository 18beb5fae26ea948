"""The agent binding of one session: bound, restarting, released, rebinding, failed.

Theory of operation
-------------------
A session is *bound* while an agent connection serves it (:class:`AgentLink`). An
:class:`AgentBinding` owns every change of that, and nothing else; it drives the link and
asks the session only through the narrow :class:`BindingOwner` port (it never imports the
session actor). The states (:attr:`AgentBinding.state`)::

    bound ──exit──▶ restarting ──ok──▶ bound
      │                 └─past the intensity, no load/resume, restore failed──▶ failed
      │
      ├─idle release (--agent-idle-release-ms, the memory budget's LRU choice)──▶ released
      └─ignored cancel on a shared child that still answers──────────────────────▶ released
    released ──first prompt / model or mode change / extension call──▶ rebinding
    rebinding ──ok──▶ bound (``agent_rebound {via, trigger}``)
       │      ──no agent now (budget, spawn, timeout)──▶ released (waiting prompts end
       │                                                 retryable; the next one tries again)
       └──────the agent no longer knows the session──▶ failed (the session ends)

A load served from the journal (serve/sessions/journal_load.py) starts *released*: the
first use binds an agent.

* **Restart in place** (:meth:`supervise`, the child watcher): an agent that exits without
  being asked to is restarted while the restart window allows; the running prompt ends with
  ``turn_error {errorKind:"agent_restarted"}`` (``agent_oom`` when it was killed for
  memory), ``session_restarted`` is published. An idle session on a shared child is a
  bystander: the restart is charged to the child. Past the window the session dies and
  :class:`AgentExited` propagates for the supervisor.
* **Idle release** (:meth:`watch_idle`, :meth:`release`): after the idle period with nothing
  pending, the release is decided in the session's inbox (``ReleaseAgent``) and the agent is
  let go in a task (``agent_released {reason, idleMs}``), so the inbox stays free.
* **Rebind** (:meth:`ensure_bound`, :meth:`bound_now`): in the background for a prompt; a
  model/mode change or an extension call waits for it (:meth:`bound_then`,
  :class:`BindingConn`).

Every method runs in the session's nursery or inbox (one trio thread); the events
``rebound`` and ``given_back`` are replaced at each release, so a waiter always waits on the
current cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import trio

from acp.process import ExitInfo
from acp.schema import SessionSetup
from actors import ActorError, Reply
from serve.sessions import turns
from serve.sessions.errors import MemoryBudgetExceeded
from serve.sessions.messages import AgentUnavailable, SessionGone

if TYPE_CHECKING:
    from serve.isolation import OomReport
    from serve.sessions.agent_link import AgentLink

log = logging.getLogger(__name__)

#: Seconds an agent closed while idle gets after stdin EOF before SIGTERM.
IDLE_EOF_GRACE_S = 0.2

BindingState = Literal["bound", "restarting", "released", "rebinding", "failed"]


class AgentExited(Exception):
    """The session's agent child exited without being asked to (a crash for the supervisor)."""

    def __init__(self, exit_info: ExitInfo) -> None:
        super().__init__(f"agent exited (code {exit_info.exit_code}, signal {exit_info.signal})")
        self.exit_info = exit_info


class BindingOwner(Protocol):
    """What the binding needs from its session (the session actor implements it)."""

    @property
    def session_id(self) -> str: ...

    @property
    def closing(self) -> bool: ...

    @property
    def stopped(self) -> bool:
        """Stopping on purpose or ended: an agent exit is no crash then."""
        ...

    @property
    def has_ended(self) -> bool:
        """The session's final event is out."""
        ...

    def has_running_prompt(self) -> bool: ...

    def has_queued_prompts(self) -> bool: ...

    def idle(self) -> bool:
        """Nothing pending: no prompt, no exclusive call, no open permission request."""
        ...

    def publish(self, event_type: str, data: dict[str, Any]) -> None: ...

    def adopt_setup(self, setup: SessionSetup | None) -> None: ...

    def end_running_turn(self, data: dict[str, Any]) -> None:
        """End the running prompt (if any) with ``turn_error`` ``data``."""
        ...

    def fail_waiting(self, data: dict[str, Any]) -> None:
        """End every waiting prompt with ``turn_error`` ``data``."""
        ...

    def cancel_turn_request(self) -> None:
        """Abandon the running turn's request (its terminal is out)."""
        ...

    async def cancel_permissions(self) -> None: ...

    async def die(self, reason: str, exit_info: ExitInfo | None = None) -> None:
        """Terminal events for everything unfinished, then ``session_died``."""
        ...

    def stop(self) -> None:
        """End the session's actor loop (after :meth:`die`)."""
        ...

    async def request_release(self, reason: str) -> None:
        """Ask the session's inbox to release the agent (answers once it is given back)."""
        ...

    def record_supervision(self, kind: str, reason: str, attempt: int) -> None: ...


class AgentBinding:
    """The agent-binding state machine of one session (see the module docstring)."""

    def __init__(self, owner: BindingOwner, link: AgentLink, *, idle_release_ms: int) -> None:
        self.owner = owner
        self.link = link
        self.idle_release_ms = idle_release_ms
        self.state: BindingState = "bound"
        self.release_count = 0
        self.exit_info: ExitInfo | None = None
        self.nursery: trio.Nursery | None = None
        #: Fires when a released session has an agent again (or could not get one).
        self.rebound = trio.Event()
        #: Set once a released agent is given back (a rebind waits for it).
        self.given_back = trio.Event()
        self.last_use = 0.0  # trio clock: the agent was bound or a prompt ended
        self.rebind_error: Exception | None = None
        #: This session had its agent killed (an ignored cancel): not a bystander of the exit.
        self.killed_agent = False
        #: Failed while released (the agent no longer knew the session): still unbound.
        self._failed_unbound = False

    # ---- read model --------------------------------------------------------------------

    @property
    def released(self) -> bool:
        """No agent serves the session now (released, or binding one again)."""
        return self.state in ("released", "rebinding") or self._failed_unbound

    @property
    def rebinding(self) -> bool:
        return self.state == "rebinding"

    def used(self) -> None:
        """The agent was bound or a prompt ended: the idle clock starts again."""
        self.last_use = trio.current_time()

    def idle_now(self) -> bool:
        """Could let the agent go now (also the memory budget's LRU choice)."""
        return (
            not self.owner.closing
            and not self.released
            and self.link.ready.is_set()
            and self.link.connected
            and self.owner.idle()
            and self.link.restorable()
        )

    def start_released(self) -> None:
        """A load served from the journal: no agent yet, the first use binds one."""
        self.state = "released"
        self.given_back.set()  # no agent to give back: the first bind starts at once

    # ---- restart in place (the child watcher) ------------------------------------------

    async def supervise(self, nursery: trio.Nursery) -> None:
        """Watch the agent child; restart it in place while the intensity allows.

        A restart keeps the session id, the event log (ids continue), the clients and
        the queued prompts; the prompt that was running ends with ``turn_error
        {errorKind: "agent_restarted"}`` and ``session_restarted`` tells clients what
        happened. Without load/resume support, or past the intensity, the session dies.
        When the link lets an agent go (idle release, a shared child left) it stops
        watching that connection (``wait_exit`` returns None).
        """
        owner = self.owner
        while True:
            exit_info = await self.link.wait_exit()
            if owner.stopped:
                return
            if exit_info is None or self.released:  # let go on purpose: wait for a new one
                while self.released and not owner.closing:
                    await self.rebound.wait()
                if owner.closing:
                    return  # binding again failed; the session is ending
                continue
            await self._restart(nursery, exit_info)

    async def _restart(self, nursery: trio.Nursery, exit_info: ExitInfo) -> None:
        owner, sid = self.owner, self.owner.session_id
        self.exit_info = exit_info
        log.warning(
            "agent of session %s exited (code %s, signal %s)",
            sid,
            exit_info.exit_code,
            exit_info.signal,
        )
        oom = self.link.oom(exit_info)
        if oom is not None:  # killed for memory (serve/isolation): say so, then restore
            owner.publish("agent_oom", {"sessionId": sid, **oom.event_data()})
        died_reason = "agent_oom" if oom is not None else "channel_closed"
        # An idle session on a shared child is a bystander: charged to the child. One
        # that had it killed (its cancel ignored) is not, though its turn has ended.
        bystander = not owner.has_running_prompt() and not self.killed_agent
        self.killed_agent = False
        attempt = await self.link.next_restart(bystander=bystander)
        if attempt is None:  # no load/resume, or past the restart intensity
            self.state = "failed"
            await owner.die(died_reason, exit_info)
            raise AgentExited(exit_info)
        self.state = "restarting"
        owner.record_supervision("crash", _exit_reason(exit_info, oom), attempt)
        owner.end_running_turn(
            turns.agent_oom(sid, oom.message()) if oom is not None else turns.agent_restarted(sid)
        )
        await owner.cancel_permissions()
        try:
            setup = await self.link.restart(nursery, sid, attempt)
        except Exception as exc:
            log.warning("restarting the agent of session %s failed: %r", sid, exc)
            self.state = "failed"
            await owner.die("channel_closed", exit_info)
            raise AgentExited(exit_info) from exc
        self.state = "bound"
        owner.adopt_setup(setup)
        owner.record_supervision("restart", f"attempt {attempt}", attempt)
        owner.publish(
            "session_restarted",
            {
                "sessionId": sid,
                "attempt": attempt,
                "exitCode": exit_info.exit_code,
                "signal": signal_name(exit_info.signal),
                **({"reason": "agent_oom"} if oom is not None else {}),
            },
        )

    # ---- idle release (--agent-idle-release-ms) ----------------------------------------

    async def watch_idle(self) -> None:
        """After ``--agent-idle-release-ms`` without a prompt, let the agent go."""
        period_s = self.idle_release_ms / 1000
        while not self.owner.closing:
            if self.released:
                await self.rebound.wait()
                continue
            now = trio.current_time()
            due = self.last_use + period_s
            if now < due:
                await trio.sleep(due - now)
                continue
            if self.idle_now():
                try:
                    await self.owner.request_release("idle")
                except (ActorError, SessionGone):
                    return
            if not self.released:
                self.used()  # busy: look again a period later

    def release(self, reason: str) -> bool | Reply[bool]:
        """Let the agent go (the session's inbox decided it): the wait for the agent to stop
        runs as a task (the inbox stays free: heartbeats, attaches, a prompt that binds
        again); the answer is a :class:`Reply`, True once the agent is given back."""
        if not self.idle_now() or self.nursery is None:
            return False
        idle_ms = int((trio.current_time() - self.last_use) * 1000)
        self.state = "released"
        self.link.ready = trio.Event()  # no turn starts on the agent being let go
        self.rebound = trio.Event()
        self.given_back = trio.Event()
        reply: Reply[bool] = Reply()
        self.nursery.start_soon(self._let_go, reason, idle_ms, self.given_back, reply)
        return reply

    async def _let_go(
        self, reason: str, idle_ms: int, given_back: trio.Event, reply: Reply[bool]
    ) -> None:
        pid = self.link.pid
        try:
            # An idle agent has nothing to finish: a short wait after stdin EOF, then SIGTERM.
            await self.link.let_go(eof_grace_s=IDLE_EOF_GRACE_S)
            self.release_count += 1
            log.info("session %s let its agent (pid %s) go: %s", self.owner.session_id, pid, reason)
            if not self.owner.has_ended:  # (closed meanwhile: its final event is out)
                self.owner.publish(
                    "agent_released",
                    {"sessionId": self.owner.session_id, "reason": reason, "idleMs": idle_ms},
                )
        finally:
            given_back.set()
            reply.set(True)

    async def leave_shared_child(self) -> None:
        """A cancel ignored on a shared child that still answers: only this session goes.
        The turn's request is abandoned and the session leaves the child (unbound, its
        terminals killed, ``session/close`` where offered) as an idle release does; the
        next prompt binds it again. An agent that cannot restore it: the session ends."""
        owner = self.owner
        if not self.link.restorable():
            self.state = "failed"
            await owner.die("cancel_timeout")
            owner.stop()
            return
        self.state = "released"
        self.rebound = trio.Event()
        given_back = self.given_back = trio.Event()  # a rebind waits for the slot to be freed
        owner.cancel_turn_request()
        try:
            await self.link.let_go()
        finally:
            given_back.set()
        self.release_count += 1
        owner.publish(
            "agent_released",
            {"sessionId": owner.session_id, "reason": "cancel_timeout", "idleMs": 0},
        )
        if owner.has_queued_prompts():
            self.ensure_bound("prompt")

    # ---- rebind ------------------------------------------------------------------------

    def ensure_bound(self, trigger: str) -> None:
        """A released session binds an agent again (in the background) for ``trigger``."""
        if self.state != "released" or self.nursery is None:
            return
        self.state = "rebinding"
        self.nursery.start_soon(self._rebind, trigger)

    async def bound_now(self, trigger: str) -> None:
        """Until the session has an agent again (model/mode changes and calls need one)."""
        if not self.released:
            return
        self.ensure_bound(trigger)
        await self.rebound.wait()
        if self.owner.closing:
            raise SessionGone(self.owner.session_id)
        if self.released:
            raise self.rebind_error or AgentUnavailable(self.owner.session_id)

    async def bound_then[M, R](
        self, trigger: str, fn: Callable[[M, float], Awaitable[R]], msg: M, timeout_s: float
    ) -> R:
        """A switch on a released session: bind an agent again first (within the bound)."""
        start = trio.current_time()
        await self.bound_now(trigger)
        return await fn(msg, max(0.001, timeout_s - (trio.current_time() - start)))

    async def _rebind(self, trigger: str) -> None:
        assert self.nursery is not None
        owner, sid = self.owner, self.owner.session_id
        await self.given_back.wait()  # the released agent is stopped (or its slot freed)
        try:
            setup = await self.link.open(self.nursery, "restart", sid)
        except Exception as exc:
            self.state = "released"
            if turns.session_unknown(exc):
                # The agent says the session does not exist (any more): it cannot come back.
                log.warning("session %s is unknown to its agent: %r", sid, exc)
                self.state, self._failed_unbound = "failed", True
                await owner.die("agent_session_not_found")
                self.rebound.set()
                owner.stop()
                return
            # No agent now (memory budget, spawn, initialize, a timeout...): the waiting
            # prompts end with a retryable error, the session stays released, and a later
            # prompt tries again.
            log.warning("session %s could not bind an agent again: %r", sid, exc)
            self.rebind_error = (
                exc if isinstance(exc, MemoryBudgetExceeded) else AgentUnavailable(sid)
            )
            owner.fail_waiting(turns.rebind_failed(sid, exc))
            rebound, self.rebound = self.rebound, trio.Event()
            rebound.set()
            return
        owner.adopt_setup(setup)
        self.state = "bound"
        self.rebind_error = None
        info = self.link.conn.info if self.link.conn is not None else None
        via = "resume" if info is not None and info.supports_resume else "load"
        # Published before the prompt worker (woken by the link's ready) runs: no checkpoint.
        owner.publish("agent_rebound", {"sessionId": sid, "via": via, "trigger": trigger})
        self.rebound.set()


class BindingConn:
    """What a vendor call on a released session talks to: binds an agent, then calls it."""

    def __init__(self, binding: AgentBinding) -> None:
        self.binding = binding

    async def request(
        self, method: str, params: dict[str, Any], timeout_s: float | None
    ) -> msgspec.Raw:
        await self.binding.bound_now("extension")
        conn = self.binding.link.conn
        if conn is None:
            raise AgentUnavailable(self.binding.owner.session_id)
        return await conn.request(method, params, timeout_s)


def _exit_reason(exit_info: ExitInfo, oom: OomReport | None) -> str:
    if oom is not None:
        return f"agent killed for memory ({oom.scope} limit)"
    return f"agent exited (code {exit_info.exit_code}, signal {exit_info.signal})"


def signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
