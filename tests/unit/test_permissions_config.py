"""Loading the ``policy:``/``capabilities:``/``approval:`` config sections from YAML."""

from __future__ import annotations

import msgspec
import pytest

from serve.permissions.config import (
    ApprovalConfig,
    CapabilitiesConfig,
    ConfigError,
    GrantConfig,
    PermissionsConfig,
    PolicyConfig,
    config_warnings,
    decode_yaml,
    load_permissions_config,
    validate_capability_key,
)

SEED_EXAMPLE = """
policy:
  permissionStrategy: consensus
  consensusQuorum: 2
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
  agents:
    reviewer:
      fs.write: false
  sessions:
    sess-1:
      fs.write:
        scope: any
approval:
  default: null
  tools:
    terminal: prompt
  capabilities:
    fs.write: prompt
  risks:
    critical: deny
"""


def test_seed_example_loads_into_typed_structs() -> None:
    cfg = load_permissions_config(SEED_EXAMPLE, source="daemon.yaml")
    assert cfg.policy == PolicyConfig(permission_strategy="consensus", consensus_quorum=2)
    assert cfg.capabilities.defaults == {
        "fs.read": GrantConfig("workspace"),
        "terminal.exec": GrantConfig("workspace"),
        "mcp.connect:*": GrantConfig("core"),
        "mcp.call:*": GrantConfig("core"),
        "secret.bind:GITHUB_TOKEN": None,
    }
    assert cfg.capabilities.agents == {"reviewer": {"fs.write": False}}
    assert cfg.capabilities.sessions == {"sess-1": {"fs.write": GrantConfig("any")}}
    assert cfg.approval == ApprovalConfig(
        default=None,
        tools={"terminal": "prompt"},
        capabilities={"fs.write": "prompt"},
        risks={"critical": "deny"},
    )
    assert config_warnings(cfg) == []


@pytest.mark.parametrize("text", ["", "{}", "policy: {}\n", "# only a comment\n"])
def test_empty_config_gives_defaults(text: str) -> None:
    cfg = load_permissions_config(text)
    assert cfg == PermissionsConfig()
    assert cfg.policy.permission_strategy == "first-responder"
    assert cfg.capabilities.defaults is None  # built-in defaults apply
    assert cfg.approval.default is None


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("polcy: {}", "", "unknown field `polcy`"),
        ("policy: {permissionStrategy: majority}", "policy.permissionStrategy", "'majority'"),
        ("policy: {bogus: 1}", "policy", "unknown field `bogus`"),
        ("policy: {consensusQuorum: 0}", "policy.consensusQuorum", ">= 1"),
        ("policy: {consensusQuorum: two}", "policy.consensusQuorum", "Expected `int"),
        ("policy: {permission_strategy: consensus}", "policy", "`permission_strategy`"),
        (
            "capabilities: {defaults: {fs.read: {scope: everywhere}}}",
            "capabilities.defaults['fs.read'].scope",
            "'everywhere'",
        ),
        (
            "capabilities: {defaults: {fs.read: {scope: any, extra: 1}}}",
            "capabilities.defaults['fs.read']",
            "unknown field `extra`",
        ),
        (
            "capabilities: {defaults: {'Fs Read': null}}",
            "capabilities.defaults['Fs Read']",
            "not a capability key",
        ),
        (
            "capabilities: {defaults: {secret.bind:1BAD: null}}",
            "capabilities.defaults['secret.bind:1BAD']",
            "not a capability key",
        ),
        (
            "capabilities: {sessions: {s1: {fs.write: {scope: nowhere}}}}",
            "capabilities.sessions['s1']['fs.write'].scope",
            "'nowhere'",
        ),
        (
            "capabilities: {agents: {a: {fs.write: 3}}}",
            "capabilities.agents['a']['fs.write']",
            "Expected",
        ),
        ("capabilities: {slots: {}}", "capabilities", "unknown field `slots`"),
        ("capabilities: {defaults: [fs.read]}", "capabilities.defaults", "got `array`"),
        ("approval: {default: maybe}", "approval.default", "'maybe'"),
        ("approval: {tools: {terminal: ask}}", "approval.tools['terminal']", "'ask'"),
        ("approval: {risks: {extreme: deny}}", "approval.risks['extreme']", "invalid key"),
        (
            "approval: {capabilities: {'bad key': deny}}",
            "approval.capabilities['bad key']",
            "not a capability key",
        ),
        ("approval: {mode: yolo}", "approval", "unknown field `mode`"),
        ("- policy", "", "got `array`"),
    ],
)
def test_bad_config_names_the_key(text: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_permissions_config(text, source="daemon.yaml")
    err = info.value
    assert err.path == path
    assert fragment in err.message
    assert str(err).startswith("config daemon.yaml")


def test_invalid_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_permissions_config("policy: [", source="x.yaml")


def test_decode_yaml_is_reusable_for_an_enclosing_config() -> None:
    class Daemon(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        policy: PolicyConfig = PolicyConfig()
        restart: dict[str, int] = {}

    got = decode_yaml("restart: {session: 3}\npolicy: {permissionStrategy: local-only}", Daemon)
    assert got.policy.permission_strategy == "local-only"
    assert got.restart == {"session": 3}
    with pytest.raises(ConfigError) as info:
        decode_yaml("restart: {session: many}", Daemon, source="d.yaml")
    assert info.value.path == "restart['session']"


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("fs.read", True),
        ("terminal.exec", True),
        ("mcp.connect:docs", True),
        ("mcp.connect:*", True),
        ("tool.call:project_note", True),
        ("agents.run:core-1", True),
        ("mcp.*", True),
        ("*", True),
        ("secret.bind:GITHUB_TOKEN", True),
        ("secret.bind:*", True),
        ("secret.bind:1TOKEN", False),
        ("secret.bind:A-B", False),
        ("secret.bind:", False),
        ("fs..read", False),
        ("FS.read", False),
        ("fs read", False),
        ("fs.re*ad", False),
        ("", False),
    ],
)
def test_capability_key_syntax(key: str, ok: bool) -> None:
    if ok:
        validate_capability_key(key)
    else:
        with pytest.raises(ValueError, match="not a capability key"):
            validate_capability_key(key)


def test_warnings_for_inert_settings() -> None:
    cfg = load_permissions_config(
        "policy: {consensusQuorum: 2}\n"
        "capabilities:\n  defaults:\n    secret.bind:*:\n  agents:\n    a: {secret.bind*: {}}\n"
    )
    warnings = config_warnings(cfg)
    assert len(warnings) == 3
    assert "consensusQuorum" in warnings[0]
    assert "never grants a secret" in warnings[1] and "defaults" in warnings[1]
    assert "agents['a']" in warnings[2]


def test_structs_are_frozen() -> None:
    cfg = load_permissions_config("policy: {permissionStrategy: designated}")
    with pytest.raises(AttributeError):
        cfg.policy.permission_strategy = "consensus"  # type: ignore[misc]
    assert CapabilitiesConfig().agents == {}
