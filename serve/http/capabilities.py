"""The capability registry: every feature tag, its version, its modes, its routes.

"Tag present means behaviour present." Each :class:`Feature` names the routes that carry
it (method + Quart rule) and, for conditional tags, a predicate over the running daemon
(``--require-auth``, ``--allow-origin``, ...). ``GET /capabilities`` advertises exactly the
features whose predicate holds; a test walks the registry and fails when a tag's route is
not registered in the app, or a registered API route belongs to no tag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon

PROTOCOL_VERSIONS = {"current": "v1", "supported": ["v1"]}


class Feature(msgspec.Struct, frozen=True):
    tag: str
    routes: tuple[tuple[str, str], ...]
    since: str = "v1"
    modes: tuple[str, ...] | None = None
    when: Callable[[Daemon], bool] | None = None

    def enabled(self, daemon: Daemon) -> bool:
        return self.when is None or self.when(daemon)


def _always(_: Daemon) -> bool:
    return True


FEATURES: list[Feature] = [
    Feature("health", (("GET", "/health"),)),
    Feature("capabilities", (("GET", "/capabilities"),)),
]


def register(*features: Feature) -> None:
    """Add features (route modules call this at import time)."""
    known = {f.tag for f in FEATURES}
    for feature in features:
        if feature.tag in known:
            raise ValueError(f"duplicate capability tag {feature.tag!r}")
        FEATURES.append(feature)
        known.add(feature.tag)


def advertised(daemon: Daemon) -> list[Feature]:
    return [f for f in FEATURES if f.enabled(daemon)]


def envelope(daemon: Daemon) -> dict[str, Any]:
    """The ``GET /capabilities`` body (qwen-serve-spec §8.2)."""
    features = advertised(daemon)
    settings = daemon.settings
    return {
        "v": 1,
        "protocolVersions": PROTOCOL_VERSIONS,
        "mode": "http-bridge",
        "features": [f.tag for f in features],
        "featureDetails": {
            f.tag: {"since": f.since, **({"modes": list(f.modes)} if f.modes else {})}
            for f in features
        },
        "sessionLiveStatePollIntervalMs": 5000,
        "modelServices": [],
        "workspaceCwd": settings.primary_workspace,
        "transports": ["rest"],
        "policy": {"permission": daemon.permission_policy},
        "limits": {
            "maxPendingPromptsPerSession": settings.max_pending_prompts_per_session or None,
            "sessionRestoreTimeoutMs": settings.session_restore_timeout_ms,
            "maxSessionsPerWorkspace": settings.max_sessions or None,
            "maxTotalSessions": settings.max_total_sessions or None,
        },
        "workspaces": daemon.workspace_descriptors(),
    }
