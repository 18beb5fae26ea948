"""The strict mutation gate: the declared list of routes that need a configured token.

Spec §3.5; the seed's semantics, which are stricter than qwen serve
0.24.4: there is no "trusted loopback" exception.

Theory of operation
-------------------
Some routes change the workspace on disk, the daemon's runtime posture or a session's
authority: file write/edit, approval mode, workspace init, tool toggles, MCP restart and
runtime MCP add/remove, the device-flow routes, the session shell, session metadata, and
workspace settings/memory writes. On a daemon started *without* a bearer token they are
refused, even on loopback, with ``401`` :data:`TOKEN_REQUIRED_BODY`, before the handler
runs (so nothing is changed on disk or in a session). On a daemon *with* a token the global
bearer middleware has already authenticated the request, so the gate passes
(:func:`strict_gate_allows`). With ``--require-auth`` the global middleware answers the
uniform ``Unauthorized`` first, so callers never see ``token_required`` there.

:data:`STRICT_ROUTES` is the single declared list; the middleware asks :func:`is_strict`
with the request method and the *matched Quart rule* (``request.url_rule.rule``), and tests
walk the list. Rule comparison ignores converter and parameter names (``<id>``,
``<string:sid>`` and ``<sessionId>`` are the same segment) and a trailing slash, so renaming
a path parameter cannot silently drop a route from the gate. ``HEAD`` is gated like ``GET``.
"""

from __future__ import annotations

import re

import msgspec

from serve.http.security._wire import ErrorBody

__all__ = [
    "APPROVAL_MODE_ROUTE",
    "STRICT_ROUTES",
    "TOKEN_REQUIRED_BODY",
    "TOKEN_REQUIRED_CODE",
    "StrictRoute",
    "approval_mode_change_allowed",
    "is_strict",
    "strict_gate_allows",
]

TOKEN_REQUIRED_CODE = "token_required"
TOKEN_REQUIRED_BODY = ErrorBody(
    error=(
        "This route requires the daemon to be configured with a bearer token. "
        "Set QWEN_SERVER_TOKEN or pass --token to enable bearer auth."
    ),
    code=TOKEN_REQUIRED_CODE,
)


class StrictRoute(msgspec.Struct, frozen=True):
    """One gated route: HTTP method, Quart rule string, and what it is (for docs/tests)."""

    method: str
    rule: str
    what: str


STRICT_ROUTES: tuple[StrictRoute, ...] = (
    StrictRoute("POST", "/file/write", "workspace file write"),
    StrictRoute("POST", "/file/edit", "workspace file edit"),
    StrictRoute("POST", "/session/<id>/approval-mode", "session approval mode"),
    StrictRoute("POST", "/workspace/init", "workspace init"),
    StrictRoute("POST", "/workspace/tools/<name>/enable", "tool toggle"),
    StrictRoute("POST", "/workspace/mcp/<server>/restart", "MCP server restart"),
    StrictRoute("POST", "/workspace/mcp/servers", "runtime MCP server add"),
    StrictRoute("DELETE", "/workspace/mcp/servers/<name>", "runtime MCP server remove"),
    StrictRoute("POST", "/workspace/auth/device-flow", "device-flow start"),
    StrictRoute("GET", "/workspace/auth/device-flow/<id>", "device-flow read"),
    StrictRoute("DELETE", "/workspace/auth/device-flow/<id>", "device-flow cancel"),
    StrictRoute("POST", "/session/<id>/shell", "session shell"),
    StrictRoute("PATCH", "/session/<id>/metadata", "session metadata"),
    StrictRoute("POST", "/workspace/settings", "workspace settings write"),
    StrictRoute("POST", "/workspace/memory", "workspace memory write"),
    StrictRoute("POST", "/workspace/reload", "workspace reload"),
    StrictRoute("POST", "/session/<id>/rewind", "session rewind"),
    StrictRoute("POST", "/daemon/bind", "late binding"),
    StrictRoute("POST", "/daemon/drain", "drain before suspend"),
    StrictRoute("PATCH", "/session/<id>/budget", "session budget"),
    StrictRoute("POST", "/webhooks", "webhook subscribe (the daemon calls the URL)"),
    StrictRoute("DELETE", "/webhooks/<id>", "webhook unsubscribe"),
)

_PARAM = re.compile(r"<[^<>]*>")


def _shape(rule: str) -> str:
    """``/session/<string:sid>/shell/`` → ``/session/<>/shell``."""
    return _PARAM.sub("<>", rule.rstrip("/") or "/")


_STRICT_SHAPES: frozenset[tuple[str, str]] = frozenset(
    (route.method, _shape(route.rule)) for route in STRICT_ROUTES
)


def is_strict(method: str, rule: str) -> bool:
    """True iff ``method`` + matched Quart ``rule`` is a strict-gate route.

    A workspace-qualified form (``/workspaces/<workspace>/file/write``,
    ``/workspaces/<workspace>/init``) is strict exactly when its singular form is."""
    gated_method = "GET" if method == "HEAD" else method
    shape = _shape(rule)
    if (gated_method, shape) in _STRICT_SHAPES:
        return True
    for prefix in ("/workspaces//<>", "/workspaces/<>"):
        if shape.startswith(prefix + "/"):
            suffix = shape[len(prefix) :]
            return (gated_method, suffix) in _STRICT_SHAPES or (
                gated_method,
                "/workspace" + suffix,
            ) in _STRICT_SHAPES
    return False


#: The gate of every approval-mode change, whatever path asks for it: this route, and the
#: paths that change the mode besides (``POST /session {approvalMode}``, ``/acp``
#: ``session/new {approvalMode}``, ``session/set_mode``, ``session/set_config_option
#: {configId: "mode"}``) ask :func:`approval_mode_change_allowed`.
APPROVAL_MODE_ROUTE = ("POST", "/session/<id>/approval-mode")


def approval_mode_change_allowed(*, token_configured: bool) -> bool:
    """The one rule for changing a session's approval mode: as its REST route."""
    return not is_strict(*APPROVAL_MODE_ROUTE) or strict_gate_allows(
        token_configured=token_configured
    )


def strict_gate_allows(*, token_configured: bool) -> bool:
    """Seed semantics: a strict route proceeds iff the daemon has a bearer token.

    (When it has one, the global bearer middleware has already rejected unauthenticated
    requests, so reaching the gate means the caller presented the token.)
    """
    return token_configured
