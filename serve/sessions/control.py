"""Agent calls off the session's inbox: each runs as a task and answers through a Reply.

Theory of operation
-------------------
The session actor's inbox never awaits its agent. A message that needs the agent gets a
:class:`~actors.Reply` at once; :class:`AgentCalls` runs the call in the session's nursery
and fills the reply when it returns. Two kinds:

* **switches** (model, approval mode): one at a time (a lock), each within its caller's
  bound, queueing included. A switch that never got its turn within the bound is not sent
  at all (:class:`ControlTimeout`): a caller is never told "failed" for a switch that then
  happens anyway. The agent call itself gets what is left of the bound.
* **vendor calls** (status reads, btw, recap, rewind, ...): concurrent. An *exclusive* one
  (rewind, branch) is refused while a prompt runs or waits (:class:`SessionBusy`, decided in
  the inbox by the caller of :meth:`AgentCalls.start_vendor`) and holds back the prompt
  worker (:meth:`wait_not_exclusive`) until it returns.

When the session closes, its nursery is cancelled: every unanswered reply fails with
:class:`SessionGone`, and so does a call whose channel closed because the session closed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
import trio

from actors import Reply
from serve.sessions.messages import (
    AgentCall,
    AgentUnavailable,
    ControlTimeout,
    SessionBusy,
    SessionGone,
)


class VendorConn(Protocol):
    """What a vendor call talks to: the agent connection, or one that binds an agent first."""

    async def request(
        self, method: str, params: dict[str, Any], timeout_s: float | None
    ) -> msgspec.Raw: ...


class AgentCalls:
    def __init__(self, *, session_id: Callable[[], str], closing: Callable[[], bool]) -> None:
        self._session_id = session_id
        self._closing = closing
        self.nursery: trio.Nursery | None = None
        self._switch_lock = trio.Lock()
        self.exclusive: str | None = None
        self._exclusive_done = trio.Event()

    def _gone(self) -> SessionGone:
        return SessionGone(self._session_id())

    def spawn[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        if self.nursery is None:
            raise self._gone()
        self.nursery.start_soon(fn, *args)

    # ---- switches ----------------------------------------------------------------------

    def start_switch[R](
        self,
        what: str,
        timeout_s: float,
        fn: Callable[[float], Awaitable[R]],
        *,
        connected: Callable[[], bool],
    ) -> Reply[R]:
        """Run ``fn(remaining_s)`` after earlier switches, within ``timeout_s`` in all."""
        reply: Reply[R] = Reply()
        deadline = trio.current_time() + timeout_s
        self.spawn(self._run_switch, reply, deadline, what, timeout_s, fn, connected)
        return reply

    async def _run_switch[R](
        self,
        reply: Reply[R],
        deadline: float,
        what: str,
        timeout_s: float,
        fn: Callable[[float], Awaitable[R]],
        connected: Callable[[], bool],
    ) -> None:
        try:
            acquired = False
            with trio.move_on_at(deadline):
                await self._switch_lock.acquire()
                acquired = True
            if not acquired:  # earlier switches took the whole bound: this one is not sent
                reply.fail(ControlTimeout(what, timeout_s))
                return
            try:
                if self._closing():
                    raise self._gone()
                if not connected():
                    raise AgentUnavailable(self._session_id())
                reply.set(await fn(max(0.001, deadline - trio.current_time())))
            finally:
                self._switch_lock.release()
        except Exception as exc:  # the channel closing under a close is the close's doing
            reply.fail(self._gone() if self._closing() else exc)
        finally:
            reply.fail(self._gone())  # cancelled (the session closed); no-op once answered

    # ---- vendor calls ------------------------------------------------------------------

    def start_vendor(self, msg: AgentCall, conn: VendorConn, *, busy: bool) -> Reply[bytes]:
        """Call ``msg.method`` on ``conn``; ``busy``: a prompt runs or waits."""
        if msg.exclusive is not None:
            if busy or self.exclusive is not None:
                raise SessionBusy(self._session_id(), msg.exclusive)
            self.exclusive = msg.exclusive
            self._exclusive_done = trio.Event()
        reply: Reply[bytes] = Reply()
        try:
            self.spawn(self._run_vendor, msg, conn, reply)
        except BaseException:
            self._end_exclusive(msg)
            raise
        return reply

    async def _run_vendor(self, msg: AgentCall, conn: VendorConn, reply: Reply[bytes]) -> None:
        try:
            params = {"sessionId": self._session_id(), **msg.params}
            reply.set(bytes(await conn.request(msg.method, params, msg.timeout_s)))
        except Exception as exc:
            reply.fail(self._gone() if self._closing() else exc)
        finally:
            reply.fail(self._gone())
            self._end_exclusive(msg)

    def _end_exclusive(self, msg: AgentCall) -> None:
        if msg.exclusive is not None and self.exclusive == msg.exclusive:
            self.exclusive = None
            self._exclusive_done.set()

    async def wait_not_exclusive(self) -> None:
        """Until no exclusive call (rewind, branch) runs."""
        while self.exclusive is not None:
            await self._exclusive_done.wait()
