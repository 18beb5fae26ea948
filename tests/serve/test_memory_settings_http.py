"""``/workspace/memory``, ``/workspace/settings`` and ``/workspace/reload`` on a real daemon."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.workspaces.state.memory_file import MEMORY_SECTION_HEADER
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import iter_events


async def new_session(client: httpx.AsyncClient) -> tuple[str, str]:
    r = await client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def find_event(client: httpx.AsyncClient, sid: str, kind: str, n: int = 1) -> list[Any]:
    """The data of the first ``n`` events of type ``kind`` in the session's log."""
    found: list[Any] = []
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        async for event in iter_events(stream):
            if event.get("type") == kind:
                found.append(event)
                if len(found) == n:
                    return found
    return found


def write(path: Path, text: str) -> None:
    path.write_text(text)


def settings_file(d: DaemonProcess) -> Path:
    return d.workspace / ".qwen" / "settings.json"


# ---- memory -------------------------------------------------------------------------------


async def test_memory_read_write_cycle(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    memory = daemon_proc.workspace / "QWEN.md"
    memory.unlink(missing_ok=True)
    r = await client.get("/workspace/memory")
    assert r.status_code == 200
    body = r.json()
    assert (body["exists"], body["content"], body["fileName"]) == (False, None, "QWEN.md")
    assert body["filePath"] == str(daemon_proc.workspace.resolve() / "QWEN.md")
    assert (body["files"], body["fileCount"], body["initialized"]) == ([], 0, False)

    r = await client.post(
        "/workspace/memory",
        json={"content": "the build uses make", "scope": "workspace"},
        headers={"X-Qwen-Client-Id": cid},
    )
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True and r.json()["changed"] is True and r.json()["mode"] == "append"
    expected = f"{MEMORY_SECTION_HEADER}\nthe build uses make\n"
    assert memory.read_text() == expected
    assert r.json()["bytesWritten"] == len(expected.encode())
    [event] = await find_event(client, sid, "memory_changed")
    assert event["data"] == {
        "scope": "workspace",
        "filePath": str(daemon_proc.workspace.resolve() / "QWEN.md"),
        "mode": "append",
        "bytesWritten": len(expected.encode()),
    }
    assert event["originatorClientId"] == cid

    r = await client.post("/workspace/memory", json={"content": "tests run with pytest"})
    assert memory.read_text() == expected + "tests run with pytest\n"
    body = (await client.get("/workspace/memory")).json()
    assert body["exists"] and body["content"] == memory.read_text()
    assert body["sizeBytes"] == body["totalBytes"] == memory.stat().st_size
    assert body["files"][0]["scope"] == "workspace" and body["fileCount"] == 1

    r = await client.post("/workspace/memory", json={"content": "  \n ", "mode": "append"})
    assert r.json()["changed"] is False and r.json()["bytesWritten"] == 0
    r = await client.post("/workspace/memory", json={"content": "# Fresh\n", "mode": "replace"})
    assert r.json()["changed"] is True and memory.read_text() == "# Fresh\n"


async def test_memory_keeps_crlf_files_crlf(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    memory = daemon_proc.workspace / "QWEN.md"
    memory.write_bytes(b"# Notes\r\nline\r\n")
    r = await client.post("/workspace/memory", json={"content": "added"})
    assert r.status_code == 200, r.text
    assert (
        memory.read_bytes()
        == f"# Notes\r\nline\r\n\r\n{MEMORY_SECTION_HEADER}\r\nadded\r\n".encode()
    )
    memory.unlink()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"content": "x", "mode": "prepend"}, "invalid_mode"),
        ({"content": 3}, "invalid_content"),
        ({}, "invalid_content"),
        ({"content": "x", "scope": "global"}, "invalid_scope"),
        ({"content": "x" * (1024 * 1024 + 1)}, "content_too_large"),
    ],
)
async def test_memory_write_validation(
    client: httpx.AsyncClient, body: dict[str, Any], code: str
) -> None:
    r = await client.post("/workspace/memory", json=body)
    assert r.status_code == 400 and r.json()["code"] == code


