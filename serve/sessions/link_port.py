"""The session's side of its agent link: how it opens, and what the link asks of it.

The seam: the agent link (serve/sessions/agent_link.py) speaks ACP and decides nothing
about the session; the session actor runs its inbox and decides nothing about opening.
Between them is the session's side of the link, which changes when what a session *takes
from its agent* changes (its id, its setup, its MCP servers, its journal), not when the
inbox or the handshake does:

* :func:`open_agent` is the first step of the session's ``run()``: open the agent link, or,
  for a load the journal can answer, start released from the journal
  (serve/sessions/journal_load.py); then the session's access record settles
  (serve/sessions/ownership.py).
* :func:`adopt_setup` takes what the agent advertised (on open, restart and rebind): the
  current model (``models``, or only a model config option as codex sends it) and the
  current approval mode; :func:`current_model_and_mode` is that decision, sans-IO.
* :class:`SessionLinkPort` implements :class:`~serve.sessions.agent_link.LinkOwner`: the
  workspace's MCP servers for the handshake, the session id the agent chose (the journal
  opens then, and a fork's stream starts by naming its parent), and the history rebuilt
  from the journal before a load or resume.

Functions of the session's inbox and its nursery's tasks (one trio thread), over the
session through :class:`LinkedSession` (a Protocol: this module does not import the actor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from serve.permissions.modes import advertised_modes
from serve.sessions import journal_load, ownership, recovery
from serve.sessions.core import SessionCore

if TYPE_CHECKING:
    import trio

    from acp.schema import InitializeResult, SessionSetup
    from actors import Actor
    from serve.access.roles import SessionAccess
    from serve.mcp.pool import McpPool
    from serve.sessions.journal_link import JournalLink
    from serve.sessions.messages import SessionMsg


class LinkedSession(SessionCore, Protocol):
    """The session as its link side sees it: the core, and what opening reads and sets."""

    workspace: str
    #: How the session was asked for: ``new``, ``load``, ``resume`` or ``fork``.
    action: str
    fork_from: str | None
    access: SessionAccess
    journal_link: JournalLink
    #: The workspace MCP pool, or None (unit tests).
    mcp_pool: McpPool | None
    restored_from_journal: bool


def current_model_and_mode(
    setup: SessionSetup, model: str | None, mode: str | None
) -> tuple[str | None, str | None]:
    """The current model and mode after the agent advertised ``setup`` (``model`` and
    ``mode``: the session's until now). ``models`` names the model (even as none); without
    it, a model config option with a string value does (codex); an advertised current mode
    wins, else the session keeps its own."""
    if setup.models is not None:
        model = getattr(setup.models, "current_model_id", None)
    elif (option := setup.model_option()) is not None and isinstance(option.current_value, str):
        model = option.current_value  # models only as a config option (codex)
    return model, advertised_modes(setup).current or mode


def adopt_setup(session: SessionCore, setup: SessionSetup | None) -> None:
    session.binding.used()
    if setup is None:
        return
    session.current_model, session.current_mode = current_model_and_mode(
        setup, session.current_model, session.current_mode
    )


async def open_agent(session: LinkedSession, nursery: trio.Nursery) -> None:
    """Open the agent link; a load of a journaled session instead starts released, from
    the journal, and binds an agent on first use (serve/sessions/journal_load.py)."""
    lazy = await journal_load.read(
        session.journal_link,
        nursery,
        session.session_id,
        settings=session.settings,
        action=session.action,
        workspace=session.workspace,
        ring_size=session.log.ring_size,
        ring_bytes=session.log.ring_bytes,
    )
    if lazy is None:
        await session.link.open(nursery, session.action, session.session_id)
        adopt_setup(session, session.link.setup)
        await journal_load.remember(session.journal_link, session.settings, session.link)
    else:
        session.log, session.restored_from_journal = lazy.log, True  # (journaled by now)
        session.log.tap = session.event_tap
        session.link.setup = lazy.setup
        adopt_setup(session, lazy.setup)
        session.binding.start_released()
        await recovery.settle(session, session.journal_link)  # the dead owner's turns end
    await ownership.settle(session)


class SessionLinkPort:
    """What the agent link asks of one session (see the module docstring); ``actor`` is
    the session's actor, the MCP pool's requester (a pass's budget events go to it)."""

    __slots__ = ("actor", "s")

    def __init__(self, session: LinkedSession, actor: Actor[SessionMsg]) -> None:
        self.s = session
        self.actor = actor

    async def mcp_servers(self, info: InitializeResult | None) -> list[dict[str, Any]]:
        """The workspace's MCP servers for the agent (pooled stdio servers are reached
        through the pool's bridge; transports the agent did not advertise are left out)."""
        s = self.s
        if s.mcp_pool is None:
            return []
        caps = info.agent_capabilities.mcp_capabilities if info is not None else None
        servers: list[dict[str, Any]] = await s.mcp_pool.acp_servers_for(
            s.workspace,
            requester=self.actor,
            http=bool(caps and caps.http),
            sse=bool(caps and caps.sse),
        )
        return servers

    async def adopt_session_id(self, session_id: str) -> None:
        s = self.s
        s.session_id = session_id
        s.log.session_id = session_id
        s.name = f"session-{session_id}"
        s.side.journal_pending = True
        s.journal_link.attrs = journal_load.agent_attrs(s.settings, s.link)
        try:
            await self._open_journal(fresh=True)
        finally:
            s.side.journal_pending = False
        if s.fork_from is not None:  # the fork's stream starts by naming its parent
            s.log.publish(
                "session_forked", {"sessionId": session_id, "parentSessionId": s.fork_from}
            )
        s.side.flush_early_updates()

    async def restore_history(self) -> bool:
        """After a daemon restart: rebuild the event log from the journal and keep
        journaling; True when the journal held the history."""
        s = self.s
        if s.journal_link.journal is None:
            return False
        restored = await s.journal_link.restore(s.session_id, s.log.ring_size, s.log.ring_bytes)
        if restored is None:
            await self._open_journal(fresh=True)
            return False
        s.log, s.restored_from_journal = restored
        s.log.tap = s.event_tap
        await self._open_journal(fresh=False)
        await recovery.settle(s, s.journal_link)  # before the agent replays anything
        return s.restored_from_journal

    async def _open_journal(self, *, fresh: bool) -> None:
        s = self.s
        nursery = s.calls.nursery  # the session's nursery, while it runs
        assert nursery is not None
        origin: Literal["new", "load", "resume"] = (
            "load" if s.action == "load" else "resume" if s.action == "resume" else "new"
        )
        ownership.stamp(s)  # the owner on record from the journal's first write
        await s.journal_link.open(nursery, s.log, workspace=s.workspace, origin=origin, fresh=fresh)
