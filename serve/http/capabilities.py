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

from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

import msgspec

from serve.access.config import may_use
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


class SharedPredicate:
    """A tag predicate that shares one pass over the daemon's state with its siblings:
    ``key in compute(host)``. :class:`Advertiser` runs each ``compute`` once per body, so
    ten tags that each need a walk over the live sessions cost one walk."""

    __slots__ = ("compute", "key")

    def __init__(self, compute: Callable[[Host], Container[str]], key: str) -> None:
        self.compute = compute
        self.key = key

    def __call__(self, host: Host) -> bool:
        return self.key in self.compute(host)


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
    return Advertiser(features).envelope(host, principal)


def envelope(host: Host, features: Sequence[Feature]) -> dict[str, Any]:
    """The ``GET /capabilities`` body (qwen-serve-spec §8.2); with multi-user auth, as the
    operator sees it."""
    return Advertiser(features).envelope(host)


class _Shown:
    """One combination of the conditional tags: the tags, their details, both encoded."""

    __slots__ = ("details", "encoded_details", "encoded_tags", "key", "tags")

    def __init__(self, key: object, tags: list[str], details: dict[str, dict[str, Any]]):
        self.key = key
        self.tags = tags
        self.details = details
        self.encoded_tags = msgspec.Raw(msgspec.json.encode(tags))
        self.encoded_details = msgspec.Raw(msgspec.json.encode(details))


class Advertiser:
    """The ``GET /capabilities`` body of one app's features, with what cannot change built
    once: the tag list and the ``featureDetails`` for each combination of the conditional
    tags' predicates (the last one kept; it changes only when a conditional tag flips).
    A request evaluates only those predicates (:class:`SharedPredicate` ones once per
    group); the body is the same as :func:`envelope`'s. :meth:`body` encodes it with the
    tag list and details kept encoded (``msgspec.Raw``: about 80 % of the bytes), so only
    the parts that can change are encoded per request. The lists and dicts
    :meth:`envelope` returns are shared between bodies: they are only encoded, never
    changed."""

    def __init__(self, features: Sequence[Feature]) -> None:
        self._features = tuple(features)
        conditional = [f.when for f in self._features if f.when is not None]
        self._plain = tuple(w for w in conditional if not isinstance(w, SharedPredicate))
        shared = [w for w in conditional if isinstance(w, SharedPredicate)]
        self._groups = tuple(dict.fromkeys(w.compute for w in shared))
        self._shared = tuple((self._groups.index(w.compute), w.key) for w in shared)
        self._last: _Shown | None = None

    def tags(self, host: Host) -> _Shown:
        """The advertised tags and their ``featureDetails``."""
        plain = [bool(when(host)) for when in self._plain]
        found = [compute(host) for compute in self._groups]
        shared = [key in found[group] for group, key in self._shared]
        last = self._last
        if last is not None and last.key == (plain, shared):
            return last
        flags = {}
        plain_flags, shared_flags = iter(plain), iter(shared)
        for f in self._features:
            if f.when is not None:
                flags[f.tag] = next(
                    shared_flags if isinstance(f.when, SharedPredicate) else plain_flags
                )
        shown = [f for f in self._features if flags.get(f.tag, True)]
        tags = [f.tag for f in shown]
        details = {
            f.tag: {"since": f.since, **({"modes": list(f.modes)} if f.modes else {})}
            for f in shown
        }
        self._last = _Shown((plain, shared), tags, details)
        return self._last

    def body(self, host: Host, principal: Principal | None = None) -> bytes:
        """The encoded :meth:`envelope`."""
        return msgspec.json.encode(self._envelope(host, principal, raw=True))

    def envelope(self, host: Host, principal: Principal | None = None) -> dict[str, Any]:
        """The body; with multi-user auth also the caller (``principal``, the operator
        when None) and the auth modes."""
        return self._envelope(host, principal, raw=False)

    def _envelope(self, host: Host, principal: Principal | None, *, raw: bool) -> dict[str, Any]:
        shown = self.tags(host)
        settings = host.settings
        body: dict[str, Any] = {
            "v": 1,
            "protocolVersions": PROTOCOL_VERSIONS,
            "mode": "http-bridge",
            "features": shown.encoded_tags if raw else shown.tags,
            "featureDetails": shown.encoded_details if raw else shown.details,
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
        if host.multi_user:
            who = principal or OPERATOR
            body["principal"] = who.describe()
            body["auth"] = {"modes": list(host.settings.auth.modes())}
            if not who.admin:  # a restricted workspace is not listed to who may not use it
                shows = shown_workspace(host, who)
                body["workspaces"] = [w for w in body["workspaces"] if shows(w["cwd"])]
                body["agents"] = [a for a in body["agents"] if shows(a["workspaceCwd"])]
        return body


def shown_workspace(host: Host, who: Principal) -> Callable[[str], bool]:
    """Whether a served workspace is shown to ``who`` (multi-user auth): the primary one
    (every answer names it), and those he may use."""
    config, primary = host.config.access, host.settings.primary_workspace
    return lambda path: path == primary or may_use(config, who, path)
