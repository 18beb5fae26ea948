"""One agent child of a pool: its record, its start (spawn + ``initialize``), its watch and stop.

An :class:`AgentChild` is the pool's record of one initialized child: its connection, the
:class:`~acp.mux.SessionMux` that routes its updates and agent requests by ``sessionId``,
its limits (cgroup / watchdog entry, :mod:`serve.isolation`) and its slots (lease id →
ACP session id). The pool actor (:mod:`serve.agents.pool`) is the only writer; status pages
read it.

:func:`start_child` spawns a child with the cwd and environment a session's child gets
(:func:`serve.sessions.agent_link.spawn_limited`: its file sandbox and its limits) and
``initialize``\\s it. Its tasks run in the nursery given (the pool's). A spawn that fails with
``OSError`` or an ``initialize`` that fails with an ``Exception`` is *returned* (the pool
fails its waiting callers with it); anything else propagates. A child whose ``initialize``
failed is stopped before the error is returned (shielded: a pool stopped mid-spawn still
reaps it).

:func:`watch_child` waits for a child's exit and removes its limits; :func:`stop_child`
stops one the pool holds (warm, spare or drained: nothing of a turn is running) by
escalation, with a short stdin-EOF grace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio

from acp import telemetry
from acp.client import AgentConnection
from acp.mux import SessionMux
from acp.process import ExitInfo
from serve.agents.primed import PrimedSession
from serve.isolation import ChildLimits, Isolation
from serve.isolation.tenants import OPERATOR_TENANT
from serve.sessions.agent_link import spawn_limited, start_failure

if TYPE_CHECKING:
    from serve.settings import Settings

#: Seconds an idle child gets after stdin EOF before SIGTERM (nothing of a turn to finish).
IDLE_EOF_GRACE_S: Final = 0.2
#: The same at daemon shutdown: none (stdin EOF and SIGTERM together; the exit must not
#: wait on an agent that ignores EOF, as qwen-code does).
SHUTDOWN_EOF_GRACE_S: Final = 0.0


class AgentChild:
    """One initialized agent child and its slots (pool state; read by status pages)."""

    __slots__ = (
        "conn",
        "dead",
        "id",
        "limits",
        "mux",
        "prime_claim",
        "primed",
        "priming",
        "ready_at",
        "reprime",
        "slots",
        "stable",
        "stopping",
        "tenant",
        "used",
    )

    def __init__(
        self,
        child_id: str,
        conn: AgentConnection,
        mux: SessionMux,
        limits: ChildLimits | None = None,
        tenant: str = OPERATOR_TENANT,
    ) -> None:
        self.id = child_id
        #: The principal this child serves for its whole life (its places: tenants.py).
        self.tenant = tenant
        self.conn = conn
        self.mux = mux
        #: Its cgroup / watchdog entry (serve/isolation); removed once it is reaped.
        self.limits = limits
        #: lease id -> ACP session id once bound ("" before).
        self.slots: dict[int, str] = {}
        #: Sessions left inside the agent (it could not close them): dead slots.
        self.dead = 0
        self.ready_at = time.time()
        self.used = False  # a session has taken a slot at least once
        self.stopping = False
        self.stable = False  # stayed up STABLE_AFTER_S: a successful start
        #: A session opened ahead of need for the next create (primed.py), until taken.
        self.primed: PrimedSession | None = None
        #: Packed: a create adopted the prime, so the pool opens the next one (primed.py);
        #: and whether that ``session/new`` is in flight.
        self.reprime = False
        self.priming = False
        #: Set by a create that took a slot while that ``session/new`` was in flight: it
        #: waits for it (``AgentLease.take_primed``); the pool keeps the prime for it.
        self.prime_claim: trio.Event | None = None

    @property
    def pid(self) -> int:
        return self.conn.process.pid

    def answer_claim(self) -> None:
        """Wake the create waiting for the prime in flight (the prime is in ``primed`` now,
        or there is none: the create opens its own session)."""
        claim, self.prime_claim = self.prime_claim, None
        if claim is not None:
            claim.set()


async def start_child(
    nursery: trio.Nursery,
    settings: Settings,
    isolation: Isolation | None,
    *,
    child_id: str,
    cwd: str,
    env: dict[str, str],
    cpu_weight: int | None,
    eof_grace_s: Callable[[], float],
    lowered: Callable[[ChildLimits | None], None],
    tenant: str = OPERATOR_TENANT,
) -> AgentChild | Exception:
    """Spawn and ``initialize`` one child (see the module docstring), in an ``agent.start``
    span. ``lowered`` is called once its process runs at ``cpu_weight`` (a refill's lower
    weight; not called without one); ``eof_grace_s`` is read when a failed child is stopped
    (it shrinks at shutdown)."""
    init_timeout = settings.initialize_timeout_ms / 1000
    mux = SessionMux()
    with telemetry.span("agent.start", attributes={"acp_serve.agent.pooled": True}) as span:
        try:
            conn, limits = await spawn_limited(
                nursery,
                settings,
                isolation,
                cwd=cwd,
                env=env,
                handler=mux,
                request_timeout_s=init_timeout,
                cpu_weight=cpu_weight,
                tenant=tenant,
            )
        except OSError as exc:
            span.set_error(f"{type(exc).__name__}: {exc}")
            return exc
        if cpu_weight is not None:
            lowered(limits)
        try:
            await conn.initialize(timeout_s=init_timeout)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                # Nothing to finish before initialize answered (a pool stopped mid-spawn
                # does not wait out a full EOF grace on an agent that ignores EOF).
                await conn.aclose(grace_s=1.0, eof_grace_s=eof_grace_s())
                if limits is not None:
                    await limits.aclose()
            if not isinstance(exc, Exception):
                raise
            failed = await start_failure(conn, exc)  # the sandbox's refusal, when it killed it
            span.set_error(f"{type(failed).__name__}: {failed}")
            return failed
        return AgentChild(child_id, conn, mux, limits, tenant)


async def watch_child(child: AgentChild) -> ExitInfo:
    """Wait for ``child`` to exit; its limits' verdict is read before they are removed."""
    try:
        info: ExitInfo = await child.conn.wait_closed()
        if child.limits is not None:
            child.limits.verdict(info)  # read before its cgroup goes (agent_oom)
    finally:
        if child.limits is not None:
            await child.limits.aclose()
    return info


async def stop_child(
    conn: AgentConnection,
    limits: ChildLimits | None = None,
    eof_grace_s: float = IDLE_EOF_GRACE_S,
) -> None:
    """Stop a child the pool holds: warm, spare or drained, so nothing of a turn is running;
    an agent that ignores stdin EOF gets only ``eof_grace_s`` before SIGTERM."""
    await conn.aclose(grace_s=1.0, eof_grace_s=eof_grace_s)
    if limits is not None:
        await limits.aclose()
