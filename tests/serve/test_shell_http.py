"""``POST /session/:id/shell`` on a real daemon: gates, grants/approvals, events, cancel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.http import capabilities
from serve.http.app import collect_features
from serve.runtime.build import build_host
from serve.settings import parse_settings
from tests.conftest import AUTH, TOKEN
from tests.serve.test_shell_run import group_gone
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import iter_events


@pytest.fixture(scope="module")
def shell_daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--enable-session-shell"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def http(shell_daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=shell_daemon.url, timeout=30, headers=AUTH) as c:
        yield c


async def new_session(client: httpx.AsyncClient, mode: str | None = "yolo") -> tuple[str, str]:
    r = await client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    sid, cid = r.json()["sessionId"], r.json()["clientId"]
    if mode is not None:
        r = await client.post(f"/session/{sid}/approval-mode", json={"mode": mode})
        assert r.status_code == 200, r.text
    return sid, cid


async def shell(
    client: httpx.AsyncClient, sid: str, cid: str | None, command: Any
) -> httpx.Response:
    headers = {"X-Qwen-Client-Id": cid} if cid is not None else {}
    return await client.post(f"/session/{sid}/shell", json={"command": command}, headers=headers)


async def events_since(
    client: httpx.AsyncClient, sid: str, stop: str, after: int = 0
) -> list[dict[str, Any]]:
    """Replay the session's events from ``after`` until one of type ``stop``."""
    out: list[dict[str, Any]] = []
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(after)}
    ) as stream:
        async for event in iter_events(stream):
            if "comment" in event:
                continue
            out.append(event)
            if event["type"] == stop:
                break
    return out


def tags(args: list[str], tmp_path: Path) -> set[str]:
    d, _ = build_host(
        parse_settings(["--workspace", str(tmp_path), *args], {"HOME": str(tmp_path)})
    )
    return {f.tag for f in capabilities.advertised(d, collect_features())}


def test_tag_needs_the_flag_and_a_token(tmp_path: Path) -> None:
    assert "session_shell_command" in tags(
        ["--enable-session-shell", "--token", "t0123456"], tmp_path
    )
    assert "session_shell_command" not in tags(["--token", "t0123456"], tmp_path)
    # Without a token the strict gate refuses the route, so the tag would lie.
    assert "session_shell_command" not in tags(["--enable-session-shell"], tmp_path)


async def test_advertised_by_the_shell_daemon(http: httpx.AsyncClient) -> None:
    assert "session_shell_command" in (await http.get("/capabilities")).json()["features"]


async def test_runs_in_the_workspace_and_streams_events(
    http: httpx.AsyncClient, shell_daemon: DaemonProcess
) -> None:
    sid, cid = await new_session(http)
    r = await shell(http, sid, cid, "  pwd; echo to-stderr >&2; exit 7  ")
    assert r.status_code == 200, r.text
    body = r.json()
    workspace = str(shell_daemon.workspace.resolve())
    assert body["sessionId"] == sid and body["command"] == "pwd; echo to-stderr >&2; exit 7"
    assert body["cwd"] == workspace
    assert (body["exitCode"], body["signal"], body["aborted"], body["timedOut"]) == (
        7,
        None,
        False,
        False,
    )
    assert body["output"] == f"{workspace}\nto-stderr\n" and body["truncated"] is False
    events = await events_since(http, sid, "user_shell_result")
    kinds = [e["type"] for e in events]
    start = kinds.index("user_shell_command")
    command_event, result_event = events[start], events[-1]
    assert command_event["data"] == {"sessionId": sid, "command": body["command"], "cwd": workspace}
    assert result_event["data"] == {
        "sessionId": sid,
        "exitCode": 7,
        "signal": None,
        "aborted": False,
    }
    assert command_event["originatorClientId"] == result_event["originatorClientId"] == cid
    streamed = [
        e["data"]["update"]
        for e in events[start:]
        if e["type"] == "session_update" and e["data"]["update"]["sessionUpdate"] == "shell_output"
    ]
    assert "".join(u["output"] for u in streamed) == body["output"]
    assert all(u["_meta"]["source"] == "user-shell" for u in streamed)


