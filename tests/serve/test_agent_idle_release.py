"""Idle release (issue 17, item 3): --agent-idle-release-ms lets an idle session's agent go.

The session stays listed and its event stream stays open; the next prompt (or model/mode
change) binds a child again through the pool and restores it with session/resume, ids
continue, and ``agent_released`` / ``agent_rebound`` tell clients what happened. A session
with a running prompt or a pending permission keeps its agent. Real daemon, real scripted
agent children; waits are bounded polls, nothing asserts a duration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from serve.http import capabilities
from serve.http.app import collect_features, create_app
from serve.http.openapi import build_document, registered_routes
from serve.runtime.build import build_host
from serve.settings import parse_settings
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until, iter_events

RELEASE_MS = 300


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def releasing() -> Any:
    d = spawn_daemon(
        ["--agent-idle-release-ms", str(RELEASE_MS), "--warm-agents", "0"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(releasing: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=releasing.url, headers=AUTH, timeout=30) as c:
        yield c


async def session_diag(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    body = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)  # type: ignore[no-any-return]


async def test_an_idle_session_lets_its_agent_go_and_binds_again_on_the_next_prompt(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post("/session", json={"sessionScope": "thread"})
    sid = created.json()["sessionId"]
    first = await client.post(f"/session/{sid}/prompt", json=text("remember me"))
    assert first.status_code == 200
    pid = (await session_diag(client, sid))["agentPid"]
    assert pid is not None

    # One stream, open across the release and the rebind.
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = iter_events(stream)
        seen: list[dict[str, Any]] = []
        async for event in events:
            if "comment" in event:
                continue
            seen.append(event)
            if event["type"] == "agent_released":
                break
        released = seen[-1]["data"]
        assert released["sessionId"] == sid and released["reason"] == "idle"
        assert released["idleMs"] >= RELEASE_MS
        diag = await session_diag(client, sid)
        assert diag["agentReleased"] is True and diag["agentPid"] is None
        assert not alive(pid)  # the child is gone...
        listed = await client.get("/daemon/status", params={"detail": "full"})
        assert sid in [
            s["sessionId"] for s in listed.json()["full"]["sessions"]
        ]  # ...not the session
        pool = listed.json()["runtime"]["agents"][0]
        assert pool["children"] == []

        accepted = await client.post(
            f"/session/{sid}/prompt", json=text("back again"), headers={"Prefer": "respond-async"}
        )
        assert accepted.status_code == 202
        async for event in events:
            if "comment" in event:
                continue
            seen.append(event)
            if event["type"] in ("turn_complete", "turn_error"):
                break
    types = [e["type"] for e in seen]
    rebound = next(e for e in seen if e["type"] == "agent_rebound")
    assert rebound["data"] == {"sessionId": sid, "via": "resume", "trigger": "prompt"}
    # The rebind is announced before the new turn's own events.
    assert types.index("agent_released") < types.index("agent_rebound")
    turn = seen[types.index("agent_rebound") + 1 :]
    assert [e["type"] for e in turn][-1] == "turn_complete"
    assert all(e.get("promptId") == accepted.json()["promptId"] for e in turn)
    assert seen[-1]["type"] == "turn_complete"
    assert seen[-1]["promptId"] == accepted.json()["promptId"]
    ids = [e["id"] for e in seen if "id" in e]
    assert ids == list(range(1, len(ids) + 1))  # ids continue across the release
    diag = await session_diag(client, sid)
    assert diag["agentReleased"] is False and diag["agentPid"] not in (None, pid)
    assert diag["agentReleases"] >= 1


async def test_a_model_change_binds_a_released_session_again(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        await collect_until(stream, lambda e: e["type"] == "agent_released")
    switched = await client.post(f"/session/{sid}/model", json={"modelId": "scripted-slow"})
    assert switched.status_code == 200, switched.text
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, lambda e: e["type"] == "model_switched")
    rebound = next(e for e in events if e["type"] == "agent_rebound")
    assert rebound["data"]["trigger"] == "model"
    assert (await session_diag(client, sid))["agentPid"] is not None


async def test_a_pending_permission_keeps_the_agent(
    client: httpx.AsyncClient, releasing: DaemonProcess
) -> None:
    created = (await client.post("/session", json={"sessionScope": "thread"})).json()
    sid = created["sessionId"]
    accepted = await client.post(
        f"/session/{sid}/prompt",
        json=text("[write kept.txt kept]"),
        headers={"Prefer": "respond-async"},
    )
    assert accepted.status_code == 202
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = iter_events(stream)
        async for event in events:
            if event.get("type") == "permission_request":
                request = event["data"]
                break
        pid = (await session_diag(client, sid))["agentPid"]
        # Several release periods pass while the permission waits: the agent stays.
        await trio.sleep(4 * RELEASE_MS / 1000)
        diag = await session_diag(client, sid)
        assert diag["agentReleased"] is False and diag["agentPid"] == pid and alive(pid)
        vote = await client.post(
            f"/session/{sid}/permission/{request['requestId']}",
            json={"outcome": {"outcome": "selected", "optionId": "allow"}},
            headers={"X-Qwen-Client-Id": created["clientId"]},
        )
        assert vote.status_code == 200
        after: list[str] = []
        async for event in events:
            if "type" in event:
                after.append(event["type"])
                if event["type"] == "agent_released":
                    break
    assert "agent_released" not in after[: after.index("turn_complete")]
    assert (releasing.workspace / "kept.txt").read_text() == "kept"


def test_the_capability_tag_follows_the_setting(tmp_path: Any) -> None:
    env = {"HOME": str(tmp_path)}
    on, _ = build_host(parse_settings(["--workspace", str(tmp_path)], env))
    off, _ = build_host(
        parse_settings(["--workspace", str(tmp_path), "--agent-idle-release-ms", "0"], env)
    )
    features = collect_features()
    assert "agent_idle_release" in {f.tag for f in capabilities.advertised(on, features)}
    assert "agent_idle_release" not in {f.tag for f in capabilities.advertised(off, features)}


def test_the_events_are_in_the_openapi_document(tmp_path: Any) -> None:
    host, _ = build_host(parse_settings(["--workspace", str(tmp_path)], {"HOME": str(tmp_path)}))
    app = create_app(host)
    features = collect_features()
    routes = registered_routes(app.url_map.iter_rules(), app.view_functions)
    advertised = [f.tag for f in capabilities.advertised(host, features)]
    doc = build_document(routes, features, advertised)
    schemas = doc["components"]["schemas"]
    assert set(schemas["AgentReleasedEvent"]["required"]) == {"sessionId", "reason", "idleMs"}
    assert set(schemas["AgentReboundEvent"]["properties"]["via"]["enum"]) == {"resume", "load"}
    events = doc["paths"]["/session/{session_id}/events"]["get"]
    assert "agent_released" in events["description"] and "agent_rebound" in events["description"]
    assert "agent_idle_release" in events["tags"]


async def test_an_agent_that_cannot_load_or_resume_is_never_released(tmp_path: Any) -> None:
    import json
    import shlex
    import sys

    from tests.support.daemon import ROOT

    config = tmp_path / "puppet.json"
    config.write_text(
        json.dumps(
            {
                "respond": {
                    "initialize": {"protocolVersion": 1, "agentCapabilities": {}},
                    "session/new": {"sessionId": "puppet-session-1"},
                    "session/prompt": {"stopReason": "end_turn"},
                }
            }
        )
    )
    agent = shlex.join(
        [
            sys.executable,
            str(ROOT / "tests" / "acp" / "puppet_agent.py"),
            str(config),
            str(tmp_path / "puppet.log"),
        ]
    )
    daemon = spawn_daemon(
        ["--agent", agent, "--agent-idle-release-ms", str(RELEASE_MS), "--warm-agents", "0"],
        workspace=tmp_path,  # the puppet writes its log there: inside its file sandbox
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"
            ]
            assert (await client.post(f"/session/{sid}/prompt", json=text("hi"))).status_code == 200
            pid = (await session_diag(client, sid))["agentPid"]
            await trio.sleep(5 * RELEASE_MS / 1000)  # several release periods, idle
            diag = await session_diag(client, sid)
            assert diag["agentReleased"] is False and diag["agentPid"] == pid and alive(pid)
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            assert "agent_released" not in [e["type"] for e in events]
    finally:
        daemon.stop()


def flaky_daemon(tmp_path: Any, *agent_flags: str) -> tuple[DaemonProcess, Any]:
    """A releasing daemon whose agent fails at start while ``down`` exists (issue 22)."""
    import shlex
    import sys

    from tests.support.daemon import ROOT

    down = tmp_path / "down"
    agent = shlex.join(
        [
            sys.executable,
            str(ROOT / "tests" / "serve" / "flaky_agent.py"),
            "--down",
            str(down),
            *agent_flags,
            "--",
            "--state-dir",
            str(tmp_path / "home" / "agent-state"),  # in its HOME: writable in the sandbox
        ]
    )
    (tmp_path / "home").mkdir(exist_ok=True)
    daemon = spawn_daemon(
        ["--agent", agent, "--agent-idle-release-ms", str(RELEASE_MS), "--warm-agents", "0"],
        env={"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(tmp_path / "home")},
    )
    return daemon, down


async def released_session(client: httpx.AsyncClient) -> str:
    sid: str = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    assert (await client.post(f"/session/{sid}/prompt", json=text("hello"))).status_code == 200
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        await collect_until(stream, lambda e: e["type"] == "agent_released")
    return sid


async def test_an_agent_outage_at_rebind_fails_the_prompt_retryably_and_keeps_the_session(
    tmp_path: Any,
) -> None:
    daemon, down = flaky_daemon(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = await released_session(client)
            down.touch()  # the agent command fails for a while
            failed = await client.post(f"/session/{sid}/prompt", json=text("during the outage"))
            assert failed.status_code == 503, failed.text
            assert failed.json()["code"] == "agent_unavailable"
            assert failed.headers["retry-after"] == "1"
            # The session stays, still released; nothing died.
            diag = await session_diag(client, sid)
            assert diag["agentReleased"] is True and diag["agentPid"] is None
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "turn_error")
            assert events[-1]["data"]["code"] == "agent_unavailable"
            assert "session_died" not in [e["type"] for e in events]

            down.unlink()  # the agent works again: the same session answers
            again = await client.post(f"/session/{sid}/prompt", json=text("after the outage"))
            assert again.status_code == 200, again.text
            assert again.json()["stopReason"] == "end_turn"
            diag = await session_diag(client, sid)
            assert diag["agentReleased"] is False and diag["agentPid"] is not None
    finally:
        daemon.stop()


async def test_a_released_session_the_agent_no_longer_knows_dies_with_that_reason(
    tmp_path: Any,
) -> None:
    daemon, _down = flaky_daemon(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = await released_session(client)
            # The agent's own record of the session is gone: resume answers "not found".
            (tmp_path / "home" / "agent-state" / "sessions" / f"{sid}.json").unlink()
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                failed = await client.post(f"/session/{sid}/prompt", json=text("still there?"))
                assert failed.status_code == 404, failed.text
                assert failed.json()["code"] == "agent_session_not_found"
                events = await collect_until(stream, lambda e: e["type"] == "session_died")
            assert events[-1]["data"]["reason"] == "agent_session_not_found"
            for _ in range(100):
                if (await client.get(f"/session/{sid}/pending-prompts")).status_code == 404:
                    break
                await trio.sleep(0.05)
            assert (await client.get(f"/session/{sid}/pending-prompts")).status_code == 404
    finally:
        daemon.stop()


async def test_an_idle_release_does_not_hold_up_the_session_while_the_agent_stops(
    tmp_path: Any,
) -> None:
    marker = tmp_path / "home" / "eof.log"  # the agent writes it: in its HOME
    # An agent that ignores stdin EOF and SIGTERM: stopping it takes the whole escalation.
    daemon, _down = flaky_daemon(tmp_path, "--linger", str(marker))
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid = created["sessionId"]
            assert (await client.post(f"/session/{sid}/prompt", json=text("hi"))).status_code == 200
            pid = (await session_diag(client, sid))["agentPid"]
            # Until the release has begun: the agent saw stdin EOF and wrote its line (the
            # file exists from the agent's open, before the line is in it).
            with trio.fail_after(20):
                while not (marker.exists() and marker.read_text().endswith("\n")):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            # The pid the agent sees: the daemon's agentPid, or 2 in its own pid namespace
            # (pid 1 is its init: serve/isolation/pidns.py).
            iso = (await client.get("/daemon/status")).json()["isolation"]
            seen = 2 if iso["pidNamespace"]["active"] else pid
            assert marker.read_text().startswith(f"{seen} eof\n")
            beat = await client.post(
                f"/session/{sid}/heartbeat", headers={"X-Qwen-Client-Id": created["clientId"]}
            )
            assert beat.status_code == 200, beat.text
            # The session answered while its old agent was still being stopped.
            assert alive(pid)
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                await collect_until(stream, lambda e: e["type"] == "agent_released")
            assert not alive(pid)
    finally:
        daemon.stop()
