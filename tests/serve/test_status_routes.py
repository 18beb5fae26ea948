"""``/daemon/status``, ``/session/:id/context`` and ``/session/:id/supported-commands``
against the real daemon (token configured, secrets in its environment)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import trio

from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "status-route-test-token-93e1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"OPENAI_API_KEY": "sk-status-secret-value-77", "QWEN_SERVER_TOKEN": TOKEN}


@pytest.fixture(scope="module")
def daemon_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("status")
    d = spawn_daemon(
        ["--token", TOKEN, "--max-sessions", "5"],
        workspace=root / "ws",
        state_dir=root / "state",
        env=ENV,
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as c:
        yield c


async def new_session(client: httpx.AsyncClient) -> tuple[str, str]:
    response = await client.post("/session", json={"sessionScope": "thread"})
    assert response.status_code == 200, response.text
    return response.json()["sessionId"], response.json()["clientId"]


async def status(client: httpx.AsyncClient, detail: str | None = None) -> dict[str, Any]:
    params = {"detail": detail} if detail is not None else {}
    response = await client.get("/daemon/status", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    for secret in (TOKEN, ENV["OPENAI_API_KEY"]):
        assert secret not in response.text
    return response.json()  # type: ignore[no-any-return]


async def test_summary_shape(client: httpx.AsyncClient, daemon_proc: DaemonProcess) -> None:
    body = await status(client)
    assert body["v"] == 1 and body["detail"] == "summary"
    assert body["status"] == "ok" and body["issues"] == []
    assert body["generatedAt"].endswith("Z")
    daemon = body["daemon"]
    assert daemon["pid"] == daemon_proc.proc.pid
    assert daemon["mode"] == "http-bridge"
    assert daemon["workspaceCwd"] == str(daemon_proc.workspace.resolve())
    assert isinstance(daemon["uptimeMs"], int) and daemon["uptimeMs"] >= 0
    assert body["security"] == {
        "tokenConfigured": True,
        "requireAuth": False,
        "loopbackBind": True,
        "allowOriginConfigured": False,
        "allowOriginMode": "none",
        "sessionShellCommandEnabled": False,
        "tokenHeader": None,
        "lateBinding": {"enabled": False, "bound": False},
    }
    assert body["limits"]["maxSessions"] == 5
    assert body["limits"]["eventRingSize"] == 8000
    caps = body["capabilities"]
    assert caps["protocolVersions"] == {"current": "v1", "supported": ["v1"]}
    served = await client.get("/capabilities")
    assert caps["features"] == served.json()["features"]
    for tag in (
        "daemon_status",
        "workspace_file_read",
        "workspace_file_bytes",
        "workspace_file_write",
        "workspace_env",
        "workspace_preflight",
        "workspace_mcp",
        "workspace_skills",
        "workspace_providers",
        "session_context",
        "session_supported_commands",
        "workspace_init",
        "workspace_tool_toggle",
    ):
        assert tag in caps["features"], tag
    assert "workspace_file_read_cursor" not in caps["features"]
    assert "workspace_file_upload" not in caps["features"]
    runtime = body["runtime"]
    assert runtime["sessions"]["active"] == 0
    assert runtime["permissions"] == {"pending": 0, "policy": "first-responder"}
    assert runtime["transport"] == {"restSseActive": 0}
    root_children = {e["child"] for e in body["supervisor"]["events"] if e["supervisor"] == "root"}
    assert {"permission-mediator", "http"} <= root_children
    assert any(child.startswith("sessions:ws_") for child in root_children)
    assert set(body["supervisor"]["events"][0]) == {
        "supervisor",
        "child",
        "kind",
        "reason",
        "at",
        "attempt",
    }
    assert "full" not in body


async def test_invalid_detail(client: httpx.AsyncClient) -> None:
    for value in ("verbose", "", "FULL"):
        response = await client.get("/daemon/status", params={"detail": value})
        assert response.status_code == 400
        assert response.json() == {
            "error": "detail must be one of: summary, full",
            "code": "invalid_detail",
        }


async def test_full_detail_has_sessions_but_no_client_ids(client: httpx.AsyncClient) -> None:
    sid, client_id = await new_session(client)
    other_sid, other_client = await new_session(client)
    try:
        summary = await status(client, "summary")
        full = await status(client, "full")
        for body in (summary, full):
            text = str(body)
            assert client_id not in text and other_client not in text
            assert body["runtime"]["sessions"]["active"] == 2
            assert body["runtime"]["channel"] == {"live": True}
        assert "full" not in summary
        sessions = {s["sessionId"]: s for s in full["full"]["sessions"]}
        assert sid in sessions
        entry = sessions[sid]
        assert entry["clientCount"] == 1
        assert entry["eventLog"]["ringSize"] == 8000
        assert entry["eventLog"]["subscribers"] == 0
        assert "requests" in full["runtime"]["permissions"]
        assert "requests" not in summary["runtime"]["permissions"]
        starts = [
            e
            for e in full["supervisor"]["events"]
            if e["supervisor"].startswith("sessions:") and e["kind"] == "start"
        ]
        assert len(starts) >= 2
    finally:
        for session_id in (sid, other_sid):
            await client.delete(f"/session/{session_id}")


async def test_pending_permission_shows_without_request_internals_in_summary(
    client: httpx.AsyncClient,
) -> None:
    sid, _ = await new_session(client)
    try:
        accepted = await client.post(
            f"/session/{sid}/prompt",
            json={"prompt": [{"type": "text", "text": "[write perm.txt hi]"}]},
            headers={"Prefer": "respond-async"},
        )
        assert accepted.status_code == 202, accepted.text
        with trio.fail_after(15):
            while True:
                body = await status(client)
                if body["runtime"]["permissions"]["pending"] == 1:
                    break
                await trio.sleep(0.05)
        assert body["status"] == "ok"  # pending permissions are an info-level issue
        assert [i["code"] for i in body["issues"]] == ["pending_permissions"]
        assert "requests" not in body["runtime"]["permissions"]
        assert body["runtime"]["activity"]["activePrompts"] == 1
        full = await status(client, "full")
        [request] = full["runtime"]["permissions"]["requests"]
        assert request["sessionId"] == sid
    finally:
        await client.delete(f"/session/{sid}")


async def test_agent_crash_is_in_the_restart_history(client: httpx.AsyncClient) -> None:
    sid, _ = await new_session(client)
    response = await client.post(
        f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "[crash]"}]}
    )
    assert response.status_code in (500, 503), response.text
    with trio.fail_after(15):
        while True:
            body = await status(client)
            crashes = [
                e
                for e in body["supervisor"]["events"]
                if e["supervisor"].startswith("sessions:") and e["kind"] == "crash"
            ]
            if crashes:
                break
            await trio.sleep(0.05)
    assert body["status"] == "warning"
    assert "supervisor_restarts" in [i["code"] for i in body["issues"]]
    assert body["supervisor"]["counts"]["crash"] >= 1
    assert TOKEN not in crashes[-1]["reason"]


# ---- session status routes ----------------------------------------------------------------


async def test_session_context_and_supported_commands(client: httpx.AsyncClient) -> None:
    sid, client_id = await new_session(client)
    try:
        context = await client.get(f"/session/{sid}/context")
        assert context.status_code == 200
        body = context.json()
        assert body["v"] == 1 and body["sessionId"] == sid
        state = body["state"]
        assert set(state) == {"models", "modes", "configOptions"}
        assert state["models"]["currentModelId"] == "scripted-fast"
        assert state["modes"]["currentModeId"] == "default"
        assert state["configOptions"][0]["id"] == "model"
        await client.post(f"/session/{sid}/approval-mode", json={"mode": "plan"})
        await client.post(f"/session/{sid}/model", json={"modelId": "scripted-slow"})
        after = (await client.get(f"/session/{sid}/context")).json()["state"]
        assert after["modes"]["currentModeId"] == "plan"
        assert after["models"]["currentModelId"] == "scripted-slow"

        with trio.fail_after(15):
            while True:
                commands = await client.get(
                    f"/session/{sid}/supported-commands", headers={"X-Qwen-Client-Id": client_id}
                )
                assert commands.status_code == 200
                if commands.json()["availableCommands"]:
                    break
                await trio.sleep(0.05)
        assert commands.json() == {
            "v": 1,
            "sessionId": sid,
            "availableCommands": [
                {"name": "echo", "description": "Echo the text back", "input": {"hint": "text"}},
                {"name": "flood", "description": "Stream N message chunks", "input": {"hint": "N"}},
            ],
            "availableSkills": [],
        }
        stranger = await client.get(
            f"/session/{sid}/context", headers={"X-Qwen-Client-Id": "client_stranger"}
        )
        assert stranger.status_code == 400 and stranger.json()["code"] == "invalid_client_id"
    finally:
        await client.delete(f"/session/{sid}")
    for route in ("context", "supported-commands"):
        gone = await client.get(f"/session/{sid}/{route}")
        assert gone.status_code == 404
        assert gone.json()["code"] == "session_not_found"