async def test_client_checks(http: httpx.AsyncClient) -> None:
    sid, cid = await new_session(http, mode=None)
    r = await shell(http, sid, None, "true")
    assert r.status_code == 403 and r.json()["code"] == "client_id_required"
    r = await shell(http, sid, "someone-else", "true")
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"
    r = await http.post(
        f"/session/{sid}/shell", json={"command": "true"}, headers={"X-Qwen-Client-Id": "x" * 200}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"
    for bad in ("", "   ", 42, None):
        r = await shell(http, sid, cid, bad)
        assert r.status_code == 400, bad
    r = await shell(http, "no-such-session", cid, "true")
    assert r.status_code == 404 and r.json()["code"] == "session_not_found"


async def test_default_mode_asks_the_clients_first(http: httpx.AsyncClient) -> None:
    sid, cid = await new_session(http, mode="default")
    results: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:

        async def run(command: str) -> None:
            results.append(await shell(http, sid, cid, command))

        nursery.start_soon(run, "echo approved")
        votes = 0
        async with http.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            async for event in iter_events(stream):
                if event.get("type") != "permission_request":
                    continue
                request = event["data"]
                assert request["toolCall"]["kind"] == "execute"
                option = "allow_once" if votes == 0 else "reject_once"
                vote = await http.post(
                    f"/session/{sid}/permission/{request['requestId']}",
                    json={"outcome": {"outcome": "selected", "optionId": option}},
                    headers={"X-Qwen-Client-Id": cid},
                )
                assert vote.status_code == 200, vote.text
                votes += 1
                if votes == 1:
                    nursery.start_soon(run, "echo rejected-command")
                else:
                    break
    allowed, rejected = sorted(results, key=lambda r: r.status_code)
    assert allowed.status_code == 200 and allowed.json()["output"] == "approved\n"
    assert rejected.status_code == 403 and rejected.json()["code"] == "effect_denied"
    assert rejected.json()["rule"] == "permission:rejected"
    events = await events_since(http, sid, "effect_denied")
    commands = [e["data"]["command"] for e in events if e["type"] == "user_shell_command"]
    assert commands == ["echo approved"]  # the rejected command never ran


@pytest.mark.parametrize(("mode", "command"), [("yolo", "rm -rf /"), ("plan", "echo hi")])
async def test_policy_refusals_never_run(
    http: httpx.AsyncClient, shell_daemon: DaemonProcess, mode: str, command: str
) -> None:
    sid, cid = await new_session(http, mode=mode)
    marker = shell_daemon.workspace / f"ran-{mode}"
    r = await shell(http, sid, cid, f"{command}; touch {marker}")
    assert r.status_code == 403 and r.json()["code"] == "effect_denied", r.text
    assert r.json()["capability"] == "terminal.exec"
    assert not marker.exists()
    events = await events_since(http, sid, "effect_denied")
    assert "user_shell_command" not in [e["type"] for e in events]
    assert "permission_request" not in [e["type"] for e in events]


async def test_client_going_away_kills_the_command(
    http: httpx.AsyncClient, shell_daemon: DaemonProcess, tmp_path: Path
) -> None:
    sid, cid = await new_session(http)
    pid_file = shell_daemon.workspace / "pid"  # the shell's sandbox: writes in the workspace
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                async with httpx.AsyncClient(
                    base_url=shell_daemon.url, timeout=60, headers=AUTH
                ) as own:
                    await shell(own, sid, cid, f"echo $$ > {pid_file}; sleep 60")

            nursery.start_soon(run)
            with trio.fail_after(20):
                while not pid_file.exists() or not pid_file.read_text().strip():  # noqa: ASYNC110
                    await trio.sleep(0.02)
            scope.cancel()
    assert await group_gone(int(pid_file.read_text()))
    result = (await events_since(http, sid, "user_shell_result"))[-1]
    assert result["data"] == {
        "sessionId": sid,
        "exitCode": None,
        "signal": "SIGKILL",
        "aborted": True,
    }


async def test_disabled_without_the_flag(client: httpx.AsyncClient) -> None:
    r = await client.post("/session", json={"sessionScope": "thread"})
    sid, cid = r.json()["sessionId"], r.json()["clientId"]
    r = await shell(client, sid, cid, "true")
    assert r.status_code == 403 and r.json()["code"] == "session_shell_disabled"
    assert "session_shell_command" not in (await client.get("/capabilities")).json()["features"]


async def test_strict_gate_without_a_token() -> None:
    d = spawn_daemon(["--enable-session-shell"])
    try:
        async with httpx.AsyncClient(base_url=d.url, timeout=30) as c:
            r = await c.post("/session", json={"sessionScope": "thread"})
            sid, cid = r.json()["sessionId"], r.json()["clientId"]
            r = await shell(c, sid, cid, f"touch {d.workspace}/ran")
            assert r.status_code == 401 and r.json()["code"] == "token_required"
            assert not (d.workspace / "ran").exists()
            assert "session_shell_command" not in (await c.get("/capabilities")).json()["features"]
    finally:
        d.stop()
