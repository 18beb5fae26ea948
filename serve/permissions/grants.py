"""Host capability grants: which effect classes the daemon lets an agent request at all.

Theory of operation
-------------------
A capability is a Host-owned effect class (``fs.read``, ``fs.write``, ``terminal.exec``,
``secret.bind:<ENV>``, ``mcp.connect:<server>``...). Grants come from the ``capabilities:``
config section and are flattened per (agent, session) into an ``EffectiveGrants`` table by
``resolve_grants``; layers apply in the order built-in/``defaults`` < ``agents[name]`` <
``sessions[id]``, each replacing the previous layer's entry key by key. A ``false`` entry is
a *revocation marker*: it stays in the table so an exact revocation also beats a wildcard.

``EffectiveGrants.check(capability, in_workspace=...)`` resolves one concrete capability:

1. an exact key wins (grant or revocation);
2. ``secret.bind:<ENV>`` stops here: only an exact key grants a secret, a wildcard never
   does (``secret.bind:*``, ``secret.*`` and ``*`` are all ignored for secrets);
3. otherwise the longest matching prefix wildcard (``mcp.connect:*``, ``fs.*``, ``*``) wins;
4. the matched grant's scope must cover the target: ``any`` covers everything,
   ``workspace`` and ``core`` only targets inside the workspace.

A capability is not an approval: a granted effect still goes through ``approval.decide``.
Everything here is pure and immutable; the table is safe to share between tasks.
"""

from __future__ import annotations

import msgspec

from serve.permissions.config import (
    BUILTIN_DEFAULT_GRANTS,
    CapabilitiesConfig,
    GrantConfig,
    GrantValue,
    Scope,
)

__all__ = ["SECRET_PREFIX", "EffectiveGrants", "GrantCheck", "resolve_grants"]

SECRET_PREFIX = "secret.bind:"


class GrantCheck(msgspec.Struct, frozen=True):
    """The answer for one capability: granted or not, by which key, and why."""

    capability: str
    granted: bool
    key: str | None  # the config key that decided (exact or wildcard), None if none matched
    scope: Scope | None
    reason: str


class EffectiveGrants(msgspec.Struct, frozen=True):
    """The flattened grant table for one (agent, session). ``None`` marks a revocation."""

    table: dict[str, Scope | None]

    def _match(self, capability: str) -> tuple[str | None, Scope | None]:
        if capability in self.table:
            return capability, self.table[capability]
        if capability.startswith(SECRET_PREFIX):
            return None, None
        best: str | None = None
        for key in self.table:
            if key.endswith("*") and capability.startswith(key[:-1]):
                if best is None or len(key) > len(best):
                    best = key
        return (best, self.table[best]) if best is not None else (None, None)

    def check(self, capability: str, *, in_workspace: bool = True) -> GrantCheck:
        """Is ``capability`` granted for a target inside (or outside) the workspace?

        Raises ``ValueError`` if ``capability`` is a wildcard (a caller bug: effects always
        name one concrete capability).
        """
        if not capability or capability.endswith("*"):
            raise ValueError(f"check() needs a concrete capability, got {capability!r}")
        key, scope = self._match(capability)
        if key is None:
            why = (
                f"{capability} needs an exact '{capability}' grant (wildcards never grant secrets)"
                if capability.startswith(SECRET_PREFIX)
                else f"{capability} is not granted"
            )
            return GrantCheck(capability, False, None, None, why)
        if scope is None:
            return GrantCheck(capability, False, key, None, f"{capability} is revoked by {key!r}")
        if not in_workspace and scope != "any":
            return GrantCheck(
                capability,
                False,
                key,
                scope,
                f"{capability} is granted only inside the workspace ({key!r} scope {scope})",
            )
        return GrantCheck(capability, True, key, scope, f"{capability} granted by {key!r}")

    def to_public(self) -> dict[str, object]:
        """JSON-ready view for ``GET /workspace/permissions`` (names only, no secret values)."""
        return {
            key: ({"scope": scope} if scope is not None else "revoked")
            for key, scope in sorted(self.table.items())
        }


def _apply(table: dict[str, Scope | None], layer: dict[str, GrantValue]) -> None:
    for key, value in layer.items():
        if value is False:
            table[key] = None
        elif isinstance(value, GrantConfig):
            table[key] = value.scope
        else:  # None or True: the default grant
            table[key] = "workspace"


def resolve_grants(
    cfg: CapabilitiesConfig, *, agent: str | None = None, session_id: str | None = None
) -> EffectiveGrants:
    """Flatten ``cfg`` for one agent and session (either may be ``None``)."""
    table: dict[str, Scope | None] = {}
    _apply(table, cfg.defaults if cfg.defaults is not None else BUILTIN_DEFAULT_GRANTS)
    if agent is not None and agent in cfg.agents:
        _apply(table, cfg.agents[agent])
    if session_id is not None and session_id in cfg.sessions:
        _apply(table, cfg.sessions[session_id])
    return EffectiveGrants(table=table)
