"""Pure logic of the status snapshots, table-driven: redaction, MCP budgets, providers."""

from __future__ import annotations

import types
from typing import Any

import msgspec
import pytest

from serve.status.agent import context_state, providers_snapshot, supported_commands
from serve.status.env import env_cells, redact_no_proxy, redact_proxy
from serve.status.init import memory_file_name
from serve.status.mcp import mcp_snapshot, transport_of
from serve.status.skills import _front_matter

# ---- proxies and env ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("http://proxy.internal:1080", "proxy.internal:1080"),
        ("http://user:pass@proxy.internal:1080", "proxy.internal:1080"),
        ("https://u:p%40ss@Proxy.Example:443/path?x=1", "proxy.example:443"),
        ("http://u:p/ss@w0rd@host:3128", "host:3128"),
        ("http://u:p@ss@host:3128", "host:3128"),
        ("proxy.internal:8080", "proxy.internal:8080"),
        ("user:secret@proxy.internal:8080", "proxy.internal:8080"),
        ("socks5://u:p@[::1]:1081", "[::1]:1081"),
        ("http://proxy.internal", "proxy.internal"),
        ("http://10.0.0.1:3128/", "10.0.0.1:3128"),
        ("", None),
        ("   ", None),
        ("http://", None),
        ("http://host:notaport", None),
        ("http://host:99999", None),
        ("http://user:pw@", None),
        ("http://" + "a" * 3000, None),
        ("http://ho st:80", None),
    ],
)
def test_redact_proxy(raw: str, shown: str | None) -> None:
    assert redact_proxy(raw) == shown
    if shown is not None:
        for secret in ("pass", "secret", "p%40ss", "w0rd", "user"):
            assert secret not in shown


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("localhost,127.0.0.1", "localhost,127.0.0.1"),
        ("u:pw@.corp.example, 10.0.0.0/8 ,*", ".corp.example,10.0.0.0/8,*"),
        ("http://a.example:8080?token=x", "a.example:8080"),
        ("bad host,ok.example", "ok.example"),
        ("", ""),
        (",".join(f"h{i}" for i in range(100)), ",".join(f"h{i}" for i in range(64))),
    ],
)
def test_redact_no_proxy(raw: str, shown: str) -> None:
    assert redact_no_proxy(raw) == shown


def test_env_cells_never_carry_secret_values() -> None:
    environ = {
        "OPENAI_API_KEY": "sk-1",
        "GEMINI_API_KEY": "",
        "https_proxy": "http://u:pw@lower.example:1",
        "HTTPS_PROXY": "http://u:pw@upper.example:2",
        "http_proxy": "http://u:pw@only-lower.example:3",
        "SANDBOX": "sandbox-exec",
        "SEATBELT_PROFILE": "/secret/path profile",
        "UNLISTED_SECRET": "zzz",
    }
    cells = env_cells(environ, python_version="3.13.1", system="linux", machine="x86_64")
    encoded = msgspec.json.encode(cells).decode()
    for secret in ("sk-1", "pw", "zzz", "/secret/path", "UNLISTED_SECRET"):
        assert secret not in encoded
    by_name = {(c.kind, c.name): msgspec.to_builtins(c) for c in cells}
    assert by_name[("proxy", "HTTPS_PROXY")]["value"] == "upper.example:2"
    assert by_name[("proxy", "HTTP_PROXY")]["value"] == "only-lower.example:3"
    assert by_name[("env_var", "OPENAI_API_KEY")] == {
        "kind": "env_var",
        "name": "OPENAI_API_KEY",
        "status": "ok",
        "present": True,
    }
    assert by_name[("env_var", "GEMINI_API_KEY")]["present"] is False
    assert by_name[("sandbox", "SANDBOX")]["value"] == "sandbox-exec"
    assert "value" not in by_name[("sandbox", "SEATBELT_PROFILE")]
    assert by_name[("runtime", "python")]["value"] == "3.13.1"
    broken = env_cells(
        {"HTTPS_PROXY": "http://u:pw@:bad"}, python_version="3", system="s", machine="m"
    )
    cell = next(msgspec.to_builtins(c) for c in broken if c.name == "HTTPS_PROXY")
    assert cell["status"] == "warning" and cell["errorKind"] == "parse_error"
    assert "value" not in cell and "pw" not in str(cell)


