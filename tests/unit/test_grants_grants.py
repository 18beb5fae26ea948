"""Capability grants: exact keys, prefix wildcards, exact-only secrets, scopes, layering."""

from __future__ import annotations

import pytest

from serve.permissions.config import load_permissions_config
from serve.permissions.grants import EffectiveGrants, resolve_grants

SEED = """
capabilities:
  defaults:
    fs.read:
      scope: workspace
    terminal.exec:
      scope: workspace
    mcp.connect:*:
      scope: core
    mcp.call:*:
      scope: core
    secret.bind:GITHUB_TOKEN:
    secret.bind:*:
    secret.*:
"""


def grants(text: str) -> EffectiveGrants:
    return resolve_grants(load_permissions_config(text).capabilities)


@pytest.mark.parametrize(
    ("capability", "granted", "key"),
    [
        # the seed: prefix grants
        ("mcp.connect:docs", True, "mcp.connect:*"),
        ("mcp.call:docs", True, "mcp.call:*"),
        ("mcp.connect:other-server", True, "mcp.connect:*"),
        ("mcp.connect", False, None),  # the prefix includes the colon
        ("mcp.list:docs", False, None),
        # exact keys
        ("fs.read", True, "fs.read"),
        ("terminal.exec", True, "terminal.exec"),
        ("fs.write", False, None),  # the seed's defaults do not grant writes
        ("network.fetch", False, None),
        # the seed: secret.bind:<ENV> must be exact; secret.bind:* never grants
        ("secret.bind:GITHUB_TOKEN", True, "secret.bind:GITHUB_TOKEN"),
        ("secret.bind:AWS_SECRET_ACCESS_KEY", False, None),
        ("secret.bind:GITHUB_TOKEN_2", False, None),
        ("secret.bind:github_token", False, None),
    ],
)
def test_seed_prefix_grants_and_secret_exactness(
    capability: str, granted: bool, key: str | None
) -> None:
    chk = grants(SEED).check(capability)
    assert (chk.granted, chk.key) == (granted, key)
    if not granted and capability.startswith("secret.bind:"):
        assert "exact" in chk.reason


def test_star_grants_everything_but_secrets() -> None:
    g = grants("capabilities: {defaults: {'*': {scope: any}}}")
    assert g.check("fs.write").granted
    assert g.check("mcp.connect:x").granted
    assert not g.check("secret.bind:HOME").granted


def test_longest_wildcard_wins_and_exact_revocation_beats_wildcard() -> None:
    g = grants(
        "capabilities:\n  defaults:\n    fs.*: {scope: any}\n    fs.write: false\n"
        "    mcp.*: {scope: core}\n    mcp.connect:*: false\n"
    )
    assert g.check("fs.read", in_workspace=False).granted
    chk = g.check("fs.write")
    assert not chk.granted and "revoked" in chk.reason
    assert not g.check("mcp.connect:docs").granted  # longer wildcard (revoked) wins
    assert g.check("mcp.call:docs").granted


def test_builtin_defaults_when_no_defaults_section() -> None:
    g = grants("")
    assert g.table == {
        "fs.read": "workspace",
        "fs.write": "workspace",
        "terminal.exec": "workspace",
    }
    assert not g.check("network.fetch").granted


@pytest.mark.parametrize(
    ("scope", "in_workspace", "granted"),
    [
        ("workspace", True, True),
        ("workspace", False, False),
        ("core", True, True),
        ("core", False, False),
        ("any", True, True),
        ("any", False, True),
    ],
)
def test_scopes(scope: str, in_workspace: bool, granted: bool) -> None:
    g = grants(f"capabilities: {{defaults: {{fs.read: {{scope: {scope}}}}}}}")
    chk = g.check("fs.read", in_workspace=in_workspace)
    assert chk.granted == granted
    assert chk.scope == scope
    if not granted:
        assert "only inside the workspace" in chk.reason


LAYERED = """
capabilities:
  defaults:
    fs.read: {scope: workspace}
    fs.write: {scope: workspace}
  agents:
    reviewer:
      fs.write: false
      network.fetch:
  sessions:
    s-wide:
      fs.read: {scope: any}
    s-tight:
      fs.write: false
      network.fetch: false
"""


@pytest.mark.parametrize(
    ("agent", "session", "capability", "outside", "granted"),
    [
        (None, None, "fs.write", False, True),
        ("reviewer", None, "fs.write", False, False),  # agent override revokes
        ("reviewer", None, "network.fetch", False, True),  # agent override adds
        ("other", None, "network.fetch", False, False),
        (None, "s-wide", "fs.read", True, True),  # session override widens the scope
        (None, None, "fs.read", True, False),
        ("reviewer", "s-tight", "network.fetch", False, False),  # session beats agent
        (None, "unknown-session", "fs.write", False, True),
    ],
)
def test_layering_defaults_agent_session(
    agent: str | None, session: str | None, capability: str, outside: bool, granted: bool
) -> None:
    g = resolve_grants(
        load_permissions_config(LAYERED).capabilities, agent=agent, session_id=session
    )
    assert g.check(capability, in_workspace=not outside).granted == granted


def test_check_needs_a_concrete_capability() -> None:
    with pytest.raises(ValueError, match="concrete"):
        grants("").check("fs.*")
    with pytest.raises(ValueError, match="concrete"):
        grants("").check("")


def test_public_view_names_grants_without_values() -> None:
    g = grants(
        "capabilities: {defaults: {secret.bind:GH_TOKEN: null, fs.read: {scope: any}, x.y: false}}"
    )
    assert g.to_public() == {
        "fs.read": {"scope": "any"},
        "secret.bind:GH_TOKEN": {"scope": "workspace"},
        "x.y": "revoked",
    }
