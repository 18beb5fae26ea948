"""The ``access:`` section of the daemon config file, and who may use a workspace.

``adminGroups``    groups (a JWT's groups claim, a scoped token's roles do not need it)
                   whose members get the daemon role ``admin`` (default ``[admin]``);
``sessionGroups``  ``{group: observer | collaborator}``: a role on every session of the
                   workspaces the member may use;
``workspaces``     ``{<absolute path>: [<principal id> | group:<name>, ...]}``: a listed
                   workspace is used only by those principals (and admins); one not listed
                   is open to every authenticated principal.
"""

from __future__ import annotations

import os
from typing import Literal

import msgspec

from serve.access.principal import Principal

__all__ = ["AccessConfig", "may_use"]


class AccessConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    admin_groups: tuple[str, ...] = ("admin",)
    session_groups: dict[str, Literal["observer", "collaborator"]] = {}
    workspaces: dict[str, tuple[str, ...]] = {}


def may_use(config: AccessConfig, principal: Principal, workspace: str) -> bool:
    """Whether ``principal`` may use the workspace at ``workspace`` (a canonical path)."""
    if principal.admin or not config.workspaces:
        return True
    grants = config.workspaces.get(workspace)
    if grants is None:
        for path, listed in config.workspaces.items():
            if os.path.normpath(path) == workspace:
                grants = listed
                break
        else:
            return True
    return principal.id in grants or any(f"group:{g}" in grants for g in principal.groups)
