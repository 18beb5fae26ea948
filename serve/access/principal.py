"""Who makes a request: the :class:`Principal` value, and the daemon roles.

A principal is resolved once at the edge (the security front for REST and SSE, the
``/acp`` handshake, see ``docs/multi-user.md``) and then travels as this frozen value into
the service calls and actor messages; nothing below the fronts knows how it was
authenticated. :data:`OPERATOR` is the holder of the single bearer token, the default
principal of every request on a daemon without multi-user auth: ``admin``, as today.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["ADMIN", "ANONYMOUS", "DAEMON_ROLES", "OPERATOR", "USER", "Principal"]

ADMIN = "admin"
USER = "user"
DAEMON_ROLES = (ADMIN, USER)


class Principal(msgspec.Struct, frozen=True):
    """One caller: ``id`` (``operator``, a JWT's ``sub`` or a scoped token's
    ``principal``: one name is one principal whichever way it authenticated), how it was
    authenticated, its daemon roles and its groups."""

    id: str
    kind: Literal["operator", "jwt", "token", "anonymous"]
    roles: tuple[str, ...] = (USER,)
    groups: tuple[str, ...] = ()

    @property
    def admin(self) -> bool:
        return ADMIN in self.roles

    def describe(self) -> dict[str, object]:
        """What ``GET /capabilities`` tells the caller about itself."""
        return {"id": self.id, "kind": self.kind, "roles": list(self.roles)}


OPERATOR = Principal("operator", "operator", (ADMIN,))
#: A caller without a valid credential on a route that needs none (``/health`` before
#: auth, with multi-user auth): no role, so it is shown nothing daemon-wide.
ANONYMOUS = Principal("anonymous", "anonymous", ())