# ---- MCP snapshot ---------------------------------------------------------------------------


SERVERS = {
    "a": {"command": "a", "env": {"K": "secret-env"}},
    "b": {"url": "https://b/sse", "headers": {"Authorization": "secret-header"}},
    "c": {"httpUrl": "https://c/mcp"},
    "d": {"command": "d"},
}


def snap(settings: dict[str, Any] | None, **kwargs: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"initialized": True, "budget": None, "mode": "off", **kwargs}
    return mcp_snapshot(settings, workspace_cwd="/ws", **options)


@pytest.mark.parametrize(
    ("config", "transport"),
    [
        ({"command": "x"}, "stdio"),
        ({"httpUrl": "https://x"}, "http"),
        ({"url": "https://x"}, "sse"),
        ({"url": "https://x", "type": "http"}, "http"),
        ({"tcp": "host:1"}, "websocket"),
        ({}, "unknown"),
    ],
)
def test_transport_of(config: dict[str, Any], transport: str) -> None:
    assert transport_of(config) == transport


@pytest.mark.parametrize(
    ("budget", "mode", "live", "refused", "budget_status"),
    [
        (None, "off", 4, 0, None),
        (10, "off", 4, 0, None),
        (10, "warn", 4, 0, "ok"),
        (5, "warn", 4, 0, "warning"),  # 4 >= 0.75 * 5
        (3, "warn", 4, 0, "warning"),  # warn never refuses
        (6, "enforce", 4, 0, "ok"),
        (4, "enforce", 4, 0, "warning"),
        (2, "enforce", 2, 2, "error"),
    ],
)
def test_mcp_budget_table(
    budget: int | None, mode: str, live: int, refused: int, budget_status: str | None
) -> None:
    body = snap({"mcpServers": SERVERS}, budget=budget, mode=mode)
    assert body["clientCount"] == live
    assert ("clientBudget" in body) == (budget is not None)
    refused_names = [s["name"] for s in body["servers"] if s.get("disabledReason") == "budget"]
    assert refused_names == ["c", "d"][:refused] if refused else refused_names == []
    if budget_status is None:
        assert body["budgets"] == []
    else:
        [cell] = body["budgets"]
        assert cell["status"] == budget_status and cell["scope"] == "session"
        assert (cell["liveCount"], cell["refusedCount"], cell["budget"]) == (live, refused, budget)
    text = str(body)
    assert "secret-env" not in text and "secret-header" not in text and "https://" not in text


def test_mcp_config_disabled_and_malformed_entries() -> None:
    settings = {
        "mcpServers": {**SERVERS, "bad": "not-an-object"},
        "mcp": {"excluded": ["a"], "allowed": ["a", "b", "c", "bad"]},
    }
    body = snap(settings, budget=1, mode="enforce")
    cells = {s["name"]: s for s in body["servers"]}
    assert cells["a"]["disabledReason"] == "config" and cells["a"]["disabled"] is True
    assert cells["d"]["disabledReason"] == "config"  # not in the allowed list
    assert cells["b"]["status"] == "unknown"
    assert cells["c"]["disabledReason"] == "budget"
    assert cells["bad"]["errorKind"] == "parse_error"
    assert body["clientCount"] == 1


def test_mcp_idle_and_broken_settings() -> None:
    idle = snap({"mcpServers": SERVERS}, initialized=False, budget=3, mode="warn")
    assert idle["servers"] == [] and idle["budgets"] == [] and idle["initialized"] is False
    broken = snap(None, error="settings.json is not valid JSON")
    assert broken["servers"] == [] and broken["errors"][0]["errorKind"] == "parse_error"
    assert snap({"mcpServers": ["not", "a", "dict"]})["servers"] == []


# ---- agent snapshots ------------------------------------------------------------------------


def fake_session(state: dict[str, Any], **attrs: Any) -> Any:
    base = {"session_id": "s", "conn": None, "current_model": None, "current_mode": None}
    session = types.SimpleNamespace(**{**base, **attrs})
    session.state_snapshot = lambda: state
    return session


