"""What of a client's prompt request reaches the agent (issue 22, item 2).

The daemon's own fields (``sessionId``, ``prompt``) always win and only ``_meta`` passes
through: a REST body's ``"sessionId"`` naming a sibling session on the same child must not run
the turn there, and no unknown key is forwarded. Real daemon, two sessions packed on one real
child (``tests/support/flavor_agent.py``, whose ``params`` prompt replies with the
``session/prompt`` params it got), REST and ``/acp``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.acpfront.helpers import AcpHttp
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

AGENT = Path(__file__).resolve().parents[1] / "support" / "flavor_agent.py"


@pytest.fixture(scope="module")
def daemon_proc() -> Iterator[DaemonProcess]:
    d = spawn_daemon(
        ["--agent", f"{sys.executable} {AGENT} gemini", "--sessions-per-agent", "2"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30, headers=AUTH) as c:
        yield c


async def create(client: httpx.AsyncClient) -> str:
    r = await client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"]  # type: ignore[no-any-return]


async def agent_replies(client: httpx.AsyncClient, sid: str) -> list[str]:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    return [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


def params_prompt() -> list[dict[str, Any]]:
    return [{"type": "text", "text": "params"}]


async def test_a_rest_body_cannot_send_the_turn_to_a_sibling_session(
    client: httpx.AsyncClient,
) -> None:
    a, b = await create(client), await create(client)
    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
    pids = {s["sessionId"]: s["agentPid"] for s in status["full"]["sessions"]}
    assert pids[a] == pids[b] is not None  # packed on one child

    r = await client.post(
        f"/session/{a}/prompt",
        json={
            "prompt": params_prompt(),
            "sessionId": b,
            "_meta": {"test.caller": 1},
            "toolsOverride": {"any": "thing"},
        },
    )
    assert r.status_code == 200, r.text

    # The turn ran in A: the agent saw A's id and only the allow-listed extra field.
    (reply,) = await agent_replies(client, a)
    seen = json.loads(reply)
    assert seen["sessionId"] == a
    assert set(seen) == {"sessionId", "_meta"}
    assert seen["_meta"]["test.caller"] == 1
    assert seen["_meta"]["qwen.daemon.invocation"]["sessionId"] == a
    assert await agent_replies(client, b) == []  # B's log got nothing


async def test_a_rest_meta_that_is_not_an_object_is_400(client: httpx.AsyncClient) -> None:
    sid = await create(client)
    r = await client.post(f"/session/{sid}/prompt", json={"prompt": params_prompt(), "_meta": 3})
    assert r.status_code == 400
    assert r.json()["error"] == "`_meta` must be a JSON object"
    assert await agent_replies(client, sid) == []


async def test_acp_prompt_params_pass_only_meta(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            sid = (await acp.new_session(str(daemon_proc.workspace.resolve()), conn))["sessionId"]
            async with acp.stream(sid) as sess:
                bad = await acp.request(
                    "session/prompt", {"sessionId": sid, "prompt": params_prompt(), "_meta": []}
                )
                error = (await sess.reply(bad)).message["error"]
                assert error["code"] == -32602 and "`_meta` must be a JSON object" in str(error)
                rid = await acp.request(
                    "session/prompt",
                    {
                        "sessionId": sid,
                        "prompt": params_prompt(),
                        "_meta": {"test.caller": 2},
                        "extraField": True,
                    },
                )
                frames = await sess.until(lambda f: f.message.get("id") == rid)
                assert frames[-1].message["result"]["stopReason"] == "end_turn"
        await client.delete("/acp", headers=acp.headers())
    (reply,) = [
        f.message["params"]["update"]["content"]["text"]
        for f in frames
        if f.method == "session/update"
        and f.message["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    seen = json.loads(reply)
    assert set(seen) == {"sessionId", "_meta"} and seen["sessionId"] == sid
    assert seen["_meta"]["test.caller"] == 2