async def test_memory_write_checks_the_client_id(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/workspace/memory", json={"content": "x"}, headers={"X-Qwen-Client-Id": "stranger"}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"


async def test_memory_symlink_out_of_the_workspace_is_refused(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.md"
    outside.write_text("TOPSECRET\n")
    memory = daemon_proc.workspace / "QWEN.md"
    memory.unlink(missing_ok=True)
    os.symlink(outside, memory)
    try:
        r = await client.get("/workspace/memory")
        assert r.status_code in (400, 403) and "TOPSECRET" not in r.text
        r = await client.post("/workspace/memory", json={"content": "x", "mode": "replace"})
        assert r.status_code in (400, 403)
        assert outside.read_text() == "TOPSECRET\n"
    finally:
        memory.unlink()


async def test_memory_file_name_follows_the_settings(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    r = await client.post(
        "/workspace/settings", json={"key": "context.fileName", "value": "AGENTS.md"}
    )
    assert r.status_code == 200, r.text
    try:
        await client.post("/workspace/memory", json={"content": "agents", "mode": "replace"})
        assert (daemon_proc.workspace / "AGENTS.md").read_text() == "agents"
        assert (await client.get("/workspace/memory")).json()["fileName"] == "AGENTS.md"
    finally:
        await client.post("/workspace/settings", json={"key": "context", "remove": True})
        (daemon_proc.workspace / "AGENTS.md").unlink()


# ---- settings -----------------------------------------------------------------------------


async def test_settings_update_keeps_unknown_keys_and_emits_an_event(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    path = settings_file(daemon_proc)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"zeta": {"keep": [1, 2]}, "tools": {"other": "x"}, "alpha": 1}))
    r = await client.post(
        "/workspace/settings",
        json={"key": "tools.disabled", "value": ["run_shell_command"], "scope": "workspace"},
        headers={"X-Qwen-Client-Id": cid},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "key": "tools.disabled",
        "scope": "workspace",
        "value": ["run_shell_command"],
        "mutation": "set",
        "changed": True,
        "requiresRestart": False,
    }
    stored = json.loads(path.read_text())
    assert stored == {
        "zeta": {"keep": [1, 2]},
        "tools": {"other": "x", "disabled": ["run_shell_command"]},
        "alpha": 1,
    }
    assert list(stored) == ["zeta", "tools", "alpha"]
    [event] = await find_event(client, sid, "settings_changed")
    assert event["data"] == {
        "key": "tools.disabled",
        "scope": "workspace",
        "value": ["run_shell_command"],
        "mutation": "set",
    }
    assert event["originatorClientId"] == cid

    again = await client.post(
        "/workspace/settings", json={"key": "tools.disabled", "value": ["run_shell_command"]}
    )
    assert again.json()["changed"] is False

    body = (await client.get("/workspace/settings")).json()
    assert body["exists"] is True and body["path"] == ".qwen/settings.json"
    by_key = {s["key"]: s for s in body["settings"]}
    assert by_key["tools.disabled"]["values"] == {
        "effective": ["run_shell_command"],
        "workspace": ["run_shell_command"],
    }
    assert by_key["tools.approvalMode"]["values"] == {"effective": "default"}
    assert [o["value"] for o in by_key["tools.approvalMode"]["options"]] == [
        "plan",
        "default",
        "auto-edit",
        "auto",
        "yolo",
    ]
    assert body["content"]["zeta"] == {"keep": [1, 2]}

    r = await client.post("/workspace/settings", json={"key": "tools.disabled", "remove": True})
    assert r.json()["mutation"] == "remove" and r.json()["changed"] is True
    assert json.loads(path.read_text())["tools"] == {"other": "x"}


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"key": "tools.disabled", "value": "run_shell_command"}, "tools.disabled"),
        ({"key": "tools.approvalMode", "value": "reckless"}, "tools.approvalMode"),
        ({"key": "context.fileName", "value": "../escape.md"}, "context.fileName"),
        ({"key": "mcpServers", "value": {"docs": {"args": ["x"]}}}, "mcpServers.docs"),
        ({"key": "mcpServers.docs", "value": {"command": "n", "env": []}}, "mcpServers.docs.env"),
        ({"key": "tools", "value": {"disabled": [1]}}, "tools.disabled"),
        ({"key": "a.__proto__.b", "value": 1}, "a.__proto__.b"),
        ({"key": "", "value": 1}, ""),
        ({"key": "ui.theme"}, "ui.theme"),
        ({"key": "ui.theme", "value": None}, "ui.theme"),
        ({"key": "ui.theme", "remove": "yes"}, "ui.theme"),
    ],
)
async def test_settings_validation_names_the_key(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, body: dict[str, Any], key: str
) -> None:
    before = (
        settings_file(daemon_proc).read_bytes() if settings_file(daemon_proc).exists() else None
    )
    r = await client.post("/workspace/settings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_setting" and r.json()["key"] == key
    after = settings_file(daemon_proc).read_bytes() if settings_file(daemon_proc).exists() else None
    assert after == before


async def test_settings_other_scopes_and_clients_are_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/workspace/settings", json={"key": "a", "value": 1, "scope": "user"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_scope"
    r = await client.post(
        "/workspace/settings", json={"key": "a", "value": 1}, headers={"X-Qwen-Client-Id": "nobody"}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"


async def test_settings_secrets_are_redacted_and_kept_on_write_back(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    path = settings_file(daemon_proc)
    path.parent.mkdir(exist_ok=True)
    servers = {
        "docs": {"command": "node", "args": ["d.js"], "env": {"API_TOKEN": "s3cret"}},
        "web": {"httpUrl": "https://mcp.example/mcp", "headers": {"Authorization": "Bearer b"}},
    }
    path.write_text(json.dumps({"mcpServers": servers, "security": {"auth": {"apiKey": "sk-1"}}}))
    body = (await client.get("/workspace/settings")).json()
    assert "s3cret" not in json.dumps(body) and "sk-1" not in json.dumps(body)
    shown = next(s for s in body["settings"] if s["key"] == "mcpServers")["values"]["workspace"]
    assert shown["docs"]["env"] == {"API_TOKEN": "[redacted]"}
    shown["docs"]["args"] = ["docs-v2.js"]
    r = await client.post("/workspace/settings", json={"key": "mcpServers", "value": shown})
    assert r.status_code == 200, r.text
    assert "s3cret" not in r.text and r.json()["value"]["docs"]["args"] == ["docs-v2.js"]
    stored = json.loads(path.read_text())
    assert stored["mcpServers"]["docs"] == {
        "command": "node",
        "args": ["docs-v2.js"],
        "env": {"API_TOKEN": "s3cret"},
    }
    assert stored["mcpServers"]["web"]["headers"] == {"Authorization": "Bearer b"}
    assert stored["security"]["auth"]["apiKey"] == "sk-1"
    r = await client.post(
        "/workspace/settings",
        json={"key": "mcpServers.new", "value": {"command": "x", "env": {"K": "[redacted]"}}},
    )
    assert r.status_code == 400 and r.json()["key"] == "mcpServers.new.env.K"
    path.unlink()


async def test_settings_file_with_comments_is_never_rewritten(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    path = settings_file(daemon_proc)
    path.parent.mkdir(exist_ok=True)
    original = '{\n  // hand-edited\n  "tools": {"disabled": []}\n}\n'
    path.write_text(original)
    body = (await client.get("/workspace/settings")).json()
    assert body["warnings"][0]["type"] == "corrupted" and body["content"] is None
    r = await client.post("/workspace/settings", json={"key": "tools.disabled", "value": ["x"]})
    assert r.status_code == 409 and r.json()["code"] == "settings_parse_error"
    r = await client.post("/workspace/reload")
    assert r.status_code == 409 and r.json()["code"] == "settings_parse_error"
    assert path.read_text() == original
    path.unlink()


# ---- reload -------------------------------------------------------------------------------


async def test_reload_reports_keys_changed_since_the_last_load(tmp_path: Path) -> None:
    config = tmp_path / "acp-serve.yaml"
    config.write_text("capabilities:\n  defaults:\n    fs.read: {scope: workspace}\n")
    with running_daemon(
        ["--enable-session-shell", "--config", str(config)], env={"QWEN_SERVER_TOKEN": TOKEN}
    ) as d:
        await _reload_flow(d, config)


async def _reload_flow(d: DaemonProcess, config: Path) -> None:
    async with httpx.AsyncClient(base_url=d.url, timeout=30, headers=AUTH) as http:
        sid, cid = await new_session(http)
        assert (
            await http.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"})
        ).status_code == 200
        headers = {"X-Qwen-Client-Id": cid}

        # the config grants no terminal.exec: the shell is refused by the Host
        r = await http.post(f"/session/{sid}/shell", json={"command": "echo hi"}, headers=headers)
        assert r.status_code == 403 and r.json()["rule"] == "grant:terminal.exec", r.text

        # nothing changed yet
        r = await http.post("/workspace/reload", headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["changedKeys"] == [] and r.json()["childReloaded"] is False

        # settings changed through the API and by hand, and the grants were widened
        await http.post("/workspace/settings", json={"key": "tools.disabled", "value": ["x"]})
        path = settings_file(d)
        doc = json.loads(path.read_text())
        doc["ui"] = {"theme": "dark"}
        path.write_text(json.dumps(doc))
        write(config, "approval:\n  default: auto\n")
        r = await http.post("/workspace/reload", headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["changedKeys"] == [
            "tools.disabled",
            "ui.theme",
            "config.capabilities",
            "config.approval",
        ]
        assert body["grantsReloaded"] is True and body["restartRequired"] == []
        _, event = await find_event(http, sid, "settings_reloaded", 2)
        assert event["data"] == body and event["originatorClientId"] == cid
        r = await http.post(f"/session/{sid}/shell", json={"command": "echo hi"}, headers=headers)
        assert r.status_code == 200 and r.json()["output"] == "hi\n", r.text

        # a second reload sees no change; a policy change needs a restart
        write(config, "approval:\n  default: auto\npolicy:\n  permissionStrategy: consensus\n")
        body = (await http.post("/workspace/reload")).json()
        assert body["changedKeys"] == ["config.policy"]
        assert body["restartRequired"] == ["config.policy.permissionStrategy"]
        caps = (await http.get("/capabilities")).json()
        assert caps["policy"]["permission"] == "first-responder"

        # a config that does not decode changes nothing
        write(config, "capabilities:\n  defaults:\n    fs.read: {scope: nowhere}\n")
        r = await http.post("/workspace/reload")
        assert r.status_code == 400 and r.json()["code"] == "invalid_config"
        assert "scope" in r.json()["error"]
        r = await http.post(
            f"/session/{sid}/shell", json={"command": "echo still"}, headers=headers
        )
        assert r.status_code == 200 and r.json()["output"] == "still\n"


@pytest.fixture(scope="module")
def tokenless() -> Iterator[DaemonProcess]:
    with running_daemon() as d:
        yield d


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/workspace/memory", {"content": "x"}),
        ("/workspace/settings", {"key": "a", "value": 1}),
        ("/workspace/reload", {}),
    ],
)
async def test_writes_are_strict_without_a_token(
    tokenless: DaemonProcess, path: str, body: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(base_url=tokenless.url, timeout=30) as http:
        r = await http.post(path, json=body)
        assert r.status_code == 401 and r.json()["code"] == "token_required", r.text
    assert not (tokenless.workspace / "QWEN.md").exists()
    assert not settings_file(tokenless).exists()


async def test_reads_and_tags_without_a_token(tokenless: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=tokenless.url, timeout=30) as http:
        assert (await http.get("/workspace/memory")).status_code == 200
        assert (await http.get("/workspace/settings")).status_code == 200
        features = (await http.get("/capabilities")).json()["features"]
        assert {"workspace_memory", "workspace_settings", "workspace_reload"} <= set(features)
