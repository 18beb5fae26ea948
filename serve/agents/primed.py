"""A spare's primed session: ``session/new`` opened ahead of need, handed to the next create.

Why: a fresh agent process answers its *first* ``session/new`` slowly (``qwen --acp``
0.24.4: 120-170 ms against about 50 ms for later ones on this machine: the code paths of a
session are loaded and compiled on first use), and with one child per session (isolation)
every create is a first one. So a child the pool spawns ahead of need (a refill, at the
refill CPU weight: ``priority.py``) opens one session right after ``initialize``, in the
workspace, with no MCP servers; the next session that takes the child and would send the
same ``session/new`` (the workspace's cwd, no MCP servers, no ``additionalDirectories``,
not a fork) adopts that session instead of opening one: its create costs the daemon's own
work only. The agent's notifications for it (e.g. ``available_commands_update``) wait in
the child's :class:`~acp.mux.SessionMux` until the session binds (bounded there).

Packed children (``--sessions-per-agent`` > 1) chain it: the create that adopted a child's
prime makes the pool open the next one on that child while it has a free slot
(``AgentPool._reprime``, a ``Primed`` message back), so every create that fits answers at
the daemon's own speed, not at the agent's ``session/new`` (about 25 ms for ``qwen --acp``
on a warm child). A create that comes while the next prime is still in flight (a busy
``qwen --acp`` answers it only after the previous session's turn: a create right after a
prompt's answer found it so every other time) waits for it (``AgentLease.take_primed``:
``AgentChild.prime_claim``, answered by the pool when its ``Primed`` arrives, bounded by
the connection's request timeout): its own ``session/new`` would queue behind the prime
in the agent and take longer, and the chain would break (only an adoption opens the next
prime). A create that does not fit closes the prime and ends the chain (a
workspace whose sessions want MCP servers does not pay a ``session/new`` and a close per
create); a prime that arrives when the child became full meanwhile is closed at once.

A prime is no staler than the spare itself: the agent read its settings when it started,
before the prime. A prime nobody can use (the session wants MCP servers) is closed again
when the agent can close sessions (``session/close``, the pool's one bounded close:
``slots.close_inside``), else left inside the agent, whose
child is the session's own (isolation) or recycled with its other dead slots (packed).
A packed child spawned for its caller rather than ahead of need (every child full, or a
principal's first child in multi-user mode: tenants keep apart) has no prime; the create it
served starts the chain when it could have adopted one (:func:`primable`).
Priming failures are not failures of the child: it stays a spare without a prime.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from acp.client import AgentConnection
from acp.errors import AcpError, RemoteError
from acp.schema import SessionSetup

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PrimedSession:
    """A session opened on a spare ahead of need, and in which workspace."""

    cwd: str
    setup: SessionSetup

    def fits(self, cwd: str, mcp_servers: object, additional_directories: object) -> bool:
        """Would ``session/new`` with these parameters have been the same request?"""
        return cwd == self.cwd and primable(mcp_servers, additional_directories)


def primable(mcp_servers: object, additional_directories: object) -> bool:
    """Whether a create with these parameters could adopt a prime (in its own workspace)."""
    return not mcp_servers and not additional_directories


async def prime(conn: AgentConnection, cwd: str, timeout_s: float) -> PrimedSession | None:
    """Open the spare's session (None when the agent refuses or does not answer in time)."""
    try:
        setup = await conn.new_session(cwd, [], timeout_s=timeout_s)
    except (AcpError, RemoteError) as exc:
        log.info("agent pid %s: no primed session (%s)", conn.process.pid, exc)
        return None
    return PrimedSession(cwd, setup)
