"""Workspace MCP settings → typed server entries, and the ACP hand-out shape."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from serve.mcp.config import (
    McpConfig,
    acp_server,
    expand_vars,
    load_config,
    parse_settings,
    strip_json_comments,
)

WS = "/work/proj"


def parse(doc: Any, environ: dict[str, str] | None = None) -> McpConfig:
    return parse_settings(json.dumps(doc).encode(), WS, environ or {})


def test_declaration_order_and_transports() -> None:
    config = parse(
        {
            "mcpServers": {
                "zeta": {"command": "node", "args": ["z.js"]},
                "alpha": {"httpUrl": "https://h.example/mcp"},
                "mid": {"url": "https://s.example/sse"},
                "typed": {"url": "https://t.example/mcp", "type": "http"},
            }
        }
    )
    assert [(s.name, s.transport) for s in config.servers] == [
        ("zeta", "stdio"),
        ("alpha", "http"),
        ("mid", "sse"),
        ("typed", "http"),
    ]
    assert config.error is None
    assert all(s.usable for s in config.servers)


def test_stdio_fields_env_expansion_and_cwd() -> None:
    config = parse(
        {
            "mcpServers": {
                "docs": {
                    "command": "$BIN/docs",
                    "args": ["--root", "${HOME}/x", "$UNKNOWN"],
                    "env": {"TOKEN": "${SECRET}", "N": 3},
                    "cwd": "tools",
                    "description": "Docs",
                }
            }
        },
        {"BIN": "/opt/bin", "HOME": "/home/u", "SECRET": "s3"},
    )
    (docs,) = config.servers
    assert docs.command == "/opt/bin/docs"
    assert docs.args == ("--root", "/home/u/x", "$UNKNOWN")
    assert docs.env == (("TOKEN", "s3"), ("N", "3"))
    assert docs.cwd == os.path.join(WS, "tools")
    assert docs.description == "Docs"


def test_default_cwd_is_the_workspace() -> None:
    (server,) = parse({"mcpServers": {"a": {"command": "x"}}}).servers
    assert server.cwd == WS


@pytest.mark.parametrize(
    ("doc", "disabled"),
    [
        ({"disabledMcpServers": ["a"]}, {"a"}),
        ({"mcp": {"excluded": ["b"]}}, {"b"}),
        ({"mcp": {"allowed": ["a"]}}, {"b", "c"}),
        ({}, {"c"}),
    ],
)
def test_disabled_by_config(doc: dict[str, Any], disabled: set[str]) -> None:
    servers = {
        "a": {"command": "a"},
        "b": {"command": "b"},
        "c": {"command": "c", "disabled": True} if not doc else {"command": "c"},
    }
    config = parse({"mcpServers": servers, **doc})
    assert {s.name for s in config.servers if s.disabled} == disabled


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("nope", "not an object"),
        ({}, "names no"),
        ({"command": ""}, "non-empty"),
        ({"command": "x", "args": "y"}, "args"),
        ({"command": "x", "env": ["A"]}, "env"),
        ({"command": "x", "cwd": 3}, "cwd"),
        ({"url": "ftp://x"}, "http(s) URL"),
        ({"httpUrl": "https://x", "headers": {"A": {"b": 1}}}, "headers"),
    ],
)
def test_invalid_entries_are_kept_but_unusable(raw: Any, why: str) -> None:
    config = parse({"mcpServers": {"bad": raw, "good": {"command": "ok"}}})
    bad, good = config.servers
    assert bad.invalid is not None and why in bad.invalid
    assert not bad.usable
    assert good.usable


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"mcpServers": []}', "must be an object"),
    ],
)
def test_file_level_errors(data: bytes, error: str) -> None:
    config = parse_settings(data, WS, {})
    assert config.servers == ()
    assert config.error is not None and error in config.error


def test_no_file_and_no_section_mean_no_servers() -> None:
    assert parse_settings(None, WS, {}) == McpConfig()
    assert parse({"tools": {}}) == McpConfig()


def test_comments_are_allowed_but_not_inside_strings() -> None:
    text = '{\n // a comment\n "mcpServers": {/* x */ "a": {"command": "http://x//y"}}}'
    assert "comment" not in strip_json_comments(text)
    config = parse_settings(text.encode(), WS, {})
    assert config.servers[0].command == "http://x//y"


def test_expand_vars_leaves_unknown_names() -> None:
    assert expand_vars("$A-${B}-$C", {"A": "1", "B": "2"}) == "1-2-$C"


def test_acp_shapes() -> None:
    config = parse(
        {
            "mcpServers": {
                "s": {"command": "node", "args": ["a"], "env": {"K": "v"}},
                "h": {"httpUrl": "https://h/mcp", "headers": {"Authorization": "Bearer t"}},
                "e": {"url": "https://e/sse"},
            }
        }
    )
    s, h, e = config.servers
    assert acp_server(s) == {
        "name": "s",
        "command": "node",
        "args": ["a"],
        "env": [{"name": "K", "value": "v"}],
    }
    assert acp_server(h) == {
        "type": "http",
        "name": "h",
        "url": "https://h/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer t"}],
    }
    assert acp_server(e)["type"] == "sse"
    bridged = acp_server(s, command="/py", args=("bridge.py", "/sock"))
    assert bridged == {"name": "s", "command": "/py", "args": ["bridge.py", "/sock"], "env": []}


def test_load_config_reads_the_workspace_file(tmp_path: Path) -> None:
    assert load_config(str(tmp_path), {}) == McpConfig()
    (tmp_path / ".qwen").mkdir()
    (tmp_path / ".qwen" / "settings.json").write_text(
        json.dumps({"mcpServers": {"a": {"command": "x"}}})
    )
    config = load_config(str(tmp_path), {})
    assert [s.name for s in config.servers] == ["a"]
    assert config.servers[0].cwd == str(tmp_path)
