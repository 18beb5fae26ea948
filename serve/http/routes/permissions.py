"""``GET /workspace/permissions``: the Host's effective grants and approval policy (read-only).

The body comes from :meth:`serve.permissions.effects.EffectGate.describe`: ``{v,
workspaceCwd, policy {permissionStrategy, consensusQuorum, permissionResponseTimeoutMs},
grants {defaults, agents, sessions}, approval {default, tools, capabilities, risks}, verdictOrder,
alwaysAllow {ttlMs, entries}, agentApprovals {windowMs, usesPerApproval, entries},
decisions {auto, prompted, denied, allowedByCache, allowedByAgentApproval, rejected,
cancelled}, sessions [{sessionId, agent, approvalMode, grants, approval, fingerprint}]}``;
``decisions`` counts since start-up, ``sessions`` covers the live sessions of the primary
workspace. With multi-user auth a caller who is not ``admin`` sees only the sessions he
holds a role on, and ``decisions``, ``alwaysAllow.entries``, ``agentApprovals.entries`` and
``grants.sessions`` count only those (nothing of another user's activity). Grants show
capability keys and scopes only; secrets appear as ``secret.bind:<NAME>`` keys, never
values. A present ``X-Qwen-Client-Id`` must be registered on a live session (``400
invalid_client_id``). Nothing is started and nothing is written; ``Cache-Control:
no-store``.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from serve.http.access import usable, visible
from serve.http.addressing import check_workspace_client
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.routes.sessions import header_client_id
from serve.http.wire import json_response

blueprint = Blueprint("workspace_permissions", __name__)

NO_STORE = {"Cache-Control": "no-store"}

FEATURES: tuple[Feature, ...] = (
    Feature("workspace_permissions", (("GET", "/workspace/permissions"),)),
)


@blueprint.get("/workspace/permissions")
async def workspace_permissions() -> Response:
    d = daemon()
    check_workspace_client(d, header_client_id())
    body = d.effects.describe(usable(d.settings.primary_workspace))
    show = visible()
    if show is not None:  # multi-user: only what concerns sessions the caller may see
        allowed = {s.session_id for s in d.registry.live() if show(s)}
        _only(body, allowed)
        # The counters and table sizes are the caller's sessions', not the daemon's.
        effects = d.effects
        body["decisions"] = effects.counters.of(allowed)
        body["alwaysAllow"]["entries"] = effects.cache.count_of(allowed)
        body["agentApprovals"]["entries"] = effects.agent_approvals.count_of(allowed)
        sessions = body["grants"]["sessions"]
        body["grants"]["sessions"] = {k: v for k, v in sessions.items() if k in allowed}
    return json_response(body, headers=NO_STORE)


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    """Drop every entry naming a session outside ``allowed`` (lists of objects with a
    ``sessionId``, at any depth)."""
    for key, value in list(body.items()):
        if isinstance(value, dict):
            _only(value, allowed)
        elif isinstance(value, list):
            body[key] = [
                v
                for v in value
                if not (isinstance(v, dict) and "sessionId" in v and v["sessionId"] not in allowed)
            ]
