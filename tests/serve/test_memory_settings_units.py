"""Pure logic behind the memory, settings and reload routes (table-driven, no sockets)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from serve.config import load_config_text
from serve.workspaces.state.memory_file import MEMORY_SECTION_HEADER as H
from serve.workspaces.state.memory_file import compose_appended
from serve.workspaces.state.reload import plan_config_reload
from serve.workspaces.state.settings_edit import (
    REDACTED,
    SettingError,
    apply_update,
    changed_keys,
    parse_key,
    redact,
    restore_redacted,
    validate_known,
)

# ---- memory append ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("existing", "new", "expected"),
    [
        ("", "remember this", f"{H}\nremember this\n"),
        ("", "\n\nremember this\n\n", f"{H}\nremember this\n"),
        ("# Project\n", "fact", f"# Project\n\n{H}\nfact\n"),
        ("# Project", "fact", f"# Project\n\n{H}\nfact\n"),
        (f"# P\n\n{H}\n- one\n", "- two", f"# P\n\n{H}\n- one\n- two\n"),
        (f"# P\n\n{H}\n- one", "- two", f"# P\n\n{H}\n- one\n- two\n"),
        # the section ends at the next "## " heading: insert before it (qwen-code's spacing)
        (f"{H}\n- one\n## Other\nx\n", "- two", f"{H}\n- one\n- two\n\n## Other\nx\n"),
        # a "## " line inside a code fence is not a heading
        (
            f"{H}\n```\n## not a heading\n```\n",
            "- two",
            f"{H}\n```\n## not a heading\n```\n- two\n",
        ),
        ("anything", "\n\n", "anything"),
    ],
)
def test_compose_appended(existing: str, new: str, expected: str) -> None:
    assert compose_appended(existing, new) == expected


# ---- keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "segments"),
    [
        ("tools.disabled", ("tools", "disabled")),
        ("mcpServers", ("mcpServers",)),
        ("ui.theme-name", ("ui", "theme-name")),
        ("a.b.c.d.e.f.g.h", tuple("abcdefgh")),
    ],
)
def test_parse_key_accepts(key: str, segments: tuple[str, ...]) -> None:
    assert parse_key(key) == segments


@pytest.mark.parametrize(
    "key",
    [
        "",
        None,
        3,
        "tools..disabled",
        ".tools",
        "tools.",
        "a.__proto__",
        "constructor",
        "x y",
        "a.b.c.d.e.f.g.h.i",
        "k" * 300,
        "tools/disabled",
    ],
)
def test_parse_key_refuses(key: Any) -> None:
    with pytest.raises(SettingError) as info:
        parse_key(key)
    assert info.value.code == "invalid_setting"


# ---- updates ------------------------------------------------------------------------------


def test_apply_update_keeps_other_keys_and_their_order() -> None:
    doc = {"z": 1, "tools": {"other": True, "disabled": ["a"]}, "a": {"b": 2}}
    out = apply_update(doc, ("tools", "disabled"), ["x"])
    assert out == {"z": 1, "tools": {"other": True, "disabled": ["x"]}, "a": {"b": 2}}
    assert list(out) == ["z", "tools", "a"] and list(out["tools"]) == ["other", "disabled"]
    assert doc["tools"]["disabled"] == ["a"]  # the input is not modified
    assert apply_update({}, ("new", "deep", "key"), 1) == {"new": {"deep": {"key": 1}}}
    assert list(apply_update({"a": 1, "b": 2}, ("c",), 3)) == ["a", "b", "c"]


def test_apply_update_removal() -> None:
    doc = {"tools": {"disabled": ["a"], "x": 1}}
    assert apply_update(doc, ("tools", "disabled"), None, remove=True) == {"tools": {"x": 1}}
    assert apply_update(doc, ("nope", "deeper"), None, remove=True) == doc
    assert apply_update({"tools": "str"}, ("tools", "x"), None, remove=True) == {"tools": "str"}


def test_apply_update_through_a_non_object_names_it() -> None:
    with pytest.raises(SettingError) as info:
        apply_update({"tools": ["not", "an", "object"]}, ("tools", "disabled"), [])
    assert info.value.key == "tools"


@pytest.mark.parametrize(
    ("doc", "path", "bad_key"),
    [
        ({"tools": {"disabled": "shell"}}, ("tools", "disabled"), "tools.disabled"),
        ({"tools": {"disabled": ["ok", 3]}}, ("tools",), "tools.disabled"),
        ({"tools": {"disabled": [""]}}, ("tools", "disabled"), "tools.disabled"),
        ({"tools": {"approvalMode": "reckless"}}, ("tools", "approvalMode"), "tools.approvalMode"),
        ({"context": {"fileName": "../x.md"}}, ("context", "fileName"), "context.fileName"),
        ({"context": {"fileName": []}}, ("context",), "context.fileName"),
        ({"mcpServers": []}, ("mcpServers",), "mcpServers"),
        ({"mcpServers": {"a": 1}}, ("mcpServers",), "mcpServers.a"),
        ({"mcpServers": {"a": {}}}, ("mcpServers", "a"), "mcpServers.a"),
        ({"mcpServers": {"a": {"command": ""}}}, ("mcpServers",), "mcpServers.a.command"),
        (
            {"mcpServers": {"a": {"command": "x", "args": "-v"}}},
            ("mcpServers", "a", "args"),
            "mcpServers.a.args",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}},
            ("mcpServers",),
            "mcpServers.a.env",
        ),
        ({"mcpServers": {"a": {"url": "ftp://x"}}}, ("mcpServers",), "mcpServers.a.url"),
        (
            {"mcpServers": {"a": {"httpUrl": "https://x", "timeout": -1}}},
            ("mcpServers",),
            "mcpServers.a.timeout",
        ),
    ],
)
def test_validate_known_names_the_bad_key(
    doc: dict[str, Any], path: tuple[str, ...], bad_key: str
) -> None:
    with pytest.raises(SettingError) as info:
        validate_known(doc, path)
    assert info.value.key == bad_key and bad_key in info.value.message


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"tools": {"disabled": ["run_shell_command"], "approvalMode": "yolo"}}, ("tools",)),
        ({"context": {"fileName": "AGENTS.md"}}, ("context", "fileName")),
        ({"context": {"fileName": ["AGENTS.md", "QWEN.md"]}}, ("context",)),
        (
            {
                "mcpServers": {
                    "docs": {"command": "node", "args": ["d.js"], "env": {"K": "v"}, "x": 1},
                    "web": {"httpUrl": "https://mcp.example/mcp", "headers": {"A": "b"}},
                    "sse": {"url": "http://127.0.0.1:1/sse", "timeout": 5, "trust": True},
                }
            },
            ("mcpServers", "docs", "args"),
        ),
        # an unrelated broken known key is not this update's business
        ({"tools": {"disabled": "broken"}, "ui": {"theme": 3}}, ("ui", "theme")),
    ],
)
def test_validate_known_accepts(doc: dict[str, Any], path: tuple[str, ...]) -> None:
    validate_known(doc, path)


# ---- secrets ------------------------------------------------------------------------------

DOC = {
    "security": {"auth": {"apiKey": "sk-123", "selectedType": "openai"}},
    "mcpServers": {
        "docs": {"command": "node", "env": {"HOME_DIR": "/h", "TOKEN": "t"}},
        "web": {"httpUrl": "https://x", "headers": {"Authorization": "Bearer b"}},
    },
    "model": {"maxTokens": 5, "name": "m"},
}


def test_redact_hides_secret_names_and_every_mcp_env_and_header_value() -> None:
    out = redact(DOC)
    assert out["security"]["auth"] == {"apiKey": REDACTED, "selectedType": "openai"}
    assert out["mcpServers"]["docs"]["env"] == {"HOME_DIR": REDACTED, "TOKEN": REDACTED}
    assert out["mcpServers"]["web"]["headers"] == {"Authorization": REDACTED}
    assert out["mcpServers"]["docs"]["command"] == "node"
    assert out["model"] == {"maxTokens": 5, "name": "m"}
    assert redact(DOC["mcpServers"], ("mcpServers",)) == out["mcpServers"]
    assert DOC["security"]["auth"]["apiKey"] == "sk-123"


def test_restore_puts_stored_secrets_back() -> None:
    shown = redact(DOC["mcpServers"], ("mcpServers",))
    shown["docs"]["args"] = ["new.js"]
    restored = restore_redacted(shown, DOC["mcpServers"], ("mcpServers",))
    assert restored["docs"]["env"] == {"HOME_DIR": "/h", "TOKEN": "t"}
    assert restored["web"]["headers"] == {"Authorization": "Bearer b"}
    assert restored["docs"]["args"] == ["new.js"]


def test_restore_refuses_a_placeholder_with_nothing_behind_it() -> None:
    with pytest.raises(SettingError) as info:
        restore_redacted({"new": {"env": {"K": REDACTED}}}, DOC["mcpServers"], ("mcpServers",))
    assert info.value.key == "mcpServers.new.env.K"


# ---- reload diffs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "keys"),
    [
        ({}, {}, []),
        ({"a": 1}, {"a": 1}, []),
        ({}, {"tools": {"disabled": ["x"]}}, ["tools.disabled"]),
        ({"tools": {"disabled": ["x"], "y": 1}}, {"tools": {"y": 1}}, ["tools.disabled"]),
        ({"a": 1, "b": {"c": {"d": 1}}}, {"a": 2, "b": {"c": {"d": 2}}}, ["a", "b.c"]),
        ({"a": {"b": 1}}, {"a": 5}, ["a"]),
        ({"mcpServers": {"x": {}}}, {"mcpServers": {"y": {}}}, ["mcpServers.x", "mcpServers.y"]),
    ],
)
def test_changed_keys(old: dict[str, Any], new: dict[str, Any], keys: list[str]) -> None:
    assert changed_keys(old, new) == keys


def test_config_reload_keeps_the_running_policy() -> None:
    old = load_config_text("policy: {permissionStrategy: first-responder}\n")
    new = load_config_text(
        "policy: {permissionStrategy: consensus, consensusQuorum: 2}\n"
        "capabilities: {defaults: {fs.read: {scope: workspace}}}\n"
        "approval: {default: prompt}\n"
    )
    plan = plan_config_reload(old, new)
    assert plan.changed == ("config.policy", "config.capabilities", "config.approval")
    assert plan.restart_required == (
        "config.policy.permissionStrategy",
        "config.policy.consensusQuorum",
    )
    assert plan.config.policy == old.policy
    assert plan.config.capabilities == new.capabilities
    assert plan.config.approval == new.approval
    same = plan_config_reload(new, new)
    assert same.changed == () and same.restart_required == ()
    assert msgspec.to_builtins(same.config) == msgspec.to_builtins(new)
