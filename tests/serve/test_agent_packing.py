"""Packing (issue 17, item 2): --sessions-per-agent M puts up to M sessions on one child.

Updates and the agent's requests are routed by ACP sessionId to the owning session; a
shared child that is SIGKILLed is replaced and each of its sessions restores in place
(running prompt: turn_error agent_restarted; queued prompts survive); sessions on other
children never notice. Real daemon, real scripted-agent children, no timed assertions.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until, iter_events


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


def is_terminal(event: dict[str, Any]) -> bool:
    return event["type"] in ("turn_complete", "turn_error")


@pytest.fixture
def packed() -> Any:
    d = spawn_daemon(
        ["--sessions-per-agent", "2", "--warm-agents", "1"], env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(packed: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=packed.url, headers=AUTH, timeout=30) as c:
        yield c


async def create(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.post("/session", json={"sessionScope": "thread"})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def pids(client: httpx.AsyncClient) -> dict[str, int | None]:
    body = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return {s["sessionId"]: s["agentPid"] for s in body["full"]["sessions"]}


async def history(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        return await collect_until(stream, lambda e: e["type"] == "replay_complete")


def agent_text(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    )


async def test_sessions_share_a_child_and_each_gets_only_its_own_traffic(
    client: httpx.AsyncClient, packed: DaemonProcess
) -> None:
    a, b, c = await create(client), await create(client), await create(client)
    owner = await pids(client)
    assert owner[a["sessionId"]] == owner[b["sessionId"]]  # packed on one child
    assert owner[c["sessionId"]] not in (owner[a["sessionId"]], None)  # M = 2: the next one
    pool = (await client.get("/daemon/status")).json()["runtime"]["agents"][0]
    assert pool["sessionsPerAgent"] == 2
    by_pid = {child["pid"]: child for child in pool["children"]}
    assert by_pid[owner[a["sessionId"]]]["sessions"] == 2
    assert by_pid[owner[a["sessionId"]]]["state"] == "full"

    # Concurrent turns on the shared child: each session's log holds its own echo only.
    replies: dict[str, httpx.Response] = {}

    async def prompt(session: dict[str, Any], words: str) -> None:
        sid = session["sessionId"]
        replies[sid] = await client.post(f"/session/{sid}/prompt", json=text(words))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(prompt, a, "[sleep 300] alpha words")
        nursery.start_soon(prompt, b, "beta words")
    assert all(r.status_code == 200 for r in replies.values())
    a_log, b_log = await history(client, a["sessionId"]), await history(client, b["sessionId"])
    assert "alpha words" in agent_text(a_log) and "beta" not in agent_text(a_log)
    assert "beta words" in agent_text(b_log) and "alpha" not in agent_text(b_log)
    assert all(e["data"]["sessionId"] == a["sessionId"] for e in a_log if "id" in e)

    # The agent's permission request and its fs/write go to the owning session.
    sid = a["sessionId"]
    accepted = await client.post(
        f"/session/{sid}/prompt",
        json=text("[write from_a.txt written by a]"),
        headers={"Prefer": "respond-async"},
    )
    assert accepted.status_code == 202
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        async for event in iter_events(stream):
            if event.get("type") == "permission_request":
                vote = await client.post(
                    f"/session/{sid}/permission/{event['data']['requestId']}",
                    json={"outcome": {"outcome": "selected", "optionId": "allow"}},
                    headers={"X-Qwen-Client-Id": a["clientId"]},
                )
                assert vote.status_code == 200
            if (
                "type" in event
                and is_terminal(event)
                and event["promptId"] == (accepted.json()["promptId"])
            ):
                assert event["type"] == "turn_complete"
                break
    assert (packed.workspace / "from_a.txt").read_text() == "written by a"
    assert "permission_request" not in [e["type"] for e in await history(client, b["sessionId"])]
    a_types = [e["type"] for e in await history(client, sid)]
    assert "permission_request" in a_types and "permission_resolved" in a_types


async def test_a_killed_shared_child_restores_each_of_its_sessions_in_place(
    client: httpx.AsyncClient,
) -> None:
    a, b, c = await create(client), await create(client), await create(client)
    sa, sb, sc = a["sessionId"], b["sessionId"], c["sessionId"]
    owner = await pids(client)
    shared, other = owner[sa], owner[sc]
    assert shared is not None and owner[sb] == shared and other != shared
    running = await client.post(
        f"/session/{sa}/prompt", json=text("[sleep 30000]"), headers={"Prefer": "respond-async"}
    )
    queued = await client.post(
        f"/session/{sa}/prompt", json=text("after restart"), headers={"Prefer": "respond-async"}
    )
    # Wait until the agent is inside the turn (its thought/update arrives), then kill it.
    async with client.stream(
        "GET", f"/session/{sa}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        await collect_until(stream, lambda e: e["type"] == "session_update")
    os.killpg(shared, signal.SIGKILL)

    async with client.stream(
        "GET", f"/session/{sa}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        done: list[dict[str, Any]] = []
        events = await collect_until(
            stream, lambda e: is_terminal(e) and done.append(e) is None and len(done) == 2
        )
    assert done[0]["promptId"] == running.json()["promptId"]
    assert done[0]["type"] == "turn_error"
    assert done[0]["data"]["errorKind"] == "agent_restarted"
    assert done[1]["promptId"] == queued.json()["promptId"]
    assert done[1]["type"] == "turn_complete"
    types = [e["type"] for e in events]
    assert "session_restarted" in types and "session_died" not in types
    ids = [e["id"] for e in events if "id" in e]
    assert ids == list(range(1, len(ids) + 1))

    # B was on the same child: restored too, and it works.
    async with client.stream(
        "GET", f"/session/{sb}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        await collect_until(stream, lambda e: e["type"] == "session_restarted")
    reply = await client.post(f"/session/{sb}/prompt", json=text("still here"))
    assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"
    assert "still here" in agent_text(await history(client, sb))

    # C, on another child, never noticed.
    after = await pids(client)
    assert after[sc] == other
    assert after[sa] not in (shared, None) and after[sb] not in (shared, None)
    c_types = [e["type"] for e in await history(client, sc)]
    assert "session_restarted" not in c_types and "session_died" not in c_types
    reply = await client.post(f"/session/{sc}/prompt", json=text("c works"))
    assert reply.status_code == 200
