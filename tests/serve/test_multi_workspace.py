"""Several workspaces in one daemon: routing, plural routes, isolation, trust, tags."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import ROOT, spawn_daemon
from tests.support.sse import iter_events


def _dirs(tmp_path: Path, *names: str) -> list[Path]:
    out = []
    for name in names:
        (tmp_path / name).mkdir()
        out.append((tmp_path / name).resolve())
    return out


async def test_three_workspaces_route_sessions_files_and_status(tmp_path: Path) -> None:
    a, b, ref = _dirs(tmp_path, "a", "b", "ref")
    (ref / "README.md").write_text("reference repo\n")
    daemon = spawn_daemon(
        ["--workspace", str(b), "--untrusted-workspace", str(ref)],
        workspace=a,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            caps = (await client.get("/capabilities")).json()
            workspaces = {w["cwd"]: w for w in caps["workspaces"]}
            assert [w["cwd"] for w in caps["workspaces"]] == [str(a), str(b), str(ref)]
            assert workspaces[str(a)]["primary"] and not workspaces[str(b)]["primary"]
            assert workspaces[str(ref)]["trusted"] is False
            assert "multi_workspace_sessions" in caps["features"]
            assert "workspace_qualified_rest_core" in caps["features"]

            # Sessions route by canonical cwd; a directory inside a workspace is no match.
            sa = (await client.post("/session", json={"cwd": str(a)})).json()
            sb = (await client.post("/session", json={"cwd": str(b) + "/"})).json()
            assert sa["workspaceCwd"] == str(a) and sb["workspaceCwd"] == str(b)
            assert sa["sessionId"] != sb["sessionId"]
            (a / "sub").mkdir()
            r = await client.post("/session", json={"cwd": str(a / "sub")})
            assert r.status_code == 400
            assert r.json()["code"] == "workspace_mismatch" and r.json()["workspaceCount"] == 3

            # Session lists through the plural forms, by id and by encoded path.
            b_id = workspaces[str(b)]["id"]
            by_id = (await client.get(f"/workspaces/{b_id}/sessions")).json()["sessions"]
            assert [s["sessionId"] for s in by_id] == [sb["sessionId"]]
            encoded = urllib.parse.quote(str(a), safe="")
            by_path = (await client.get(f"/workspaces/{encoded}/sessions")).json()["sessions"]
            assert [s["sessionId"] for s in by_path] == [sa["sessionId"]]
            r = await client.get("/workspaces/ws_unknown/sessions")
            assert r.status_code == 400

            # Files through the plural forms land in the right directory.
            r = await client.post(
                f"/workspaces/{b_id}/file/write",
                json={"path": "notes.txt", "content": "in b\n", "mode": "create"},
            )
            assert r.status_code in (200, 201), r.text
            assert (b / "notes.txt").read_text() == "in b\n"
            assert not (a / "notes.txt").exists()
            r = await client.get(f"/workspaces/{b_id}/file", params={"path": "notes.txt"})
            assert r.json()["content"] == "in b\n"
            r = await client.get("/workspaces/ws_nope/file", params={"path": "x"})
            assert r.status_code == 404 and r.json()["code"] == "workspace_not_found"

            # The untrusted workspace reads but refuses writes.
            ref_id = workspaces[str(ref)]["id"]
            r = await client.get(f"/workspaces/{ref_id}/file", params={"path": "README.md"})
            assert r.json()["content"] == "reference repo\n"
            r = await client.post(
                f"/workspaces/{ref_id}/file/write",
                json={"path": "new.txt", "content": "x", "mode": "create"},
            )
            assert r.status_code == 403 and r.json()["errorKind"] == "untrusted_workspace"
            assert not (ref / "new.txt").exists()

            # /daemon/status has a section per workspace.
            status = (await client.get("/daemon/status")).json()
            counts = {w["cwd"]: w["sessions"] for w in status["workspaces"]}
            assert counts == {str(a): 1, str(b): 1, str(ref): 0}
    finally:
        daemon.stop()


async def test_a_crash_in_one_workspace_leaves_the_other_streaming(tmp_path: Path) -> None:
    a, b = _dirs(tmp_path, "a", "b")
    daemon = spawn_daemon(["--workspace", str(b)], workspace=a, env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sa = (await client.post("/session", json={"cwd": str(a)})).json()["sessionId"]
            sb = (await client.post("/session", json={"cwd": str(b)})).json()["sessionId"]
            received: list[dict[str, Any]] = []

            async def watch_b(*, task_status: trio.TaskStatus[None]) -> None:
                async with client.stream("GET", f"/session/{sb}/events") as stream:
                    task_status.started()  # subscribed: the route subscribes, then answers
                    async for event in iter_events(stream):
                        if "comment" not in event:
                            received.append(event)
                        if event.get("type") == "turn_complete":
                            return

            async with trio.open_nursery() as nursery:
                await nursery.start(watch_b)
                for _ in range(4):  # past a's restart intensity: a dies for good
                    await client.post(
                        f"/session/{sa}/prompt",
                        json={"prompt": [{"type": "text", "text": "[crash]"}]},
                    )
                r = await client.post(
                    f"/session/{sb}/prompt",
                    json={"prompt": [{"type": "text", "text": "[flood 200]"}]},
                )
                assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"
            assert (await client.post(f"/session/{sa}/heartbeat")).status_code == 404
            chunks = [e for e in received if e["type"] == "session_update"]
            assert len(chunks) >= 200
    finally:
        daemon.stop()


async def test_single_workspace_has_no_multi_workspace_tags(tmp_path: Path) -> None:
    (a,) = _dirs(tmp_path, "a")
    daemon = spawn_daemon(workspace=a, env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as client:
            caps = (await client.get("/capabilities")).json()
        assert not [t for t in caps["features"] if t.startswith("multi_workspace")]
        assert len(caps["workspaces"]) == 1
    finally:
        daemon.stop()


@pytest.mark.parametrize("spelling", ["{a}", "{a}/", "{a}/../a"])
def test_duplicate_workspaces_refuse_to_start(tmp_path: Path, spelling: str) -> None:
    (a,) = _dirs(tmp_path, "a")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "serve",
            "--port",
            "0",
            "--workspace",
            str(a),
            "--workspace",
            spelling.format(a=a),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"},
    )
    assert result.returncode == 1
    assert "given more than once" in result.stderr