def test_providers_group_models_by_auth_type_suffix() -> None:
    state = {
        "models": {
            "currentModelId": "qwen3-coder(openai)",
            "availableModels": [
                {"modelId": "qwen3-coder(openai)", "name": "Qwen3 Coder"},
                {"modelId": "qwen3(qwen-oauth)", "name": "Qwen 3", "description": "d"},
                {"modelId": "plain", "name": "Plain"},
                {"name": "no id"},
            ],
        }
    }
    out = providers_snapshot(fake_session(state))
    assert out["current"] == {"authType": "openai", "modelId": "qwen3-coder(openai)"}
    groups = {p["authType"]: p for p in out["providers"]}
    assert list(groups) == ["openai", "qwen-oauth", "default"]
    assert groups["openai"]["current"] is True and groups["default"]["current"] is False
    assert groups["qwen-oauth"]["models"][0]["baseModelId"] == "qwen3"
    assert groups["openai"]["models"][0]["isCurrent"] is True


def test_providers_from_a_model_config_option_and_live_current() -> None:
    state = {
        "configOptions": [
            {"id": "mode", "category": "mode", "options": [{"value": "x", "name": "X"}]},
            {
                "id": "model",
                "category": "model",
                "currentValue": "m1",
                "options": [
                    {"value": "m1", "name": "M1"},
                    {"group": "more", "name": "More", "options": [{"value": "m2", "name": "M2"}]},
                ],
            },
        ]
    }
    out = providers_snapshot(fake_session(state, current_model=None))
    assert [m["modelId"] for m in out["providers"][0]["models"]] == ["m1", "m2"]
    moved = providers_snapshot(fake_session(state, current_model="m2"))
    assert moved["current"]["modelId"] == "m2"
    assert providers_snapshot(fake_session({})) == {"current": None, "providers": []}


def test_context_state_defaults_and_current_values() -> None:
    assert context_state(fake_session({})) == {"models": {}, "modes": {}, "configOptions": []}
    state = {"models": {"currentModelId": "a"}, "modes": {"currentModeId": "default"}}
    out = context_state(fake_session(state, current_model="b", current_mode="plan"))
    assert out["models"]["currentModelId"] == "b" and out["modes"]["currentModeId"] == "plan"
    assert state["models"]["currentModelId"] == "a"  # the session's copy is not mutated


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (None, []),
        (b"not json", []),
        (b'{"availableCommands": "nope"}', []),
        (
            b'{"availableCommands": [{"name": "a", "description": "A"}, {"nameless": 1},'
            b' {"name": "b", "_meta": {"source": "builtin"}}]}',
            ["a", "b"],
        ),
    ],
)
def test_supported_commands_decoding(raw: bytes | None, names: list[str]) -> None:
    session = types.SimpleNamespace(
        available_commands=msgspec.Raw(raw) if raw is not None else None
    )
    out = supported_commands(session)
    assert [c["name"] for c in out] == names
    if names:
        assert out[0] == {"name": "a", "description": "A", "input": None}
        assert out[1]["_meta"] == {"source": "builtin"} and out[1]["description"] == ""


# ---- memory file and skills -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "settings", "name"),
    [
        ("QWEN.md", {}, "QWEN.md"),
        ("AGENTS.md", {"context": {"fileName": "OTHER.md"}}, "AGENTS.md"),
        ("QWEN.md", {"context": {"fileName": "GEMINI.md"}}, "GEMINI.md"),
        ("QWEN.md", {"context": {"fileName": ["A.md", "B.md"]}}, "A.md"),
        ("QWEN.md", {"context": {"fileName": "../escape.md"}}, "QWEN.md"),
        ("QWEN.md", {"context": {"fileName": ".."}}, "QWEN.md"),
        ("QWEN.md", {"context": "nope"}, "QWEN.md"),
    ],
)
def test_memory_file_name(flag: str, settings: dict[str, Any], name: str) -> None:
    assert memory_file_name(flag, settings) == name


@pytest.mark.parametrize(
    ("text", "meta"),
    [
        ("no front matter\n", {}),
        ("---\nname: x\ndescription: y\n---\nbody\n", {"name": "x", "description": "y"}),
        ("---\n---\n", {}),
        ("---\nname: [unclosed\n---\n", None),
        ("---\nname: x\n", None),
        ("---\n- a list\n---\n", None),
        ("---\n" + "k: " + "v" * 20000 + "\n---\n", None),
    ],
)
def test_skill_front_matter(text: str, meta: dict[str, Any] | None) -> None:
    assert _front_matter(text) == meta
