"""The strict mutation gate's declared route list."""

from __future__ import annotations

import pytest

from serve.http.security.strict import (
    STRICT_ROUTES,
    TOKEN_REQUIRED_BODY,
    is_strict,
    strict_gate_allows,
)

# Issue 5 item 3, one entry per gated route (method, Quart rule).
EXPECTED = {
    ("POST", "/file/write"),
    ("POST", "/file/edit"),
    ("POST", "/session/<id>/approval-mode"),
    ("POST", "/workspace/init"),
    ("POST", "/workspace/tools/<name>/enable"),
    ("POST", "/workspace/mcp/<server>/restart"),
    ("POST", "/workspace/mcp/servers"),
    ("DELETE", "/workspace/mcp/servers/<name>"),
    ("POST", "/workspace/auth/device-flow"),
    ("GET", "/workspace/auth/device-flow/<id>"),
    ("DELETE", "/workspace/auth/device-flow/<id>"),
    ("POST", "/session/<id>/shell"),
    ("PATCH", "/session/<id>/metadata"),
    ("POST", "/workspace/settings"),
    ("POST", "/workspace/memory"),
    # Beyond the issue's list: strict in qwen serve 0.24.4 too.
    ("POST", "/workspace/reload"),
    ("POST", "/session/<id>/rewind"),
    # acp-serve's own: late binding and the drain before a suspend.
    ("POST", "/daemon/bind"),
    ("POST", "/daemon/drain"),
    # A session's token and cost budget (it decides what the session may spend).
    ("PATCH", "/session/<id>/budget"),
    # Webhook subscriptions (the daemon calls the URL a caller names).
    ("POST", "/webhooks"),
    ("DELETE", "/webhooks/<id>"),
}


def test_declared_list_is_the_issue_list_plus_reload_rewind_and_bind() -> None:
    declared = [(r.method, r.rule) for r in STRICT_ROUTES]
    assert len(declared) == len(set(declared))
    assert set(declared) == EXPECTED
    assert all(r.what for r in STRICT_ROUTES)


@pytest.mark.parametrize("route", STRICT_ROUTES, ids=lambda r: f"{r.method} {r.rule}")
def test_every_declared_route_is_strict(route: object) -> None:
    assert is_strict(route.method, route.rule)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "rule"),
    [
        ("POST", "/session/<string:session_id>/shell"),
        ("POST", "/session/<sessionId>/approval-mode"),
        ("PATCH", "/session/<path:x>/metadata/"),
        ("HEAD", "/workspace/auth/device-flow/<flow_id>"),
        ("DELETE", "/workspace/mcp/servers/<string:server_name>"),
        ("POST", "/file/write/"),
    ],
)
def test_parameter_names_and_converters_do_not_matter(method: str, rule: str) -> None:
    assert is_strict(method, rule)


@pytest.mark.parametrize(
    ("method", "rule"),
    [
        ("POST", "/session"),
        ("POST", "/session/<id>/prompt"),
        ("POST", "/session/<id>/cancel"),
        ("POST", "/session/<id>/load"),
        ("POST", "/session/<id>/model"),
        ("POST", "/session/<id>/heartbeat"),
        ("GET", "/session/<id>/events"),
        ("DELETE", "/session/<id>"),
        ("GET", "/session/<id>/approval-mode"),
        ("GET", "/workspace/settings"),
        ("GET", "/workspace/memory"),
        ("GET", "/workspace/mcp"),
        ("GET", "/file"),
        ("GET", "/file/write"),
        ("PUT", "/file/write"),
        ("post", "/file/write"),
        ("GET", "/workspace/auth/device-flow"),
        ("POST", "/workspace/auth/device-flow/<id>"),
        ("GET", "/workspace/auth/status"),
        ("GET", "/health"),
        ("GET", "/capabilities"),
        ("POST", "/permission/<request_id>"),
        ("POST", "/file/writes"),
        ("POST", "/file"),
    ],
)
def test_other_routes_are_not_strict(method: str, rule: str) -> None:
    assert not is_strict(method, rule)


def test_token_required_body() -> None:
    assert TOKEN_REQUIRED_BODY.encode() == (
        b'{"error":"This route requires the daemon to be configured with a bearer token. '
        b'Set QWEN_SERVER_TOKEN or pass --token to enable bearer auth.",'
        b'"code":"token_required"}'
    )


def test_gate_needs_a_configured_token() -> None:
    assert strict_gate_allows(token_configured=True)
    assert not strict_gate_allows(token_configured=False)
