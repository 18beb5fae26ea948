"""Moving sessions off a draining daemon in a cluster: the drain's last step.

With ``--journal-url`` (several daemons on one PostgreSQL journal), ``POST /daemon/drain``
does not leave its sessions to end with the daemon (``session_died {reason:
"daemon_shutdown"}`` at its exit): once no turn runs and the journal is flushed,
:func:`hand_over_idle` hands every live idle session over
(:class:`~serve.sessions.messages.HandOver`, serve/sessions/endings.py): no final event,
its streams end (clients reconnect), its agent stops, and its journal is closed cleanly,
which releases its lease (``expires_at = now()``). Another daemon restores it from the
journal on the next request for it, as a ``POST /session/:id/load`` does, with its history,
its event epoch and its budget. The files journal (one daemon per journal) keeps the old
behaviour: there is no other daemon to take them.

Bounded: each session is asked within :data:`ASK_TIMEOUT_S` and given ``timeout_s`` in
all to be gone (its agent stopped, its journal closed); a session still busy, or one that
refuses, stays here and is counted in ``kept``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import trio

from actors import ActorError
from serve.sessions.actor import SessionActor
from serve.sessions.messages import HandOver, SessionGone

log = logging.getLogger(__name__)

__all__ = ["ASK_TIMEOUT_S", "HandedOver", "hand_over_idle"]

#: How long one session is asked to hand itself over (s).
ASK_TIMEOUT_S: Final = 3.0


@dataclass(frozen=True)
class HandedOver:
    """What the hand-over did: sessions moved (gone from this daemon, their journal
    closed) and kept (busy, refusing, or not gone in time)."""

    moved: int
    kept: int


async def hand_over_idle(sessions: Iterable[SessionActor], *, timeout_s: float) -> HandedOver:
    """Hand every idle session of ``sessions`` over to the cluster (module docstring)."""
    moved = kept = 0
    leaving: list[SessionActor] = []
    for session in sessions:
        try:
            left = await session.ask(HandOver(), timeout_s=ASK_TIMEOUT_S)
        except (SessionGone, ActorError):  # gone, closing, or its inbox did not answer
            left = False
        if left:
            leaving.append(session)
        else:
            kept += 1
    with trio.move_on_after(timeout_s):
        for session in leaving:
            await session.gone.wait()  # its agent stopped, its journal closed (the lease)
    for session in leaving:
        if session.gone.is_set():
            moved += 1
        else:
            kept += 1
            log.warning("session %s: handed over but not gone in time", session.session_id)
    return HandedOver(moved, kept)
