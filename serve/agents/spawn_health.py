"""Whether a pool's agent command works: consecutive failures, backoff, ``failing`` and probes.

A spawn or ``initialize`` that fails, or a warm child that exits before any session used
it, counts as a consecutive failure (:meth:`SpawnHealth.failed`). A child is stable once it
has stayed up :data:`STABLE_AFTER_S` after ``initialize``: only that is a successful start
(:meth:`SpawnHealth.stable`), and it resets the count and the backoff (so an agent that
dies a second after ``initialize`` is failing, not respawned at full speed). The warm refill
waits ``REFILL_BACKOFF_S * 2**(n-1)`` (capped at :data:`MAX_REFILL_BACKOFF_S`) after each
failure. After :data:`FAILING_AFTER` in a row the pool is ``failing`` (the last error,
truncated, in ``/daemon/status``; ``/readyz`` answers ``agent_unavailable`` when it is the
primary workspace's pool, see ``serve/host.py``): the pool's refill then only *probes*, one
child at a time after the capped backoff (``AgentPool._plan``), so it recovers by itself
once the agent works again.

A failure that is the file sandbox's refusal (:class:`AgentSandboxDenied`: the child died
because the sandbox refused it a path) is deterministic: the pool is ``failing`` at once
(:attr:`SpawnHealth.denied`), a create is answered with it at once (``AgentPool``, no spawn,
no backoff to wait out), ``/readyz`` and ``/daemon/status`` name it; the probes go on, and
a child that becomes stable (the operator fixed the agent) ends it.

Pure bookkeeping (no I/O but a log line), owned by one pool actor; times on the trio
clock except ``last_error_at`` (epoch seconds, for status pages).
"""

from __future__ import annotations

import logging
import time
from typing import Final

import trio

from serve.sessions.errors import AgentSandboxDenied

log = logging.getLogger(__name__)

#: Consecutive spawn failures after which the pool is failing (the refill only probes).
FAILING_AFTER: Final = 3
#: Seconds a child must stay up after ``initialize`` to count as a successful start.
STABLE_AFTER_S: Final = 5.0
REFILL_BACKOFF_S: Final = 0.5
MAX_REFILL_BACKOFF_S: Final = 30.0
#: Characters of the last spawn error kept for /daemon/status.
MAX_ERROR_CHARS: Final = 300


class SpawnHealth:
    """The consecutive failures of one pool's agent command and the refill's backoff."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.failures = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        #: The warm refill waits until then (trio clock).
        self.backoff_until = 0.0
        #: The last failure, when it was the sandbox's refusal (deterministic).
        self.denied: AgentSandboxDenied | None = None

    @property
    def failing(self) -> bool:
        return self.failures >= FAILING_AFTER or self.denied is not None

    def refusal(self) -> AgentSandboxDenied | None:
        """A fresh copy of the sandbox's refusal to answer a caller with (None: none)."""
        d = self.denied
        return None if d is None else AgentSandboxDenied(d.message, d.path, d.flag)

    def failed(self, error: BaseException) -> None:
        """A failed start (spawn, ``initialize``, an early exit of a warm child)."""
        self.failures += 1
        self.denied = error if isinstance(error, AgentSandboxDenied) else None
        self.last_error = _truncate(f"{type(error).__name__}: {error}")
        self.last_error_at = time.time()
        backoff = min(MAX_REFILL_BACKOFF_S, REFILL_BACKOFF_S * 2 ** (self.failures - 1))
        self.backoff_until = trio.current_time() + backoff
        if self.failing:
            log.error(
                "agent command keeps failing in %s (%d in a row): %s; probing with backoff",
                self.workspace,
                self.failures,
                self.last_error,
            )
        else:
            log.warning("agent spawn failed in %s: %s", self.workspace, self.last_error)

    def stable(self) -> None:
        """A child stayed up :data:`STABLE_AFTER_S`: a successful start."""
        self.failures = 0
        self.backoff_until = 0.0
        self.denied = None


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
