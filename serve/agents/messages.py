"""The messages of the agent pool actor (:class:`serve.agents.pool.AgentPool`).

Public ones are sent by sessions (through :class:`~serve.agents.slots.AgentLease` and
:meth:`AgentPool.acquire`) and by the workspace runtime (:class:`Drain`,
:class:`InstallAgentEnv`); the others come from the pool's own tasks (a spawn's
outcome, a child's exit, timers, the memory sampler), so every change of pool state happens
in the actor's one task.
"""

from __future__ import annotations

import msgspec

from acp.process import ExitInfo
from actors import Reply
from actors.actor import Request
from serve.agents.child import AgentChild
from serve.agents.primed import PrimedSession
from serve.agents.slots import AgentLease
from serve.isolation import ChildLimits
from serve.isolation.tenants import OPERATOR_TENANT
from serve.sessions.errors import AgentSandboxDenied


class Acquire(msgspec.Struct, Request[Reply[AgentLease]], frozen=True):
    """Answered with a :class:`Reply` that resolves to an :class:`AgentLease` on a child of
    ``tenant`` (the principal the session's agent works for)."""

    tenant: str = OPERATOR_TENANT


class Release(msgspec.Struct, frozen=True):
    child_id: str
    lease_id: int
    #: The session could not be closed in the agent (no ``session/close``, or it failed):
    #: it stays inside the child, and its slot is not given back (a dead slot).
    left_behind: bool = False


class Bound(msgspec.Struct, frozen=True):
    child_id: str
    lease_id: int
    session_id: str


class ChargeExit(msgspec.Struct, Request[bool], frozen=True):
    """A session restoring itself after its shared child exited: answered True while the
    window of shared-child restarts allows (each child's exit counted once)."""

    child_id: str
    intensity: int
    period_s: float


class InstallAgentEnv(msgspec.Struct, frozen=True):
    """Late binding (``POST /daemon/bind``): the tenant's variables, added to every child
    spawned from now on; the warm refill held since start (``--bootstrap-token``) begins.
    Answered with ``None`` once installed."""

    env: dict[str, str]


class Drain(msgspec.Struct, frozen=True):
    """Daemon shutdown: take no more callers, and stop every child no session is on (warm
    spares) at once, while the sessions close, instead of after them; the children left
    are stopped when the pool stops, without the EOF grace."""


class Spawned(msgspec.Struct, frozen=True):
    child: AgentChild
    pss_kib: int = 0  # measured after initialize (with a budget), 0: not measured
    spawn_s: float = -1.0  # spawn to the initialize reply (seconds)


class SpawnFailed(msgspec.Struct, frozen=True):
    error: Exception
    child_id: str = ""
    tenant: str = OPERATOR_TENANT


class Lowered(msgspec.Struct, frozen=True):
    """A refill's process runs (not yet initialized) at the refill CPU weight."""

    child_id: str
    limits: ChildLimits | None


class Resize(msgspec.Struct, frozen=True):
    """Re-plan the adaptive warm capacity (its arrivals age out of the window)."""


class Exited(msgspec.Struct, frozen=True):
    child_id: str
    exit_info: ExitInfo
    #: An unused child that died because the file sandbox refused it a path (its stderr
    #: says so): deterministic, the pool is failing with it at once (spawn_health.py).
    denied: AgentSandboxDenied | None = None


class Primed(msgspec.Struct, frozen=True):
    """A packed child's next session opened ahead of need (None: the agent refused)."""

    child_id: str
    primed: PrimedSession | None


class Refill(msgspec.Struct, frozen=True):
    pass


class Stable(msgspec.Struct, frozen=True):
    child_id: str


class Measured(msgspec.Struct, frozen=True):
    pss_kib: dict[str, int]  # child id -> KiB


class RoomResult(msgspec.Struct, frozen=True):
    released: bool


class Abandon(msgspec.Struct, frozen=True):
    """A caller stopped waiting (cancelled): forget its reply, or give back its lease."""

    reply: Reply[AgentLease]


PoolMsg = (
    Acquire
    | Release
    | Bound
    | ChargeExit
    | Spawned
    | SpawnFailed
    | Exited
    | Primed
    | Refill
    | Stable
    | InstallAgentEnv
    | Drain
    | Abandon
    | Measured
    | RoomResult
    | Lowered
    | Resize
)
