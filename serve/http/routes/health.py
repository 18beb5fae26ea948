"""``GET /health`` and ``GET /capabilities``.

With multi-user auth, ``/health?deep=1`` shows its daemon-wide counts only to ``admin``
(a ``user``, or an anonymous caller on a loopback daemon, gets ``{"status":"ok"}``)."""

from __future__ import annotations

from quart import Blueprint, Response, request

from serve.http import capabilities
from serve.http.access import principal
from serve.http.context import daemon, features
from serve.http.wire import json_response, raw_json_response

blueprint = Blueprint("health", __name__)

_SHALLOW = b'{"status":"ok"}'


@blueprint.get("/health")
async def health() -> Response:
    deep = request.args.get("deep")
    if deep is None or deep not in ("", "1", "true"):
        return raw_json_response(_SHALLOW)
    host = daemon()
    if host.multi_user and not principal().admin:
        # Daemon-wide counts (sessions, permissions, clients) are for admins: a user or an
        # anonymous probe gets the plain answer.
        return raw_json_response(_SHALLOW)
    return json_response(host.deep_health())


@blueprint.get("/readyz")
async def readyz() -> Response:
    """Readiness for orchestrators: 503 while draining, starting, at capacity, while the
    primary workspace's agent keeps failing, or while the tokens file is unusable
    (``auth_tokens_file_unusable``: no token from it is accepted); workspaces whose agent
    is failing are listed (``agentsFailing``) when there are any, and those whose agent the
    file sandbox refused a path (``sandboxDenied``: reason ``agent_sandbox_denied`` for the
    primary)."""
    host = daemon()
    if host.tokens_file is not None:
        await host.tokens_file.refresh()  # (at most once a second, in a worker thread)
    ready, reason = host.readiness()
    failing = host.agents_failing()
    denied = host.sandbox_denials()
    who = principal()
    if host.multi_user and not who.admin:  # only the workspaces the caller may see
        shows = capabilities.shown_workspace(host, who)
        failing = [path for path in failing if shows(path)]
        denied = [d for d in denied if shows(d["workspaceCwd"])]
    extra: dict[str, object] = {"agentsFailing": failing} if failing else {}
    if denied:
        extra["sandboxDenied"] = denied  # the path, the flag that grants it, the message
    if ready:
        return json_response({"status": "ready", **extra})
    return json_response(
        {"status": "not_ready", "reason": reason, **extra}, 503, {"Retry-After": "5"}
    )


@blueprint.get("/capabilities")
async def get_capabilities() -> Response:
    return json_response(capabilities.envelope_for(daemon(), features(), principal()))
