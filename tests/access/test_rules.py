"""Every REST route and every /acp method has an access rule, and docs/ shows them all.

A route added without a rule fails here (and is refused by the gate to everyone but
admins); ``docs/access-rules.md`` is regenerated with ``python -m serve.access.rules``.
"""

from __future__ import annotations

from pathlib import Path

from quart_trio import QuartTrio

from serve.access.rules import (
    ACP_RULES,
    CONNECTION,
    OWNER,
    ROUTE_RULES,
    RULES,
    WORKSPACE,
    canonical,
    markdown,
)
from serve.acpfront.dispatch import METHODS
from serve.http import capabilities
from serve.http.access import needs
from serve.http.app import collect_features, create_app
from serve.runtime.build import build_host
from serve.settings import parse_settings

ROOT = Path(__file__).resolve().parents[2]


def _app(tmp_path: Path) -> QuartTrio:
    settings = parse_settings(
        ["--workspace", str(tmp_path), "--enable-session-shell"], {"HOME": str(tmp_path)}
    )
    return create_app(build_host(settings)[0])


def _routes(tmp_path: Path) -> set[tuple[str, str]]:
    app = _app(tmp_path)
    out = set()
    for rule in app.url_map.iter_rules():
        for method in rule.methods or ():
            if method not in ("HEAD", "OPTIONS"):
                out.add(("WS" if rule.websocket else method, canonical(rule.rule)))
    return out


def test_every_route_has_a_rule(tmp_path: Path) -> None:
    missing = sorted(_routes(tmp_path) - set(ROUTE_RULES))
    assert not missing, f"routes without an access rule (serve/access/rules.py): {missing}"


def test_every_rule_names_a_route(tmp_path: Path) -> None:
    stale = sorted(set(ROUTE_RULES) - _routes(tmp_path))
    assert not stale, f"rules for routes that do not exist: {stale}"


def test_the_gate_resolves_every_route_once(tmp_path: Path) -> None:
    """The gate's table (built at install) is the rules table for every route of the app,
    the %2F-encoded twins and the WebSockets included."""
    known = needs(_app(tmp_path))
    resolved = {
        (method, canonical(rule))
        for (method, rule), need in known.items()
        if need and method != "HEAD"
    }
    assert resolved == _routes(tmp_path)
    # A HEAD needs what its GET needs (the table names GETs only).
    heads = {rule: need for (method, rule), need in known.items() if method == "HEAD"}
    assert heads and all(need == known[("GET", rule)] for rule, need in heads.items())
    assert known[("PUT", "/session/<session_id>/members")] == OWNER
    assert known[("GET", "/workspaces//<path:workspace>/file")] == WORKSPACE
    assert known[("WS", "/acp")] == CONNECTION


def test_every_acp_method_has_a_rule() -> None:
    missing = sorted(set(METHODS) - set(ACP_RULES))
    assert not missing, f"ACP methods without an access rule: {missing}"
    assert set(ACP_RULES) - set(METHODS) <= {"initialize"}


def test_rules_are_known_words() -> None:
    assert set(ROUTE_RULES.values()) | set(ACP_RULES.values()) <= set(RULES)


def test_the_document_is_the_table() -> None:
    assert (ROOT / "docs" / "access-rules.md").read_text() == markdown(), (
        "docs/access-rules.md is stale: python -m serve.access.rules > docs/access-rules.md"
    )


def test_the_tag_is_advertised_only_when_configured(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text("[]")
    features = collect_features()
    on = build_host(
        parse_settings(
            [
                "--workspace",
                str(tmp_path),
                "--token",
                "t0123456",
                "--auth-tokens-file",
                str(tokens),
            ],
            {"HOME": str(tmp_path)},
        )
    )[0]
    off = build_host(parse_settings(["--workspace", str(tmp_path)], {"HOME": str(tmp_path)}))[0]
    shown = {f.tag: f for f in capabilities.advertised(on, features)}
    assert shown["multi_user_auth"].modes == ("jwt", "tokens")
    assert capabilities.envelope_for(on, features, None)["auth"] == {"modes": ["tokens"]}
    assert "multi_user_auth" not in {f.tag for f in capabilities.advertised(off, features)}
    # Without the flags the envelope is exactly what it was: no principal, no auth block.
    assert capabilities.envelope_for(off, features, None) == capabilities.envelope(off, features)
