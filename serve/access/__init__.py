"""Many users on one daemon: principals, session roles, the rule table, quotas, audit.

Transport-free (a domain package): the fronts resolve a :class:`Principal` and pass it
down; :mod:`.roles` says what it may do on a session, :mod:`.rules` what every route and
ACP method needs, :mod:`.config` who may use a workspace, :mod:`.quotas` how much a
principal may run, :mod:`.audit` records mutations and denials. See ``docs/multi-user.md``.
"""

from serve.access.principal import ADMIN, OPERATOR, USER, Principal
from serve.access.roles import (
    COLLABORATOR,
    OBSERVER,
    OWNER,
    SESSION_ROLES,
    SessionAccess,
    at_least,
    role_of,
)

__all__ = [
    "ADMIN",
    "COLLABORATOR",
    "OBSERVER",
    "OPERATOR",
    "OWNER",
    "SESSION_ROLES",
    "USER",
    "Principal",
    "SessionAccess",
    "at_least",
    "role_of",
]
