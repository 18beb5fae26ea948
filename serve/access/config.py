"""The ``access:`` section of the daemon config file, and who may use a workspace.

``adminGroups``    groups (a JWT's groups claim, a scoped token's roles do not need it)
                   whose members get the daemon role ``admin`` (default ``[admin]``);
``sessionGroups``  ``{group: observer | collaborator}``: a role on every session of the
                   workspaces the member may use;
``workspaces``     ``{<absolute path>: [<principal id> | group:<name>, ...]}``: a listed
                   workspace is used only by those principals (and admins); one not listed
                   is open to every authenticated principal.

:func:`role_in` is what every gate asks of a session: the principal's role on it, or None
when it holds none or may not use the session's workspace (the session is then not
disclosed: ``404``).
"""

from __future__ import annotations

import os
from typing import Literal

import msgspec

from serve.access.principal import Principal
from serve.access.roles import SessionAccess, role_of

__all__ = ["AccessConfig", "may_use", "role_in"]


class AccessConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    admin_groups: tuple[str, ...] = ("admin",)
    session_groups: dict[str, Literal["observer", "collaborator"]] = {}
    workspaces: dict[str, tuple[str, ...]] = {}

    def __post_init__(self) -> None:
        """``workspaces`` keyed by normalized paths, once (a path written as normalized
        wins over another spelling of it), so :func:`may_use` is one lookup."""
        listed = self.workspaces
        normal = {path: grants for path, grants in listed.items() if os.path.normpath(path) == path}
        for path, grants in listed.items():
            normal.setdefault(os.path.normpath(path), grants)
        msgspec.structs.force_setattr(self, "workspaces", normal)


def may_use(config: AccessConfig, principal: Principal, workspace: str) -> bool:
    """Whether ``principal`` may use the workspace at ``workspace`` (a canonical path)."""
    if principal.admin or not config.workspaces:
        return True
    grants = config.workspaces.get(workspace)
    if grants is None:
        return True
    return principal.id in grants or any(f"group:{g}" in grants for g in principal.groups)


def role_in(
    config: AccessConfig, principal: Principal, access: SessionAccess, workspace: str
) -> str | None:
    """The principal's role on a session (its ``access`` record, in ``workspace``), with
    the config's group rules; None when it has none or may not use the workspace."""
    role = role_of(access, principal, config.session_groups)
    return role if role is not None and may_use(config, principal, workspace) else None
