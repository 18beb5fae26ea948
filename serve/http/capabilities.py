"""Capability tags: every feature tag, its version, its modes, its routes.

"Tag present means behaviour present." Each :class:`Feature` names the routes that carry
it (method + Quart rule) and, for conditional tags, a predicate over the Host
(``--require-auth``, ``--allow-origin``, ...). Each route module exports the features it
serves as ``FEATURES``; the app collects them once (:func:`collect`) into the feature list
of that app. ``GET /capabilities`` advertises exactly the features whose predicate holds; a
test walks the list and fails when a tag's route is not registered in the app, or a
registered API route belongs to no tag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from serve.access.principal import OPERATOR, Principal
from serve.http.forks import capabilities_agents

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from serve.host import Host

PROTOCOL_VERSIONS = {"current": "v1", "supported": ["v1"]}


class Feature(msgspec.Struct, frozen=True):
    tag: str
    routes: tuple[tuple[str, str], ...]
    since: str = "v1"
    modes: tuple[str, ...] | None = None
    when: Callable[[Host], bool] | None = None

    def enabled(self, host: Host) -> bool:
        return self.when is None or self.when(host)


#: The app's own tags (the routes of :mod:`serve.http.routes.health`).
BASE_FEATURES: tuple[Feature, ...] = (
    Feature("health", (("GET", "/health"),)),
    Feature("capabilities", (("GET", "/capabilities"),)),
)


def collect(*groups: Iterable[Feature]) -> tuple[Feature, ...]:
    """The groups joined in order; a tag given twice is a bug (``ValueError``)."""
    out: list[Feature] = []
    known: set[str] = set()
    for group in groups:
        for feature in group:
            if feature.tag in known:
                raise ValueError(f"duplicate capability tag {feature.tag!r}")
            out.append(feature)
            known.add(feature.tag)
    return tuple(out)


def advertised(host: Host, features: Sequence[Feature]) -> list[Feature]:
    return [f for f in features if f.enabled(host)]


def envelope_for(
    host: Host, features: Sequence[Feature], principal: Principal | None
) -> dict[str, Any]:
    """:func:`envelope`, and with multi-user auth who the caller is (``principal``: its
    id, kind and daemon roles) and how principals are made here (``auth.modes``)."""
    body = envelope(host, features)
    if host.multi_user:
        body["principal"] = (principal or OPERATOR).describe()
        body["auth"] = {"modes": list(host.settings.auth.modes())}
    return body


def envelope(host: Host, features: Sequence[Feature]) -> dict[str, Any]:
    """The ``GET /capabilities`` body (qwen-serve-spec §8.2)."""
    shown = advertised(host, features)
    settings = host.settings
    return {
        "v": 1,
        "protocolVersions": PROTOCOL_VERSIONS,
        "mode": "http-bridge",
        "features": [f.tag for f in shown],
        "featureDetails": {
            f.tag: {"since": f.since, **({"modes": list(f.modes)} if f.modes else {})}
            for f in shown
        },
        "sessionLiveStatePollIntervalMs": 5000,
        "modelServices": [],
        "workspaceCwd": settings.primary_workspace,
        "transports": ["rest"],
        "policy": {"permission": host.permission_policy},
        "limits": {
            "maxPendingPromptsPerSession": settings.max_pending_prompts_per_session or None,
            "sessionRestoreTimeoutMs": settings.session_restore_timeout_ms,
            "maxSessionsPerWorkspace": settings.max_sessions or None,
            "maxTotalSessions": settings.max_total_sessions or None,
        },
        "workspaces": host.workspace_descriptors(),
        # per workspace: its agent and whether it can fork (serve/http/forks.py)
        "agents": capabilities_agents(host),
    }
