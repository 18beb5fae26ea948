"""The decision for one request on a session that is not live on this daemon
(see :mod:`serve.cluster`): pure, from the journal's :class:`Ownership` alone."""

from __future__ import annotations

import enum

from serve.journal import Ownership


class Route(enum.Enum):
    LOCAL = "local"
    FORWARD = "forward"
    TAKE_OVER = "take_over"
    UNREACHABLE = "unreachable"


def route(owner: Ownership | None, *, forwarded: bool) -> Route:
    """Where a request for a session not live here goes. ``forwarded``: another daemon
    already sent it here (it is never forwarded a second time)."""
    if owner is None or owner.ended:
        return Route.LOCAL  # nothing journaled, or the session ended: as on one daemon
    if owner.alive and not owner.mine:
        if forwarded or not owner.address:
            return Route.UNREACHABLE
        return Route.FORWARD
    return Route.TAKE_OVER  # its owner is gone, or it is this daemon's own (a restart)
