"""The MCP routes and events through the real daemon (bearer token configured)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")
TOKEN = "T-mcp-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def stdio(name: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [MCP_SERVER, "--name", name]}


def make_workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    (ws / ".qwen").mkdir(parents=True)
    servers = {"a": stdio("a"), "b": stdio("b"), "web": {"url": "https://mcp.example/sse"}}
    (ws / ".qwen" / "settings.json").write_text(json.dumps({"mcpServers": servers}))
    return ws


@pytest.fixture(scope="module")
def mcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    ws = make_workspace(tmp_path_factory.mktemp("mcp-http"))
    d = spawn_daemon(
        ["--token", TOKEN, "--mcp-client-budget", "1", "--mcp-budget-mode", "enforce"],
        workspace=ws,
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def http(mcp_daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=mcp_daemon.url, headers=AUTH, timeout=30) as c:
        yield c


async def features(client: httpx.AsyncClient) -> dict[str, Any]:
    body = (await client.get("/capabilities")).json()
    return {tag: body["featureDetails"][tag] for tag in body["features"]}


async def test_capability_tags_with_the_pool(http: httpx.AsyncClient) -> None:
    tags = await features(http)
    for tag in (
        "mcp_guardrails",
        "mcp_guardrail_events",
        "workspace_mcp_restart",
        "mcp_workspace_pool",
        "mcp_pool_restart",
    ):
        assert tag in tags
    assert tags["mcp_guardrails"]["modes"] == ["warn", "enforce"]


def test_pool_tags_are_absent_when_the_pool_is_off(tmp_path: Path) -> None:
    d = spawn_daemon(
        ["--token", TOKEN], workspace=make_workspace(tmp_path), env={"QWEN_SERVE_NO_MCP_POOL": "1"}
    )
    try:
        body = httpx.get(f"{d.url}/capabilities", headers=AUTH).json()
        assert "mcp_guardrails" in body["features"]
        assert "mcp_guardrail_events" in body["features"]
        for tag in ("workspace_mcp_restart", "mcp_workspace_pool", "mcp_pool_restart"):
            assert tag not in body["features"]
        response = httpx.post(f"{d.url}/workspace/mcp/a/restart", headers=AUTH, json={})
        assert response.status_code == 404
        assert response.json()["code"] == "mcp_server_not_found"
        assert response.json()["reason"] == "not_pooled"
    finally:
        d.stop()


async def test_restart_route_and_its_events(http: httpx.AsyncClient) -> None:
    created = await http.post("/session", json={})
    assert created.status_code in (200, 201), created.text
    session_id = created.json()["sessionId"]
    watcher = created.json()["clientId"]  # minted by the daemon
    client = {"X-Qwen-Client-Id": watcher}

    restarted = await http.post("/workspace/mcp/a/restart", json={}, headers=client)
    assert restarted.status_code == 200, restarted.text
    body = restarted.json()
    assert body["serverName"] == "a" and body["restarted"] is True
    assert isinstance(body["durationMs"], int)

    entries = await http.post("/workspace/mcp/a/restart?entryIndex=*", headers=client)
    assert entries.status_code == 200
    (entry,) = entries.json()["entries"]
    assert entry["entryIndex"] == 0 and entry["restarted"] is True

    skipped = await http.post("/workspace/mcp/b/restart", headers=client)
    assert skipped.status_code == 200
    assert skipped.json() == {
        "serverName": "b",
        "restarted": False,
        "skipped": True,
        "reason": "budget_would_exceed",
    }

    async with http.stream(
        "GET", f"/session/{session_id}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        with trio.fail_after(30):
            events = await collect_until(
                stream, lambda e: e.get("type") == "mcp_server_restart_refused"
            )
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    (warning,) = by_type["mcp_budget_warning"]
    assert warning["data"]["budget"] == 1 and warning["data"]["mode"] == "enforce"
    (batch,) = by_type["mcp_child_refused_batch"]
    refused = [s["name"] for s in batch["data"]["refusedServers"]]
    assert refused == ["b", "web"]
    assert len(by_type["mcp_server_restarted"]) == 2
    for event in by_type["mcp_server_restarted"]:
        assert event["data"]["serverName"] == "a"
        assert event["originatorClientId"] == watcher
        assert event["data"]["originatorClientId"] == watcher
    (refused_event,) = by_type["mcp_server_restart_refused"]
    assert refused_event["data"]["reason"] == "budget_would_exceed"
    assert refused_event["data"]["serverName"] == "b"


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/workspace/mcp/nope/restart", 404, "mcp_server_not_found"),
        ("/workspace/mcp/a/restart?entryIndex=3", 404, "mcp_pool_entry_not_found"),
        ("/workspace/mcp/a/restart?entryIndex=x", 400, "invalid_entry_index"),
        ("/workspace/mcp/%20/restart", 400, "invalid_server_name"),
    ],
)
async def test_restart_errors(http: httpx.AsyncClient, path: str, status: int, code: str) -> None:
    response = await http.post(path, json={})
    assert response.status_code == status, response.text
    assert response.json()["code"] == code


async def test_restart_of_a_refused_remote_server_is_skipped(http: httpx.AsyncClient) -> None:
    # "web" is an SSE server past the budget: the budget refusal is reported first.
    response = await http.post("/workspace/mcp/web/restart", json={})
    assert response.status_code == 200
    assert response.json()["reason"] == "budget_would_exceed"


async def test_unregistered_client_id_and_bad_body(http: httpx.AsyncClient) -> None:
    stranger = await http.post(
        "/workspace/mcp/a/restart", json={}, headers={"X-Qwen-Client-Id": "stranger"}
    )
    assert stranger.status_code == 400
    assert stranger.json()["code"] == "invalid_client_id"
    bad = await http.post(
        "/workspace/mcp/a/restart",
        content=b"{nope",
        headers={"Content-Type": "application/json"},
    )
    assert bad.status_code == 400
    assert bad.json() == {"error": "Invalid JSON in request body"}
