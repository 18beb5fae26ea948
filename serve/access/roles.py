"""Session roles and a session's access record, pure.

:class:`SessionAccess` is the owner and the members of one session: the session actor
holds it (its own state, swapped whole by ``SetAccess``) and journals it in its meta's
``attrs`` (:func:`to_attr` / :func:`from_attr`), so ownership survives a daemon restart.
:func:`role_of` answers what a principal may do on it: an admin is ``owner`` of every
session, the owner ``owner``, a member its role, a member of a group the best of its
groups' roles (from the access record or the config's ``sessionGroups``), else nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from serve.access.principal import OPERATOR, Principal

__all__ = [
    "COLLABORATOR",
    "OBSERVER",
    "OWNER",
    "SESSION_ROLES",
    "SessionAccess",
    "at_least",
    "can_vote",
    "from_attr",
    "role_of",
    "to_attr",
]

OBSERVER = "observer"
COLLABORATOR = "collaborator"
OWNER = "owner"
#: Weakest first.
SESSION_ROLES = (OBSERVER, COLLABORATOR, OWNER)
_RANK = {role: rank for rank, role in enumerate(SESSION_ROLES)}
#: Most members one session may list.
MAX_MEMBERS = 256
ATTR = "access"


class SessionAccess(msgspec.Struct, frozen=True):
    """Who owns a session and who else holds a role on it (``group:<name>`` keys grant a
    group)."""

    owner: str = OPERATOR.id
    members: dict[str, str] = {}


def at_least(role: str | None, need: str) -> bool:
    return role is not None and _RANK[role] >= _RANK[need]


def role_of(
    access: SessionAccess, principal: Principal, group_roles: Mapping[str, str] | None = None
) -> str | None:
    """The principal's role on the session (None: none at all)."""
    if principal.admin or principal.id == access.owner:
        return OWNER
    best = access.members.get(principal.id)
    for group in principal.groups:
        for role in (access.members.get(f"group:{group}"), (group_roles or {}).get(group)):
            if role is not None and (best is None or _RANK[role] > _RANK[best]):
                best = role
    return best


def can_vote(
    access: SessionAccess, principal: Principal, group_roles: Mapping[str, str] | None = None
) -> bool:
    """Whether the principal's votes count on the session (collaborator or more; the
    operator and admins are owners)."""
    return at_least(role_of(access, principal, group_roles), COLLABORATOR)


def to_attr(access: SessionAccess) -> str:
    return msgspec.json.encode(access).decode()


def from_attr(attrs: Mapping[str, str]) -> SessionAccess | None:
    raw = attrs.get(ATTR)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=SessionAccess)
    except msgspec.DecodeError:
        return None
