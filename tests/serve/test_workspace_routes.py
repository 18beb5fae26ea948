"""Workspace status snapshots and mutations against the real daemon.

The daemon runs with a bearer token (``/workspace/init`` and ``/workspace/tools/:name/enable``
are strict routes), real secret-looking environment variables, an MCP budget, and a
workspace with ``.qwen/settings.json`` (MCP servers whose env/headers hold secrets) and
project skills. Tests run in file order: the idle snapshots come first, before any session.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import trio

from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

TOKEN = "workspace-route-test-token-5b1d"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRETS = {
    "OPENAI_API_KEY": "sk-live-0123456789abcdef-openai",
    "DASHSCOPE_API_KEY": "sk-dashscope-fedcba9876543210",
    "QWEN_SERVER_TOKEN": TOKEN,
    "MY_PRIVATE_SERVICE_TOKEN": "private-token-not-on-any-list-4242",
    "HTTPS_PROXY": "http://alice:hunter2-pw@proxy.internal:1080",
    # Percent-encoded credentials: other daemon parts hand this to httpx, which must parse it.
    "HTTP_PROXY": "http://bob:p%2Fss%40w0rd@proxy2.internal:3128/path?q=1",
    "ALL_PROXY": "http://carol:c4r0l-pw@[::1]:1081",
    "NO_PROXY": "localhost,dave:d4ve-pw@.corp.example,10.0.0.0/8",
    "SANDBOX": "docker",
    "SEATBELT_PROFILE": "/Users/erin/profiles/erin-secret-profile.sb",
}
SECRET_SUBSTRINGS = (
    "sk-live-0123456789abcdef-openai",
    "sk-dashscope-fedcba9876543210",
    TOKEN,
    "private-token-not-on-any-list-4242",
    "hunter2-pw",
    "alice",
    "w0rd",
    "p%2Fss",
    "bob:",
    "c4r0l-pw",
    "carol",
    "d4ve-pw",
    "erin-secret-profile",
    "mcp-env-secret-value",
    "mcp-header-secret-value",
    "skill body text that must never be returned",
)
SETTINGS = {
    "mcpServers": {
        "docs": {
            "command": "docs-server",
            "args": ["--token", "mcp-env-secret-value"],
            "env": {"DOCS_TOKEN": "mcp-env-secret-value"},
            "description": "Documentation server",
        },
        "remote": {
            "url": "https://mcp.example/sse",
            "headers": {"Authorization": "Bearer mcp-header-secret-value"},
        },
        "streamable": {"httpUrl": "https://mcp.example/mcp"},
        "off": {"command": "off-server"},
        "extra": {"command": "extra-server"},
    },
    "mcp": {"excluded": ["off"]},
    "tools": {"disabled": ["web_fetch"]},
    "otherKey": {"keep": [1, 2, 3]},
}
SKILL = """---
name: review
description: Review code
argument-hint: "[path]"
---
skill body text that must never be returned
"""


@pytest.fixture(scope="module")
def daemon_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("wsroutes")
    ws = root / "ws"
    (ws / ".qwen" / "skills" / "review").mkdir(parents=True)
    (ws / ".qwen" / "skills" / "review" / "SKILL.md").write_text(SKILL)
    (ws / ".qwen" / "skills" / "broken").mkdir()
    (ws / ".qwen" / "skills" / "broken" / "SKILL.md").write_text("---\nname: [unclosed\n---\n")
    (ws / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS, indent=4) + "\n")
    d = spawn_daemon(
        ["--token", TOKEN, "--mcp-client-budget", "2", "--mcp-budget-mode", "enforce"],
        workspace=ws,
        state_dir=root / "state",
        # The configuration-derived snapshot (the shared pool's live view is tested in
        # tests/serve/test_mcp_*.py).
        env={**SECRETS, "QWEN_SERVE_NO_MCP_POOL": "1"},
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as c:
        yield c


def assert_no_secrets(text: str) -> None:
    for secret in SECRET_SUBSTRINGS:
        assert secret not in text, secret


def cell(cells: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [c for c in cells if c["kind"] == kind and (name is None or c.get("name") == name)]
    assert len(found) == 1, (kind, name, cells)
    return found[0]


# ---- idle (no session yet) ----------------------------------------------------------------


async def test_idle_snapshots_never_start_an_agent(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    ws = str(daemon_proc.workspace.resolve())
    mcp = (await client.get("/workspace/mcp")).json()
    assert mcp == {
        "v": 1,
        "workspaceCwd": ws,
        "initialized": False,
        "discoveryState": "not_started",
        "clientCount": 0,
        "budgetMode": "enforce",
        "clientBudget": 2,
        "budgets": [],
        "servers": [],
    }
    skills = (await client.get("/workspace/skills")).json()
    assert skills == {"v": 1, "workspaceCwd": ws, "initialized": False, "skills": []}
    providers = (await client.get("/workspace/providers")).json()
    assert providers == {
        "v": 1,
        "workspaceCwd": ws,
        "initialized": False,
        "current": None,
        "providers": [],
    }
    preflight = await client.get("/workspace/preflight")
    assert preflight.status_code == 200
    body = preflight.json()
    assert body["acpChannelLive"] is False and body["workspaceCwd"] == ws
    acp = [c for c in body["cells"] if c["locality"] == "acp"]
    assert [c["kind"] for c in acp] == [
        "auth",
        "mcp_discovery",
        "skills",
        "providers",
        "tool_registry",
        "egress",
    ]
    assert all(c["status"] == "not_started" for c in acp)
    daemon_cells = {c["kind"]: c for c in body["cells"] if c["locality"] == "daemon"}
    assert set(daemon_cells) == {
        "python_version",
        "cli_entry",
        "workspace_dir",
        "ripgrep",
        "git",
        "npm",
        "node",
    }
    assert daemon_cells["python_version"]["status"] == "ok"
    assert daemon_cells["workspace_dir"] == {
        "kind": "workspace_dir",
        "status": "ok",
        "locality": "daemon",
        "detail": {"path": ws},
    }
    for kind in ("ripgrep", "git", "npm", "node"):
        tool = daemon_cells[kind]
        assert tool["status"] in ("ok", "warning")
        if tool["status"] == "warning":
            assert tool["errorKind"] == "missing_binary"
    status = (await client.get("/daemon/status")).json()
    assert status["runtime"]["sessions"]["active"] == 0
    assert not any(e["supervisor"] == "sessions" for e in status["supervisor"]["events"])
    for response in (mcp, skills, providers, body):
        assert_no_secrets(json.dumps(response))


async def test_env_reports_presence_and_proxy_hosts_only(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    response = await client.get("/workspace/env")
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    assert_no_secrets(response.text)
    body = response.json()
    assert body["v"] == 1 and body["initialized"] is True and body["acpChannelLive"] is False
    cells = body["cells"]
    assert cell(cells, "runtime")["name"] == "python"
    assert cell(cells, "platform")["status"] == "ok"
    assert cell(cells, "env_var", "OPENAI_API_KEY") == {
        "kind": "env_var",
        "name": "OPENAI_API_KEY",
        "status": "ok",
        "present": True,
    }
    assert cell(cells, "env_var", "QWEN_SERVER_TOKEN")["present"] is True
    assert cell(cells, "env_var", "ANTHROPIC_API_KEY") == {
        "kind": "env_var",
        "name": "ANTHROPIC_API_KEY",
        "status": "disabled",
        "present": False,
    }
    assert all("value" not in c for c in cells if c["kind"] == "env_var")
    assert not any(c["name"] == "MY_PRIVATE_SERVICE_TOKEN" for c in cells)
    assert cell(cells, "proxy", "HTTPS_PROXY")["value"] == "proxy.internal:1080"
    assert cell(cells, "proxy", "HTTP_PROXY")["value"] == "proxy2.internal:3128"
    assert cell(cells, "proxy", "ALL_PROXY")["value"] == "[::1]:1081"
    assert cell(cells, "proxy", "NO_PROXY")["value"] == "localhost,.corp.example,10.0.0.0/8"
    assert cell(cells, "sandbox", "SANDBOX")["value"] == "docker"
    seatbelt = cell(cells, "sandbox", "SEATBELT_PROFILE")
    assert seatbelt["present"] is True and "value" not in seatbelt


# ---- with a live session ------------------------------------------------------------------


async def test_live_session_snapshots(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    created = await client.post("/session", json={})
    assert created.status_code == 200, created.text
    sid = created.json()["sessionId"]
    try:
        mcp = await client.get("/workspace/mcp")
        assert_no_secrets(mcp.text)
        body = mcp.json()
        assert body["initialized"] is True and body["clientCount"] == 2
        servers = {s["name"]: s for s in body["servers"]}
        assert list(servers) == ["docs", "remote", "streamable", "off", "extra"]
        assert servers["docs"] == {
            "kind": "mcp_server",
            "status": "unknown",
            "name": "docs",
            "mcpStatus": "unknown",
            "transport": "stdio",
            "disabled": False,
            "description": "Documentation server",
        }
        assert servers["remote"]["transport"] == "sse"
        assert servers["off"]["disabled"] is True
        assert servers["off"]["disabledReason"] == "config"
        # enforce, budget 2: docs and remote connect; the next enabled ones are refused.
        assert servers["streamable"]["disabledReason"] == "budget"
        assert servers["streamable"]["errorKind"] == "budget_exhausted"
        assert servers["extra"]["status"] == "error"
        assert body["budgets"] == [
            {
                "kind": "mcp_budget",
                "scope": "session",
                "status": "error",
                "liveCount": 2,
                "budget": 2,
                "mode": "enforce",
                "refusedCount": 2,
                "errorKind": "budget_exhausted",
                "hint": body["budgets"][0]["hint"],
            }
        ]

        skills = await client.get("/workspace/skills")
        assert_no_secrets(skills.text)
        assert ".qwen/skills" not in skills.text
        listed = skills.json()["skills"]
        assert skills.json()["initialized"] is True
        assert listed[1] == {
            "kind": "skill",
            "status": "ok",
            "name": "review",
            "description": "Review code",
            "level": "project",
            "modelInvocable": True,
            "argumentHint": "[path]",
        }
        assert listed[0]["name"] == "broken" and listed[0]["status"] == "error"
        assert listed[0]["errorKind"] == "parse_error"

        providers = (await client.get("/workspace/providers")).json()
        assert providers["initialized"] is True
        assert providers["current"] == {"authType": "default", "modelId": "scripted-fast"}
        [provider] = providers["providers"]
        assert provider["kind"] == "model_provider" and provider["current"] is True
        assert [m["modelId"] for m in provider["models"]] == ["scripted-fast", "scripted-slow"]
        assert [m["isCurrent"] for m in provider["models"]] == [True, False]
        assert providers["agent"]["name"] == "acp-scripted"
        assert providers["authMethods"] == []
        assert providers["agentCapabilities"]["loadSession"] is True

        changed = await client.post(f"/session/{sid}/model", json={"modelId": "scripted-slow"})
        assert changed.status_code == 200, changed.text
        after = (await client.get("/workspace/providers")).json()
        assert after["current"]["modelId"] == "scripted-slow"

        preflight = (await client.get("/workspace/preflight")).json()
        assert preflight["acpChannelLive"] is True
        acp = {c["kind"]: c for c in preflight["cells"] if c["locality"] == "acp"}
        assert acp["auth"]["status"] == "ok"
        assert acp["providers"]["detail"] == {"models": 2, "currentModelId": "scripted-fast"}
        assert acp["skills"]["detail"] == {"count": 2}
        assert acp["egress"]["status"] == "not_started"
        assert (await client.get("/workspace/env")).json()["acpChannelLive"] is True
    finally:
        await client.delete(f"/session/{sid}")
    idle = (await client.get("/workspace/providers")).json()
    assert idle["initialized"] is False


# ---- mutations ----------------------------------------------------------------------------


async def test_workspace_init_outcomes(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    memory = daemon_proc.workspace / "QWEN.md"
    expected_path = str(daemon_proc.workspace.resolve() / "QWEN.md")
    created = await client.post("/workspace/init", json={})
    assert created.status_code == 200, created.text
    assert created.json() == {"path": expected_path, "action": "created"}
    assert memory.read_bytes() == b""
    assert (await client.post("/workspace/init", json={})).json()["action"] == "noop"
    memory.write_text("  \n\t\n")
    noop = await client.post("/workspace/init", json={"force": True})
    assert noop.json()["action"] == "noop"
    assert memory.read_text() == "  \n\t\n"

    memory.write_text("# Project memory\n")
    conflict = await client.post("/workspace/init", json={"force": False})
    assert conflict.status_code == 409
    assert conflict.json() == {
        "error": conflict.json()["error"],
        "code": "workspace_init_conflict",
        "path": expected_path,
        "existingSize": 17,
    }
    assert memory.read_text() == "# Project memory\n"
    bad = await client.post("/workspace/init", json={"force": "yes"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_force_flag"
    overwrote = await client.post("/workspace/init", json={"force": True})
    assert overwrote.json() == {"path": expected_path, "action": "overwrote"}
    assert memory.read_bytes() == b""

    memory.unlink()
    memory.symlink_to("README.md")
    (daemon_proc.workspace / "README.md").write_text("readme\n")
    linked = await client.post("/workspace/init", json={"force": True})
    assert linked.status_code == 400 and linked.json()["code"] == "workspace_init_symlink"
    assert (daemon_proc.workspace / "README.md").read_text() == "readme\n"
    memory.unlink()


async def test_workspace_init_publishes_an_event(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    created = await client.post("/session", json={"sessionScope": "thread"})
    sid, client_id = created.json()["sessionId"], created.json()["clientId"]
    try:
        unknown = await client.post(
            "/workspace/init", json={}, headers={"X-Qwen-Client-Id": "client_stranger"}
        )
        assert unknown.status_code == 400 and unknown.json()["code"] == "invalid_client_id"
        done = await client.post(
            "/workspace/init", json={}, headers={"X-Qwen-Client-Id": client_id}
        )
        assert done.status_code == 200, done.text
        with trio.fail_after(15):
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "workspace_initialized")
        event = events[-1]
        assert event["data"] == done.json()
        assert event["originatorClientId"] == client_id
    finally:
        await client.delete(f"/session/{sid}")
        (daemon_proc.workspace / "QWEN.md").unlink(missing_ok=True)


async def test_tool_toggle_persists_and_publishes(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    settings_file = daemon_proc.workspace / ".qwen" / "settings.json"
    created = await client.post("/session", json={"sessionScope": "thread"})
    sid, client_id = created.json()["sessionId"], created.json()["clientId"]
    headers = {"X-Qwen-Client-Id": client_id}
    try:
        off = await client.post(
            "/workspace/tools/run_shell_command/enable", json={"enabled": False}, headers=headers
        )
        assert off.status_code == 200, off.text
        assert off.json() == {"toolName": "run_shell_command", "enabled": False}
        saved = json.loads(settings_file.read_text())
        assert saved["tools"]["disabled"] == ["web_fetch", "run_shell_command"]
        assert saved["otherKey"] == {"keep": [1, 2, 3]}
        assert list(saved) == list(SETTINGS)  # other keys and their order survive
        mcp_name = "mcp__docs__search"
        await client.post(f"/workspace/tools/{mcp_name}/enable", json={"enabled": False})
        again = await client.post(
            "/workspace/tools/run_shell_command/enable", json={"enabled": False}
        )
        assert again.status_code == 200
        on = await client.post("/workspace/tools/web_fetch/enable", json={"enabled": True})
        assert on.json() == {"toolName": "web_fetch", "enabled": True}
        saved = json.loads(settings_file.read_text())
        assert saved["tools"]["disabled"] == ["run_shell_command", mcp_name]

        for body in ({}, {"enabled": "false"}, {"enabled": None}):
            bad = await client.post("/workspace/tools/x/enable", json=body)
            assert bad.status_code == 400 and bad.json()["code"] == "invalid_enabled_flag"
        too_long = await client.post(f"/workspace/tools/{'t' * 257}/enable", json={"enabled": True})
        assert too_long.status_code == 400 and too_long.json()["code"] == "invalid_tool_name"
        blank = await client.post("/workspace/tools/%20/enable", json={"enabled": True})
        assert blank.status_code == 400 and blank.json()["code"] == "invalid_tool_name"

        with trio.fail_after(15):
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(
                    stream,
                    lambda e: e["type"] == "tool_toggled" and e["data"]["toolName"] == "web_fetch",
                )
        toggles = [e for e in events if e["type"] == "tool_toggled"]
        assert toggles[0]["data"] == {"toolName": "run_shell_command", "enabled": False}
        assert toggles[0]["originatorClientId"] == client_id
        assert "originatorClientId" not in toggles[-1]
    finally:
        await client.delete(f"/session/{sid}")


async def test_tool_toggle_refuses_to_rewrite_a_broken_settings_file(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    settings_file = daemon_proc.workspace / ".qwen" / "settings.json"
    original = settings_file.read_text()
    broken = '{\n  // a comment the daemon cannot round-trip\n  "tools": {}\n}\n'
    settings_file.write_text(broken)
    try:
        response = await client.post("/workspace/tools/grep/enable", json={"enabled": False})
        assert response.status_code == 409
        assert response.json()["code"] == "settings_parse_error"
        assert settings_file.read_text() == broken
    finally:
        settings_file.write_text(original)


async def test_concurrent_tool_toggles_all_land(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    names = [f"tool_{i}" for i in range(12)]
    responses: list[httpx.Response] = []

    async def toggle(name: str) -> None:
        url = f"/workspace/tools/{name}/enable"
        responses.append(await client.post(url, json={"enabled": False}))

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(toggle, name)
    assert [r.status_code for r in responses] == [200] * len(names), [r.text for r in responses]
    saved = json.loads((daemon_proc.workspace / ".qwen" / "settings.json").read_text())
    assert set(names) <= set(saved["tools"]["disabled"])


async def test_tool_toggle_creates_the_settings_file(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    qwen_dir = daemon_proc.workspace / ".qwen"
    settings_file = qwen_dir / "settings.json"
    original = settings_file.read_bytes()
    settings_file.unlink()
    try:
        response = await client.post("/workspace/tools/grep/enable", json={"enabled": False})
        assert response.status_code == 200, response.text
        assert json.loads(settings_file.read_text()) == {"tools": {"disabled": ["grep"]}}
    finally:
        settings_file.write_bytes(original)


def test_strict_rules_are_the_declared_ones() -> None:
    from serve.http.security.strict import is_strict

    assert is_strict("POST", "/workspace/init")
    assert is_strict("POST", "/workspace/tools/<name>/enable")
    assert is_strict("POST", "/file/write")
    assert is_strict("POST", "/file/edit")
    assert not is_strict("GET", "/workspace/env")
